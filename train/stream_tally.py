"""What a stream run consumed, as a checkpoint's meta.json holds it, and how a resume takes it
back (rec.train.stream_loop trains; this is its bookkeeping).

`Tally`: a rank's events, digest and held-out count over the run's lineage, with its position.
One stream (the legacy layout): per rank; meta.json's `stream` lists every rank's. A partitioned
stream (rec.contract.partitions): per partition (`PartTally`), since a partition moves to
another rank at a resume at another world size: meta.json's `stream` is format 2,

    {"format": 2, "url", "group", "partitions": P, "world": W,
     "parts": [{"partition", "key", "position", "events", "digest", "held_out"}, ...]}

and a resume at any --nproc hands each rank its partitions (k mod world == rank) with their
lineage. The partitions' entries still pending sit under consumer partition<k>, which the new
reader takes over, so exactly once holds. A checkpoint is refused on a stream whose layout
changed (another partition count, or one stream become partitioned): positions hold only in
their own partition. One stream's checkpoint at another world size keeps check_world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from rec.contract.partitions import Layout
from rec.data.stream import StreamBatch, StreamPosition, add_digests, assigned, read_layout


@dataclass
class PartTally:
    """What the run's lineage consumed of one partition of a partitioned stream, whatever
    ranks read it: its position, events (trained and held out), their digest, the held out."""

    position: dict[str, Any] | None = None
    events: int = 0
    digest: int = 0
    held_out: int = 0

    def to_meta(self, k: int, key: str) -> dict[str, Any]:
        return {"partition": k, "key": key, "position": self.position, "events": self.events,
                "digest": str(self.digest), "held_out": self.held_out}  # fmt: skip


@dataclass
class Tally:
    """What this rank trained from the stream, over the run's lineage (restored on resume). Of
    a partitioned stream, `parts` holds it per partition this rank reads (the sums below are
    then unused): a partition's lineage moves with it to whichever rank reads it next."""

    position: dict[str, Any] | None = None
    events: int = 0
    """Events consumed: trained and held out."""
    digest: int = 0
    held_out: int = 0
    parts: dict[int, PartTally] | None = None
    layout: Layout | None = None

    def add(self, b: StreamBatch) -> None:
        if self.parts is not None:
            for k, take in b.parts.items():
                part = self.parts.setdefault(k, PartTally())
                part.position = b.position[k]
                part.events += take.events
                part.held_out += take.held_out
                part.digest = add_digests(part.digest, take.digest)
            return
        if len(b) or b.held_out:
            self.position = b.position
        self.events += len(b) + b.held_out
        self.held_out += b.held_out
        self.digest = add_digests(self.digest, b.digest)

    def adopt(self, layout: Layout, mine: list[int]) -> None:
        """A partitioned stream's reader is open: a tally per partition it reads."""
        self.layout = layout
        self.parts = self.parts if self.parts is not None else {}
        for k in mine:
            self.parts.setdefault(k, PartTally())

    def at(self) -> dict[Any, Any] | None:
        """Where the reader starts and what an acknowledgement covers: the position, or
        {partition: position} of a partitioned stream (None: from the group's own)."""
        if self.parts is None:
            return self.position
        return {k: p.position for k, p in self.parts.items() if p.position is not None}

    def covered(self) -> StreamPosition | dict[int, StreamPosition] | None:
        """at() as StreamPositions (what the held-out events saved must be covered by)."""
        at = self.at()
        if at is None or self.parts is None:
            return StreamPosition.from_dict(at) if at is not None else None
        return {k: StreamPosition.from_dict(v) for k, v in at.items()}


def stream_meta(tally: Tally, cfg) -> dict[str, Any]:
    """meta.json's `stream` section (a collective): every rank's position, events and digest;
    of a partitioned stream (format 2) every partition's, whatever rank read it."""
    if tally.parts is not None:
        assert tally.layout is not None
        keys = tally.layout.keys
        mine: Any = [p.to_meta(k, keys[k]) for k, p in sorted(tally.parts.items())]
    else:
        mine = {"position": tally.position, "events": tally.events, "digest": tally.digest,
                "held_out": tally.held_out}  # fmt: skip
    every: list[Any] = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(every, mine)
    else:
        every[0] = mine
    if tally.parts is not None:
        assert tally.layout is not None
        parts = sorted((p for rank in every for p in rank), key=lambda p: p["partition"])
        return {"format": 2, "url": cfg.url, "group": cfg.group,
                "partitions": tally.layout.partitions, "world": len(every),
                "parts": parts}  # fmt: skip
    return {"url": cfg.url, "group": cfg.group, "consumer_prefix": cfg.consumer_prefix,
            "positions": [e["position"] for e in every], "events": [e["events"] for e in every],
            "digests": [str(e["digest"]) for e in every],
            "held_out": [e["held_out"] for e in every]}  # fmt: skip


