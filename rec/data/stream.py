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

from typing import Any

from rec.config import ConfigError, StreamConfig
from rec.contract.events import dead_stream
from rec.contract.features import FeatureSpec
from rec.data.stream_reader import (
    Assembler,
    EventReader,
    HoldOutSink,
    StreamBatch,
    StreamPosition,
    add_digests,
    decode_entry,
    entry_key,
    event_digest,
)
from rec.data.stream_redis import RedisEventReader


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
    hold_out: HoldOutSink | None = None,
) -> EventReader:
    """The reader of cfg.url for `rank`, from `start` (a checkpoint's position) if given; the
    events training holds out go to `hold_out` (rec.data.held_out)."""
    if cfg.url.startswith("redis://"):
        position = StreamPosition.from_dict(start) if start else None
        return RedisEventReader(cfg, spec, rank, position, raw_dense, hold_out=hold_out)
    raise ConfigError(f"data.stream.url={cfg.url!r}: rec reads redis://HOST:PORT[/STREAM] streams")


__all__ = [
    "Assembler",
    "EventReader",
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
