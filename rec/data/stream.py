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

import abc
import json
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rec.batch import RecBatch
from rec.config import ConfigError, StreamConfig
from rec.contract.events import EventError, Events, dead_stream, decode
from rec.data.source import Rows
from rec.features import FeatureSpec


@dataclass(frozen=True)
class StreamPosition:
    """Where a rank stands: its events of entries up to `entry` are consumed, of `entry` itself
    the first `events` of its `size` (see the module docstring)."""

    entry: str = "0-0"
    events: int = 0
    size: int = 0

    @property
    def complete(self) -> bool:
        return self.events >= self.size

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "events": self.events, "size": self.size}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StreamPosition:
        return StreamPosition(str(data["entry"]), int(data["events"]), int(data["size"]))


def entry_key(entry_id: str | bytes) -> tuple[int, int]:
    """A Redis entry id ("ms-seq") as a sortable pair."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


_U64 = np.uint64


def event_digest(entry: str, index: np.ndarray) -> int:
    """An order-free fingerprint of events named by (entry id, place in the entry): the sum,
    modulo 2**64, of a 64-bit mix of each. Summed over what a run trained, it equals the sum over
    what the stream holds exactly when every event was trained once (a lost event and a repeated
    one do not cancel, except by a 2**-64 chance): the exactly-once test's count."""
    ms, seq = entry_key(entry)
    with np.errstate(over="ignore"):
        x = _U64(ms) * _U64(0x100000001B3) + _U64(seq) * _U64(0x9E3779B97F4A7C15)
        x = x + np.asarray(index, dtype=np.uint64) * _U64(0xD6E8FEB86659FD93)
        x ^= x >> _U64(30)
        x *= _U64(0xBF58476D1CE4E5B9)
        x ^= x >> _U64(27)
        x *= _U64(0x94D049BB133111EB)
        x ^= x >> _U64(31)
        return int(np.sum(x, dtype=np.uint64))


def add_digests(a: int, b: int) -> int:
    return (a + b) % (1 << 64)


@dataclass
class StreamBatch:
    """One rank's batch, the position after it, and its events' digest (event_digest)."""

    batch: RecBatch
    position: dict[str, Any]
    digest: int = 0

    def __len__(self) -> int:
        return len(self.batch)


class EventReader(abc.ABC):
    """The interface a trainer reads a stream through (module docstring)."""

    refused: Counter
    """Refused entries and events so far, by reason (rec.contract.events.REASONS)."""

    @abc.abstractmethod
    def next_batch(self, batch_size: int, wait_s: float | None = None) -> StreamBatch:
        """Up to batch_size events, waiting up to wait_s for a full batch; may be empty."""

    @abc.abstractmethod
    def position(self) -> dict[str, Any]:
        """The position after the last batch, JSON-able, for the checkpoint."""

    @abc.abstractmethod
    def ack(self, up_to: dict[str, Any]) -> int:
        """Acknowledges what a committed checkpoint at `up_to` holds; entries acknowledged."""

    @abc.abstractmethod
    def lag(self) -> int | None:
        """Events (Redis: entries) in the stream that no consumer has read yet; None if unknown."""

    def close(self) -> None:  # noqa: B027 (optional)
        pass


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


def open_reader(
    cfg: StreamConfig,
    spec: FeatureSpec,
    rank: int,
    start: dict[str, Any] | None = None,
    raw_dense: bool = False,
) -> EventReader:
    """The reader of cfg.url for `rank`, from `start` (a checkpoint's position) if given."""
    if cfg.url.startswith("redis://"):
        from rec.data.stream_redis import RedisEventReader

        position = StreamPosition.from_dict(start) if start else None
        return RedisEventReader(cfg, spec, rank, position, raw_dense)
    raise ConfigError(f"data.stream.url={cfg.url!r}: rec reads redis://HOST:PORT[/STREAM] streams")


@dataclass
class _Held:
    """An entry read and decoded, whose good events are not all delivered yet."""

    entry: str
    events: Events
    next: int = 0
    """Index into events' good events of the next one to deliver."""


