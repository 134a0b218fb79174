"""`rec export --follow RUN`: every new committed checkpoint of a training run becomes a new
version of the model repository, and the newest `keep` versions stay.

    >>> follow("runs/live", "model_repository", keep=3)  # doctest: +SKIP
    version torchscript 2: step 400 (+200) in 2.4 s (3.1 s after its commit); verified: ...

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

Each export runs in a process of its own, forked from a multiprocessing forkserver that has
imported torch once: scripting a model leaves its compiled code in TorchScript's process-wide
compilation unit (about 1.2 MiB per export of the tests' tiny model, 19 more functions each
time), so exporting in the follower itself grows it for as long as it runs. A forked child
costs milliseconds, not the seconds of a fresh interpreter's imports.

Stopping: the first SIGTERM or SIGINT stops at once when waiting, or after the export in
progress is committed and pruned (a version is never left half done); a second one abandons
that export: the child gets SIGTERM and export_run's cleanup removes its staging directory.
Either way the repository holds only whole versions.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rec import run_dir, warnings_filter
from rec.config import ConfigError
from rec.contract import ModelDir
from rec.export import formats
from rec.export import repository as repo_lib
from rec.export.build import Log
from rec.export.pipeline import ExportResult, export_run, resolve_config
from rec.export.verify import VerificationError
from rec.logs.update_trim import Registration, oldest, reader_name

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
    or once the export in progress is committed); the second sets `abandon` (stop that
    export's process). Flags only: the loops read them."""

    def __init__(self, log: Log) -> None:
        self.requested = False
        self.abandon = False
        self._log = log

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.abandon = True
            return
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


def _export_child(conn: Any, run: Path, repo: Path, step_dir: Path, args: dict) -> None:
    """An export in its own process: its lines, then ("result", ExportResult), ("error", e) or
    ("abandoned", None), through `conn`."""
    # Ctrl-C reaches the whole process group: the follower decides, and sends SIGTERM to abandon.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # KeyboardInterrupt: cleanup runs
    warnings_filter.install()
    if "OMP_NUM_THREADS" not in os.environ:
        # Beside training, on the same cores: with torch's default (a thread per core) the
        # default model's export took 1.8-2.8 s on 2 busy cores, against 0.4-0.8 s on one.
        torch.set_num_threads(1)
    try:
        log = lambda line: conn.send(("line", line))  # noqa: E731
        conn.send(("result", export_run(run, repo, checkpoint=str(step_dir), log=log, **args)))
    except KeyboardInterrupt:
        conn.send(("abandoned", None))
    except Exception as e:
        if not isinstance(e, ConfigError | VerificationError | OSError):
            traceback.print_exc()  # the follower stops with it: show where
        try:
            conn.send(("error", e))
        except Exception:  # an exception that does not pickle
            conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}")))
    finally:
        conn.close()


