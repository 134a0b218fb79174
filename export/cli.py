"""`rec export`: a run's checkpoint -> quantized TorchScript / ONNX in a model repository."""

from __future__ import annotations

from pathlib import Path

import click

from rec.config import QUANT_DTYPES, export_formats


@click.command("export")
@click.argument("run", type=click.Path(path_type=Path))
@click.option(
    "--repo",
    type=click.Path(path_type=Path),
    default=Path("model_repository"),
    show_default=True,
    help="Model repository (Contract 2) to write into.",
)
@click.option("--checkpoint", default=None, help="Step dir to export (default: LATEST).")
@click.option(
    "--quantize",
    type=click.Choice(QUANT_DTYPES),
    default=None,
    help="Embedding storage for tables without an override (default: export.quantize).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(export_formats()),
    default=None,
    help="Formats to write (default: export.format).",
)
@click.option(
    "--config",
    "-c",
    type=click.Path(path_type=Path),
    default=None,
    help="YAML whose `export:` section (per-table dtypes, batching) and `features.context` "
    "override the run's.",
)
@click.option(
    "--version",
    type=click.IntRange(min=1),
    default=None,
    help="Version directory to write (default: the next one).",
)
@click.option("--force", is_flag=True, help="Replace an existing --version.")
@click.option(
    "--store",
    default=None,
    metavar="URL",
    help="redis://HOST:PORT[,...] of a Redis Cluster: the large tables' rows go there too "
    "(export.store; docs/store.md).",
)
@click.option(
    "--skip-exported",
    is_flag=True,
    help="Write nothing if the newest version already holds this checkpoint (for deployments "
    "that export on every start).",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Run until stopped: export each new committed checkpoint of RUN (still training) as "
    "the repository's next version (docs/follow.md).",
)
@click.option(
    "--keep",
    type=click.IntRange(min=2),
    default=3,
    show_default=True,
    help="With --follow: versions kept per model; older ones are deleted (at least 2: the one "
    "a server serves and the one it is about to load).",
)
def export_command(
    run, repo, checkpoint, quantize, fmt, config, version, force, store, skip_exported, follow,
    keep,
):  # fmt: skip
    """Export RUN's checkpoint, verify it, and write it into the model repository."""
    from rec.export.pipeline import export_run

    if follow:
        given = {"--checkpoint": checkpoint, "--version": version, "--force": force,
                 "--store": store, "--skip-exported": skip_exported}  # fmt: skip
        clash = [name for name, value in given.items() if value]
        if clash:
            raise click.UsageError(f"--follow exports every new checkpoint as the next version; "
                                   f"it does not take {', '.join(clash)}")  # fmt: skip
        from rec.export.follow import follow as follow_run

        follow_run(run, repo, keep=keep, quantize=quantize, fmt=fmt, config=config,
                   log=click.echo)  # fmt: skip
        return

    result = export_run(run, repo, checkpoint=checkpoint, quantize=quantize, fmt=fmt,
                        config=config, version=version, force=force,
                        skip_exported=skip_exported, store=store)  # fmt: skip
    for fmt_name, path in result.models.items():
        click.echo(f"{fmt_name}: {path}")


COMMANDS = [export_command]
