"""Reading labelled events from a live stream (rec.contract.events), one rank at a time.

`EventReader` is the interface a trainer reads through: `next_batch` (a RecBatch of up to
batch_size events), `position` (what goes into a checkpoint), `ack` (after that checkpoint
commits) and `lag`. `RedisEventReader` implements it over Redis Streams; a Kafka reader would
implement the same four methods with partition offsets as its position (none is built: no Kafka
broker installs here). `open_reader` picks one by the URL's scheme.

Redis: one consumer group (StreamConfig.group) in which each rank is a consumer named
`<consumer_prefix><rank>`. XREADGROUP hands each entry to exactly one consumer, so the ranks
share the stream without a plan: a rank that trains faster reads more.

Exactly once into the model:
  - A rank delivers its entries in entry-id order: first its own pending entries (delivered to
    it before, never acknowledged: XREADGROUP with an id, not ">"), then new ones (">"). Every
    pending entry is older than every new one, so "trained up to entry E" is one id per rank.
  - The position after a batch is (entry, events): the last entry any of whose events the batch
    took, and how many of that entry's events, refused ones included, are consumed. It goes into
    the checkpoint; entries that are wholly refused count as consumed as they are passed.
  - `ack(position)` XACKs the entries a committed checkpoint holds: those before `entry`, and
    `entry` itself once all its events are consumed. Nothing is acknowledged earlier.
  - On resume (`start=` the checkpoint's position for this rank), the rank re-reads its pending
    entries from id 0: those the position holds are acknowledged and skipped, the entry it ends
    in delivers only its events from `events` on, and the rest are delivered again. Resuming
    needs the same consumer names, so the same world size; entries pending for a consumer that
    no longer exists stay pending (XPENDING shows them; XCLAIM moves them by hand).

A partitioned stream (rec.contract.partitions: the layout record {S}:layout exists; open_reader
looks): `PartitionedReader`. Rank r of W reads the partitions {k : k mod W == r}, each through
a RedisEventReader as consumer `partition<k>` (no collective: the assignment follows from r and
W). It changes only at a resume, a checkpoint boundary, where each partition's position moves
with it to its new rank. A rank with no partition (W > P) steps with padded batches (warned).
next_batch takes what its partitions' read-ahead threads hold in rotation without waiting, then
waits for any of them until the deadline; the position is {k: position}, the lag the sum.

A rank whose share runs dry: `next_batch` waits up to `wait_s` for a full batch, then returns
what it has: a short batch, or an empty one. The trainer keeps the ranks in step with one
collective per step (`events_everywhere`, an all-reduce of the batch sizes): if no rank has an
event, no step is taken and the ranks wait again; otherwise every rank steps, one with an empty
batch too, as the file readers' short batches already do. No event is dropped either way.

Malformed entries and events (rec.contract.events.REASONS) are never trained: each is counted
in `refused` and parked in the dead-letter stream with its reason. A dead letter is written when
the entry is first read; a crash before the next checkpoint can park it again on resume, so the
dead-letter stream holds every refusal at least once (its `entry` and `index` fields make a
repeat recognisable).

The broker going away (a restart, a network error): every command is retried after a reconnect,
with a backoff from `retry_s` doubling to `max_retry_s`, and after a reconnect the rank re-reads
its pending entries past the last one it took, so an entry that the broker handed out in a reply
that never arrived is not lost. `next_batch` still returns by its deadline (what it has).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rec.config import ConfigError, StreamConfig
from rec.contract.events import dead_stream, parse_url
from rec.contract.features import FeatureSpec
from rec.contract.partitions import Layout, dead_key, layout_key, parse_layout
from rec.data.backoff import Backoff
from rec.data.source import Rows
from rec.data.stream_reader import (
    Assembler,
    EventReader,
    HoldOutSink,
    PartTake,
    StreamBatch,
    StreamPosition,
    add_digests,
    decode_entry,
    entry_key,
    event_digest,
)
from rec.data.stream_redis import READ_AHEAD_BATCHES, Partition, RedisEventReader
from rec.logs.route import Router


def events_everywhere(n_local: int) -> int:
    """The events of this step's batches over all ranks (one all-reduce; n_local without a
    process group). A trainer steps only if it is > 0, so the ranks step together."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return n_local
    total = torch.tensor([n_local], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def say(kind: str, message: str) -> None:
    """A reader's event worth a line in the run's output: partitions taken over, warnings."""
    if kind in ("claimed", "warning"):
        print(f"[rec stream] {message}", flush=True)


LAYOUT_WAIT_S = 120.0
"""How long read_layout waits for an unreachable broker (a reader retries as long; a trainer
cannot choose its reader without the answer)."""


def read_layout(cfg: StreamConfig, wait_s: float = LAYOUT_WAIT_S) -> Layout | None:
    """The stream's layout record (rec.contract.partitions), None for the legacy layout;
    retried with backoff while the broker is unreachable, up to wait_s."""
    import redis

    where = parse_url(cfg.url)
    key = layout_key(where.stream)
    router, backoff = Router(where.nodes), Backoff(cfg.retry_s, cfg.max_retry_s)
    end = time.monotonic() + wait_s
    while True:
        try:
            host, port = router.node_for(key)
            client = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=3)
            try:
                text = client.get(key)
            finally:
                client.close()
            return None if text is None else parse_layout(text, f"{where} {key}")
        except (redis.RedisError, OSError) as e:
            if not router.reroutes(e) or time.monotonic() >= end:
                raise
            router.invalidate()
            backoff.wait(end - time.monotonic())


