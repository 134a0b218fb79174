"""Training from a live stream (data.stream, `rec train --stream URL`): the batch source that
Trainer.fit's loop trains from (rec.train.batch_source), as FileEpochs is for files.

Each rank reads its own events through an EventReader (rec.data.stream) and the ranks step
together: before each step one all-reduce sums [events, stop, checkpoint due] over the ranks.
  - No rank has an event: nobody steps; they read again (idle_exit_s ends the run). The
    segment ends there too, so the train pipeline, which reads a batch ahead, trains the batch
    it holds now rather than when the next event comes.
  - Some rank has events: every rank steps, each batch padded with rows labelled PAD_LABEL,
    which TrainModel's loss leaves out (zero loss, zero gradient), to the step's largest batch:
    a rank without any event takes part in the step's collectives, and a row-wise sharded
    table's backward (torchrec's ReduceScatterV, an all-gather that gloo runs only over equal
    sizes) gets the same batch size from every rank. No event waits for a full batch longer
    than data.stream.wait_s.
  - A time-based checkpoint ends the segment on every rank at the same step; the batch read
    in that same step is held for the next segment.
  - A signal (SIGTERM, SIGINT) drains: from the read that sees it, on every rank alike, the
    readers fetch no new entry (EventReader.drain) and the ranks train what was delivered to
    them (the batch read then, the entries read ahead, the rest of a part-trained entry) until
    no rank has an event; then the run checkpoints and acknowledges every entry delivered, so a
    clean stop leaves nothing pending. idle_exit_s stops with nothing delivered; training.steps
    stops at its step, and what was delivered past it stays pending for the resumed run.

Exactly once: the checkpoint's meta.json holds each rank's position after the last batch it
trained (`stream.positions`; of a partitioned stream each partition's: rec.train.stream_tally),
with the events it trained and their digest (rec.data.stream.event_digest) summed over the
run's whole lineage; the reader acknowledges only what a committed checkpoint holds, and a
resume starts each rank (each partition) at its position.

Held out: about one event in data.stream.hold_out_every_nth is not trained but kept for `rec
export`'s quality checks (rec.data.held_out). It is consumed as a trained one is (position,
count, digest: `events` counts both, `held_out` these), and each checkpoint holds the newest.

Progressive validation: the training forward scores a batch with the weights of before the
batch's own update, so its logits are the standard online metric, free. Every log_every steps
the window's scores are gathered and its AUC, log loss and calibration (mean predicted over
observed rate) go to metrics.jsonl (kind "online"), TensorBoard and the progress line.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rec import metrics, run_dir
from rec.batch import PAD_LABEL, RecBatch
from rec.config import RecConfig
from rec.data.held_out import HeldOut
from rec.data.source import empty_rows
from rec.data.stream import (
    EventReader,
    PartitionedReader,
    StreamBatch,
    open_reader,
)
from rec.data.stream_trim import trim_stream
from rec.features import feature_spec
from rec.train.batch_source import Position, ToTorchrec
from rec.train.distributed import DistContext, gather_rows
from rec.train.progress import Progress, log
from rec.train.stream_tally import (  # noqa: F401 (check_world: rec.train.launch's)
    Tally,
    check_world,
    resume_tally,
    stream_meta,
)

STATUS_S = 10.0
"""With no step for this long, rank 0 says why (no event, or every event refused) this often."""

CALIBRATION = "calibration"


class StopSignal:
    """SIGTERM and SIGINT set a flag the loop reads between steps, instead of killing the rank
    mid-step: the run then checkpoints, publishes and exits (the launcher's agent waits 30 s
    for it before it kills the ranks)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old = {s: signal.signal(s, self._set) for s in (signal.SIGTERM, signal.SIGINT)}

    def _set(self, signum, frame) -> None:
        self.signal = signum

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


@dataclass
class _Passed:
    """A read whose events were all held out (no rank had one to train): consumed without a
    step, it goes into the tally in read order with the trained batches around it."""

    batch: StreamBatch


