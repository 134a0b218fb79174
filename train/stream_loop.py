"""Training from a live stream (data.stream, `rec train --stream URL`): the trainer's loop.

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
  - A stop (SIGTERM, SIGINT, training.steps, idle_exit_s) or a time-based checkpoint ends the
    segment on every rank at the same step; the batch read in that same step is held for the
    next segment (or, at a stop, never trained and never acknowledged: the resumed run gets it).

Exactly once: the checkpoint's meta.json holds each rank's position after the last batch it
trained (`stream.positions`), with the events it trained and their digest
(rec.data.stream.event_digest) summed over the run's whole lineage; the reader acknowledges
only what a committed checkpoint holds, and a resume starts each rank at its position.

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
from typing import Any

import torch
import torch.distributed as dist

from rec import metrics
from rec.batch import PAD_LABEL, RecBatch
from rec.config import RecConfig
from rec.data.source import empty_rows
from rec.data.stream import EventReader, StreamBatch, add_digests
from rec.train.distributed import gather_rows

# A segment with no checkpoint, round or step limit ahead: effectively unbounded.
UNBOUNDED = 1 << 62
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
class Tally:
    """What this rank trained from the stream, over the run's lineage (restored on resume)."""

    position: dict[str, Any] | None = None
    events: int = 0
    digest: int = 0

    def add(self, b: StreamBatch) -> None:
        if len(b):
            self.position = b.position
        self.events += len(b)
        self.digest = add_digests(self.digest, b.digest)


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
    docstring). `trained` receives each yielded batch's StreamBatch in order; the trainer pops
    one per step it completes."""

    def __init__(self, trainer, reader: EventReader, stop: StopSignal) -> None:
        self.t, self.reader, self.stop = trainer, reader, stop
        cfg: RecConfig = trainer.cfg
        self.wait_s, self.idle_exit_s = cfg.data.stream.wait_s, cfg.data.stream.idle_exit_s
        self.every_seconds = cfg.checkpoint.every_seconds
        self.trained: deque[StreamBatch] = deque()
        self.held: StreamBatch | None = None
        self.empty_since: float | None = None
        """When the reads began to find nothing on every rank (None: the last one found events)."""
        self.last_save = time.monotonic()
        self.last_step = self.last_status = time.monotonic()
        self.saved_step = trainer.pos.step
        self.pad_to = 0
        """The largest batch of the last read over the ranks: every rank pads its batch to it."""
        self.stopping = False
        self.ended_due = False
        """The last segment ended because checkpoint.every_seconds passed."""
        self.why = ""

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
                b = self.reader.next_batch(self.t.batch_size, self.wait_s)
                total, stop, due = self._agree(len(b))
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
        one all-gather per read of [events, signalled, idle, due, refused]. Idle counts only
        reads that found nothing, from the first of them: a step slower than idle_exit_s
        between two reads is not the stream's silence, and a read that found events on any
        rank never stops the run as idle."""
        now = time.monotonic()
        signalled = self.stop.signal is not None
        idle = (bool(self.idle_exit_s) and self.empty_since is not None
                and now - self.empty_since > self.idle_exit_s)  # fmt: skip
        due = (self.every_seconds and now - self.last_save >= self.every_seconds
               and self.t.pos.step > self.saved_step)  # fmt: skip
        refused = sum(self.reader.refused.values())
        flags = torch.tensor([n_local, signalled, idle, bool(due), refused], dtype=torch.int64)
        every = [flags]
        if dist.is_available() and dist.is_initialized():
            every = [torch.zeros_like(flags) for _ in range(dist.get_world_size())]
            dist.all_gather(every, flags)
        self.pad_to = max(int(f[0]) for f in every)
        total, signalled_all, idle_all, due_all, refused_all = (int(x) for x in sum(every))
        idle_all = idle_all if not total else 0
        if total:
            self.empty_since = None
        else:
            self.empty_since = now if self.empty_since is None else self.empty_since
            if now - self.last_step > STATUS_S and now - self.last_status > STATUS_S:
                self.last_status = now
                if self.t.ctx.is_main:
                    self._status(now, refused_all)
        if signalled_all and not self.why:
            name = signal.Signals(self.stop.signal).name if signalled else ""
            self.why = f"signal {name}" if signalled else "another rank got a signal"
        elif idle_all and not self.why:
            self.why = f"no event for {self.idle_exit_s:g} s (data.stream.idle_exit_s)"
        return total, signalled_all + idle_all, due_all

    def _status(self, now: float, refused: int) -> None:
        """Why nothing trains: no new event, or every event refused (a config that does not
        match the events refuses them all, as missing_field)."""
        from rec.train.progress import log

        stream = self.t.cfg.data.stream
        lag = self.reader.lag()
        behind = "?" if lag is None else f"{lag:,}"
        line = (f"no step for {now - self.last_step:.0f} s: no new event for group "
                f"{stream.group!r} at {stream.url} (lag {behind} entries)")  # fmt: skip
        if refused:
            reasons = ", ".join(f"{k} {v}" for k, v in self.reader.refused.most_common())
            dead = getattr(self.reader, "dead", "the dead-letter stream")
            line += (f"; {refused:,} events refused so far (rank 0: {reasons}), parked in "
                     f"{dead}: does the config match the events?")  # fmt: skip
        log(line)

    def saved(self, step: int) -> None:
        self.saved_step, self.last_save = step, time.monotonic()

    def _torchrec(self, batch: RecBatch):
        """Padded to the step's largest batch (pad_to; a batch held from the step that ended a
        segment keeps the size of that step's read, on every rank)."""
        t = self.t
        if len(batch) == 0:  # this rank's share ran dry this step: rows with no loss
            cfg = t.cfg
            batch = empty_rows(cfg.features.dense, len(t.keys), cfg.model.num_tasks).to_batch()
        batch = batch.padded(max(self.pad_to, 1))
        return batch.to_torchrec(t.keys, t.rows, t.zch.remap_train if t.zch else None)


