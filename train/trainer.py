"""One rank of `rec train`: shard the model, train, evaluate, checkpoint (Contract 1 writer)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv

from rec import metrics, run_dir
from rec.batch import PAD_LABEL, RecBatch
from rec.config import RecConfig
from rec.data import make_source
from rec.data.source import empty_rows
from rec.model import TrainModel, build_model, embedding_modules, table_rows
from rec.train import plan_stats, publish, sharding
from rec.train.checkpoint import Checkpointer
from rec.train.distributed import (
    DistContext,
    all_mean,
    gather_rows,
    init_distributed,
    peak_rss_bytes,
)
from rec.train.optim import attach_embedding_optimizer, lr_factor, make_optimizer, set_dense_lr
from rec.train.progress import Progress, log, plot_metrics
from rec.train.step_profile import StepProfiler
from rec.train.stream_loop import Tally, fit_stream, resume_tally, stream_meta
from rec.train.zch import SUMMARY_EVERY_ROUNDS, ZchTables
from rec.versions import library_versions

# Steps run before the profiled window (train.step_profile): the first ones build the
# pipeline and warm caches, and are slower than the rest.
PROFILE_WARMUP = 5


@dataclass
class Position:
    """Where training stands: optimiser steps done, and the data position of the next sample."""

    step: int = 0
    epoch: int = 0
    offset: int = 0  # global samples of `epoch` already consumed

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {k: torch.tensor(getattr(self, k), dtype=torch.int64) for k in self.__dict__}


class Trainer:
    def __init__(self, cfg: RecConfig, run: Path, ctx: DistContext) -> None:
        self.cfg, self.run, self.ctx = cfg, run, ctx
        self.keys = list(cfg.features.sparse)
        self.rows = table_rows(cfg)
        self.batch_size = cfg.training.batch_size
        self.global_batch = self.batch_size * ctx.world_size
        self.pos = Position()
        self.streaming = bool(cfg.data.stream.url)
        self.stream_tally = Tally()
        if not self.streaming:  # a stream run validates online (rec.train.stream_loop)
            self.train_source = make_source(cfg, "train")
            self.eval_source = make_source(cfg, "eval")
            if self.eval_source.num_samples() == 0:
                raise ValueError("the held-out split has no samples to evaluate on")
        self.zch = ZchTables.of(cfg, self.keys)
        self._build_model()
        self.checkpointer = Checkpointer(run, cfg.checkpoint, ctx.rank)

    # ---- set-up -----------------------------------------------------------------------------
    def _build_model(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(cfg.training.seed)  # same dense init on every rank
        if cfg.sharding.topology.local_world_size:
            # TorchRec's sharding code reads the host size from LOCAL_WORLD_SIZE, the planner
            # from the topology; they must agree, also when one machine simulates several hosts.
            os.environ["LOCAL_WORLD_SIZE"] = str(cfg.sharding.topology.local_world_size)
        model = TrainModel(build_model(cfg, "meta"))
        for tables in embedding_modules(
            model.model
        ).values():  # the EBC, and din's EmbeddingCollection
            attach_embedding_optimizer(tables, cfg.training)
        compute = sharding.compute_device_type(ctx.device)
        planner = sharding.make_planner(cfg, ctx.world_size, compute)
        sharders = sharding.make_sharders()
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
        self.plan_rows = sharding.plan_rows(plan)
        self.dmp = DistributedModelParallel(
            module=model,
            env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
            device=ctx.device,
            plan=plan,
            sharders=sharders,  # type: ignore[arg-type]
        )
        if cfg.publish.url:  # before the pipeline wraps the model: it records every lookup
            self.dmp.init_torchrec_delta_tracker(publish.tracker_config())
        self.publisher: publish.UpdatePublisher | None = None
        self.optimizer = make_optimizer(self.dmp, cfg.training)
        pipeline_cls = (
            TrainPipelineSparseDist if cfg.training.pipeline == "sparse_dist" else TrainPipelineBase
        )
        self.pipeline = pipeline_cls(self.dmp, self.optimizer, ctx.device)
        self.plan_report: dict[str, Any] = {}
        if ctx.is_main:  # the planner ran here (collective_plan), so its estimates are here
            topology = dataclasses.asdict(cfg.sharding.topology)
            capture = sharding.planner_capture(planner)
            self.plan_report = plan_stats.plan_report(plan, capture, topology, cfg, measure=False)
            print(sharding.format_plan(self.plan_rows), flush=True)
            sharding.write_plan(self.run / run_dir.PLAN_FILE, self.plan_report)

    def _state(self) -> dict[str, Any]:
        state = {
            "model": self.dmp.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train": {**self.pos.as_tensors(), "rng": torch.get_rng_state()},
        }
        if self.zch is not None:  # replicated: DCP saves one copy, every rank loads it whole
            state["zch"] = {name: m.state() for name, m in self.zch.maps.items()}
        return state

    def start_publishing(self) -> None:
        """After any resume: the publisher reads its shards' weights as they are now."""
        ident = [publish.next_identity(self.run) if self.ctx.is_main else None]
        dist.broadcast_object_list(ident, src=0)
        self.publisher = publish.UpdatePublisher(self.cfg, self.dmp, self.ctx.rank,
                                                 self.ctx.world_size, ident[0], log,
                                                 zch=self.zch)  # fmt: skip
        if self.ctx.is_main:
            log(f"publishing changed rows to {self.publisher.url} (run {ident[0].run}, "
                f"generation {ident[0].gen})")  # fmt: skip
        if ident[0].gen > 1:  # a resume: undo what the last generation published past here
            n = self.publisher.republish_undone(self.pos.step)
            if self.ctx.is_main and n:
                log(f"re-sent {n} rows at their step-{self.pos.step} values: the last "
                    "generation published them after this checkpoint")  # fmt: skip

    def resume(self, step_dir: Path) -> None:
        """Loads a checkpoint written at any world size into this (re)sharded model."""
        _, dense = self.optimizer.optimizers[-1]
        dense.init_state()  # Adam's state is lazy; DCP loads into existing tensors only
        state = self._state()
        fresh = Checkpointer.load(step_dir, state)
        self.dmp.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        t = state["train"]
        self.pos = Position(int(t["step"]), int(t["epoch"]), int(t["offset"]))
        torch.set_rng_state(t["rng"])
        if self.streaming:
            self.stream_tally = resume_tally(step_dir, self.ctx.rank, self.ctx.world_size,
                                             self.cfg.data.stream)  # fmt: skip
        if self.ctx.is_main:
            log(f"resumed from {step_dir} at step {self.pos.step} (epoch {self.pos.epoch})")
            if self.zch is not None:
                log(f"resumed id maps: {self.zch.live_line()}")
        if self.ctx.is_main and fresh:  # the plan moved them to or from data_parallel
            log(f"table(s) {', '.join(fresh)}: rows as saved, optimizer state fresh: this plan "
                "shards them otherwise, and a data_parallel table is trained by the dense "
                "optimizer, any other by the embedding one")  # fmt: skip

    # ---- data -------------------------------------------------------------------------------
    def total_steps(self) -> int:
        t = self.cfg.training
        if t.steps:
            return t.steps
        per_epoch = self.train_source.num_samples() // self.global_batch
        if per_epoch == 0:
            raise ValueError(
                f"the training data has {self.train_source.num_samples()} samples, fewer than "
                f"one global batch ({self.batch_size} x {self.ctx.world_size} ranks)"
            )
        left_now = (self.train_source.num_samples() - self.pos.offset) // self.global_batch
        return self.pos.step + left_now + per_epoch * (t.epochs - self.pos.epoch - 1)

    def _train_stream(self, positions: deque) -> Iterator[Batch]:
        """Batches from the current position on, across epochs; records where each one ends."""
        epoch, offset = self.pos.epoch, self.pos.offset
        remap = self.zch.remap_train if self.zch else None
        while self.cfg.training.steps or epoch < self.cfg.training.epochs:
            for batch in self.train_source.batches(
                self.batch_size, self.ctx.rank, self.ctx.world_size, start=offset
            ):
                offset += self.global_batch
                positions.append((epoch, offset))
                yield batch.to_torchrec(self.keys, self.rows, remap)
            epoch, offset = epoch + 1, 0

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """AUC (their mean, and per task with several) and log loss on the held-out split:
        every rank's probabilities and labels gathered, then rec.metrics, as export's
        verification and `rec predict` compute them."""
        probs, labels = [], []
        self.dmp.eval()
        try:
            for _, all_logits, all_labels in self._eval_outputs(self._eval_batches()):
                real = all_labels[:, 0] != PAD_LABEL  # padding rows are left out
                probs.append(torch.sigmoid(all_logits[real]).float())
                labels.append(all_labels[real].float())
        finally:
            self.dmp.train()
        # Every rank takes part in the gather, with no rows if all of its rows were padding.
        all_probs, all_labels = gather_rows(torch.cat(probs)), gather_rows(torch.cat(labels))
        return metrics.flat(metrics.quality(all_probs.cpu(), all_labels.cpu(),
                                            self.cfg.model.task_names))  # fmt: skip

    def _eval_batches(self) -> Iterator[Batch]:
        """Every held-out sample once (up to training.eval_batches per rank). Sharded forwards
        are collective, so every rank runs the same number of batches of batch_size rows: the
        split's short last batches, and the ones a rank has none for, are padded with rows
        labelled PAD_LABEL (RecBatch.padded) that the metrics leave out."""
        n = self.eval_source.num_samples()
        steps = -(-n // self.global_batch)
        if self.cfg.training.eval_batches:
            steps = min(steps, self.cfg.training.eval_batches)
        source = self.eval_source.batches(
            self.batch_size, self.ctx.rank, self.ctx.world_size, drop_last=False
        )
        for _ in range(steps):
            batch = next(source, None)
            if batch is None:  # this rank's share of the split ended a batch earlier
                batch = self._empty_batch()
            yield batch.padded(self.batch_size).to_torchrec(
                self.keys, self.rows, self.zch.remap if self.zch else None
            )

    def _empty_batch(self) -> RecBatch:
        cfg = self.cfg
        return empty_rows(cfg.features.dense, len(self.keys), cfg.model.num_tasks).to_batch()

    def _eval_outputs(self, batches: Iterator[Batch]) -> Iterator[tuple[torch.Tensor, ...]]:
        """(loss, logits, labels) per held-out batch.

        TrainPipelineSparseDist rewrites the sharded modules' forward, so evaluation must go
        through it (it drains and restarts on a new iterator); the plain pipeline caches the
        training iterator it was connected to, so there the model is called directly.
        """
        if isinstance(self.pipeline, TrainPipelineSparseDist):
            while True:
                try:
                    yield self.pipeline.progress(batches)
                except StopIteration:
                    return
        for batch in batches:
            yield self.dmp(batch.to(self.ctx.device))[1]

    # ---- the loop ---------------------------------------------------------------------------
    def _boundaries(self, total: int) -> list[int]:
        """Steps where the pipeline drains: evaluations, checkpoints, ZCH rounds and the end."""
        t, c = self.cfg.training, self.cfg.checkpoint
        marks = {total}
        if self.zch is not None:  # a batch remapped before a round must be trained before it
            marks.update(self.zch.round_steps(self.pos.step, total))
        for every in (t.eval_every, c.every_steps):
            if every:
                marks.update(range(every, total, every))
        return sorted(m for m in marks if m > self.pos.step)

    def fit(self) -> dict[str, float]:
        total = self.total_steps()
        progress = None
        if self.ctx.is_main:
            progress = Progress(self.run / run_dir.METRICS_FILE, total, self.global_batch,
                                self.run / run_dir.TENSORBOARD_DIR)  # fmt: skip
            progress.start(self.pos.step)
            log(f"training {total} steps, {self.ctx.world_size} ranks x batch {self.batch_size}")
        self.step_profiler = StepProfiler(self.pos.step + PROFILE_WARMUP,
                                          self.cfg.training.profile_steps)  # fmt: skip
        positions: deque = deque()
        if self.zch is not None:
            self.zch.step = self.pos.step
        stream = self._train_stream(positions)
        metrics: dict[str, float] = {}
        for boundary in self._boundaries(total):
            self._train_segment(itertools.islice(stream, boundary - self.pos.step), positions,
                                total, progress)  # fmt: skip
            if self.pos.step < boundary:  # the data ran out before `total` steps
                if progress:  # said, not silent: a short run must not pass for a whole one
                    log(f"training stopped at step {self.pos.step} of {total}: the training "
                        "data ran out")  # fmt: skip
                break
            last = boundary == total
            evaluate = last or (
                self.cfg.training.eval_every and boundary % self.cfg.training.eval_every == 0
            )
            if self.zch is not None:  # training time, not a pause: every round is a cost of ZCH
                self._zch_round(boundary, bool(evaluate), progress)
            if self.publisher is not None and (evaluate or last):  # not held through the pause
                self.publisher.before_pause(self.pos.step)
            t0 = time.perf_counter()
            if evaluate:
                metrics = self.evaluate()
                if progress:
                    progress.eval(self.pos.step, metrics)
            if last or self.checkpointer.due(boundary):
                self.save(metrics, complete=last)
            if progress:
                progress.pause(time.perf_counter() - t0)
        self.finish(progress)
        return metrics

    def finish(self, progress: Progress | None) -> None:
        """The end of any run: the publisher closed, memory and step reports."""
        if self.publisher is not None:
            self.publisher.close(self.pos.step)
            self._report_published(self.publisher)
        self._report_memory(progress)
        self._report_steps(progress)
        if progress:
            progress.close()

    def _zch_round(self, step: int, evaluating: bool, progress: Progress | None) -> None:
        """The ZCH tables' round at `step` if one is due (rec.train.zch); a summary (log line,
        metrics.jsonl record of kind "zch") every SUMMARY_EVERY_ROUNDS rounds and at evaluations."""
        assert self.zch is not None
        ran = self.zch.round(step, self.dmp, self.optimizer, self.ctx.device)
        if self.publisher is not None and ran:  # the map changes with their fresh rows
            self.publisher.publish_map(step, ran)
        rounds = self.zch.rounds_done()
        if (evaluating or (ran and rounds % SUMMARY_EVERY_ROUNDS == 0)) and rounds:
            line, numbers = self.zch.summary()
            if progress:
                log(f"step {step}: {line}")
                progress.write({"kind": "zch", "step": step, **numbers})

    def _report_published(self, pub: publish.UpdatePublisher) -> None:
        """The rows every rank published (each publishes its own shards' rows) and the training
        time each spent publishing, gathered: the whole run's, not rank 0's share."""
        mine = torch.tensor([pub.published_rows, pub.publish_seconds], dtype=torch.float64,
                            device=self.ctx.device)  # fmt: skip
        every = [torch.zeros_like(mine) for _ in range(self.ctx.world_size)]
        dist.all_gather(every, mine)
        if self.ctx.is_main:
            rows = [int(t[0]) for t in every]
            per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(rows))
            slowest = max(float(t[1]) for t in every)
            log(f"published to {pub.url}: {sum(rows)} rows from {len(rows)} ranks ({per_rank}), "
                f"at most {slowest:.2f} s of a rank's training time")  # fmt: skip

    def _report_memory(self, progress: Progress | None) -> None:
        """Every rank's peak RSS, gathered, next to the plan's estimate for its shards."""
        peak = torch.tensor([peak_rss_bytes()], dtype=torch.int64, device=self.ctx.device)
        peaks = [torch.zeros_like(peak) for _ in range(self.ctx.world_size)]
        dist.all_gather(peaks, peak)
        if progress:
            planned = [r["host_memory"]["used"] + r["device_memory"]["used"]
                       for r in self.plan_report["ranks"]]  # fmt: skip
            progress.memory(self.pos.step, [int(p) for p in peaks], planned, self.plan_report)

    def _report_steps(self, progress: Progress | None) -> None:
        """Every rank's profiled step split and bytes sent (train.step_profile), gathered."""
        results: list[dict | None] = [None] * self.ctx.world_size
        dist.all_gather_object(results, self.step_profiler.result)
        if progress and all(r is not None for r in results):
            planned = [r["send_buffer_bytes"] for r in self.plan_report["ranks"]]
            progress.steps(self.pos.step, results, planned)  # type: ignore[arg-type]

    def new_segment(self) -> None:
        """Readies the pipeline for a segment's new iterator. TorchRec's TrainPipelineBase stays
        stopped once an iterator ends (every later progress() raises StopIteration), so without
        this a run with pipeline: base ended silently at its first evaluation or checkpoint;
        TrainPipelineSparseDist drains and restarts on a new iterator by itself. The reset is
        TrainPipelineBase's own (private) method: its batch in hand was trained before the
        StopIteration, so nothing is dropped."""
        if isinstance(self.pipeline, TrainPipelineBase):
            self.pipeline._reset_data_iter()

    def _train_segment(self, batches, positions: deque, total: int, progress) -> None:
        log_every = self.cfg.training.log_every
        self.new_segment()
        loss_sum, loss_n = 0.0, 0
        while True:
            factor = lr_factor(self.pos.step, total, self.cfg.training)
            set_dense_lr(self.optimizer, factor, self.cfg.training)
            spent = self.step_profiler.before(self.pos.step)
            try:
                loss, _, _ = self.pipeline.progress(batches)
            except StopIteration:
                spent += self.step_profiler.close()  # an evaluation or a checkpoint is next
                if progress:
                    progress.pause(spent)
                return
            self.pos.epoch, self.pos.offset = positions.popleft()
            self.pos.step += 1
            if self.publisher is not None:
                self.publisher.after_step(self.pos.step)
            spent += self.step_profiler.after(self.pos.step)
            if progress and spent:
                progress.pause(spent)
            loss_sum, loss_n = loss_sum + float(loss), loss_n + 1
            if self.pos.step % log_every == 0 or self.pos.step == total:
                mean = all_mean(loss_sum / loss_n, self.ctx.device)
                loss_sum, loss_n = 0.0, 0
                if progress:
                    progress.train(self.pos.step, mean, self.cfg.training.dense_lr * factor)

    def save(self, metrics: dict[str, float], complete: bool = False) -> None:
        plan_json = (self.run / run_dir.PLAN_FILE).read_bytes() if self.ctx.is_main else b""
        meta = {
            "world_size": self.ctx.world_size,
            "epoch": self.pos.epoch,
            "offset": self.pos.offset,
            "plan_digest": hashlib.sha256(plan_json).hexdigest()[:16],
            "eval": metrics,
            "skipped_rows": 0 if self.streaming else self.train_source.skipped_rows,
            "versions": library_versions(),
            # The last step of this length of run: `rec train --resume` has nothing to do unless
            # config.yaml's steps or epochs were raised since.
            "complete": complete,
            "length": {"steps": self.cfg.training.steps, "epochs": self.cfg.training.epochs},
            # The update log's generation that trained up to here (rec.contract.updates): a
            # server starting from an export of this step applies that log after (gen, step).
            "publish_gen": self.publisher.ident.gen if self.publisher is not None else None,
        }
        if self.streaming:
            meta["stream"] = stream_meta(self.stream_tally, self.cfg.data.stream)
        if self.publisher is not None:  # the log first: it must hold all this checkpoint trained
            self.publisher.flush(self.pos.step)
        step_dir = self.checkpointer.save(self.pos.step, self._state(), meta)
        if self.ctx.is_main:
            log(f"checkpoint committed: {step_dir}")