@dataclass
class Online:
    """Progressive validation's window: scores of real rows (PAD_LABEL ones left out)."""

    task_names: list[str]
    probs: list[torch.Tensor] = field(default_factory=list)
    labels: list[torch.Tensor] = field(default_factory=list)

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        real = labels[:, 0] != PAD_LABEL
        self.probs.append(torch.sigmoid(logits[real].float()))
        self.labels.append(labels[real].float())

    def gather(self) -> dict[str, float] | None:
        """The window's metrics over every rank's rows (a collective), then a new window; None
        when the window holds no event or only one class (AUC undefined)."""
        n_tasks = len(self.task_names)
        probs = torch.cat(self.probs) if self.probs else torch.zeros(0, n_tasks)
        labels = torch.cat(self.labels) if self.labels else torch.zeros(0, n_tasks)
        self.probs, self.labels = [], []
        probs, labels = gather_rows(probs.reshape(-1, n_tasks)), gather_rows(labels)
        return online_metrics(probs, labels, self.task_names)


def online_metrics(probs: torch.Tensor, labels: torch.Tensor, tasks: list[str]) -> dict | None:
    """AUC and log loss (rec.metrics, as evaluation computes them) and calibration: the mean
    predicted probability over the observed positive rate, first task."""
    if len(labels) == 0 or labels[:, 0].min() == labels[:, 0].max():
        return None
    out = metrics.flat(metrics.quality(probs, labels, tasks))
    out[CALIBRATION] = float(probs[:, 0].mean() / labels[:, 0].mean())
    out["events"] = len(labels)
    return out


