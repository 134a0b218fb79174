"""One rank of `rec train`: shard the model, train, evaluate, checkpoint (Contract 1 writer)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv

from rec import metrics, run_dir, zch
from rec.batch import PAD_LABEL, RecBatch
from rec.config import RecConfig
from rec.contract.sections import ZCH_MAP_LAYOUT
from rec.data import make_source
from rec.data.source import DataSource, empty_rows
from rec.logs import update_trim
from rec.model import TrainModel, build_model, embedding_modules, table_rows
from rec.train import plan_stats, publish, sharding
from rec.train.batch_source import BatchSource, FileEpochs, Position
from rec.train.checkpoint import Checkpointer
from rec.train.distributed import (
    DistContext,
    gather_rows,
    init_distributed,
    peak_rss_bytes,
)
from rec.train.optim import attach_embedding_optimizer, lr_factor, make_optimizer, set_dense_lr
from rec.train.progress import Progress, log, plot_metrics
from rec.train.step_profile import StepProfiler
from rec.train.stream_loop import StreamSource
from rec.train.zch import SUMMARY_EVERY_ROUNDS, ZchTables
from rec.versions import library_versions

# Steps run before the profiled window (train.step_profile): the first ones build the
# pipeline and warm caches, and are slower than the rest.
PROFILE_WARMUP = 5
# A segment with no boundary ahead (a stream with no checkpoint by steps, round or step limit)
# is effectively unbounded; ZCH rounds are looked for this far ahead.
UNBOUNDED = 1 << 62
ZCH_HORIZON = 1_000_000


class Trainer:
    def __init__(self, cfg: RecConfig, run: Path, ctx: DistContext) -> None:
        self.cfg, self.run, self.ctx = cfg, run, ctx
        self.keys = list(cfg.features.sparse)
        self.rows = table_rows(cfg)
        self.batch_size = cfg.training.batch_size
        self.global_batch = self.batch_size * ctx.world_size
        self.pos = Position()
        self.zch = ZchTables.of(cfg, self.keys)
        self.source: BatchSource
        # A stream run validates online (rec.train.stream_loop): it has no held-out split.
        self.eval_source: DataSource | None = None
        if cfg.data.stream.url:
            self.source = StreamSource(cfg, ctx, self.train_batch)
        else:
            self.source = FileEpochs(cfg, ctx, self.train_batch)
            self.eval_source = make_source(cfg, "eval")
            if self.eval_source.num_samples() == 0:
                raise ValueError("the held-out split has no samples to evaluate on")
        self.quality: dict[str, float] = {}
        """The last evaluation's metrics (a stream's: its last window's online metrics)."""
        self.saved_step = 0
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
        self.resumed_meta: dict | None = None  # the checkpoint's meta.json, after resume()
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
        ident = [publish.next_identity(self.run, self.cfg.publish, self.ctx.world_size)
                 if self.ctx.is_main else None]  # fmt: skip
        dist.broadcast_object_list(ident, src=0)
        self.publisher = publish.UpdatePublisher(self.cfg, self.dmp, self.ctx.rank,
                                                 self.ctx.world_size, ident[0], log,
                                                 zch=self.zch)  # fmt: skip
        if self.ctx.is_main:
            parts = f", {len(ident[0].keys)} partitions" if ident[0].keys else ""
            log(f"publishing changed rows to {self.publisher.url} (run {ident[0].run}, "
                f"generation {ident[0].gen}{parts})")  # fmt: skip
        if self.resumed_meta is not None and not publish.log_holds(self.resumed_meta):
            # Trained (at least in part) without publishing: the log lacks rows a replica's
            # watermark would pass. Every row, which also undoes any dead generation's.
            n = torch.tensor([self.publisher.republish_all(self.pos.step)],
                             device=self.ctx.device)  # fmt: skip
            dist.all_reduce(n)  # every rank's shards: the whole model's rows
            if self.ctx.is_main:
                log(f"re-sent all {int(n)} rows at their step-{self.pos.step} values: this "
                    "checkpoint was trained without publishing")  # fmt: skip
        elif ident[0].gen > 1:  # a resume: undo what the last generation published past here
            n = self.publisher.republish_undone(self.pos.step)
            if self.ctx.is_main and n:
                log(f"re-sent {n} rows at their step-{self.pos.step} values: the last "
                    "generation published them after this checkpoint")  # fmt: skip

    def resume(self, step_dir: Path) -> None:
        """Loads a checkpoint written at any world size into this (re)sharded model."""
        meta = run_dir.read_meta(step_dir)
        if self.zch is not None:  # before loading: maps another home() placed would misread
            zch.check_checkpoint_layout(meta, step_dir)
        _, dense = self.optimizer.optimizers[-1]
        dense.init_state()  # Adam's state is lazy; DCP loads into existing tensors only
        state = self._state()
        fresh = Checkpointer.load(step_dir, state)
        self.dmp.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        t = state["train"]
        self.pos = Position(int(t["step"]), int(t["epoch"]), int(t["offset"]))
        self.resumed_meta = meta
        torch.set_rng_state(t["rng"])
        self.source.resume(step_dir)
        if self.ctx.is_main:
            log(f"resumed from {step_dir} at step {self.pos.step} (epoch {self.pos.epoch})")
            if self.zch is not None:
                log(f"resumed id maps: {self.zch.live_line()}")
        if self.ctx.is_main and fresh:  # the plan moved them to or from data_parallel
            log(f"table(s) {', '.join(fresh)}: rows as saved, optimizer state fresh: this plan "
                "shards them otherwise, and a data_parallel table is trained by the dense "
                "optimizer, any other by the embedding one")  # fmt: skip

    # ---- data -------------------------------------------------------------------------------
    def train_batch(self, batch: RecBatch) -> Batch:
        """A training batch as the model takes it; ZCH tables remap (and count) its ids."""
        return batch.to_torchrec(self.keys, self.rows, self.zch.remap_train if self.zch else None)

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
    def fit(self) -> dict[str, float]:
        """The one training loop, for files and streams alike (rec.train.batch_source): segments
        of steps between drained boundaries, and at each boundary the ZCH round, an evaluation
        and a checkpoint when due, until the source's end or a stop. Returns the last
        evaluation's metrics (a stream's: its last window's online metrics)."""
        source, total = self.source, self.source.total_steps(self.pos)
        progress = None
        if self.ctx.is_main:
            progress = Progress(self.run / run_dir.METRICS_FILE, total or 0, self.global_batch,
                                self.run / run_dir.TENSORBOARD_DIR)  # fmt: skip
            progress.start(self.pos.step)
        self.step_profiler = StepProfiler(self.pos.step + PROFILE_WARMUP,
                                          self.cfg.training.profile_steps)  # fmt: skip
        if self.zch is not None:
            self.zch.step = self.pos.step
        self.saved_step = self.pos.step
        why, first_step = None, self.pos.step
        try:
            source.start(self.pos, progress)
            stop = self._reached(total)
            while not stop:
                before = self.pos.step
                limit = self._next_boundary(total) - before
                self._train_segment(source.segment(limit), total, progress)
                why = source.should_stop()
                stop = why is not None or self._reached(total)
                self._boundary(total, stop, self.pos.step > before, progress)
        finally:
            source.close()
        if progress and why:
            log(f"stopped at step {self.pos.step}: {why}")
        self.finish(progress)
        source.ended(first_step, self.pos.step)  # a stream that refused every event: an error
        return self.quality

    def _reached(self, total: int | None) -> bool:
        return total is not None and self.pos.step >= total

    def _next_boundary(self, total: int | None) -> int:
        """The next step where the pipeline drains: an evaluation, a checkpoint by steps, a ZCH
        round (a batch remapped before a round must be trained before it), or the end."""
        step, t = self.pos.step, self.cfg.training
        every = [
            self.cfg.checkpoint.every_steps,
            t.eval_every if self.eval_source is not None else 0,
        ]
        marks = [(step // e + 1) * e for e in every if e]
        if total is not None:
            marks.append(total)
        if self.zch is not None:
            marks.extend(self.zch.round_steps(step, min(marks, default=step + ZCH_HORIZON)))
        return min(marks, default=step + UNBOUNDED)

    def _boundary(self, total: int | None, stop: bool, moved: bool,
                  progress: Progress | None) -> None:  # fmt: skip
        """At a drained step: the ZCH round and an evaluation when due (not again at a step
        that already had them: a segment that trained nothing), then a checkpoint when due;
        before a checkpoint, every ZCH table's round (ZchTables.round's flush)."""
        step, t = self.pos.step, self.cfg.training
        evaluate = (
            moved
            and self.eval_source is not None
            and (stop or bool(t.eval_every and step % t.eval_every == 0))
        )
        due = self.source.checkpoint_due(step) or stop or self.checkpointer.due(step)
        save = due and step > self.saved_step
        if self.zch is not None and (moved or save or stop):  # training time, not a pause
            # Its summary goes with an evaluation, a stream's online metrics line, the stop.
            online = self.source.online and step % t.log_every == 0
            self._zch_round(step, evaluate or online or stop, save, progress)
        if self.publisher is not None and (evaluate or save):  # not held through the pause
            self.publisher.before_pause(step)
        t0 = time.perf_counter()
        if evaluate:
            self.quality = self.evaluate()
            if progress:
                progress.eval(step, self.quality)
        if save:
            self.save(self.quality, complete=self._reached(total))
            self.source.after_checkpoint(step)
        if progress:
            progress.pause(time.perf_counter() - t0)

    def finish(self, progress: Progress | None) -> None:
        """The end of any run: the publisher closed, memory and step reports."""
        if self.publisher is not None:
            self.publisher.close(self.pos.step)
            self._report_published(self.publisher)
        self._report_memory(progress)
        self._report_steps(progress)
        if progress:
            progress.close()

    def _zch_round(self, step: int, say: bool, flush: bool, progress: Progress | None) -> None:
        """The ZCH tables' round at `step` if one is due, or each table's before a checkpoint
        (`flush`, rec.train.zch); a summary (log line, metrics.jsonl record of kind "zch")
        every SUMMARY_EVERY_ROUNDS rounds and when `say` (evaluations, a stream's progress
        lines, the stop)."""
        assert self.zch is not None
        ran = self.zch.round(step, self.dmp, self.optimizer, self.ctx.device, flush=flush)
        if self.publisher is not None and ran:  # the map changes with their fresh rows
            self.publisher.publish_map(step, ran)
        rounds = self.zch.rounds_done()
        if (say or (ran and rounds % SUMMARY_EVERY_ROUNDS == 0)) and rounds:
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

    def _train_segment(self, batches: Iterator[Batch], total: int | None,
                       progress: Progress | None) -> None:  # fmt: skip
        """Steps until the segment's batches end; the source's report every log_every steps
        and at the last one."""
        t = self.cfg.training
        self.new_segment()
        while True:
            factor = lr_factor(self.pos.step, total or 0, t)
            set_dense_lr(self.optimizer, factor, t)
            spent = self.step_profiler.before(self.pos.step)
            try:
                loss, logits, labels = self.pipeline.progress(batches)
            except StopIteration:
                if self.publisher is not None and self.step_profiler.recording:
                    self.publisher.before_pause(self.pos.step)  # closing the window pauses
                spent += self.step_profiler.close()  # a boundary is next
                if progress:
                    progress.pause(spent)
                return
            self.pos.step += 1
            self.source.after_step(self.pos, loss, logits, labels)
            if self.publisher is not None:
                self.publisher.after_step(self.pos.step)
                if self.step_profiler.closes_after():  # rows trained in the window go first
                    self.publisher.before_pause(self.pos.step)
            spent += self.step_profiler.after(self.pos.step)
            if progress and spent:
                progress.pause(spent)
            if self.pos.step % t.log_every == 0 or self.pos.step == total:
                quality = self.source.report(self.pos.step, t.dense_lr * factor)
                if quality:
                    self.quality = quality

    def save(self, metrics: dict[str, float], complete: bool = False) -> None:
        plan_json = (self.run / run_dir.PLAN_FILE).read_bytes() if self.ctx.is_main else b""
        pub = self.publisher
        gen = pub.ident.gen if pub is not None else publish.last_gen(self.run)
        meta = {
            "world_size": self.ctx.world_size,
            "epoch": self.pos.epoch,
            "offset": self.pos.offset,
            "plan_digest": hashlib.sha256(plan_json).hexdigest()[:16],
            "eval": metrics,
            "versions": library_versions(),
            # The last step of this length of run: `rec train --resume` has nothing to do unless
            # config.yaml's steps or epochs were raised since.
            "complete": complete,
            "length": {"steps": self.cfg.training.steps, "epochs": self.cfg.training.epochs},
            # The update log's generation that trained up to here (rec.contract.updates): a
            # server starting from an export of this step applies that log after (gen, step).
            # Trained without publishing: the last generation that did, whose records up to this
            # step such an export holds newer rows for.
            "publish_gen": gen,
            # The log holds every row trained up to here (publish.log_holds): a resume that
            # publishes from a checkpoint without it re-sends every row first.
            "published": pub is not None,
            # The home() that placed the id maps' ids (rec.zch.check_checkpoint_layout).
            zch.CHECKPOINT_LAYOUT_KEY: ZCH_MAP_LAYOUT,
        }
        meta.update(self.source.meta())  # skipped rows; a stream's positions (collective)
        tails = None  # each partition's last entry before the flush: the trim's upper bound
        if self.publisher is not None and self.ctx.is_main:
            tails = update_trim.safe_tails(self.cfg.publish.url, log)
            # What an export of this step needs of the log at most: `rec export --follow`
            # registers it as a reader (rec.logs.update_trim).
            meta["publish_tails"] = tails
        if self.publisher is not None:  # the log first: it must hold all this checkpoint trained
            self.publisher.flush(self.pos.step)
        step_dir = self.checkpointer.save(
            self.pos.step, self._state(), meta, self.source.write_files
        )
        self.saved_step = self.pos.step
        if self.ctx.is_main:
            log(f"checkpoint committed: {step_dir}")
        if tails and self.cfg.publish.trim:  # rank 0: the log below what readers and it need
            update_trim.trim_log(self.cfg.publish, tails, gen, self.pos.step, log=log)


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
    metrics = trainer.fit()
    if ctx.is_main:
        curve = plot_metrics(run / run_dir.METRICS_FILE, run / "training_curve.png")
        log(f"training curve: {curve}")
    dist.barrier()
    dist.destroy_process_group()
    return metrics
