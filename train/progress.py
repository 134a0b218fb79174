"""Rank 0's progress lines, the run's metrics.jsonl and its TensorBoard event files."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rec.metrics import AUC, LOG_LOSS
from rec.train.step_profile import COLLECTIVES, PHASES


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Prints `step, loss, AUC, samples/s, ETA` lines and appends every record to metrics.jsonl,
    and its numbers as scalars to TensorBoard event files in `tensorboard_dir` when given.

    Only rank 0 makes one; other ranks pass `None` around.
    """

    def __init__(
        self,
        metrics_path: Path,
        total_steps: int,
        samples_per_step: int,
        tensorboard_dir: Path | None = None,
    ) -> None:
        self.metrics_path = metrics_path
        self._board = _Board(tensorboard_dir) if tensorboard_dir is not None else None
        self.total_steps = total_steps
        self.samples_per_step = samples_per_step
        self.last_auc: float | None = None
        self._t_last = time.perf_counter()
        self._step_last: int | None = None
        self._t_start = self._t_last
        self._step_start: int | None = None

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._board is not None:
            self._board.add(record)

    def close(self) -> None:
        if self._board is not None:
            self._board.close()

    def start(self, step: int) -> None:
        self._step_last = self._step_start = step
        self._t_last = self._t_start = time.perf_counter()

    def pause(self, seconds: float) -> None:
        """Excludes time spent outside training steps (eval, checkpoints) from the rate."""
        self._t_last += seconds
        self._t_start += seconds

    def train(self, step: int, loss: float, lr: float) -> None:
        now = time.perf_counter()
        steps = step - (self._step_last or 0)
        rate = steps * self.samples_per_step / max(now - self._t_last, 1e-9)
        done = step - (self._step_start or 0)
        overall = done / max(now - self._t_start, 1e-9)
        eta = (self.total_steps - step) / overall if overall > 0 else 0.0
        self._t_last, self._step_last = now, step
        self.write(
            {"kind": "train", "step": step, "loss": loss, "lr": lr, "samples_per_s": round(rate, 1)}
        )
        auc = f"{self.last_auc:.4f}" if self.last_auc is not None else "  -   "
        pct = 100.0 * step / max(self.total_steps, 1)
        print(
            f"step {step:>6}/{self.total_steps} ({pct:5.1f}%) | loss {loss:.4f} | "
            f"eval auc {auc} | {rate:8.0f} samples/s | eta {_duration(eta)}",
            flush=True,
        )

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.last_auc = metrics[AUC]
        self.write({"kind": "eval", "step": step, **metrics})
        parts = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in metrics.items())  # fmt: skip
        print(f"eval @ step {step}: {parts}", flush=True)

    def steps(self, step: int, per_rank: list[dict[str, Any]],
              planned: list[dict[str, int]]) -> None:  # fmt: skip
        """Per rank: the profiled steps' time split and bytes sent (train.step_profile) next to
        the plan's send buffers (plan_stats.send_buffers), one list per field in metrics.jsonl
        (`plan_<collective>_bytes` for the plan's), a line per rank in the output."""
        fields = [k for k in per_rank[0] if k != "steps"]
        plan = {f"plan_{c}_bytes": [p[c] for p in planned] for c in COLLECTIVES}
        self.write({"kind": "step_time", "step": step, "profiled_steps": per_rank[0]["steps"],
                    **{k: [r[k] for r in per_rank] for k in fields}, **plan})  # fmt: skip
        for rank, (r, plan) in enumerate(zip(per_rank, planned, strict=True)):
            split = " + ".join(f"{p} {r[p + '_ms']:.2f}" for p in PHASES)
            sent = ", ".join(f"{c} {_kib(r[c + '_bytes'])} (plan {_kib(plan[c])})"
                             for c in COLLECTIVES)  # fmt: skip
            log(f"rank {rank}: step {r['step_ms']:.2f} ms = {split} ms "
                f"({r['steps']} steps profiled); sends per step: {sent}")  # fmt: skip

    def mean_step_ms(self) -> float | None:
        """The run's mean step so far, evaluations, checkpoints and profiling left out."""
        done = (self._step_last or 0) - (self._step_start or 0)
        return (self._t_last - self._t_start) * 1e3 / done if done > 0 else None

    def memory(self, step: int, peak_rss: list[int], planned: list[int],
               report: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Per rank: peak RSS next to this CPU's calibrated estimate (the plan report's
        `calibrated`, train.plan_estimate) part by part, and TorchRec's planner's estimate for
        its shards (`planned`); the run's mean step next to the estimated one."""
        cal = (report or {}).get("calibrated")
        estimated = [r["memory_bytes"] for r in cal["ranks"]] if cal else [None] * len(planned)
        measured_ms = self.mean_step_ms()
        self.write({"kind": "memory", "step": step, "peak_rss_bytes": peak_rss,
                    "plan_shard_bytes": planned,
                    "estimated_bytes": [e["total"] for e in estimated] if cal else None,
                    "estimated_step_ms": cal["step_ms"] if cal else None,
                    "measured_step_ms": measured_ms})  # fmt: skip
        if cal and measured_ms:
            loads = f"{os.getloadavg()[0]:.1f} now, {cal.get('load_avg') or 0:.1f} when calibrated"
            log(f"step: estimated {cal['step_ms']:.1f} ms (slowest rank, this CPU's calibration: "
                f"rec plan), measured {measured_ms:.1f} ms (the run's mean, evaluations and "
                f"checkpoints left out): {cal['step_ms'] / measured_ms:.2f}x; load average "
                f"{loads}")  # fmt: skip
        for rank, (peak, plan, est) in enumerate(zip(peak_rss, planned, estimated, strict=True)):
            mine = "no calibration of this CPU (rec plan makes one)"
            if est is not None:
                parts = " + ".join(f"{k.replace('_', ' ')} {_gib(est[k])[:-4]}"
                                   for k in est if k != "total")  # fmt: skip
                mine = f"estimated {_gib(est['total'])} ({est['total'] / peak:.2f}x: {parts})"
            log(
                f"rank {rank}: peak RSS {_gib(peak)}, {mine}; TorchRec's planner: "
                f"the plan's estimate for its shards {_gib(plan)}"
            )
        if cal and cal.get("profile_steps"):
            log(f"the estimate leaves out what torch.profiler holds over the "
                f"{cal['profile_steps']} profiled steps (about 0.2 GiB per rank on the "
                "Kaggle-size model); training.profile_steps: 0 runs without them")  # fmt: skip