def open_reader(
    cfg: StreamConfig,
    spec: FeatureSpec,
    rank: int,
    start: dict[Any, Any] | None = None,
    raw_dense: bool = False,
    hold_out: HoldOutSink | None = None,
    world: int = 1,
    layout: Layout | None = None,
) -> EventReader:
    """The reader of cfg.url for `rank` of `world`, from `start` (a checkpoint's position) if
    given; the events training holds out go to `hold_out` (rec.data.held_out). A partitioned
    stream's reader when its layout record exists (`layout`, or read here)."""
    if cfg.url.startswith("redis://"):
        layout = layout or read_layout(cfg)
        if layout is not None:
            return PartitionedReader(cfg, spec, rank, world, layout, start, raw_dense,
                                     hold_out=hold_out, on_event=say)  # fmt: skip
        position = StreamPosition.from_dict(start) if start else None
        return RedisEventReader(cfg, spec, rank, position, raw_dense, hold_out=hold_out)
    raise ConfigError(f"data.stream.url={cfg.url!r}: rec reads redis://HOST:PORT[/STREAM] streams")


def assigned(partitions: int, rank: int, world: int) -> list[int]:
    """The partitions rank `rank` of `world` reads: k mod world == rank."""
    return [k for k in range(partitions) if k % world == rank]


