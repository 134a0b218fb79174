"""The real-time loop's two logs (the event stream, rec.contract.events, and the update log,
rec.contract.updates) beyond one Redis node: routing a log's keys to the nodes of a Redis
Cluster (`route`). The layout and keys of a partitioned log are a contract of their own,
rec.contract.partitions."""
