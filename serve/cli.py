"""Click commands of the serving stage: `rec serve`, `rec predict`, `rec bench`.

Each parses its options into a config and calls one library function; ServeError (a bad
repository, a port in use, a server not built, an input row that does not fit) becomes one
`error:` line and exit code 2, like the other stages' configuration errors.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click
from rec.serve.repository import ServeError

_PATH = click.Path(path_type=Path)


def _user_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ServeError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


def _ports(fn):
    for name, default in (("metrics", 8002), ("grpc", 8001), ("http", 8000)):
        fn = click.option(
            f"--{name}-port", type=click.IntRange(0, 65535), default=default, show_default=True,
            help=f"{name.upper()} port (0: pick a free one)",
        )(fn)  # fmt: skip
    return fn


@click.command()
@click.argument("repo", type=_PATH)
@click.option("--backend", type=click.Choice(["cpp", "triton"]), default="cpp", show_default=True)
@click.option("--model", default=None, help="Model in the repository (default: its only model).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@_ports
@click.option("-v", "--verbose", is_flag=True, help="Echo the server's log.")
@_user_errors
def serve(repo, backend, model, host, http_port, grpc_port, metrics_port, verbose):
    """Serve the model repository REPO until Ctrl-C / SIGTERM."""
    from rec.serve.launch import ServeConfig, serve_forever

    cfg = ServeConfig(repo, backend, model, host, http_port, grpc_port, metrics_port, verbose)
    sys.exit(serve_forever(cfg))


@click.command()
@click.option("--url", required=True, help="Server host:port (the HTTP or gRPC port).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--model", default="rec", show_default=True)
@click.option("--input", "input_path", type=_PATH, help="CSV, TSV or JSON-lines rows.")
@click.option("--synthetic", type=click.IntRange(0), default=0, help="Score N random rows.")
@click.option("--repo", type=_PATH, help="Read feature names from this repository's rec.json.")
@click.option("--output", type=_PATH, help="Write scores as CSV here (default: stdout).")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of synthetic rows.")
@_user_errors
def predict(url, protocol, model, input_path, synthetic, repo, output, batch_size, seed):
    """Score rows on a running server (rec-server or Triton)."""
    from rec.serve.predict import PredictConfig
    from rec.serve.predict import predict as run_predict

    run_predict(
        PredictConfig(url, protocol, model, input_path, synthetic, repo, output, batch_size, seed)
    )


COMMANDS = [serve, predict]