class PartitionedReader(EventReader):
    """Rank `rank`'s partitions of a partitioned stream (module docstring). `start`: the
    checkpoint's {partition: position} (keys int or str, as JSON left them; partitions of other
    ranks ignored). Needs read-ahead threads (read_ahead >= 1): they wake next_batch."""

    def __init__(self, cfg: StreamConfig, spec: FeatureSpec, rank: int, world: int,
                 layout: Layout, start: dict[Any, Any] | None = None, raw_dense: bool = False,
                 hold_out: HoldOutSink | None = None,
                 on_event: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 read_ahead: int = READ_AHEAD_BATCHES) -> None:  # fmt: skip
        self.cfg, self.layout, self.clock = cfg, layout, clock
        self.on_event = on_event or (lambda kind, message: None)
        self.mine = assigned(layout.partitions, rank, world)
        at = {int(k): StreamPosition.from_dict(v) for k, v in (start or {}).items() if v}
        router = Router(parse_url(cfg.url).nodes)  # one map for every partition's links
        self.wake = threading.Condition()
        self.woken = False
        self.parts: dict[int, RedisEventReader] = {}
        for k in self.mine:
            part = Partition(k, layout.keys[k], dead_key(layout.keys[k]))
            self.parts[k] = RedisEventReader(
                cfg, spec, rank, at.get(k), raw_dense, on_event=self.on_event, clock=clock,
                read_ahead=max(1, read_ahead), hold_out=hold_out, partition=part, router=router,
                notify=self._notify,
            )  # fmt: skip
        self.turn = 0
        self.shape = Assembler(spec, raw_dense)  # transforms the concatenated rows, once
        self.stopping = threading.Event()
        self.dead = (f"the dead-letter streams <partition key>:dead of partitions "
                     f"{', '.join(map(str, self.mine))}")  # fmt: skip
        if not self.mine:
            self.on_event("warning", f"rank {rank} of {world} reads no partition of "
                          f"{parse_url(cfg.url)} ({layout.partitions} partitions): it steps with "
                          "padded batches; use at most as many ranks as partitions")  # fmt: skip

    def _notify(self) -> None:
        with self.wake:
            self.woken = True
            self.wake.notify_all()

    @property
    def refused(self) -> Counter:  # type: ignore[override]
        return sum((p.refused for p in self.parts.values()), Counter())

    @property
    def refused_columns(self) -> Counter:  # type: ignore[override]
        return sum((p.refused_columns for p in self.parts.values()), Counter())

    def next_batch(self, batch_size: int, wait_s: float | None = None) -> StreamBatch:
        wait = self.cfg.wait_s if wait_s is None else wait_s
        deadline = self.clock() + wait
        order = self.mine[self.turn :] + self.mine[: self.turn]
        self.turn = (self.turn + 1) % max(len(self.mine), 1)
        if not self.parts:
            self.stopping.wait(wait)
        while self.parts:
            with self.wake:
                self.woken = False
            alive = [self.parts[k].poll(batch_size) for k in order]
            ready = sum(p.asm.ready for p in self.parts.values())
            left = deadline - self.clock()
            if ready >= batch_size or left <= 0 or not any(alive):
                break
            with self.wake:
                if not self.woken:
                    self.wake.wait(left)
        return self._take(order, batch_size)

    def _take(self, order: list[int], batch_size: int) -> StreamBatch:
        """Up to batch_size events from the partitions in `order`, each from where it stands;
        once the batch is full the others wait (they come first in the next rotations)."""
        rows, parts, need = [], {}, batch_size
        for k in order:
            if need <= 0:
                break
            asm = self.parts[k].asm
            got = asm.take_rows(need)
            need -= len(got)
            rows.append(got)
            if len(got) or asm.held_out:
                parts[k] = PartTake(len(got) + asm.held_out, asm.digest, asm.held_out)
        # With no partition, an empty Assembler's take is the spec's empty rows.
        batch = self.shape.to_batch(Rows.concat(rows) if rows else self.shape.take_rows(0))
        digest = 0
        for p in parts.values():
            digest = add_digests(digest, p.digest)
        return StreamBatch(batch, self.position(), digest,
                           sum(p.held_out for p in parts.values()), parts)  # fmt: skip

    def position(self) -> dict[int, dict[str, Any]]:
        return {k: p.position() for k, p in self.parts.items()}

    def ack(self, up_to: dict[Any, Any]) -> int:
        done = 0
        for k, pos in up_to.items():
            if int(k) in self.parts and pos:
                done += self.parts[int(k)].ack(pos)
        return done

    def lag(self) -> int | None:
        lags = [lag for p in self.parts.values() if (lag := p.lag()) is not None]
        return sum(lags) if lags else None

    def drain(self) -> None:
        for p in self.parts.values():
            p.drain()

    def close(self) -> None:
        self.stopping.set()
        for p in self.parts.values():
            p.close()


__all__ = [
    "Assembler",
    "EventReader",
    "PartitionedReader",
    "RedisEventReader",
    "StreamBatch",
    "StreamConfig",
    "StreamPosition",
    "add_digests",
    "dead_stream",
    "decode_entry",
    "entry_key",
    "event_digest",
    "events_everywhere",
    "open_reader",
]
