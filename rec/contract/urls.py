"""The URL of a Redis stream, as both logs name theirs: `redis://HOST:PORT[,HOST:PORT...][/STREAM]`.

The update log (rec.contract.updates, contract 3) and the event stream (rec.contract.events,
contract 5) are each one Redis stream, and their URLs differ only in the stream key a URL
without a path names and in what a message calls the URL. One parser serves both, so the two
cannot drift apart; tests/data/url_golden.json pins its parts and refusals for one node, which
rec-server's C++ parser of update log URLs reads too, and tests/data/stream_url_golden.json
node lists, which rec-server's ParseUpdateUrl reads too (cpp/tests/contract_golden_test.cpp).

The nodes are those of the store's URL (rec.contract.store.parse_store_url): one node, or any
nodes of a Redis Cluster (a client learns the rest from them). `host` and `port` are the first
node's, so a reader that knows one node only keeps working on a one-node URL.

The path names the stream, never a database number: a path of digits only is refused, so
`redis://h:6379/0` (a Redis client's database 0) fails loudly instead of naming a stream "0".

Example:
    >>> str(parse_stream_url("redis://h:6379", "event stream", "rec:events"))
    'redis://h:6379/rec:events'
    >>> parse_stream_url("redis://a:7000,b:7001/s", "event stream", "rec:events").nodes
    (('a', 7000), ('b', 7001))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The node list stops at the first "/", so a stream may hold "," or ":" ("redis://h:1/a,b").
_URL = re.compile(r"^redis://(?P<nodes>[^/?#\s]+)(?:/(?P<stream>[^?#\s]*))?$")
_NODE = re.compile(r"^(?P<host>[^/:?#,\s]+):(?P<port>\d{1,5})$")
_FORM = "redis://HOST:PORT[/STREAM]"
_CLUSTER_FORM = "redis://HOST:PORT,HOST:PORT...[/STREAM]"


@dataclass(frozen=True)
class StreamUrl:
    """A stream URL's parts. `nodes` defaults to ((host, port),): a one-node URL's parts can
    still be written StreamUrl(host, port, stream)."""

    host: str
    port: int
    stream: str
    nodes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes:
            object.__setattr__(self, "nodes", ((self.host, self.port),))

    @property
    def address(self) -> str:
        """The node list as the URL writes it: `host:port[,host:port...]`."""
        return ",".join(f"{h}:{p}" for h, p in self.nodes)

    def __str__(self) -> str:
        return f"redis://{self.address}/{self.stream}"


def parse_stream_url(
    url: str, what: str, default_stream: str, error: type[ValueError] = ValueError
) -> StreamUrl:
    """`redis://HOST:PORT[,HOST:PORT...][/STREAM]` -> its parts, the stream `default_stream`
    when the URL has no path (or an empty one). A refused URL raises `error` (a ValueError
    subclass: each log has its own), its message starting with `what` ("update log", "event
    stream")."""
    bad = f"{what} URL {url!r} must look like {_FORM} (a cluster: {_CLUSTER_FORM})"
    m = _URL.match(url) if isinstance(url, str) else None
    if not m:
        raise error(bad)
    parts = m["nodes"].split(",")
    nodes = []
    for part in parts:
        node = _NODE.match(part)
        if not node:
            if len(parts) == 1:
                raise error(bad)
            raise error(f"{what} URL {url!r}: {part!r} is not HOST:PORT; want {_CLUSTER_FORM}")
        port = int(node["port"])
        if not 0 < port < 65536:
            raise error(f"{what} URL {url!r}: port {port} is not in [1, 65535]")
        nodes.append((node["host"], port))
    stream = m["stream"] or default_stream
    if stream.isdigit():
        raise error(
            f"{what} URL {url!r}: the path names the stream, and {stream!r} looks like a "
            f"Redis database number; name the stream (for example /{default_stream})"
        )
    return StreamUrl(nodes[0][0], nodes[0][1], stream, tuple(nodes))
