"""The `rec` command. Each stage owns its commands (rec.<stage>.cli); this file only joins them.

Commands parse options into a config and call one library function; everything else lives in
the YAML config (rec.config).
"""

from __future__ import annotations

import importlib
import sys

import click

from rec import __version__, warnings_filter
from rec.config import ConfigError
from rec.contract.store import StoreError
from rec.data.errors import DataError
from rec.resources import ResourceError

# Stage modules that define click commands in a `COMMANDS` list.
_STAGE_CLI_MODULES = ("rec.train.cli", "rec.export.cli", "rec.serve.cli", "rec.store.cli",
                      "rec.data.stream_cli",
                      "rec.config_doc")  # fmt: skip


class _Group(click.Group):
    """Turns configuration and user errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (ConfigError, DataError, ResourceError, StoreError, FileNotFoundError,
                FileExistsError) as e:  # fmt: skip
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rec")
@click.option(
    "--verbose",
    is_flag=True,
    help="Also show the third-party warnings rec hides as harmless (rec/warnings_filter.py "
    "lists each with why), in this process and the ones it starts (REC_VERBOSE=1 does too).",
)
def main(verbose: bool) -> None:
    """rec: train sharded recommendation models, export them quantized, serve them fast."""
    warnings_filter.set_verbose(verbose)


for _name in _STAGE_CLI_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as e:
        if e.name != _name:  # the stage exists but something it imports is missing
            raise
        continue
    for _command in getattr(_module, "COMMANDS", []):
        main.add_command(_command)
