"""`rec train` and `rec plan`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command("train")
@click.option(
    "--config",
    "-c",
    type=click.Path(path_type=Path),
    default=None,
    help="YAML config (default: the embedded small DLRM on synthetic data). With --resume: laid "
    "over the run's config.yaml; it may change only training length, intervals, checkpoint and "
    "publish settings, anything else is refused by name.",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the run goes (default: runs/<timestamp>).",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Local processes (ranks).",
)
@click.option(
    "--resume",
    "resume",
    type=click.Path(path_type=Path),
    default=None,
    help="Continue this run directory from its LATEST checkpoint, at any --nproc (a run "
    "training from a stream: the same --nproc while entries delivered to its ranks are "
    "unacknowledged).",
)
@click.option(
    "--steps",
    metavar="N",
    type=click.IntRange(min=1),
    default=None,
    help="With --resume: train N steps more than the last checkpoint (also a finished run).",
)
@click.option(
    "--epochs",
    metavar="N",
    type=click.IntRange(min=1),
    default=None,
    help="With --resume: train N epochs more (the checkpoint's unfinished one counts as one).",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Restarts of all ranks after a rank fails; each resumes from LATEST.",
)
@click.option(
    "--publish",
    metavar="URL",
    default=None,
    help="Publish the rows each step changed to this update log (redis://HOST:PORT[/STREAM]) "
    "for serving replicas to apply; sets publish.url in the run's config.yaml. A --resume "
    "publishes as the run did: --publish turns it on (first re-sending every row if the "
    "checkpoint was trained without it), --no-publish off.",
)
@click.option(
    "--no-publish",
    is_flag=True,
    help="Publish nothing: clears publish.url, for this start and later resumes.",
)
@click.option(
    "--stream",
    metavar="URL",
    default=None,
    help="Train from this live event stream (redis://HOST:PORT[/STREAM], docs/stream.md) "
    "until stopped: sets data.stream.url. SIGTERM or Ctrl-C checkpoints and stops; "
    "--resume goes on from each rank's position.",
)
def train_command(config, run_dir, nproc, resume, steps, epochs, max_restarts, publish,
                  no_publish, stream) -> None:  # fmt: skip
    """Train with TorchRec DistributedModelParallel on NPROC local ranks.

    \b
    rec train -c cfg.yaml --run-dir runs/a     a new run
    rec train --resume runs/a                  finish it from its last checkpoint
    rec train --resume runs/a --steps 500      500 steps more (a finished run too)
    rec train --resume runs/a -c more.yaml     with more.yaml's training.epochs, intervals...
    rec train --resume runs/a --publish URL    on, publishing the rows it changes
    rec train --resume runs/a --no-publish     on, not publishing (until --publish URL)
    rec train --stream redis://h:6379/clicks   from a live stream, until SIGTERM
    """
    from rec.train.launch import TrainingFailedError, train

    if publish is not None and no_publish:
        raise click.UsageError("give --publish URL or --no-publish, not both")
    if no_publish:
        publish = ""
    try:
        run = train(config, resume or run_dir, nproc, resume=resume is not None,
                    max_restarts=max_restarts, publish=publish, steps=steps,
                    epochs=epochs, stream=stream)  # fmt: skip
    except TrainingFailedError as e:
        # rec's own one-line form ("error: ..."), as for a bad config; exit 1: the run failed
        # after it started, where a refusal before anything ran exits 2.
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    click.echo(f"run directory: {run}")


@click.command("plan")
@click.option("--config", "-c", type=click.Path(path_type=Path), default=None)
@click.option("--world-size", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--local-world-size",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per host (default: sharding.topology.local_world_size, else all on one host).",
)
@click.option("--json", "as_json", is_flag=True, help="The whole report as JSON, for scripts.")
@click.option(
    "--calibrate",
    is_flag=True,
    help="Measure this CPU's costs again (a few seconds; otherwise measured once and cached).",
)
@click.option(
    "--store-masters",
    type=click.IntRange(min=3),
    default=None,
    help="Also plan export.store's tables in a Redis Cluster of this many masters.",
)
@click.option("--store-replicas", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--cache-hit-rate",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.9,
    show_default=True,
    help="The row cache is sized for this share of lookups.",
)
@click.option("--zipf", "alpha", type=click.FloatRange(min=0.0, min_open=True), default=1.05,
              show_default=True, help="Each stored table's ids taken as Zipf(ALPHA).")  # fmt: skip
def plan_command(config, world_size, local_world_size, as_json, calibrate, store_masters,
                 store_replicas, cache_hit_rate, alpha) -> None:  # fmt: skip
    """The sharding plan for a config and world size, with each rank's step time and memory
    estimated from this CPU's measured costs (train/calibration.py), TorchRec's own numbers and
    bytes per collective within and across hosts; no training. With --store-masters, also the
    embedding store's memory per node and the row cache a replica needs (docs/store.md)."""
    from rec.train.plan_stats import format_report, plan_report_for
    from rec.train.zch_sizing import plan_block as zch_plan_block

    report = plan_report_for(config, world_size, local_world_size, calibrate, quiet=as_json)
    text = format_report(report)
    text += zch_plan_block(config)
    if store_masters is not None:
        from rec.config import load_config
        from rec.store.plan import format_store_plan, store_plan

        cfg = load_config(config)
        dtypes = {t.name: cfg.export.table_dtypes.get(t.name, cfg.export.quantize)
                  for t in cfg.tables}  # fmt: skip
        report["store"] = store_plan(cfg, dtypes, store_masters, store_replicas,
                                     cache_hit_rate, alpha)  # fmt: skip
        text += "\n" + format_store_plan(report["store"])
    click.echo(json.dumps(report, indent=1) if as_json else text)


COMMANDS = [train_command, plan_command]
