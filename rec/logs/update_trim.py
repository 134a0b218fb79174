"""Trimming the update log (#60 section 5): readers say what they still need, rank 0 trims below
it after each checkpoint, and a reader the trim went past says so instead of skipping rows.

Readers register in the hash `{S}:readers` (on the node of its own slot, as `{S}:layout`): field
= the reader's name, value = JSON {"t": unix seconds, "need": {k: entry id}}, rewritten about
every REGISTER_EVERY_S by a `Registration` thread. `need[k]` is the oldest entry of partition k
(0 for the legacy stream) the reader may still read: its cursor, or the place a restart would
replay from if that is older.

After each checkpoint rank 0 trims each partition with XTRIM MINID ~ bound, where bound is the
minimum of
  - every registration younger than publish.reader_ttl_s (older ones are readers gone or stuck:
    trimmed past; `rec export` and a new replica recover them);
  - the ids written publish.keep_s ago (the node's clock): that much history always stays;
  - the partition's last entry just before the checkpoint's flush, plus one: the newest
    checkpoint's export applies the log after its step, and every record of a later step was
    written after that entry.
No live registration at all means nothing is known about the readers, so nothing is trimmed.
Approximate trimming removes whole macro nodes only, so it keeps more, never less.

`{S}:trimmed` then holds {k: {"minid", "gen", "step"}}: entries below minid may be gone, and a
model holding the log up to (gen, step) (an export of that checkpoint or newer) needs none of
them. `past_trim` is the reader's check.

Example:
    >>> trim_log(cfg, tails, gen=1, step=40)  # doctest: +SKIP
    {0: '1718000000000-0', 1: '1718000000000-3'}
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable

from rec.config import PublishConfig
from rec.contract.partitions import layout_key
from rec.contract.updates import parse_url
from rec.logs.layout import connect, read_layout
from rec.logs.route import Router

REGISTER_EVERY_S = 5.0
"""How often a reader rewrites its registration."""

Id = tuple[int, int]


def readers_key(stream: str) -> str:
    """The registrations' hash, "{S}:readers" (the slot of the layout record)."""
    return layout_key(stream).replace(":layout", ":readers")


def trimmed_key(stream: str) -> str:
    """The last trim's record, "{S}:trimmed"."""
    return layout_key(stream).replace(":layout", ":trimmed")