class StreamFeed:
    """This rank's torchrec batches from the stream, the ranks stepping together (module
    docstring). `trained` receives each yielded batch's StreamBatch in order; the source pops
    one per step the trainer completes, and keeps `step` current."""

    def __init__(self, cfg: RecConfig, is_main: bool, reader: EventReader, stop: StopSignal,
                 to_torchrec: ToTorchrec, step: int) -> None:  # fmt: skip
        self.cfg, self.is_main, self.reader, self.stop = cfg, is_main, reader, stop
        self.to_torchrec = to_torchrec
        self.wait_s, self.idle_exit_s = cfg.data.stream.wait_s, cfg.data.stream.idle_exit_s
        self.every_seconds = cfg.checkpoint.every_seconds
        self.trained: deque[StreamBatch | _Passed] = deque()
        self.held: StreamBatch | None = None
        self.empty_since: float | None = None
        """When the reads began to find nothing on every rank (None: the last one found events)."""
        self.last_save = time.monotonic()
        self.last_step = self.last_status = time.monotonic()
        self.step = self.saved_step = step
        self.pad_to = 0
        """The largest batch of the last read over the ranks: every rank pads its batch to it."""
        self.stopping = False
        self.ended_due = False
        """The last segment ended because checkpoint.every_seconds passed."""
        self.why = ""
        self.refused_all = 0
        self.draining = False
        """A signal came: the ranks train the events already delivered to them, then stop."""
        self.stop_drains = False
        """Set by _agree: the stop it returned is a signal's (an idle stop has nothing to train)."""
        """Events refused so far over every rank (the last agreement's sum: the same on all)."""

    def segment(self, steps: int) -> Iterator[Any]:
        """Up to `steps` batches; fewer when the ranks agree to stop or to checkpoint."""
        done = 0
        # Idle means reads that found nothing: a checkpoint or a ZCH round between segments
        # is not the stream's silence.
        self.empty_since = None
        while done < steps:
            if self.held is not None:
                b, self.held = self.held, None
            else:
                b = self.reader.next_batch(self.cfg.training.batch_size, self.wait_s)
                total, stop, due = self._agree(len(b))
                if not total and b.held_out:
                    self.trained.append(_Passed(b))
                if stop and self.draining:
                    stop = 0  # a signal's stop comes when the delivered events are trained
                elif stop and self.stop_drains:
                    self.draining = True  # every rank at the same read: the sums agree
                    self.reader.drain()
                    stop = 0
                if self.draining and not total:
                    self.stopping = True  # every event delivered is in the batches trained
                    return
                if stop or (due and done):
                    # Read in the step where the ranks stop or checkpoint: trained after it.
                    self.held = b if total else None
                    self.stopping, self.ended_due = bool(stop), not stop
                    return
                if not total:
                    if done:  # the pipeline holds batches it trains when its input ends
                        return
                    continue
            self.trained.append(b)
            self.last_step = time.monotonic()
            done += 1
            yield self._torchrec(b.batch)

    def _agree(self, n_local: int) -> tuple[int, int, int]:
        """[events, stop, checkpoint due] over the ranks, and the largest batch (pad_to), from
        one all-gather per read of [events, signal number, idle, due, refused]. Idle counts only
        reads that found nothing, from the first of them: a step slower than idle_exit_s
        between two reads is not the stream's silence, and a read that found events on any
        rank never stops the run as idle."""
        now = time.monotonic()
        signum = self.stop.signal or 0  # the number, so every rank names the same signal
        idle = (bool(self.idle_exit_s) and self.empty_since is not None
                and now - self.empty_since > self.idle_exit_s)  # fmt: skip
        due = (self.every_seconds and now - self.last_save >= self.every_seconds
               and self.step > self.saved_step)  # fmt: skip
        refused = sum(self.reader.refused.values())
        flags = torch.tensor([n_local, signum, idle, bool(due), refused], dtype=torch.int64)
        every = [flags]
        if dist.is_available() and dist.is_initialized():
            every = [torch.zeros_like(flags) for _ in range(dist.get_world_size())]
            dist.all_gather(every, flags)
        self.pad_to = max(int(f[0]) for f in every)
        total, _, idle_all, due_all, refused_all = (int(x) for x in sum(every))
        signum_all = max(int(f[1]) for f in every)
        signalled_all = int(signum_all > 0)
        self.refused_all = refused_all
        idle_all = idle_all if not total else 0
        if total:
            self.empty_since = None
        else:
            self.empty_since = now if self.empty_since is None else self.empty_since
            if now - self.last_step > STATUS_S and now - self.last_status > STATUS_S:
                self.last_status = now
                if self.is_main:
                    self._status(now, refused_all)
        self.stop_drains = bool(signalled_all)
        if signalled_all and not self.why:  # rank 0 says it whichever rank got it first
            self.why = f"signal {signal.Signals(signum_all).name}"
        elif idle_all and not self.why:
            self.why = f"no event for {self.idle_exit_s:g} s (data.stream.idle_exit_s)"
        return total, signalled_all + idle_all, due_all

    def _status(self, now: float, refused: int) -> None:
        """Why nothing trains: no new event, or every event refused (a config that does not
        match the events refuses them all, as missing_field)."""
        stream = self.cfg.data.stream
        lag = self.reader.lag()
        behind = "?" if lag is None else f"{lag:,}"
        line = (f"no step for {now - self.last_step:.0f} s: no new event for group "
                f"{stream.group!r} at {stream.url} (lag {behind} entries)")  # fmt: skip
        if refused:
            dead = getattr(self.reader, "dead", "the dead-letter stream")
            line += (f"; {refused:,} events refused so far (rank 0: {refusals(self.reader)}), "
                     f"parked in {dead}: does the config match the events?")  # fmt: skip
        log(line)

    def saved(self, step: int) -> None:
        self.saved_step, self.last_save = step, time.monotonic()

    def _torchrec(self, batch: RecBatch):
        """Padded to the step's largest batch (pad_to; a batch held from the step that ended a
        segment keeps the size of that step's read, on every rank)."""
        if len(batch) == 0:  # this rank's share ran dry this step: rows with no loss
            cfg = self.cfg
            batch = empty_rows(cfg.features.dense, len(cfg.features.sparse),
                               cfg.model.num_tasks).to_batch()  # fmt: skip
        return self.to_torchrec(batch.padded(max(self.pad_to, 1)))


@dataclass
class _Window:
    """The progress line's window: loss sum and count, refusals so far, its start."""

    loss: float = 0.0
    """Sum of each step's loss times its events: a rank's mean over the events it trained."""
    events: int = 0
    t0: float = field(default_factory=time.perf_counter)