# Imported once, in the forkserver: torch and everything an export imports on its way.
PRELOAD = ["rec.export.follow", "rec.export.formats.torchscript", "rec.export.formats.onnx",
           "rec.export.formats.aoti", "rec.data.source", "rec.data.synthetic"]  # fmt: skip


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_export(run: Path, repo: Path, step_dir: Path, stop: StopSignal, on_line: Log,
               args: dict) -> ExportResult | None:  # fmt: skip
    """export_run in a child process (module docstring), its lines to `on_line`; None when
    abandoned (stop.abandon). Raises what export_run raised."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_export_child, args=(send, run, repo, step_dir, args),
                        name=f"rec export {step_dir.name}")  # fmt: skip
    child.start()
    send.close()  # the child holds the only write end: its exit ends the pipe (EOFError)
    outcome: tuple[str, Any] = ("died", None)
    terminated = False
    while True:
        if stop.abandon and not terminated:
            child.terminate()
            terminated = True
        if not receive.poll(0.1):
            continue
        try:
            kind, value = receive.recv()
        except EOFError:
            break
        if kind == "line":
            on_line(value)
        else:
            outcome = (kind, value)
    child.join(30)
    if child.is_alive():  # stuck in a native call past SIGTERM
        child.kill()
        child.join()
        for left in repo.glob(f".staging-{child.pid}-*"):
            shutil.rmtree(left, ignore_errors=True)
    kind, value = outcome
    if kind == "result":
        return value
    if kind == "error":
        raise value
    if terminated:
        return None
    raise RuntimeError(f"the export of {step_dir} died (exit code {child.exitcode})")


def export_one(run: Path, repo: Path, step_dir: Path, previous: int | None, keep: int,
               stop: StopSignal, log: Log, detail: Log | None,
               **export_args: Any) -> Exported | None:  # fmt: skip
    """Exports one checkpoint as the next version and prunes; None when there is no version to
    show for it: abandoned (stop.abandon), its verification failed (said, and the follower
    moves on to the next checkpoint), or training deleted it meanwhile
    (checkpoint.keep_last). export_run's own lines go to `detail`; without it, only its
    warnings, to `log`."""
    start = time.monotonic()
    lines: list[str] = []

    def export_log(line: str) -> None:
        lines.append(line)
        if detail is not None:
            detail(line)

    try:
        result = run_export(run, repo, step_dir, stop, export_log, export_args)
    except VerificationError as e:
        log(f"step {step_of(step_dir)} not exported, verification failed: {e}")
        return None
    except Exception:
        if step_dir.exists():
            raise
        log(f"step {step_of(step_dir)}: deleted by training while exporting "
            "(checkpoint.keep_last); taking the newest")  # fmt: skip
        return None
    if result is None:
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
    # The forkserver imports torch while the follower waits, not when the first export is due.
    _context()
    multiprocessing.forkserver.ensure_running()
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
        served = _ServedPlaces(cfg.publish.url, keep)
        try:
            export_args = dict(quantize=quantize, fmt=fmt, config=config)
            last = _follow_loop(run, repo, last, keep, poll_s, stop, log, detail, done, served,
                                export_args)  # fmt: skip
        finally:
            served.stop()
        log(f"stopped after {len(done)} version(s)")
    return done


class _ServedPlaces:
    """The update log's readers' registry (rec.logs.update_trim) told what the versions kept
    may still replay: the oldest of their checkpoints' `publish_tails` (a server may serve any
    of them until its next poll), so the log is not trimmed past a version being served."""

    def __init__(self, url: str, keep: int) -> None:
        self.keep, self.tails = keep, []
        self.registration = (
            Registration(url, reader_name("export-follow"), self.need) if url else None
        )

    def add(self, step_dir: Path) -> None:
        with contextlib.suppress(OSError, ValueError):  # deleted by training meanwhile
            if tails := run_dir.read_meta(step_dir).get("publish_tails"):
                self.tails = [*self.tails[1 - self.keep :], tails]

    def need(self) -> dict[int, str] | None:
        return oldest(self.tails) if self.tails else None

    def stop(self) -> None:
        if self.registration is not None:
            self.registration.stop()


def _follow_loop(run: Path, repo: Path, last: int | None, keep: int, poll_s: float,
                 stop: StopSignal, log: Log, detail: Log | None, done: list[Exported],
                 served: _ServedPlaces, export_args: dict[str, Any]) -> int | None:  # fmt: skip
    """follow()'s rounds until a stop: each newest checkpoint exported, said and registered."""
    if last is not None:
        served.add(run_dir.checkpoints_dir(run) / run_dir.step_dir_name(last))
    while not stop.requested:
        step_dir = run_dir.latest_checkpoint(run)
        if step_dir is None or (last is not None and step_of(step_dir) <= last):
            stop.sleep(poll_s)
            continue
        exported = export_one(run, repo, step_dir, last, keep, stop, log, detail, **export_args)
        if exported is None and stop.abandon:
            log(f"abandoned the export of step {step_of(step_dir)}; its staging directory "
                "was removed")  # fmt: skip
            break
        if exported is not None:
            done.append(exported)
            served.add(step_dir)
            log(format_line(exported))
        # A checkpoint that failed verification is not tried again; a deleted one is gone.
        last = step_of(step_dir)
    return last