def entry_key(entry_id: str | bytes) -> Id:
    """A stream entry id ("ms-seq") as what orders it."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _id(at: Id) -> str:
    return f"{at[0]}-{at[1]}"


def register(url: str, name: str, need: dict[int, str], now: float | None = None) -> None:
    """Writes `name`'s registration: it still needs partition k's entries from need[k] on."""
    where = parse_url(url)
    key = readers_key(where.stream)
    client = connect(Router(where.nodes).node_for(key))
    try:
        value = {"t": time.time() if now is None else now, "need": need}
        client.hset(key, name, json.dumps(value))
    finally:
        client.close()


def reader_name(kind: str) -> str:
    """A registration's name: the reader's kind, host and pid (one field per process)."""
    import os
    import socket

    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


class Registration:
    """A daemon thread registering `need()` as `name` every REGISTER_EVERY_S until stop(); a
    broker away is skipped (the next round writes it again)."""

    def __init__(self, url: str, name: str, need: Callable[[], dict[int, str] | None],
                 every_s: float = REGISTER_EVERY_S) -> None:  # fmt: skip
        self.url, self.name, self.need, self.every_s = url, name, need, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rec-register", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import redis

        while not self._stop.is_set():
            need = self.need()
            if need:
                with contextlib.suppress(redis.RedisError, OSError):  # the next round
                    register(self.url, self.name, need)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def live_needs(raw: dict, ttl_s: float, now: float) -> dict[int, Id] | None:
    """Per partition, the oldest entry a registration younger than `ttl_s` needs (None: no live
    registration). `raw`: the readers hash as HGETALL gives it."""
    low: dict[int, Id] = {}
    live = False
    for value in raw.values():
        reg = json.loads(value)
        if now - float(reg["t"]) > ttl_s:
            continue
        live = True
        for k, entry in reg["need"].items():
            at = entry_key(entry)
            low[int(k)] = min(low.get(int(k), at), at)
    return low if live else None


def tails(url: str) -> dict[int, str]:
    """Each partition's last entry id now ("0-0" when empty): taken before a checkpoint's flush,
    every later record (of a later step) is after it."""
    where = parse_url(url)
    router = Router(where.nodes)
    out: dict[int, str] = {}
    for k, key in _keys(router, where.stream):
        client = connect(router.node_for(key))
        try:
            last = client.xrevrange(key, count=1)
        finally:
            client.close()
        out[k] = last[0][0].decode() if last else "0-0"
    return out


def safe_tails(url: str, log: Callable[[str], None] = print) -> dict[int, str] | None:
    """tails(url), or None (logged: no trim this checkpoint) when the broker is away."""
    import redis

    try:
        return tails(url)
    except (redis.RedisError, OSError) as e:
        log(f"the update log's tails unknown ({e}): no trim at this checkpoint")
        return None


def _keys(router: Router, stream: str) -> list[tuple[int, str]]:
    layout = read_layout(router, stream)
    return [(0, stream)] if layout is None else list(enumerate(layout.keys))


def trim_log(cfg: PublishConfig, tails_before: dict[int, str], gen: int, step: int,
             log: Callable[[str], None] = print,
             now: float | None = None) -> dict[int, str]:  # fmt: skip
    """Trims each partition of cfg.url's log below its bound (module docstring) and records it
    in `{S}:trimmed`; {k: the MINID given}. A broker error is logged and trims nothing more."""
    import redis

    where = parse_url(cfg.url)
    router = Router(where.nodes)
    done: dict[int, str] = {}
    try:
        head = connect(router.node_for(readers_key(where.stream)))
        try:
            needs = live_needs(head.hgetall(readers_key(where.stream)), cfg.reader_ttl_s,
                               time.time() if now is None else now)  # fmt: skip
            if needs is None:
                return done  # nothing known about the readers: keep everything
            for k, key in _keys(router, where.stream):
                if k not in needs or k not in tails_before:
                    continue  # no live reader says what it needs here
                client = connect(router.node_for(key))
                try:
                    secs, micros = client.time()
                    kept_ms = int(secs * 1000 + micros // 1000 - cfg.keep_s * 1000)
                    tail = entry_key(tails_before[k])
                    bound = min(needs[k], (kept_ms, 0), (tail[0], tail[1] + 1))
                    client.xtrim(key, minid=_id(bound), approximate=True)
                finally:
                    client.close()
                done[k] = _id(bound)
            if done:
                record = {str(k): {"minid": m, "gen": gen, "step": step} for k, m in done.items()}
                old = head.get(trimmed_key(where.stream))
                merged = {**(json.loads(old) if old else {}), **record}
                head.set(trimmed_key(where.stream), json.dumps(merged))
        finally:
            head.close()
    except (redis.RedisError, OSError) as e:
        log(f"trimming the update log {where} skipped ({e}); the next checkpoint tries again")
    return done


def read_trimmed(url: str) -> dict[int, dict]:
    """The last trims, {k: {"minid", "gen", "step"}} ({} when never trimmed)."""
    where = parse_url(url)
    key = trimmed_key(where.stream)
    client = connect(Router(where.nodes).node_for(key))
    try:
        text = client.get(key)
    finally:
        client.close()
    return {} if text is None else {int(k): v for k, v in json.loads(text).items()}


def past_trim(trimmed: dict[int, dict], places: dict[int, str],
              mark: tuple[int, int]) -> str | None:  # fmt: skip
    """Why a reader at `places` (its cursor per partition) holding the log up to `mark` (gen,
    step) has lost entries to a trim, or None. A model at or past the trim's (gen, step) needs
    nothing trimmed; a cursor at or past minid - 1 lost nothing."""
    for k, t in sorted(trimmed.items()):
        minid = entry_key(t["minid"])
        cursor = entry_key(places.get(k, "0-0"))
        if mark >= (int(t["gen"]), int(t["step"])) or cursor >= (minid[0], minid[1] - 1):
            continue
        return (f"the update log's partition {k} was trimmed below {t['minid']} (after "
                f"checkpoint gen {t['gen']} step {t['step']}) past this reader's entry "
                f"{_id(cursor)}, its model at gen {mark[0]} step {mark[1]}: its rows would miss "
                f"records. Recover from a newer export (rec export; rec-server and Triton hot-"
                f"swap to it) or, for stored tables, rec export --store; then follow again. "
                f"Readers register in {{S}}:readers; one silent past publish.reader_ttl_s is "
                f"trimmed past")  # fmt: skip
    return None


def oldest(places: list[dict[int, str]]) -> dict[int, str]:
    """Per partition, the oldest of these places (a partition one lacks: from its start)."""
    keys = {int(k) for seen in places for k in seen}
    return {k: _id(min(entry_key(_get(seen, k)) for seen in places)) for k in keys}


def _get(places: dict, k: int) -> str:
    return places.get(k, places.get(str(k), "0-0"))


class TrimWatch:
    """A reader's check against `{S}:trimmed`, at most every `every_s`: `check(places, mark)`
    returns past_trim's message while the reader is past a trim, else None. One read can jump a
    cursor over the gap a trim left before the reader sees `{S}:trimmed` (written just after
    the XTRIM), so each check judges the oldest of the places of the last three checks. Call it
    once before the first read too. A broker away is no answer: the reader's retries say that."""

    def __init__(self, url: str, every_s: float = REGISTER_EVERY_S) -> None:
        self.url, self.every_s = url, every_s
        self._next = 0.0
        self._seen: list[dict[int, str]] = []
        self.message: str | None = None

    def check(self, places: dict[int, str], mark: tuple[int, int]) -> str | None:
        import redis

        if time.monotonic() < self._next:
            return self.message
        self._next = time.monotonic() + self.every_s
        self._seen = [*self._seen[-2:], dict(places)]
        low = oldest(self._seen)
        with contextlib.suppress(redis.RedisError, OSError):  # the reader's retries say it
            self.message = past_trim(read_trimmed(self.url), low, mark)
        return self.message
