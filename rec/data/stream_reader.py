"""What every broker's event reader shares: the interface a trainer reads through
(`EventReader`), the position a checkpoint holds (`StreamPosition`), how decoded entries are cut
into batches (`Assembler`), dead letters, digests and the reconnect backoff.

rec.data.stream has the semantics (its module docstring) and picks a reader by URL;
rec.data.stream_redis is the Redis reader built on this module. Kept apart from both so that a
reader of another broker builds on it without importing the Redis one, and the two modules above
it import it rather than each other.
"""

from __future__ import annotations

import abc
import json
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from rec.batch import RecBatch
from rec.contract.events import EventError, Events, decode
from rec.contract.features import FeatureSpec
from rec.data.source import Rows
from rec.features import transform_dense


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


def event_hashes(entry: str, index: np.ndarray, partition: int = 0) -> np.ndarray:
    """A 64-bit mix of each event named by (entry id, place in the entry, partition), uint64
    [n]. The partition is added before the mix, partition 0 adding nothing: so the legacy
    layout's (one stream, partition 0) hashes, digests and held-out choices are as they were,
    and the same entry id in two partitions names two different events."""
    ms, seq = entry_key(entry)
    with np.errstate(over="ignore"):
        x = _U64(ms) * _U64(0x100000001B3) + _U64(seq) * _U64(0x9E3779B97F4A7C15)
        x = x + _U64(partition) * _U64(0xC2B2AE3D27D4EB4F)
        x = x + np.asarray(index, dtype=np.uint64) * _U64(0xD6E8FEB86659FD93)
        x ^= x >> _U64(30)
        x *= _U64(0xBF58476D1CE4E5B9)
        x ^= x >> _U64(27)
        x *= _U64(0x94D049BB133111EB)
        x ^= x >> _U64(31)
    return np.asarray(x, dtype=np.uint64)


def event_digest(entry: str, index: np.ndarray, partition: int = 0) -> int:
    """An order-free fingerprint of events named by (entry id, place in the entry, partition):
    the sum,
    modulo 2**64, of event_hashes. Summed over what a run consumed, it equals the sum over
    what the stream holds exactly when every event was consumed once (a lost event and a
    repeated one do not cancel, except by a 2**-64 chance): the exactly-once test's count."""
    with np.errstate(over="ignore"):
        return int(np.sum(event_hashes(entry, index, partition), dtype=np.uint64))


def held_out_mask(entry: str, index: np.ndarray, nth: int, partition: int = 0) -> np.ndarray:
    """Which events training holds out (data.stream.hold_out_every_nth): about one in `nth`,
    chosen by the events' own names, so the same on every rank, resume and world size."""
    if nth <= 0:
        return np.zeros(len(index), dtype=bool)
    return (event_hashes(entry, index, partition) >> _U64(40)) % _U64(nth) == 0


def add_digests(a: int, b: int) -> int:
    return (a + b) % (1 << 64)


@dataclass(frozen=True)
class PartTake:
    """What one batch consumed of one partition: events (trained and held out), their digest,
    and how many were held out."""

    events: int
    digest: int
    held_out: int


@dataclass
class StreamBatch:
    """One rank's batch, the position after it, its events' digest (event_digest, held-out
    events included) and how many events it held out of training. Of a partitioned stream
    (rec.data.stream.PartitionedReader) the position is {partition: position} and `parts` says
    what the batch took of each partition it took from."""

    batch: RecBatch
    position: dict[Any, Any]
    digest: int = 0
    held_out: int = 0
    parts: dict[int, PartTake] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch)


class EventReader(abc.ABC):
    """The interface a trainer reads a stream through (module docstring)."""

    refused: Counter
    """Refused entries and events so far, by reason (rec.contract.events.REASONS)."""
    refused_columns: Counter
    """Refused events so far by (reason, the field refused), for those a field is to blame."""

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

    def drain(self) -> None:  # noqa: B027 (optional: a reader without one ends as it is)
        """A clean stop: read nothing more; next_batch hands out what was delivered."""

    def close(self) -> None:  # noqa: B027 (optional)
        pass


class HoldOutSink(Protocol):
    """Where an Assembler puts the events training holds out (rec.data.held_out.HeldOut)."""

    every_nth: int

    def add(self, entry: str, rows: Rows, partition: int = 0) -> None: ...


