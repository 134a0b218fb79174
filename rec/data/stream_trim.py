"""Trimming the event stream (#60 section 5): after each checkpoint, rank 0 deletes what no kept
checkpoint may resume from and no other consumer group still needs, so a long run's broker
memory stays bounded.

Per stream key (one stream, or each partition of a partitioned one), the bound is the minimum of
  - every kept checkpoint's position there (meta.json `stream`; a resume of any of them skips
    what its position holds and reads from it on). A key where some kept checkpoint has no
    position (that rank or partition trained nothing yet) is not trimmed: its resume reads from
    the group's start;
  - every other group's oldest pending entry and its last-delivered-id + 1 (another job reading
    the same stream, at its own pace).
XTRIM key MINID ~ bound deletes entries below it, approximately: whole macro nodes only, so it
keeps more, never less. The dead-letter streams are capped (MAXLEN ~ DEAD_KEEP): nothing reads
them back, an operator looks at the newest.

Pending entries of this run's group below the bound are ones a checkpoint's position covers: a
resume acknowledges them without their fields (rec.data.stream_redis._take's skip comes first).
Best effort: a broker away is said and left to the next checkpoint.

Example:
    >>> trim_stream(cfg, [run_dir.read_meta(d)["stream"] for d in kept])  # doctest: +SKIP
    {'{clicks:0:3}': '1718000000000-0', ...}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rec.config import StreamConfig
from rec.contract.events import dead_stream, parse_url
from rec.contract.partitions import dead_key
from rec.data.stream_reader import entry_key
from rec.logs.route import Router

DEAD_KEEP = 10_000
"""Dead letters kept per dead-letter stream at least (MAXLEN ~)."""

Bound = tuple[int, int]


def kept_bounds(metas: Iterable[dict[str, Any] | None], stream: str) -> dict[str, Bound | None]:
    """Per stream key, the oldest entry any kept checkpoint may resume from (None: some kept
    checkpoint has no position there, so the key is not trimmed). `metas`: the kept checkpoints'
    meta.json `stream` sections (None for one without); `stream`: the URL's stream name, the key
    of one stream's positions."""
    out: dict[str, Bound | None] = {}

    def hold(key: str, position: dict[str, Any] | None) -> None:
        if position is None:
            out[key] = None
        elif key not in out or out[key] is not None:
            at = entry_key(str(position["entry"]))
            out[key] = at if key not in out else min(out[key], at)  # type: ignore[type-var]

    for meta in metas:
        if meta is None:
            continue
        if meta.get("format") == 2:
            for part in meta["parts"]:
                hold(part["key"], part["position"])
        else:
            for position in meta["positions"]:
                hold(stream, position)
    return out


def others_bound(client: Any, key: str, group: str) -> Bound | None:
    """The oldest entry another group of `key` still needs: its oldest pending one or the one
    after its last delivered (None: no other group)."""
    low: Bound | None = None
    for info in client.xinfo_groups(key):
        name = _text(info["name"])
        if name == group:
            continue
        ms, seq = entry_key(_text(info["last-delivered-id"]))
        need = (ms, seq + 1)
        if int(info["pending"]):
            need = min(need, entry_key(_text(client.xpending(key, name)["min"])))
        low = need if low is None else min(low, need)
    return low


def trim_stream(cfg: StreamConfig, metas: Iterable[dict[str, Any] | None],
                log: Callable[[str], None] = print,
                router: Router | None = None) -> dict[str, str]:  # fmt: skip
    """Trims each key of cfg.url's stream below its bound (module docstring) and caps its
    dead letters; {key: the MINID given}. A broker error is logged and trims nothing more."""
    import redis

    where = parse_url(cfg.url)
    router = router or Router(where.nodes)
    done: dict[str, str] = {}
    try:
        for key, bound in kept_bounds(metas, where.stream).items():
            if bound is None:
                continue
            host, port = router.node_for(key)
            client = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=2)
            try:
                if not client.exists(key):
                    continue
                other = others_bound(client, key, cfg.group)
                low = bound if other is None else min(bound, other)
                minid = f"{low[0]}-{low[1]}"
                client.xtrim(key, minid=minid, approximate=True)
                dead = dead_stream(key, cfg.dead_letter) if key == where.stream else dead_key(key)
                client.xtrim(dead, maxlen=DEAD_KEEP, approximate=True)
                done[key] = minid
            finally:
                client.close()
    except (redis.RedisError, OSError) as e:
        log(f"trimming the event stream {where} skipped ({e}); the next checkpoint tries again")
    return done


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
