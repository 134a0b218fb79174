"""The URL of a Redis stream, as both logs name theirs: `redis://HOST:PORT[/STREAM]`.

The update log (rec.contract.updates, contract 3) and the event stream (rec.contract.events,
contract 5) are each one Redis stream, and their URLs differ only in the stream key a URL
without a path names and in what a message calls the URL. One parser serves both, so the two
cannot drift apart; tests/data/url_golden.json pins its parts and refusals, which rec-server's
C++ parser of update log URLs reads too.

The path names the stream, never a database number: a path of digits only is refused, so
`redis://h:6379/0` (a Redis client's database 0) fails loudly instead of naming a stream "0".

Example:
    >>> str(parse_stream_url("redis://h:6379", "event stream", "rec:events"))
    'redis://h:6379/rec:events'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_URL = re.compile(r"^redis://(?P<host>[^/:?#\s]+):(?P<port>\d{1,5})(?:/(?P<stream>[^?#\s]*))?$")


@dataclass(frozen=True)
class StreamUrl:
    host: str
    port: int
    stream: str

    def __str__(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.stream}"


def parse_stream_url(
    url: str, what: str, default_stream: str, error: type[ValueError] = ValueError
) -> StreamUrl:
    """`redis://HOST:PORT[/STREAM]` -> its parts, the stream `default_stream` when the URL has
    no path (or an empty one). A refused URL raises `error` (a ValueError subclass: each log
    has its own), its message starting with `what` ("update log", "event stream")."""
    m = _URL.match(url)
    if not m:
        raise error(f"{what} URL {url!r} must look like redis://HOST:PORT[/STREAM]")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise error(f"{what} URL {url!r}: port {port} is not in [1, 65535]")
    stream = m["stream"] or default_stream
    if stream.isdigit():
        raise error(
            f"{what} URL {url!r}: the path names the stream, and {stream!r} looks like a "
            f"Redis database number; name the stream (for example /{default_stream})"
        )
    return StreamUrl(m["host"], port, stream)
