"""`rec export --follow RUN`: every new committed checkpoint of a training run becomes a new
version of the model repository, and the newest `keep` versions stay.

    >>> follow("runs/live", "model_repository", keep=3)  # doctest: +SKIP
    version 2: step 400 in 2.4 s (3.1 s after its commit); torchscript AUC 0.71 ...

The loop, until SIGTERM or SIGINT:

1. Wait for a committed checkpoint newer than the one the repository's newest version holds
   (rec.run_dir.latest_checkpoint: LATEST, or the newest step dir with COMMITTED). Checked every
   `poll_s` seconds; reading two small files costs nothing.
2. Export the newest one with rec.export.export_run, which stages the version inside the
   repository and moves it in with renames: a server never sees a half-written version.
   Checkpoints committed while it ran are skipped (superseded): the next round takes the newest.
3. Prune each exported model to its newest `keep` versions (below).

Rows between versions: each version's rec.json `updates` names the (gen, step) its checkpoint
holds (meta.json's `publish_gen` and `step`), as for a plain export; a server that swaps to it
applies the update log's records after that point, so the log goes on filling in the rows
that training changes after the checkpoint.

Pruning (`keep` >= 2): a server polls the repository and swaps to the newest version, so it
serves the newest or, until its next poll, the one before. Keeping at least those two means a
version is deleted only once two newer ones are in the repository, that is at least one whole
export after its successor appeared; with exports that take longer than a server's poll
interval (`--poll-repository-s`), no server still serves or is loading it. Should one lag
anyway, it keeps serving what it loaded (the version lives in its memory; AOTInductor's
mapped tables.bin stays readable once unlinked), and a load that loses its files fails, is
logged, and the next poll loads the newest. A pruned version is first renamed into a staging
directory, then deleted, so no server sees a version directory half gone.

Stopping: the first SIGTERM or SIGINT stops at once when waiting, or after the export in
progress is committed and pruned (a version is never left half done); a second one abandons
that export, whose staging directory export_run's cleanup removes. Either way the repository
holds only whole versions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rec import run_dir
from rec.config import ConfigError
from rec.contract import ModelDir
from rec.export import formats
from rec.export import repository as repo_lib
from rec.export.build import Log
from rec.export.pipeline import ExportResult, export_run, resolve_config
from rec.export.verify import VerificationError

MIN_KEEP = 2  # the version a server serves and the one it is about to load (module docstring)
DEFAULT_KEEP = 3  # those two and one more to go back to by hand
DEFAULT_POLL_S = 1.0


@dataclass
class Exported:
    """One version written by the follower, as its progress line reports it."""

    step: int
    versions: dict[str, int]
    """Format -> the version written."""
    seconds: float
    """Export time, from starting to read the checkpoint to the version's commit."""
    behind_commit_s: float | None
    """From the checkpoint's commit to the version's commit (None: no commit time recorded)."""
    previous_step: int | None
    """The step of the version before it (None: the first); checkpoints in between were
    superseded while an export ran, and skipped."""
    pruned: dict[str, list[int]]
    verification: str


def commit_time(step_dir: Path) -> float | None:
    """When the checkpoint was committed: rec.run_dir.commit_checkpoint writes time.time()
    into COMMITTED."""
    with contextlib.suppress(OSError, ValueError):
        return float((step_dir / run_dir.COMMITTED_FILE).read_text().strip())
    return None


def step_of(step_dir: Path) -> int:
    return int(step_dir.name.removeprefix("step_"))


def exported_step(repo: Path, model_dir_name: str, run: Path) -> int | None:
    """The step of `run` that the model's newest version holds (rec.json `source`), or None
    when it holds none (no version, or one exported from another run)."""
    model = ModelDir.of(repo, model_dir_name)
    have = model.versions()
    if not have or not model.version_manifest(have[-1]).is_file():
        return None
    source = json.loads(model.version_manifest(have[-1]).read_text()).get("source", {})
    if source.get("run_dir") != str(run.resolve()):
        return None
    return source.get("step")