def next_limit(trainer, every_steps: int) -> int:
    """Steps to the next drained boundary: a checkpoint by steps, a ZCH round, training.steps."""
    step = trainer.pos.step
    ends = []
    if every_steps:
        ends.append((step // every_steps + 1) * every_steps)
    if trainer.zch is not None:
        rounds = trainer.zch.round_steps(step, step + 1_000_000)
        if rounds:
            ends.append(min(rounds))
    if trainer.cfg.training.steps:
        ends.append(trainer.cfg.training.steps)
    return min(ends) - step if ends else UNBOUNDED


@dataclass
class _Window:
    """The progress line's window: loss sum and count, refusals so far, its start."""

    loss: float = 0.0
    """Sum of each step's loss times its events: a rank's mean over the events it trained."""
    events: int = 0
    t0: float = field(default_factory=time.perf_counter)


def fit_stream(t) -> dict[str, float]:
    """Trainer.fit for a stream run (module docstring): until a stop, checkpointing by steps
    (checkpoint.every_steps) and by time (checkpoint.every_seconds), acknowledging after each
    commit. Returns the last window's online metrics."""
    from rec.data.stream import open_reader
    from rec.features import feature_spec
    from rec.train.progress import Progress, log
    from rec.train.step_profile import StepProfiler
    from rec.train.trainer import PROFILE_WARMUP

    cfg, tally = t.cfg, t.stream_tally
    reader = open_reader(cfg.data.stream, feature_spec(cfg), t.ctx.rank, start=tally.position)
    stop = StopSignal()
    feed = StreamFeed(t, reader, stop)
    online = Online(list(cfg.model.task_names))
    progress = None
    if t.ctx.is_main:
        progress = Progress(t.run / "metrics.jsonl", 0, t.global_batch, t.run / "tensorboard")
        progress.start(t.pos.step)
        log(f"training from {cfg.data.stream.url} (group {cfg.data.stream.group!r}), "
            f"{t.ctx.world_size} ranks x batch {t.batch_size}, from step {t.pos.step}; "
            "SIGTERM or Ctrl-C checkpoints and stops")  # fmt: skip
    t.step_profiler = StepProfiler(t.pos.step + PROFILE_WARMUP, cfg.training.profile_steps)
    if t.zch is not None:
        t.zch.step = t.pos.step
    last: dict[str, float] = {}
    window, lag_said = _Window(), 0.0
    try:
        while not feed.stopping:
            limit = next_limit(t, cfg.checkpoint.every_steps)
            last, lag_said = _segment(t, feed, feed.segment(limit), online, progress, window,
                                      last, lag_said)  # fmt: skip
            step = t.pos.step
            if cfg.training.steps and step >= cfg.training.steps:
                feed.stopping, feed.why = True, f"training.steps={cfg.training.steps} reached"
            if t.zch is not None:  # its summary line with the progress line, if they meet
                t._zch_round(step, step % cfg.training.log_every == 0, progress)
            t0 = time.perf_counter()
            due = feed.stopping or feed.ended_due or t.checkpointer.due(step)
            feed.ended_due = False
            if due and step > feed.saved_step:
                t.save(last, complete=bool(cfg.training.steps and step >= cfg.training.steps))
                if tally.position is not None:
                    reader.ack(tally.position)
                feed.saved(step)
            if progress:
                progress.pause(time.perf_counter() - t0)
    finally:
        stop.restore()
        reader.close()
    if progress:
        log(f"stopped at step {t.pos.step}: {feed.why or 'stopped'}")
    t.finish(progress)
    return last


def _segment(t, feed, batches, online, progress, window, last, lag_said):
    """Steps until the segment's batches end (Trainer._train_segment, for a stream)."""
    from rec.train.optim import lr_factor, set_dense_lr

    log_every = t.cfg.training.log_every
    t.new_segment()
    while True:
        set_dense_lr(t.optimizer, lr_factor(t.pos.step, 0, t.cfg.training), t.cfg.training)
        spent = t.step_profiler.before(t.pos.step)
        try:
            loss, logits, labels = t.pipeline.progress(batches)
        except StopIteration:
            spent += t.step_profiler.close()
            if progress:
                progress.pause(spent)
            return last, lag_said
        b = feed.trained.popleft()
        t.stream_tally.add(b)
        t.pos.step += 1
        if t.publisher is not None:
            t.publisher.after_step(t.pos.step)
        spent += t.step_profiler.after(t.pos.step)
        if progress and spent:
            progress.pause(spent)
        online.add(logits, labels)
        window.loss, window.events = window.loss + float(loss) * len(b), window.events + len(b)
        if t.pos.step % log_every == 0:
            last, lag_said = _report(t, feed, online, progress, window, last, lag_said)


def _report(t, feed, online, progress, window, last, lag_said):
    """The window's line and metrics.jsonl records (collective: every rank calls it)."""
    from rec.train.progress import log

    # The mean over every rank's events: a rank with none in the window weighs nothing.
    sums = torch.tensor([window.loss, window.events], dtype=torch.float64)
    dist.all_reduce(sums)
    loss = float(sums[0] / sums[1].clamp(min=1))
    found = online.gather()
    refused = torch.tensor([sum(feed.reader.refused.values())], dtype=torch.int64)
    dist.all_reduce(refused)
    now = time.perf_counter()
    events = found["events"] if found else 0
    rate = events / max(now - window.t0, 1e-9)
    window.loss, window.events, window.t0 = 0.0, 0, now
    if found:
        last = {k: v for k, v in found.items() if k != "events"}
    if not progress:
        return last, lag_said
    lag = feed.reader.lag()
    step = t.pos.step
    progress.write({"kind": "train", "step": step, "loss": loss, "samples_per_s": round(rate, 1)})
    record = {"kind": "online", "step": step, "events_per_s": round(rate, 1), "lag": lag,
              "refused": int(refused), **(found or {})}  # fmt: skip
    progress.write(record)
    quality = (f"online auc {found[metrics.AUC]:.4f} log_loss {found[metrics.LOG_LOSS]:.4f} "
               f"calibration {found[CALIBRATION]:.3f}" if found
               else "online auc   -   (window has one class)")  # fmt: skip
    print(f"step {step:>7} | loss {loss:.4f} | {quality} | {rate:8,.0f} events/s | "
          f"lag {'?' if lag is None else f'{lag:,}'} entries | refused {int(refused)}",
          flush=True)  # fmt: skip
    bound = t.cfg.data.stream.max_lag
    if bound and lag is not None and lag > bound and now - lag_said > 60:
        lag_said = now
        log(f"the stream's head is {lag:,} entries ahead of training (data.stream.max_lag "
            f"{bound:,}): the producers outpace training; nothing is skipped or dropped, so "
            "add ranks or slow the producers")  # fmt: skip
    return last, lag_said


def stream_meta(tally: Tally, cfg) -> dict[str, Any]:
    """meta.json's `stream` section (a collective): every rank's position, events and digest."""
    mine = {"position": tally.position, "events": tally.events, "digest": tally.digest}
    every: list[Any] = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(every, mine)
    else:
        every[0] = mine
    return {"url": cfg.url, "group": cfg.group, "consumer_prefix": cfg.consumer_prefix,
            "positions": [e["position"] for e in every], "events": [e["events"] for e in every],
            "digests": [str(e["digest"]) for e in every]}  # fmt: skip


def resume_tally(step_dir, rank: int, world_size: int, cfg) -> Tally:
    """This rank's Tally from a checkpoint's meta.json (stream_meta). At another world size
    (allowed only when the group holds no unacknowledged entry: every entry delivered is in the
    checkpoint, whole), every rank starts at the group's own position, and rank 0 carries the
    lineage's sums."""
    from rec import run_dir
    from rec.config import ConfigError

    meta = run_dir.read_meta(step_dir).get("stream")
    if meta is None:
        raise ConfigError(f"{step_dir} was not trained from a stream: it holds no stream positions "
                          "to resume from (data.stream.url)")  # fmt: skip
    saved = len(meta["positions"])
    if saved == world_size:
        return Tally(meta["positions"][rank], int(meta["events"][rank]),
                     int(meta["digests"][rank]))  # fmt: skip
    check_world(step_dir, saved, world_size, cfg)
    if rank != 0:
        return Tally()
    digest = 0
    for d in meta["digests"]:
        digest = add_digests(digest, int(d))
    return Tally(None, sum(int(e) for e in meta["events"]), digest)


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