class _Board:
    """metrics.jsonl's records as TensorBoard scalars, through torch's SummaryWriter (the
    `tensorboard` package's event-file format): `<kind>/<name>` at the record's step, and
    `<kind>/<name>/rank_<r>` for per-rank lists. A resumed run adds an event file beside the
    first one; TensorBoard reads them as one run."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def add(self, record: dict[str, Any]) -> None:
        kind, step = record.get("kind"), record.get("step")
        if kind is None or step is None:
            return
        for name, value in record.items():
            if name in ("kind", "step", "time"):
                continue
            values = value if isinstance(value, list) else [value]
            for rank, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                tag = f"{kind}/{name}/rank_{rank}" if isinstance(value, list) else f"{kind}/{name}"
                self.writer.add_scalar(tag, v, global_step=step, walltime=record["time"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def _gib(n: float) -> str:
    return f"{n / 1024**3:.3f} GiB"


def log(msg: str) -> None:
    print(f"[rec train] {msg}", file=sys.stdout, flush=True)


def single_eval_note(evals: list[dict]) -> str | None:
    """What the AUC panel says when it has one point: a run no longer than training.eval_every
    is evaluated only at its end, so it has no curve to draw."""
    if len(evals) != 1:
        return None
    r = evals[0]
    return (f"one evaluation (AUC {r[AUC]:.4f} at step {r['step']}):\n"
            "set training.eval_every below training.steps for a curve")  # fmt: skip


def plot_metrics(metrics_path: Path, out: Path) -> Path:
    """Training loss and held-out AUC against step, from metrics.jsonl, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    # Runs started before rec.metrics named it log_loss logged "logloss".
    losses = [r.get(LOG_LOSS, r.get("logloss")) for r in evals]
    if evals:
        ax_loss.plot([r["step"] for r in evals], losses, "o-", label="held-out log loss")
    ax_loss.set_xlabel("step")
    ax_loss.legend()
    ax_auc.plot([r["step"] for r in evals], [r[AUC] for r in evals], "o-", color="C2")
    ax_auc.set_xlabel("step")
    ax_auc.set_ylabel("held-out AUC")
    # A run training from a stream validates progressively: each batch scored before its step.
    online = [r for r in records if r["kind"] == "online" and AUC in r]
    if online:
        steps = [r["step"] for r in online]
        ax_loss.plot(steps, [r[LOG_LOSS] for r in online], label="online log loss")
        ax_loss.legend()
        ax_auc.plot(steps, [r[AUC] for r in online], color="C3", label="online AUC")
        ax_auc.set_ylabel("AUC")
        ax_auc.legend()
    if not online and (note := single_eval_note(evals)) is not None:
        ax_auc.set_title(note, fontsize=9)
        ax_auc.set_xlim(ax_loss.get_xlim())  # the point where it is in the run, not alone
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
