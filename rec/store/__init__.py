"""The embedding tier: tables kept in a Redis Cluster instead of every replica's memory (#35).

layout: where a row lives (key, hash tag, partition) and what the store will hold;
cluster: a Redis Cluster of our own for tests, the demo and the benchmarks;
writer: export's sink that puts a table's rows there.
"""