def prune(repo: Path, model_dir_name: str, keep: int) -> list[int]:
    """Deletes all but the newest `keep` versions of a model; returns the ones deleted."""
    if keep < MIN_KEEP:
        raise ConfigError(f"keep={keep!r} must be at least {MIN_KEEP} (module docstring)")
    model = ModelDir.of(repo, model_dir_name)
    old = model.versions()[:-keep]
    if not old:
        return []
    trash = repo_lib.staging_dir(repo)  # a crash mid-delete leaves it to the next export
    try:
        for v in old:
            os.rename(model.version(v), trash / str(v))  # gone from the server's view at once
    finally:
        shutil.rmtree(trash, ignore_errors=True)
    return old


def summary(result: ExportResult) -> str:
    """The export's verification in a few words: per format its held-out AUC against the float
    model's (or its largest difference from it), then the quality bar."""
    parts, ev = [], {}
    for fmt, m in result.manifests.items():
        checks = m["verification"]
        ev = checks["eval"]
        batched = checks["batched_vs_single_max_diff"].get(fmt)
        one = f"{fmt} "
        if fmt in ev:
            q = ev[fmt]
            one += f"AUC {q['auc']:.4f} (x{q['auc_ratio']:.5f} of float)"
        else:
            one += f"max |diff| vs float {ev.get(f'{fmt}_max_abs_diff_vs_float', float('nan')):.1e}"
        parts.append(one + f", batched-single {batched:.0e}")
    if "quality_bar_passed" in ev:
        parts.append("quality bar " + ("passed" if ev["quality_bar_passed"] else "NOT passed"))
    return "; ".join(parts)


def format_line(e: Exported) -> str:
    versions = ", ".join(f"{fmt} {v}" for fmt, v in e.versions.items())
    after = "" if e.behind_commit_s is None else f" ({e.behind_commit_s:.1f} s after its commit)"
    since = "" if e.previous_step is None else f" (+{e.step - e.previous_step})"
    pruned = sorted({v for vs in e.pruned.values() for v in vs})
    gone = f"; pruned {', '.join(map(str, pruned))}" if pruned else ""
    return (f"version {versions}: step {e.step}{since} in {e.seconds:.1f} s{after}{gone}; "
            f"verified: {e.verification}")  # fmt: skip


class StopSignal:
    """SIGTERM and SIGINT, while the follower runs: the first sets `requested` (stop when idle,
    or once the export in progress is committed); the second raises KeyboardInterrupt, which
    abandons that export (export_run's cleanup removes its staging directory)."""

    def __init__(self, log: Log) -> None:
        self.requested = False
        self._log = log

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._log(f"{signal.Signals(signum).name}: stopping once the export in progress (if "
                  "any) is committed; send it again to abandon that export")  # fmt: skip

    def sleep(self, seconds: float) -> None:
        """Sleeps up to `seconds`, less once a stop is requested. Short sleeps, not
        Event.wait: a handler that sets an Event can deadlock with a wait in the same thread."""
        end = time.monotonic() + seconds
        while not self.requested and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))


@contextlib.contextmanager
def stop_on_signals(log: Log) -> Iterator[StopSignal]:
    """A StopSignal installed for SIGTERM and SIGINT (main thread only), then the old handlers."""
    stop = StopSignal(log)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals go to the main thread; the caller sets stop.requested itself
        return
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _newest_checkpoint(run: Path, stop: StopSignal, poll_s: float, log: Log) -> Path | None:
    """The run's newest committed checkpoint, once there is one (training may not have written
    its first yet); None if stopped before."""
    said = False
    while not stop.requested:
        if (run / run_dir.CONFIG_FILE).is_file():
            found = run_dir.latest_checkpoint(run)
            if found is not None:
                return found
        if not said:
            log(f"waiting for a committed checkpoint in {run}")
            said = True
        stop.sleep(poll_s)
    return None