def _resume_point(run: Path, resume: bool) -> Path | None:
    """The checkpoint every rank resumes from, or None for a fresh start: rank 0's view, sent to
    all. Ranks that decided apart hung: after a host's ranks were killed, the other host's agent
    restarted its workers for the membership change without counting a restart, so its ranks
    started fresh while the killed host's resumed, and their collectives never met."""
    latest = run_dir.latest_checkpoint(run) if resume else None
    choice = [str(latest) if latest is not None else None]
    dist.broadcast_object_list(choice, src=0)
    return Path(choice[0]) if choice[0] is not None else None


def run_training(cfg: RecConfig, run: Path, resume: bool) -> dict[str, float]:
    """The body of every rank. Resumes from LATEST when asked, or after an elastic restart."""
    ctx = init_distributed(cfg.training)
    trainer = Trainer(cfg, run, ctx)
    latest = _resume_point(run, resume or ctx.attempt > 1)
    if latest is not None:
        trainer.resume(latest)
    if cfg.publish.url:
        trainer.start_publishing()
    metrics = fit_stream(trainer) if trainer.streaming else trainer.fit()
    if ctx.is_main:
        curve = plot_metrics(run / run_dir.METRICS_FILE, run / "training_curve.png")
        log(f"training curve: {curve}")
    dist.barrier()
    dist.destroy_process_group()
    return metrics