@dataclass
class _Held:
    """An entry read and decoded, whose good events are not all delivered yet."""

    entry: str
    events: Events
    next: int = 0
    """Index into events' good events of the next one to deliver."""
    held_out: np.ndarray | None = None
    """Which of the good events training holds out (held_out_mask), None: none."""

    def left(self) -> int:
        """Events still to deliver to training (held-out ones not counted)."""
        rest = len(self.events) - self.next
        if self.held_out is None or rest == 0:
            return rest
        return rest - int(np.count_nonzero(self.held_out[self.next :]))

    def stop_after(self, n: int) -> int:
        """The index just past the n-th event still to deliver to training, or the end."""
        end = len(self.events)
        if self.held_out is None:
            return min(end, self.next + n)
        trained = np.cumsum(~self.held_out[self.next :])
        if trained.size == 0 or trained[-1] < n:
            return end
        return self.next + int(np.searchsorted(trained, n)) + 1


class Assembler:
    """Cuts decoded entries into batches and says the position after each (module docstring).

    Kept apart from Redis, so a reader of another broker cuts batches the same way. `partition`
    names the events of a partitioned stream's partition (event_hashes; 0 for one stream)."""

    def __init__(self, spec: FeatureSpec, raw_dense: bool = False,
                 hold_out: HoldOutSink | None = None, partition: int = 0) -> None:  # fmt: skip
        self.spec, self.raw_dense, self.hold_out = spec, raw_dense, hold_out
        self.partition = partition
        self.held: deque[_Held] = deque()
        self.at = StreamPosition()
        self.digest = 0
        """event_digest of the last take's events, held-out ones included."""
        self.held_out = 0
        """Events the last take passed to `hold_out` instead of the batch."""

    def add(self, entry: str, events: Events, skip: int = 0) -> None:
        """Holds an entry, its first `skip` events (by place in the entry) already consumed."""
        mask = None
        if self.hold_out is not None and self.hold_out.every_nth > 0:
            mask = held_out_mask(entry, events.index, self.hold_out.every_nth, self.partition)
        held = _Held(entry, events, int(np.searchsorted(events.index, skip)), mask)
        self.held.append(held)

    @property
    def ready(self) -> int:
        return sum(h.left() for h in self.held)

    def take(self, n: int) -> RecBatch:
        """take_rows as a batch, its dense values transformed (unless raw_dense)."""
        return self.to_batch(self.take_rows(n))

    def to_batch(self, rows: Rows) -> RecBatch:
        """Rows of take_rows (one reader's, or several partitions' concatenated) as a batch."""
        if not self.raw_dense:
            rows = replace(rows, dense=transform_dense(self.spec, rows.dense))
        return rows.to_batch()

    def take_rows(self, n: int) -> Rows:
        """Up to n events for training, untransformed. Held-out events on the way are consumed
        with them (in the position and the digest, so exactly once covers them) and go to
        `hold_out`."""
        parts: list[Rows] = []
        self.digest = self.held_out = 0
        while self.held:
            head = self.held[0]
            stop = head.stop_after(n) if n > 0 else head.next
            if stop > head.next:
                rows = _rows(head.events, head.next, stop)
                taken = head.events.index[head.next : stop]
                digest = event_digest(head.entry, taken, self.partition)
                self.digest = add_digests(self.digest, digest)
                if head.held_out is not None:
                    out = head.held_out[head.next : stop]
                    if out.any():
                        assert self.hold_out is not None
                        self.hold_out.add(head.entry, rows.select(out), self.partition)
                        self.held_out += int(np.count_nonzero(out))
                        rows = rows.select(~out)
                parts.append(rows)
                head.next = stop
                n -= len(rows)
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
        return Rows.concat(parts) if parts else _empty(self.spec)


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
    return events, [_dead(r.index, r.reason, r.message, raw[r.index], r.column)
                    for r in events.refused]  # fmt: skip


def _field(fields: dict, key: str) -> str:
    value = fields.get(key, fields.get(key.encode()))
    return value.decode() if isinstance(value, bytes) else value


def _dead(index: int, reason: str, message: str, what: Any, column: str = "") -> dict[str, str]:
    out = {"reason": reason, "message": message, "index": str(index)}
    if column:  # the refused field, by name: what a config that does not match the events lacks
        out["column"] = column
    if index >= 0:
        out["event"] = json.dumps(what, separators=(",", ":"))
    elif what is not None:  # the entry's own fields, as they were (bytes kept as bytes)
        out.update({f"field:{_text(k)}": v for k, v in what.items()})
    return out


def _text(key: str | bytes) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key