def export_one(run: Path, repo: Path, step_dir: Path, previous: int | None, keep: int,
               log: Log, detail: Log | None, **export_args: Any) -> Exported | None:  # fmt: skip
    """Exports one checkpoint as the next version and prunes; None when there is no version to
    show for it: its verification failed (said, and the follower moves on to the next
    checkpoint), or training deleted it meanwhile (checkpoint.keep_last). export_run's own
    lines go to `detail`; without it, only its warnings, to `log`."""
    start = time.monotonic()
    lines: list[str] = []

    def export_log(line: str) -> None:
        lines.append(line)
        if detail is not None:
            detail(line)

    try:
        result = export_run(run, repo, checkpoint=str(step_dir), log=export_log, **export_args)
    except VerificationError as e:
        log(f"step {step_of(step_dir)} not exported, verification failed: {e}")
        return None
    except Exception:
        if step_dir.exists():
            raise
        log(f"step {step_of(step_dir)}: deleted by training while exporting "
            "(checkpoint.keep_last); taking the newest")  # fmt: skip
        return None
    for line in lines if detail is None else []:
        if line.startswith("warning"):
            log(line)
    seconds = time.monotonic() - start
    committed = commit_time(step_dir)
    pruned = {fmt: prune(repo, path.parent.name, keep) for fmt, path in result.models.items()}
    return Exported(
        step=step_of(step_dir),
        previous_step=previous,
        versions={fmt: int(path.name) for fmt, path in result.models.items()},
        seconds=seconds,
        behind_commit_s=None if committed is None else time.time() - committed,
        pruned=pruned,
        verification=summary(result),
    )


def follow(
    run: str | Path,
    repo: str | Path = "model_repository",
    *,
    keep: int = DEFAULT_KEEP,
    quantize: str | None = None,
    fmt: str | None = None,
    config: str | Path | None = None,
    poll_s: float = DEFAULT_POLL_S,
    log: Log = print,
    detail: Log | None = None,
) -> list[Exported]:
    """Exports each new committed checkpoint of `run` into `repo` until SIGTERM or SIGINT
    (module docstring); returns what it wrote.

    Args:
        run: run directory, still training or not yet started.
        repo: model repository. keep: versions kept per model (>= 2).
        quantize, fmt, config: as for export_run. poll_s: how often to look for a checkpoint.
        log: the follower's lines, one per version. detail: export_run's own lines (default:
            only its warnings, to `log`).
    """
    run, repo = Path(run), Path(repo)
    if keep < MIN_KEEP:
        raise ConfigError(f"--keep {keep} must be at least {MIN_KEEP}: the version a server "
                          "serves and the one it is about to load")  # fmt: skip
    done: list[Exported] = []
    with stop_on_signals(log) as stop:
        if _newest_checkpoint(run, stop, poll_s, log) is None:
            return done
        cfg = resolve_config(run, quantize, fmt, config)
        if cfg.export.store.url:
            raise ConfigError("--follow with export.store: pruning a version would have to "
                              "delete its rows from the store, which it does not yet")  # fmt: skip
        first_model = formats.get(formats.resolve(cfg.export.format)[0])
        last = exported_step(repo, first_model.model_dir_name(cfg.export.model_name), run)
        if last is not None:
            log(f"the repository's newest version holds step {last}; following from there")
        while not stop.requested:
            step_dir = run_dir.latest_checkpoint(run)
            if step_dir is None or (last is not None and step_of(step_dir) <= last):
                stop.sleep(poll_s)
                continue
            try:
                exported = export_one(run, repo, step_dir, last, keep, log, detail,
                                      quantize=quantize, fmt=fmt, config=config)  # fmt: skip
            except KeyboardInterrupt:
                if not stop.requested:
                    raise
                log(f"abandoned the export of step {step_of(step_dir)}; nothing of it was kept")
                break
            if exported is not None:
                done.append(exported)
                log(format_line(exported))
            # A checkpoint that failed verification is not tried again; a deleted one is gone.
            last = step_of(step_dir)
        log(f"stopped after {len(done)} version(s)")
    return done
