"""The Redis Streams reader of events (rec.data.stream has the semantics; this is the mechanics).

Commands, per rank (consumer C of group G on stream S):
  XGROUP CREATE S G <start> MKSTREAM        once; an existing group is kept as it is
  XREADGROUP GROUP G C COUNT n STREAMS S id  C's own pending entries after `id` (from 0 at a
                                            start, from the last one taken after a reconnect)
  XREADGROUP GROUP G C COUNT n BLOCK ms STREAMS S >   then new entries
  XADD <dead> * reason .. message .. ...    a refused entry or event, when first read
  XACK S G id...                            what a committed checkpoint holds (ack) and, on a
                                            resume, the pending entries the position holds
  XINFO GROUPS S                            the group's lag (entries not yet read by anyone)
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from rec.contract.events import dead_stream, parse_url
from rec.data.stream import (
    Assembler,
    Backoff,
    EventReader,
    StreamBatch,
    StreamConfig,
    StreamPosition,
    decode_entry,
    entry_key,
)
from rec.features import FeatureSpec

MAX_COUNT = 512
"""Entries asked for by one XREADGROUP at most."""


class _Down(Exception):
    """The broker stayed away until the caller's deadline."""


class RedisEventReader(EventReader):
    """Rank `rank`'s reader of cfg.url (rec.data.stream's module docstring); `start` is the
    position its checkpoint recorded, None for a fresh run. `on_event(kind, message)` hears
    "up" (connected), "down" (the broker went away; once per outage) and "dead" (an entry or
    event parked, with its reason)."""

    def __init__(
        self,
        cfg: StreamConfig,
        spec: FeatureSpec,
        rank: int,
        start: StreamPosition | None = None,
        raw_dense: bool = False,
        on_event: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.spec, self.where = cfg, spec, parse_url(cfg.url)
        self.stream, self.group = self.where.stream, cfg.group
        self.dead = dead_stream(self.stream, cfg.dead_letter)
        self.consumer = f"{cfg.consumer_prefix}{rank}"
        self.resume = start
        self.asm = Assembler(spec, raw_dense)
        if start is not None:
            self.asm.at = start
        self.unacked: deque[str] = deque()
        """Entries taken and not acknowledged, in id order."""
        self.cursor: str | None = "0"
        """Where the scan of this consumer's pending entries stands; None: reading new ones."""
        self.last = "0-0"
        self.per_entry = 64.0
        self.refused: Counter = Counter()
        self.counts: Counter = Counter()
        self.on_event = on_event or (lambda kind, message: None)
        self.clock = clock
        self.backoff = Backoff(cfg.retry_s, cfg.max_retry_s)
        self.client = None
        self.up: bool | None = None

    # ---- connection ----------------------------------------------------------------------
    def _connect(self) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        client = redis.Redis(
            host=self.where.host,
            port=self.where.port,
            socket_connect_timeout=1,
            socket_timeout=5 + self.cfg.wait_s,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
            try:
                client.xgroup_create(self.stream, self.group, id=self.cfg.start, mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
        except Exception:
            client.close()
            raise
        self.client = client
        # A reply lost with the connection may have handed entries to this consumer: they are
        # in its pending list, after the last entry taken.
        self.cursor = self.last
        if self.up is not True:
            self.up = True
            self.on_event(
                "up",
                f"reading {self.where} as {self.group}/{self.consumer} "
                f"from its pending entries after {self.last}",
            )

    def _command(self, fn: Callable[[Any], Any], deadline: float) -> Any:
        """fn(client), reconnecting with backoff while the broker is away, until `deadline`."""
        import redis

        while True:
            try:
                if self.client is None:
                    self._connect()
                result = fn(self.client)
                self.backoff.reset()
                return result
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                self.close()
                if self.up is not False:
                    self.up = False
                    self.counts["outages"] += 1
                    self.on_event("down", f"event stream {self.where} unreachable ({e}); retrying")
                left = deadline - self.clock()
                if left <= 0:
                    raise _Down() from None
                self.backoff.wait(left)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    # ---- reading -------------------------------------------------------------------------
    def next_batch(self, batch_size: int, wait_s: float | None = None) -> StreamBatch:
        wait = self.cfg.wait_s if wait_s is None else wait_s
        deadline = self.clock() + wait
        while self.asm.ready < batch_size:
            need = batch_size - self.asm.ready
            try:
                progressed = self._command(lambda c, n=need: self._read(c, n, deadline), deadline)
            except _Down:
                break
            if not progressed and self.clock() >= deadline:
                break
        batch = self.asm.take(batch_size)
        self.counts["events"] += len(batch)
        return StreamBatch(batch, self.position(), self.asm.digest)

    def _read(self, client, need: int, deadline: float) -> bool:
        """One XREADGROUP: pending entries while there are any, then new ones (blocking until
        `deadline`). True if it took entries or finished the pending scan."""
        count = max(1, min(MAX_COUNT, math.ceil(need / max(self.per_entry, 1.0))))
        if self.cursor is not None:
            reply = client.xreadgroup(
                self.group, self.consumer, {self.stream: self.cursor}, count=count
            )
            entries = reply[0][1] if reply else []
            if not entries:
                self.cursor = None
                return True
        else:
            left_ms = int((deadline - self.clock()) * 1000)
            reply = client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=count,
                block=left_ms if left_ms > 0 else None,
            )
            entries = reply[0][1] if reply else []
        if entries:
            self._take(client, entries)
        return bool(entries)

    def _take(self, client, entries: list) -> None:
        """Decodes entries, parks the refused, acks what a resumed position already holds, and
        only then holds them (a broker error before that leaves them to be read again)."""
        taken, covered, letters = [], [], []
        for raw_id, fields in entries:
            entry = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            skip = self._skip(entry)
            if skip is None:
                covered.append(entry)
                continue
            events, dead = decode_entry(fields, self.spec)
            # Refused events before `skip` were parked before the resume; -1 is the entry.
            dead = [d for d in dead if not 0 <= int(d["index"]) < skip]
            letters += [
                {
                    **d,
                    "stream": self.stream,
                    "entry": entry,
                    "group": self.group,
                    "consumer": self.consumer,
                }
                for d in dead
            ]
            taken.append((entry, events, skip))
        if letters or covered:
            pipe = client.pipeline(transaction=False)
            for letter in letters:
                pipe.xadd(self.dead, letter)
            if covered:
                pipe.xack(self.stream, self.group, *covered)
            pipe.execute()
        for letter in letters:
            self.refused[letter["reason"]] += 1
            self.on_event("dead", f"{letter['entry']}[{letter['index']}]: {letter['message']}")
        for entry, events, skip in taken:
            self.asm.add(entry, events, skip)
            self.unacked.append(entry)
            self.per_entry = 0.9 * self.per_entry + 0.1 * max(events.size, 1)
        self.counts["entries"] += len(taken)
        self.last = entries[-1][0].decode() if isinstance(entries[-1][0], bytes) else entries[-1][0]
        if self.cursor is not None:
            self.cursor = self.last

    def _skip(self, entry: str) -> int | None:
        """Events of `entry` the resumed position already holds; None: all of them."""
        at = self.resume
        if at is None or entry_key(entry) > entry_key(at.entry):
            return 0
        if entry == at.entry and not at.complete:
            return at.events
        return None

    # ---- position, acknowledgement, lag --------------------------------------------------
    def position(self) -> dict[str, Any]:
        return self.asm.at.to_dict()

    def ack(self, up_to: dict[str, Any]) -> int:
        at = StreamPosition.from_dict(up_to)
        key = entry_key(at.entry)
        done = []
        while self.unacked:
            head = entry_key(self.unacked[0])
            if head < key or (head == key and at.complete):
                done.append(self.unacked.popleft())
            else:
                break
        if not done:
            return 0
        try:
            deadline = self.clock() + self.cfg.max_retry_s
            self._command(lambda c: c.xack(self.stream, self.group, *done), deadline)
        except _Down:  # still pending: the next ack, or a resume's skip, covers them
            self.unacked.extendleft(reversed(done))
            return 0
        self.counts["acked"] += len(done)
        return len(done)

    def lag(self) -> int | None:
        def info(client):
            for group in client.xinfo_groups(self.stream):
                if group["name"] in (self.group, self.group.encode()):
                    return group.get("lag")
            return None

        try:
            return self._command(info, self.clock() + self.cfg.retry_s)
        except _Down:
            return None


def pending_entries(cfg: StreamConfig) -> int:
    """Entries delivered to the group's consumers and not acknowledged (0 without the group)."""
    import redis

    from rec.contract.events import parse_url

    u = parse_url(cfg.url)
    client = redis.Redis(host=u.host, port=u.port, socket_timeout=5, socket_connect_timeout=3)
    try:
        return int(client.xpending(u.stream, cfg.group)["pending"])
    except redis.ResponseError:  # no such stream or group
        return 0
    finally:
        client.close()
