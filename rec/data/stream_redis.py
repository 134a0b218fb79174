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

Read-ahead (rec.data.read_ahead): with `read_ahead` > 0 (the trainer's reader), a thread per
rank runs the XREADGROUPs, the dead letters and decoding, and holds up to `read_ahead` batches
of decoded events; next_batch takes entries from it, so the round trip and the decoding of the
next batch overlap the training step. The thread has its own connection; XACK and XINFO go
through another one, on the trainer's thread, as do the position, the acknowledgements, the
refusal counts and the `on_event` "dead" messages ("up" and "down" come from the thread).

A partition of a partitioned stream (rec.contract.partitions; Partition): the same reader on
the partition's key and dead-letter key, as consumer `partition<k>` whichever rank reads it, so
at any world size its pending entries sit under the consumer its next reader reads as, and the
pending scan and the position's skip keep exactly once. At open (the reading connection's first
connect) it takes over what any other consumer of the group holds on the key (XAUTOCLAIM, to
the cursor's end), then deletes those consumers (XGROUP DELCONSUMER), saying so ("claimed").

On a Redis Cluster (a URL of several nodes, or one node of a cluster), each connection dials the
master of the stream's slot (rec.logs.route.Router), and an answer that the slot is served
elsewhere or not now (MOVED, ASK, CLUSTERDOWN, TRYAGAIN, READONLY) is an outage like a lost
connection: close, route afresh, back off. On one plain node nothing changes. On a cluster the
dead-letter stream must share the stream's slot (check_dead_slot), as a partition's does.

A failover: the promoted replica holds a prefix of the master's writes, XREADGROUPs and XACKs
included. Its group may be rolled back to an older last-delivered-id, so `>` delivers again
entries this reader took already: any id at or below the last one taken is such a delivery, is
not trained again, and is kept (`redelivered`) to be XACKed once a committed position covers
it. XACKs lost with the old master leave covered entries pending: after an outage, the reading
link's reconnect asks XPENDING for this consumer's entries up to the committed position and
acks them (sweep_acked).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rec.config import StreamConfig
from rec.contract.events import Events, dead_stream, parse_url
from rec.contract.features import FeatureSpec
from rec.contract.partitions import key_slot
from rec.data.backoff import Backoff
from rec.data.read_ahead import ReadAhead
from rec.data.stream_reader import (
    Assembler,
    EventReader,
    HoldOutSink,
    StreamBatch,
    StreamPosition,
    decode_entry,
    entry_key,
)
from rec.logs.route import Router, describe

MAX_COUNT = 512
"""Entries asked for by one XREADGROUP at most."""
READ_AHEAD_BATCHES = 2
"""Batches of decoded events the trainer's read-ahead thread holds at most (plus the rest of the
last entry it read). One batch is the next step's; the second absorbs a step that took longer
than reading one batch (a checkpoint, a collective waiting on the other rank). More would not
train faster: what it holds is delivered to this rank only, so a deeper read-ahead takes entries
that another, drier rank could train, and re-delivers more of them after a crash. Memory is
small: 2 x 256 events of the default model are about 0.1 MB decoded."""
READ_BLOCK_S = 0.25
"""The read-ahead thread's XREADGROUP BLOCK: how often it looks at a stop while the stream is
quiet, so close() waits about this long at most."""


@dataclass
class _Taken:
    """An entry read and decoded (on the reading thread), not yet held by the Assembler."""

    entry: str
    events: Events
    skip: int
    letters: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Partition:
    """Partition k of a partitioned stream: its stream key and dead-letter key (the layout
    record's, rec.contract.partitions)."""

    k: int
    key: str
    dead: str

    @property
    def consumer(self) -> str:
        """Its consumer in the group, the same whatever rank reads it."""
        return f"partition{self.k}"


class _Down(Exception):
    """The broker stayed away until the caller's deadline."""


class _Link:
    """One connection, reconnecting with backoff while the broker is away (or the stream's slot
    is moving: module docstring). The reader has two: one for reading (the read-ahead thread's,
    when there is one) and one for XACK and XINFO, since a blocked XREADGROUP holds its
    connection."""

    def __init__(self, reader: RedisEventReader, reads: bool, sleep: Callable[[float], None]):
        self.r, self.reads = reader, reads
        self.backoff = Backoff(reader.cfg.retry_s, reader.cfg.max_retry_s, sleep)
        self.client = None
        self.up: bool | None = None

    def connect(self) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        r = self.r
        host, port = r.router.node_for(r.stream)
        if r.router.cluster:
            r.check_dead_slot()
        client = redis.Redis(
            host=host,
            port=port,
            socket_connect_timeout=1,
            socket_timeout=5 + max(r.cfg.wait_s, READ_BLOCK_S),
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
            try:
                client.xgroup_create(r.stream, r.group, id=r.cfg.start, mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
            if self.reads and r.part is not None and not r.claimed:
                r.claim_strays(client)
            if self.reads and self.up is False:  # after an outage: acks may have been lost
                r.sweep_acked(client)
        except Exception:
            client.close()
            raise
        self.client = client
        if self.reads:
            on = f" on {host}:{port}" if r.router.cluster else ""
            r.connected(announce=self.up is not True, on=on)
        self.up = True

    def command(self, fn: Callable[[Any], Any], deadline: float) -> Any:
        """fn(client), reconnecting with backoff while the broker is away, until `deadline`."""
        import redis

        while True:
            try:
                if self.client is None:
                    self.connect()
                result = fn(self.client)
                self.backoff.reset()
                return result
            except (redis.RedisError, OSError) as e:
                if not self.r.router.reroutes(e):
                    raise
                self.close()
                self.r.router.invalidate()  # the next connect asks who serves the stream now
                if self.up is not False:
                    self.up = False
                    if self.reads:  # one message per outage, from the reading connection
                        self.r.counts["outages"] += 1
                        moved = self.r.router.moved(e)
                        state = "not served where it was" if moved else "unreachable"
                        self.r.on_event(
                            "down",
                            f"event stream {self.r.where} {state} ({describe(e)}); retrying",
                        )
                left = deadline - self.r.clock()
                if left <= 0:
                    raise _Down() from None
                self.backoff.wait(left)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class RedisEventReader(EventReader):
    """Rank `rank`'s reader of cfg.url (rec.data.stream's module docstring); `start` is the
    position its checkpoint recorded, None for a fresh run. `read_ahead`: batches to read ahead
    in a thread (module docstring; 0 reads inside next_batch). `on_event(kind, message)` hears
    "up" (connected), "down" (the broker went away; once per outage), "dead" (an entry or
    event parked, with its reason) and "claimed" (a partition's stray consumers taken over).
    `partition`: read that partition of a partitioned stream (module docstring), routed by
    `router` (one shared by a rank's partitions; None: the reader's own)."""

    def __init__(
        self,
        cfg: StreamConfig,
        spec: FeatureSpec,
        rank: int,
        start: StreamPosition | None = None,
        raw_dense: bool = False,
        on_event: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_ahead: int = READ_AHEAD_BATCHES,
        hold_out: HoldOutSink | None = None,
        partition: Partition | None = None,
        router: Router | None = None,
        notify: Callable[[], None] | None = None,
    ) -> None:
        self.cfg, self.spec, self.where = cfg, spec, parse_url(cfg.url)
        self.group, self.part = cfg.group, partition
        if partition is None:  # the legacy layout: one stream, a consumer per rank
            self.stream = self.where.stream
            self.dead = dead_stream(self.stream, cfg.dead_letter)
            self.consumer = f"{cfg.consumer_prefix}{rank}"
        else:
            self.stream, self.dead = partition.key, partition.dead
            self.consumer = partition.consumer
        self.claimed = False
        """A partition's stray consumers were taken over (at the reading link's first connect)."""
        self.router = router or Router(self.where.nodes)
        self.notify = notify
        """Called on the read-ahead thread after it holds new entries (PartitionedReader's
        wake-up), None: nobody waits on several readers."""
        self.resume = start
        self.asm = Assembler(spec, raw_dense, hold_out, partition.k if partition else 0)
        if start is not None:
            self.asm.at = start
        self.unacked: deque[str] = deque()
        """Entries held by the Assembler and not acknowledged, in id order."""
        self.redelivered: deque[str] = deque()
        """Entries delivered again after a failover (module docstring), not trained again; the
        reading thread appends, ack() acknowledges those its position covers."""
        self.committed: StreamPosition | None = None
        """The position of the last committed checkpoint acknowledged (ack's argument)."""
        # The reading state, the read-ahead thread's when there is one.
        self.cursor: str | None = "0"
        """Where the scan of this consumer's pending entries stands; None: reading new ones."""
        self.last = "0-0"
        self.per_entry = 64.0
        self.refused: Counter = Counter()
        self.refused_columns: Counter = Counter()
        self.counts: Counter = Counter()
        self.on_event = on_event or (lambda kind, message: None)
        self.clock = clock
        self.stopping = threading.Event()
        self.reading = _Link(self, True, sleep=self.stopping.wait)  # close() ends a backoff
        self.side = _Link(self, False, sleep=time.sleep)
        self.read_ahead = read_ahead
        self.draining = False
        self.ahead: ReadAhead[_Taken] | None = None

    # ---- connection ----------------------------------------------------------------------
    def connected(self, announce: bool, on: str = "") -> None:
        """The reading connection is (re)made (`on`: " on HOST:PORT", the node of a cluster). A
        reply lost with the old one may have handed entries to this consumer: they are in its
        pending list, after the last entry taken."""
        self.cursor = self.last
        if announce:
            self.on_event(
                "up",
                f"reading {self.where}{on} as {self.group}/{self.consumer} "
                f"from its pending entries after {self.last}",
            )

    def claim_strays(self, client) -> None:
        """A partition's open: every entry pending for another consumer of the group on this
        key becomes this consumer's (XAUTOCLAIM from 0-0 until the cursor comes back to 0-0),
        then those consumers are deleted. They are what an earlier world's readers left: a
        consumer renamed, or one per rank before partitions. Claimed before the pending scan,
        they are delivered in it, in id order, the resumed position skipping what it holds."""
        strays = {}
        for info in client.xinfo_consumers(self.stream, self.group):
            name = _text(info["name"])
            if name != self.consumer:
                strays[name] = int(info["pending"])
        held = sum(strays.values())
        if held:
            cursor = "0-0"
            while True:
                # Not JUSTID: redis-py then returns the ids without the cursor.
                reply = client.xautoclaim(self.stream, self.group, self.consumer, 0,
                                          start_id=cursor, count=MAX_COUNT)  # fmt: skip
                cursor = _text(reply[0])
                if cursor == "0-0":
                    break
        for name in strays:
            client.xgroup_delconsumer(self.stream, self.group, name)
        self.claimed = True
        if strays:
            listed = ", ".join(f"{n} ({p} pending)" for n, p in sorted(strays.items()))
            self.on_event("claimed", f"event stream {self.where} partition {self.part.k} "
                          f"({self.stream}): took over {held} pending entries as "
                          f"{self.consumer} and deleted consumers {listed}")  # fmt: skip

    def check_dead_slot(self) -> None:
        """On a cluster: a ValueError unless the dead-letter stream shares the stream's slot. The
        reader parks refused entries in the pipeline that acknowledges them, on the stream's
        node; a dead-letter key elsewhere would be redirected on every refusal."""
        if key_slot(self.dead) == key_slot(self.stream):
            return
        tagged = "{" + self.stream + "}:dead"  # the tag hashes as the untagged stream name
        hint = (f"; set data.stream.dead_letter to {tagged!r}, which does"
                if key_slot(tagged) == key_slot(self.stream) else "")  # fmt: skip
        raise ValueError(f"event stream {self.where}: on a Redis Cluster the dead-letter stream "
                         f"{self.dead!r} must share the stream's hash slot{hint}")  # fmt: skip

    def close(self) -> None:
        self.stopping.set()
        if self.ahead is not None:
            self.ahead.close(timeout=READ_BLOCK_S + 2.0)
        self.reading.close()
        self.side.close()

    def drain(self) -> None:
        """A clean stop: no entry is read from now on; next_batch hands out the events already
        delivered (read ahead, or left in an entry) until none is left, so a stop can train
        them and acknowledge every entry delivered to this consumer."""
        self.draining = True
        if self.ahead is not None:
            self.ahead.finish(timeout=READ_BLOCK_S + 2.0)

    # ---- reading -------------------------------------------------------------------------
    def next_batch(self, batch_size: int, wait_s: float | None = None) -> StreamBatch:
        wait = self.cfg.wait_s if wait_s is None else wait_s
        deadline = self.clock() + wait
        if self.read_ahead > 0 and (self.ahead is not None or not self.draining):
            self._pull(batch_size, deadline)
        while self.read_ahead <= 0 and not self.draining and self.asm.ready < batch_size:
            need = batch_size - self.asm.ready
            try:
                progressed, taken = self.reading.command(
                    lambda c, n=need: self._read(c, n, deadline), deadline
                )
            except _Down:
                break
            self._hold(taken)
            if not progressed and self.clock() >= deadline:
                break
        batch = self.asm.take(batch_size)
        self.counts["events"] += len(batch)
        return StreamBatch(batch, self.position(), self.asm.digest, self.asm.held_out)

    def _pull(self, batch_size: int, deadline: float) -> None:
        """Entries from the read-ahead thread until a batch is ready or `deadline` passes."""
        self._start_ahead(batch_size)
        assert self.ahead is not None
        while self.asm.ready < batch_size:
            taken = self.ahead.get(max(0.0, deadline - self.clock()))
            if taken is None:
                return
            self._hold([taken])

    def _start_ahead(self, batch_size: int) -> None:
        """The read-ahead thread, started by the first read: its depth needs the batch size."""
        if self.ahead is None:
            depth = self.read_ahead * batch_size
            self.ahead = ReadAhead(self._fetch_ahead, _events, depth, batch_size,
                                   f"rec-read-{self.consumer}", self.notify)  # fmt: skip

    def poll(self, batch_size: int) -> bool:
        """Without waiting: what the read-ahead thread holds into the Assembler, until a batch
        is ready; False once nothing more can come (drained, and all of it taken)."""
        if self.ahead is None:
            if self.draining:
                return False
            self._start_ahead(batch_size)
        assert self.ahead is not None
        while self.asm.ready < batch_size:
            taken = self.ahead.poll()
            if taken is None:
                break
            self._hold([taken])
        return not self.ahead.done

    def _fetch_ahead(self, need: int) -> list[_Taken] | None:
        """The read-ahead thread's fetch: one XREADGROUP, blocking READ_BLOCK_S at most."""
        if self.stopping.is_set():
            return None
        deadline = self.clock() + READ_BLOCK_S
        try:
            while True:
                progressed, taken = self.reading.command(
                    lambda c: self._read(c, need, deadline), deadline
                )
                if taken or not progressed:
                    return taken
                # The pending scan ended empty: this fetch reads new entries too, so that an
                # empty fetch means an empty stream.
        except _Down:
            return None

    def _read(self, client, need: int, deadline: float) -> tuple[bool, list[_Taken]]:
        """One XREADGROUP: pending entries while there are any, then new ones (blocking until
        `deadline`). (progressed: it took entries or finished the pending scan, the entries)."""
        count = max(1, min(MAX_COUNT, math.ceil(need / max(self.per_entry, 1.0))))
        if self.cursor is not None:
            reply = client.xreadgroup(
                self.group, self.consumer, {self.stream: self.cursor}, count=count
            )
            entries = reply[0][1] if reply else []
            if not entries:
                self.cursor = None
                return True, []
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
        if not entries:
            return False, []
        return True, self._take(client, entries)

    def _take(self, client, entries: list) -> list[_Taken]:
        """Decodes entries, parks the refused and acks what a resumed position already holds;
        only then are they taken (a broker error before that leaves them to be read again)."""
        taken, covered, again = [], [], []
        last = entry_key(self.last)
        for raw_id, fields in entries:
            entry = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            skip = self._skip(entry)
            if skip is None:
                covered.append(entry)
                continue
            if entry_key(entry) <= last:  # a failover's rolled-back group delivers it again
                again.append(entry)
                continue
            events, dead = decode_entry(fields, self.spec)
            # Refused events before `skip` were parked before the resume; -1 is the entry.
            dead = [d for d in dead if not 0 <= int(d["index"]) < skip]
            letters = [
                {
                    **d,
                    "stream": self.stream,
                    "entry": entry,
                    "group": self.group,
                    "consumer": self.consumer,
                }
                for d in dead
            ]
            taken.append(_Taken(entry, events, skip, letters))
        if covered or any(t.letters for t in taken):
            pipe = client.pipeline(transaction=False)
            for letter in (letter for t in taken for letter in t.letters):
                pipe.xadd(self.dead, letter)
            if covered:
                pipe.xack(self.stream, self.group, *covered)
            pipe.execute()
        for t in taken:
            self.per_entry = 0.9 * self.per_entry + 0.1 * max(t.events.size, 1)
        if again:
            self.redelivered.extend(again)
            self.counts["redelivered"] += len(again)
        newest = _text(entries[-1][0])
        if entry_key(newest) > last:
            self.last = newest
        if self.cursor is not None:
            self.cursor = self.last
        return taken

    def _hold(self, taken: list[_Taken]) -> None:
        """Entries into the Assembler, and their refusals into the counts (trainer's thread)."""
        for t in taken:
            for letter in t.letters:
                self.refused[letter["reason"]] += 1
                if letter.get("column"):
                    self.refused_columns[letter["reason"], letter["column"]] += 1
                self.on_event("dead", f"{letter['entry']}[{letter['index']}]: {letter['message']}")
            self.asm.add(t.entry, t.events, t.skip)
            self.unacked.append(t.entry)
        self.counts["entries"] += len(taken)

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
        self.committed = at
        done = []
        while self.unacked and _covers(at, self.unacked[0]):
            done.append(self.unacked.popleft())
        again = [e for e in list(self.redelivered) if _covers(at, e)]
        if not done and not again:
            return 0
        try:
            deadline = self.clock() + self.cfg.max_retry_s
            ids = list(dict.fromkeys(done + again))
            self.side.command(lambda c: c.xack(self.stream, self.group, *ids), deadline)
        except _Down:  # still pending: the next ack, or a resume's skip, covers them
            self.unacked.extendleft(reversed(done))
            return 0
        for entry in again:
            self.redelivered.remove(entry)
        self.counts["acked"] += len(done)
        return len(done)

    def sweep_acked(self, client) -> int:
        """After an outage (the reading link's reconnect): XACKs lost with a failed master
        leave entries the committed position covers pending; this consumer's are acked again
        (XPENDING up to the position). Returns how many."""
        at = self.committed
        if at is None:
            return 0
        end = at.entry if at.complete else "(" + at.entry
        swept = 0
        while True:
            rows = client.xpending_range(self.stream, self.group, "-", end, MAX_COUNT,
                                         consumername=self.consumer)  # fmt: skip
            ids = [_text(r["message_id"]) for r in rows]
            if ids:
                swept += client.xack(self.stream, self.group, *ids)
            if len(ids) < MAX_COUNT:
                break
        if swept:
            self.counts["swept"] += swept
        return swept

    def lag(self) -> int | None:
        def info(client):
            for group in client.xinfo_groups(self.stream):
                if group["name"] in (self.group, self.group.encode()):
                    return group.get("lag")
            return None

        try:
            return self.side.command(info, self.clock() + self.cfg.retry_s)
        except _Down:
            return None


def _covers(at: StreamPosition, entry: str) -> bool:
    """Whether position `at` holds all of `entry`'s events."""
    key, head = entry_key(at.entry), entry_key(entry)
    return head < key or (head == key and at.complete)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _events(taken: _Taken) -> int:
    """What an entry weighs in the read-ahead's bound: its good events, at least 1."""
    return max(len(taken.events), 1)


def pending_entries(cfg: StreamConfig) -> int:
    """Entries delivered to the group's consumers and not acknowledged (0 without the group)."""
    import redis

    u = parse_url(cfg.url)
    host, port = Router(u.nodes).node_for(u.stream)  # a MOVED is no "no such group"
    client = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=3)
    try:
        return int(client.xpending(u.stream, cfg.group)["pending"])
    except redis.ResponseError:  # no such stream or group
        return 0
    finally:
        client.close()
