"""A log's layout record in Redis (rec.contract.partitions): read it, or create it once.

The record `{S}:layout` lives on the node of its own slot (its hash tag is S), which the Router
names. Whoever creates a layout writes it with SET NX, so two writers racing (every rank of a
first start) leave one record, and each then checks the one that won against what it wanted: a
log's partitioning never changes under its readers.

Example:
    >>> layout = ensure_layout(Router([("127.0.0.1", 6379)]), "rec:updates", 4)  # doctest: +SKIP
    >>> layout.keys[1]                                                          # doctest: +SKIP
    '{rec:updates:1:2}'
"""

from __future__ import annotations

from rec.contract.partitions import Layout, layout_key, make_layout, parse_layout
from rec.logs.route import Node, Router


class LayoutError(ValueError):
    """The log's layout record disagrees with what a writer wants."""


def connect(node: Node, timeout_s: float = 5.0):
    """A redis-py client of one node (not a cluster client: the Router picks the node)."""
    import redis

    return redis.Redis(host=node[0], port=node[1], socket_timeout=timeout_s,
                       socket_connect_timeout=timeout_s)  # fmt: skip


def read_layout(router: Router, stream: str) -> Layout | None:
    """The layout of `stream`, or None when it has none (the legacy layout: one stream S)."""
    key = layout_key(stream)
    client = connect(router.node_for(key))
    try:
        text = client.get(key)
    finally:
        client.close()
    return None if text is None else parse_layout(text, key)


def ensure_layout(router: Router, stream: str, partitions: int) -> Layout:
    """The layout of `stream` in `partitions` partitions: created with SET NX when there is none,
    else the existing one, which must have as many partitions (LayoutError otherwise)."""
    want = make_layout(stream, partitions)
    key = layout_key(stream)
    client = connect(router.node_for(key))
    try:
        client.set(key, want.to_json(), nx=True)
        have = parse_layout(client.get(key), key)
    finally:
        client.close()
    if have.partitions != partitions:
        raise LayoutError(f"{key} says {stream!r} has {have.partitions} partitions, not "
                          f"{partitions}: a log's layout is fixed once made")  # fmt: skip
    return have