class Assembler:
    """Cuts decoded entries into batches and says the position after each (module docstring).

    Kept apart from Redis, so a reader of another broker cuts batches the same way."""

    def __init__(self, spec: FeatureSpec, raw_dense: bool = False) -> None:
        self.spec, self.raw_dense = spec, raw_dense
        self.held: deque[_Held] = deque()
        self.at = StreamPosition()
        self.digest = 0
        """event_digest of the last take's events."""

    def add(self, entry: str, events: Events, skip: int = 0) -> None:
        """Holds an entry, its first `skip` events (by place in the entry) already consumed."""
        held = _Held(entry, events, int(np.searchsorted(events.index, skip)))
        self.held.append(held)

    @property
    def ready(self) -> int:
        return sum(len(h.events) - h.next for h in self.held)

    def take(self, n: int) -> RecBatch:
        parts: list[Rows] = []
        self.digest = 0
        while self.held:
            head = self.held[0]
            k = min(n, len(head.events) - head.next)
            if k > 0:
                parts.append(_rows(head.events, head.next, head.next + k))
                taken = head.events.index[head.next : head.next + k]
                self.digest = add_digests(self.digest, event_digest(head.entry, taken))
                head.next += k
                n -= k
            if head.next < len(head.events):  # the batch is full inside this entry
                self.at = StreamPosition(
                    head.entry, int(head.events.index[head.next]), head.events.size
                )
                break
            self.held.popleft()
            self.at = StreamPosition(head.entry, head.events.size, head.events.size)
            # A full batch still passes the entries after it that have nothing left to give
            # (refused whole, or skipped on a resume), so the position covers them.
            if n == 0 and (not self.held or len(self.held[0].events) > self.held[0].next):
                break
        rows = Rows.concat(parts) if parts else _empty(self.spec)
        if not self.raw_dense:
            rows = replace(rows, dense=self.spec.transform_dense(rows.dense))
        return rows.to_batch()


def _rows(ev: Events, i: int, j: int) -> Rows:
    ends = np.concatenate([[0], np.cumsum(ev.lengths.sum(axis=1, dtype=np.int64))])
    return Rows.build(
        ev.dense[i:j], ev.lengths[i:j], ev.values[ends[i] : ends[j]], ev.labels[i:j], ev.index[i:j]
    )


def _empty(spec: FeatureSpec) -> Rows:
    return Rows.build(
        np.zeros((0, len(spec.dense)), np.float32),
        np.zeros((0, len(spec.sparse)), np.int32),
        np.zeros(0, np.int64),
        np.zeros((0, len(spec.labels)), np.float32),
        np.zeros(0, np.int64),
    )


def refused_entry() -> Events:
    """The Events of an entry refused whole: no events, nothing to deliver."""
    z = np.zeros
    return Events(
        z((0, 0), np.float32),
        z((0, 0), np.float32),
        z((0, 0), np.int32),
        z(0, np.int64),
        z(0, np.int64),
        0,
    )


def decode_entry(fields: dict | None, spec: FeatureSpec) -> tuple[Events, list[dict[str, str]]]:
    """An entry's Events and its dead letters' fields (reason, message, index, event)."""
    if not fields:  # a pending entry deleted (trimmed) since: Redis returns it without fields
        why = EventError("malformed_entry", "the entry was deleted before it was trained")
        return refused_entry(), [_dead(-1, why.reason, why.detail, None)]
    try:
        events = decode(fields, spec)
    except EventError as e:
        return refused_entry(), [_dead(-1, e.reason, e.detail, fields)]
    if not events.refused:
        return events, []
    raw = json.loads(_field(fields, "events"))
    return events, [_dead(r.index, r.reason, r.message, raw[r.index]) for r in events.refused]


def _field(fields: dict, key: str) -> str:
    value = fields.get(key, fields.get(key.encode()))
    return value.decode() if isinstance(value, bytes) else value


def _dead(index: int, reason: str, message: str, what: Any) -> dict[str, str]:
    out = {"reason": reason, "message": message, "index": str(index)}
    if index >= 0:
        out["event"] = json.dumps(what, separators=(",", ":"))
    elif what is not None:  # the entry's own fields, as they were (bytes kept as bytes)
        out.update({f"field:{_text(k)}": v for k, v in what.items()})
    return out


def _text(key: str | bytes) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key


class Backoff:
    """retry_s, doubling up to max_retry_s; reset() after a success."""

    def __init__(self, first: float, most: float, sleep: Callable[[float], None] = time.sleep):
        self.first, self.most, self.sleep = first, max(most, first), sleep
        self.delay = first

    def wait(self, budget: float = math.inf) -> None:
        self.sleep(max(0.0, min(self.delay, budget)))
        self.delay = min(self.delay * 2, self.most)

    def reset(self) -> None:
        self.delay = self.first


__all__ = [
    "Assembler",
    "EventReader",
    "StreamBatch",
    "StreamConfig",
    "StreamPosition",
    "add_digests",
    "dead_stream",
    "entry_key",
    "event_digest",
    "events_everywhere",
    "open_reader",
]