class StreamSource:
    """The stream as Trainer.fit's batch source (rec.train.batch_source.BatchSource): this
    rank's reader and the ranks' agreement (StreamFeed, opened by `start`), what this rank
    trained (Tally), progressive validation (Online) and the window's lines."""

    online = True

    def __init__(self, cfg: RecConfig, ctx: DistContext, to_torchrec: ToTorchrec) -> None:
        self.cfg, self.ctx, self.to_torchrec = cfg, ctx, to_torchrec
        self.tally = Tally()
        self.scores = Online(list(cfg.model.task_names))
        self.window = _Window()
        self.lag_said = 0.0
        """When the line that training lags data.stream.max_lag was last said."""
        self.progress: Progress | None = None
        self.feed: StreamFeed | None = None
        self.run: Path | None = None
        """The run directory (learnt from the first checkpoint written)."""
        s = cfg.data.stream
        self.held_out = HeldOut(s.hold_out_every_nth, -(-s.hold_out_keep // ctx.world_size))

    def total_steps(self, pos: Position) -> int | None:
        return self.cfg.training.steps or None

    def resume(self, step_dir) -> None:
        self.tally = resume_tally(step_dir, self.ctx.rank, self.ctx.world_size,
                                  self.cfg.data.stream)  # fmt: skip
        self.held_out.restore(step_dir, self.ctx.rank, self.ctx.world_size,
                              partitioned=self.tally.parts is not None)  # fmt: skip

    def start(self, pos: Position, progress: Progress | None) -> None:
        """Opens the reader at this rank's position and catches SIGTERM and SIGINT."""
        cfg, ctx = self.cfg, self.ctx
        hold_out = self.held_out if self.held_out.every_nth > 0 else None
        reader = open_reader(cfg.data.stream, feature_spec(cfg), ctx.rank,
                             start=self.tally.at(), hold_out=hold_out, world=ctx.world_size,
                             layout=self.tally.layout)  # fmt: skip
        if isinstance(reader, PartitionedReader):
            self.tally.adopt(reader.layout, reader.mine)
        self.feed = StreamFeed(cfg, ctx.is_main, reader, StopSignal(), self.to_torchrec,
                               pos.step)  # fmt: skip
        self.progress, self.window = progress, _Window()
        if progress:
            log(f"training from {cfg.data.stream.url} (group {cfg.data.stream.group!r}), "
                f"{ctx.world_size} ranks x batch {cfg.training.batch_size}, from step "
                f"{pos.step}; SIGTERM or Ctrl-C checkpoints and stops")  # fmt: skip

    def segment(self, limit: int) -> Iterator[Any]:
        assert self.feed is not None, "start() opens the stream"
        return self.feed.segment(limit)

    def after_step(self, pos: Position, loss: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> None:  # fmt: skip
        assert self.feed is not None
        self._passed()
        b = self.feed.trained.popleft()
        assert isinstance(b, StreamBatch)
        self.tally.add(b)
        self._passed()
        self.feed.step = pos.step
        self.scores.add(logits, labels)
        self.window.loss += float(loss) * len(b)
        self.window.events += len(b)

    def report(self, step: int, lr: float) -> dict[str, float] | None:
        """The window's line and metrics.jsonl records (collective: every rank calls it); its
        online metrics, None when it had none (one class, or no event)."""
        assert self.feed is not None
        reader, window = self.feed.reader, self.window
        # The mean over every rank's events: a rank with none in the window weighs nothing.
        sums = torch.tensor([window.loss, window.events], dtype=torch.float64)
        dist.all_reduce(sums)
        loss = float(sums[0] / sums[1].clamp(min=1))
        found = self.scores.gather()
        refused = torch.tensor([sum(reader.refused.values())], dtype=torch.int64)
        dist.all_reduce(refused)
        now = time.perf_counter()
        rate = (found["events"] if found else 0) / max(now - window.t0, 1e-9)
        self.window = _Window(t0=now)
        if self.progress:
            self._line(step, loss, found, rate, reader.lag(), int(refused))
        return {k: v for k, v in found.items() if k != "events"} if found else None

    def _line(self, step: int, loss: float, found: dict | None, rate: float,
              lag: int | None, refused: int) -> None:  # fmt: skip
        """Rank 0: the window's records, its progress line, and whether training lags."""
        assert self.progress is not None
        self.progress.write({"kind": "train", "step": step, "loss": loss,
                             "samples_per_s": round(rate, 1)})  # fmt: skip
        self.progress.write({"kind": "online", "step": step, "events_per_s": round(rate, 1),
                             "lag": lag, "refused": refused, **(found or {})})  # fmt: skip
        quality = (f"online auc {found[metrics.AUC]:.4f} log_loss {found[metrics.LOG_LOSS]:.4f} "
                   f"calibration {found[CALIBRATION]:.3f}" if found
                   else "online auc   -   (window has one class)")  # fmt: skip
        print(f"step {step:>7} | loss {loss:.4f} | {quality} | {rate:8,.0f} events/s | "
              f"lag {'?' if lag is None else f'{lag:,}'} entries | refused {refused}",
              flush=True)  # fmt: skip
        bound, now = self.cfg.data.stream.max_lag, time.perf_counter()
        if bound and lag is not None and lag > bound and now - self.lag_said > 60:
            self.lag_said = now
            log(f"the stream's head is {lag:,} entries ahead of training (data.stream.max_lag "
                f"{bound:,}): the producers outpace training; nothing is skipped or dropped, so "
                "add ranks or slow the producers")  # fmt: skip

    def should_stop(self) -> str | None:
        """A signal or idle_exit_s (the ranks agreed in the segment), or training.steps."""
        feed, steps = self.feed, self.cfg.training.steps
        assert feed is not None
        if steps and feed.step >= steps:
            feed.stopping, feed.why = True, f"training.steps={steps} reached"
        return (feed.why or "stopped") if feed.stopping else None

    def checkpoint_due(self, step: int) -> bool:
        """The segment ended because checkpoint.every_seconds passed."""
        assert self.feed is not None
        due, self.feed.ended_due = self.feed.ended_due, False
        return due

    def after_checkpoint(self, step: int) -> None:
        """Acknowledges what the committed checkpoint holds: exactly once. Rank 0 then trims
        the stream below what the kept checkpoints may resume from (rec.data.stream_trim)."""
        assert self.feed is not None
        if (at := self.tally.at()) is not None:
            self.feed.reader.ack(at)
        self.feed.saved(step)
        if self.ctx.is_main and self.cfg.data.stream.trim and self.run is not None:
            kept = [run_dir.read_meta(d).get("stream") for d in run_dir.committed_steps(self.run)]
            trim_stream(self.cfg.data.stream, kept, log=log)

    def _passed(self) -> None:
        """Reads that were all held out, up to the next trained batch, into the tally."""
        assert self.feed is not None
        while self.feed.trained and isinstance(self.feed.trained[0], _Passed):
            self.tally.add(self.feed.trained.popleft().batch)

    def meta(self) -> dict[str, Any]:
        if self.feed is not None:
            self._passed()  # at a drained boundary only such reads are left
        return {"skipped_rows": 0, "stream": stream_meta(self.tally, self.cfg.data.stream)}

    def write_files(self, step_dir) -> None:
        """This rank's files in a checkpoint being written: its held-out events."""
        self.run = Path(step_dir).parent.parent  # <run>/checkpoints/step_N: where to trim from
        self.held_out.save(step_dir, self.ctx.rank, self.tally.covered())

    def close(self) -> None:
        if self.feed is not None:
            self.feed.stop.restore()
            self.feed.reader.close()

    def ended(self, first_step: int, step: int) -> None:
        """A run that trained no step and refused events fails (NothingTrainedError), however it
        stopped (a signal, idle_exit_s): it exited 0 and looked like a quiet stream. One that
        refused nothing (no event came) ends as it did."""
        feed = self.feed
        if feed is None or step > first_step or not feed.refused_all:
            return
        dead = getattr(feed.reader, "dead", "the dead-letter stream")
        raise NothingTrainedError(
            f"trained nothing: {feed.refused_all:,} events refused (rank {self.ctx.rank}: "
            f"{refusals(feed.reader) or 'none'}) and none trained. Does the config's "
            f"features/labels match the events? Each refusal is parked in {dead} (fields "
            "reason, message, column)"
        )


FIELDS_SAID = 3
"""Refused fields named per reason in a line; more are counted, not named."""


def refusals(reader: EventReader) -> str:
    """The reader's refusals by reason, each with the fields refused (the first field that
    failed in each event): "missing_field 2,000: 'C27'", "label_not_binary 3: 'label'"."""
    parts = []
    columns = getattr(reader, "refused_columns", {})
    for reason, n in reader.refused.most_common():
        named = sorted(((k, c) for (r, c), k in columns.items() if r == reason), reverse=True)
        said = ", ".join(repr(c) for _, c in named[:FIELDS_SAID])
        more = f" and {len(named) - FIELDS_SAID} more" if len(named) > FIELDS_SAID else ""
        parts.append(f"{reason} {n:,}" + (f": {said}{more}" if said else ""))
    return ", ".join(parts)


class NothingTrainedError(RuntimeError):
    """A stream run stopped without a step while it refused events: a config that does not
    match the events, most likely. Raised on every rank, so the run exits non-zero."""