def lineage(meta: dict[str, Any]) -> tuple[int, int]:
    """Events a checkpoint's lineage consumed (trained and held out) and their digest, from its
    meta.json `stream` section (either format)."""
    if meta.get("format") == 2:
        events, digests = [p["events"] for p in meta["parts"]], [p["digest"] for p in meta["parts"]]
    else:
        events, digests = meta["events"], meta["digests"]
    digest = 0
    for d in digests:
        digest = add_digests(digest, int(d))
    return sum(int(e) for e in events), digest


def resume_tally(step_dir, rank: int, world_size: int, cfg) -> Tally:
    """This rank's Tally from a checkpoint's meta.json (stream_meta). Partitioned (format 2):
    at any world size, the partitions this rank now reads (k mod world == rank), each with its
    position and lineage; entries still pending stay under consumer partition<k>, which the
    new reader takes over. One stream: at another world size (allowed only when the group holds
    no unacknowledged entry: every entry delivered is in the checkpoint, whole), every rank
    starts at the group's own position, and rank 0 carries the lineage's sums."""
    from rec import run_dir
    from rec.config import ConfigError

    meta = run_dir.read_meta(step_dir).get("stream")
    if meta is None:
        raise ConfigError(f"{step_dir} was not trained from a stream: it holds no stream positions "
                          "to resume from (data.stream.url)")  # fmt: skip
    layout = check_resume(step_dir, meta, world_size, cfg)
    if layout is not None:
        parts = {int(p["partition"]): PartTally(p["position"], int(p["events"]), int(p["digest"]),
                                                int(p["held_out"]))
                 for p in meta["parts"]}  # fmt: skip
        mine = {k: parts.get(k, PartTally()) for k in assigned(layout.partitions, rank, world_size)}
        return Tally(parts=mine, layout=layout)
    saved = len(meta["positions"])
    held = [int(h) for h in meta.get("held_out", [0] * saved)]
    if saved == world_size:
        return Tally(meta["positions"][rank], int(meta["events"][rank]),
                     int(meta["digests"][rank]), held[rank])  # fmt: skip
    if rank != 0:
        return Tally()
    digest = 0
    for d in meta["digests"]:
        digest = add_digests(digest, int(d))
    return Tally(None, sum(int(e) for e in meta["events"]), digest, sum(held))


def check_resume(step_dir, meta: dict[str, Any], world_size: int, cfg) -> Layout | None:
    """Refuses a resume the stream cannot keep exactly once; the layout of a partitioned
    stream's checkpoint. Its partitions must be the stream's now (their count and keys: a
    position means nothing in another partition); one stream's checkpoint needs the stream
    still unpartitioned, and check_world."""
    from rec.config import ConfigError

    layout = read_layout(cfg)
    if meta.get("format") == 2:
        saved = int(meta["partitions"])
        keys = [p["key"] for p in sorted(meta["parts"], key=lambda p: p["partition"])]
        if layout is None or layout.partitions != saved or list(layout.keys) != keys:
            now = "no layout record" if layout is None else f"{layout.partitions} partitions"
            raise ConfigError(f"{step_dir} was trained from {cfg.url} in {saved} partitions, and "
                              f"the stream now has {now}: a position holds only in its own "
                              "partition, so this checkpoint cannot resume on it; train a new "
                              "run (or another data.stream.group) to read the stream as it is "
                              "now")  # fmt: skip
        return layout
    if layout is not None:
        raise ConfigError(f"{step_dir} was trained from {cfg.url} as one stream, which is now "
                          f"{layout.partitions} partitions: its position does not hold in them; "
                          "train a new run (or another data.stream.group)")  # fmt: skip
    check_world(step_dir, len(meta["positions"]), world_size, cfg)
    return None


def check_world(step_dir, saved: int, world_size: int, cfg) -> None:
    """Refuses a resume at another world size while the group has unacknowledged entries:
    they are held for the saved ranks' consumers, and a rank that no longer exists would never
    train them."""
    from rec.config import ConfigError
    from rec.data.stream_redis import pending_entries

    if saved != world_size and (pending := pending_entries(cfg)):
        raise ConfigError(f"{step_dir} was trained from the stream by {saved} ranks, and "
                          f"{pending} entries delivered to them are not acknowledged yet (each is "
                          f"held for its rank's consumer): resume it with --nproc {saved}, not "
                          f"{world_size}; once a run of {saved} ranks has checkpointed them all, "
                          "any --nproc resumes")  # fmt: skip
