"""A client of the embedding store's cluster (rec.contract.store's URL), for its writers and
readers alike. It imports neither torch nor FBGEMM, so a reader that only fetches rows (rec's
Triton model) loads none of export's code.
"""

from __future__ import annotations

from rec.contract.store import StoreError, parse_store_url


def connect(url: str):
    """A redis-py RedisCluster on the store's URL (every node of the URL a startup node)."""
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException, RedisError

    nodes = [ClusterNode(h, p) for h, p in parse_store_url(url).nodes]
    try:
        return RedisCluster(startup_nodes=nodes, socket_timeout=30, require_full_coverage=True)
    except (RedisError, RedisClusterException) as e:
        raise StoreError(f"store {url}: cannot reach the cluster ({e})") from e
