"""`rec train`: prepares the run directory, then starts N ranks with the elastic launcher."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from rec import factory, resources, run_dir
from rec.config import ConfigError, RecConfig, load_config
from rec.data.preflight import check_training_data
from rec.features import SPEC_FILE, feature_spec
from rec.train.plan_stats import check_plan_fits
from rec.train.resume import resume_config, write_changes


class RunDirExistsError(FileExistsError):
    pass


class TrainingFailedError(RuntimeError):
    """A rank failed (after any restarts); the message is that rank's own error."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def prepare_run_dir(cfg: RecConfig, run: Path) -> RecConfig:
    """Writes config.yaml for a new run (a resume's: rec.train.resume).

    Refuses a directory that already holds checkpoints (no silent overwrite).
    """
    saved = run / run_dir.CONFIG_FILE
    if run_dir.checkpoints_dir(run).exists() and any(run_dir.checkpoints_dir(run).iterdir()):
        raise RunDirExistsError(
            f"run directory {str(run)!r} already has checkpoints; use --resume to continue it "
            "or choose another --run-dir"
        )
    run.mkdir(parents=True, exist_ok=True)
    saved.write_text(cfg.to_yaml())
    # The feature spec beside the config: what a raw row means to this model (rec.features).
    spec = feature_spec(cfg).to_dict()
    (run / SPEC_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    return cfg


def launch(run: Path, nproc: int, resume: bool, max_restarts: int = 0) -> None:
    """Runs `python -m rec.train.worker` on `nproc` local ranks and waits for them."""
    log_dir = tempfile.mkdtemp(prefix="rec-train-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"rec-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.5,
        # A log dir (not /dev/null) gives each rank an error file, so a failure reports the
        # rank's exception rather than "exitcode 1". Output still goes to the terminal.
        # Removed when the launch ends: the failure (read below) is all that is needed of it.
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    args = ["-m", "rec.train.worker", "--run-dir", str(run)]
    if resume:
        args.append("--resume")
    try:
        elastic_launch(config, entrypoint=sys.executable)(*args)
    except SignalException as e:
        # The launcher passed the signal on to the ranks; a rank training from a stream
        # checkpoints before it exits, any other resumes from its last checkpoint.
        latest = run_dir.latest_checkpoint(run)
        name = signal.Signals(e.sigval).name
        # This run's own --nproc: a stream run stopped without a clean drain resumes only at
        # it (rec.train.stream_loop.check_world); any other run resumes at any.
        again = f"`rec train --resume {run} --nproc {nproc}`"
        if latest is None:
            print(f"[rec train] stopped by {name} before any checkpoint: nothing was kept; "
                  f"{again} starts it again from the beginning", flush=True)  # fmt: skip
        else:
            print(f"[rec train] stopped by {name}: LATEST is {latest.name}; {again} goes on "
                  "from there", flush=True)  # fmt: skip
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", message)
        if not message or failure.error_file_data == {}:
            message = f"exit code {failure.exitcode} (see the rank's output above)"
        raise TrainingFailedError(f"rank {rank} failed: {message}") from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def completed_checkpoint(run: Path, cfg: RecConfig) -> Path | None:
    """LATEST, when a run of `cfg`'s length saved it at its last step."""
    latest = run_dir.latest_checkpoint(run)
    if latest is None or not (latest / run_dir.META_FILE).is_file():
        return None
    meta = run_dir.read_meta(latest)
    length = {"steps": cfg.training.steps, "epochs": cfg.training.epochs}
    return latest if meta.get("complete") and meta.get("length") == length else None


def _check_stream_resume(run: Path, cfg: RecConfig, nproc: int) -> None:
    """A stream run resumes at another --nproc only when nothing is left unacknowledged, or
    from a partitioned stream whose layout is unchanged (rec.train.stream_tally.check_resume):
    refused here, before any rank starts."""
    latest = run_dir.latest_checkpoint(run)
    if not cfg.data.stream.url or latest is None or not (latest / run_dir.META_FILE).is_file():
        return
    meta = run_dir.read_meta(latest).get("stream")
    if meta is not None:
        from rec.train.stream_tally import check_resume

        check_resume(latest, meta, nproc, cfg.data.stream)


def train(
    config: Path | None,
    run: Path | None,
    nproc: int,
    resume: bool = False,
    max_restarts: int = 0,
    publish: str | None = None,
    steps: int | None = None,
    epochs: int | None = None,
    stream: str | None = None,
) -> Path:
    """The library function behind `rec train`. Returns the run directory.

    With `resume`, `config`, `steps`, `epochs` and `publish` (a URL, or "" for off) change the
    run's config.yaml as rec.train.resume allows; the ranks read it."""
    if resume and run is None:
        raise run_dir.RunDirError("--resume needs the run directory to continue")
    if not resume and (steps is not None or epochs is not None):
        raise ConfigError(
            "--steps and --epochs extend a run with --resume; a new run's length is "
            "training.steps or training.epochs in its config"
        )
    if resume and stream is not None:
        raise ConfigError(
            "--stream starts a run; a --resume reads the stream in the run's config.yaml "
            "(data.stream.url) from each rank's checkpointed position"
        )
    run = run or default_run_dir()
    overrides: dict = {}
    if publish is not None:  # "": --no-publish
        overrides["publish"] = {"url": publish}
    if stream is not None:
        overrides["data"] = {"stream": {"url": stream}}
    cfg = None if resume else load_config(config, overrides or None)
    if cfg is not None:  # before the run directory is made: a refused run leaves nothing
        factory.check(cfg)
        resources.check_training(cfg, nproc, run)
        check_plan_fits(cfg, nproc)
        check_training_data(cfg, nproc)
    if resume:  # config.yaml with -c, --steps, --epochs and --publish / --no-publish
        cfg = resume_config(run, config, steps, epochs, publish)
    else:
        assert cfg is not None
        cfg = prepare_run_dir(cfg, run)
    if resume and (done := completed_checkpoint(run, cfg)) is not None:
        write_changes(run, cfg)
        print(f"[rec train] {run} is complete (final checkpoint {done.name}): nothing to train; "
              "--steps N or --epochs N trains on")  # fmt: skip
        return run
    if resume:  # with --publish, the plan checked is the one that publishes
        _check_stream_resume(run, cfg, nproc)
        factory.check(cfg)
        resources.check_training(cfg, nproc, run, resume=True)
        check_plan_fits(cfg, nproc)
        check_training_data(cfg, nproc)
        write_changes(run, cfg)  # only once nothing refused the resume
    launch(run, nproc, resume, max_restarts)
    return run
