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
@click.option(
    "--server-arg", "server_args", multiple=True, metavar="FLAG",
    help="A flag for rec-server (cpp backend), repeatable: --server-arg=--busy-poll-us=0 "
    "(build/cpp/rec-server --help lists them).",
)  # fmt: skip
@click.option(
    "--allow-batch-variant", is_flag=True,
    help="Serve a model whose rec.json batch probe scores a batch differently from its samples "
    "one by one on this CPU (with a warning and the rec_model_batch_variant metric) instead of "
    "refusing it.",
)  # fmt: skip
@_user_errors
def serve(repo, backend, model, host, http_port, grpc_port, metrics_port, verbose, server_args,
          allow_batch_variant):  # fmt: skip
    """Serve the model repository REPO until Ctrl-C / SIGTERM."""
    from rec.serve.launch import ServeConfig, serve_forever

    cfg = ServeConfig(
        repo, backend, model, host, http_port, grpc_port, metrics_port, verbose, server_args,
        allow_batch_variant,
    )  # fmt: skip
    sys.exit(serve_forever(cfg))


@click.command()
@click.option("--url", required=True, help="Server host:port (the HTTP or gRPC port).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--model", default="rec", show_default=True)
@click.option(
    "--input", "input_path", type=_PATH,
    help="Rows to score: CSV, Parquet, Criteo TSV, TSV with a header or JSON lines.",
)  # fmt: skip
@click.option(
    "--format", "input_format", type=click.Choice(["csv", "tsv", "criteo_tsv", "parquet", "jsonl"]),
    help="Format of --input (default: from its suffix; .tsv is Criteo's for a Criteo model).",
)  # fmt: skip
@click.option(
    "--send", type=click.Choice(["ids", "strings"]), default="ids", show_default=True,
    help="Sparse values as INT64 ids mapped here, or as BYTES strings mapped by the server.",
)  # fmt: skip
@click.option("--synthetic", type=click.IntRange(0), default=0, help="Score N random rows.")
@click.option("--repo", type=_PATH, help="Read the feature spec from this repository's rec.json.")
@click.option("--output", type=_PATH, help="Write scores as CSV here (default: stdout).")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of synthetic rows.")
@click.option(
    "--group-by", metavar="COLUMN",
    help="Rows sharing this column's value make one request: one context (rec.json's context "
    "columns, the same on each of its rows) and its candidates; a context model's.",
)  # fmt: skip
@click.option(
    "--form", type=click.Choice(["context", "flat"]), default="context", show_default=True,
    help="With --group-by: send the context once per request, or the flat rows it stands for.",
)  # fmt: skip
@_user_errors
def predict(
    url, protocol, model, input_path, input_format, send, synthetic, repo, output, batch_size, seed,
    group_by, form,
):  # fmt: skip
    """Score rows on a running server (rec-server or Triton); AUC too when the file has labels."""
    from rec.serve.predict import PredictConfig
    from rec.serve.predict import predict as run_predict

    run_predict(
        PredictConfig(
            url,
            protocol,
            model,
            input_path,
            synthetic,
            repo,
            output,
            batch_size,
            seed,
            input_format,
            send,
            group_by,
            form,
        )  # fmt: skip
    )


def _numbers(kind):
    def parse(ctx, param, value):
        try:
            return tuple(kind(v) for v in value.split(",") if v.strip()) if value else ()
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a comma-separated list") from None

    return parse


@click.command()
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="NAME=PROTO://HOST:PORT",
    help="A running server to measure, e.g. cpp-grpc=grpc://127.0.0.1:8001 (repeatable).",
)
@click.option("--repo", type=_PATH, help="Start servers on this repository, one at a time.")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["cpp", "triton"]),
    help="Servers to start with --repo (default: both).",
)
@click.option(
    "--protocol",
    "protocols",
    multiple=True,
    type=click.Choice(["http", "grpc"]),
    help="Protocols to measure on started servers (default: both).",
)
@click.option("--model", default="rec", show_default=True)
@click.option(
    "--batch-size",
    "batch_sizes",
    default="1,256",
    show_default=True,
    callback=_numbers(int),
    help="Samples per request (comma-separated sweep).",
)
@click.option(
    "--concurrency",
    default="1,4,16",
    show_default=True,
    callback=_numbers(int),
    help="Requests in flight, closed loop (comma-separated sweep).",
)
@click.option(
    "--rate",
    "rates",
    default="",
    callback=_numbers(float),
    help="Offered requests/s, open loop (comma-separated sweep).",
)
@click.option(
    "--candidates", default="", callback=_numbers(int),
    help="Requests of one context and N candidates, swept in place of --batch-size "
    "(comma-separated, e.g. 16,128,512; a context model's, or see --context-from).",
)  # fmt: skip
@click.option(
    "--form", type=click.Choice(["context", "flat", "both"]), default="context",
    show_default=True,
    help="With --candidates: the context once per request, the flat rows with the context "
    "repeated per candidate, or both.",
)  # fmt: skip
@click.option(
    "--context-from", type=_PATH, metavar="REPO",
    help="With --candidates: the context columns of this repository's model (--model), to send "
    "a plain model (--form flat) the same pairs as its context twin.",
)  # fmt: skip
@click.option("--warmup", type=float, default=1.0, show_default=True, help="Seconds per point.")
@click.option("--duration", type=float, default=5.0, show_default=True, help="Seconds per point.")
@click.option(
    "--requests",
    type=click.IntRange(0),
    default=0,
    help="Measure N requests per point instead of --duration.",
)
@click.option(
    "--processes", type=click.IntRange(1), default=2, show_default=True, help="Client processes."
)
@click.option("--output", type=_PATH, default=Path("bench.json"), show_default=True)
@click.option("--plot", type=_PATH, default=Path("bench.png"), show_default=True)
@click.option("--no-plot", is_flag=True)
@_user_errors
def bench(targets, repo, backends, protocols, model, batch_sizes, concurrency, rates, candidates,
          form, context_from, warmup, duration, requests, processes, output, plot,
          no_plot):  # fmt: skip
    """Measure throughput and p50/p95/p99/p99.9 latency of serving targets."""
    from rec.serve.bench import BenchConfig, Target, run_bench
    from rec.serve.predict import no_context, repo_context

    context = None
    if context_from is not None:
        context, where = repo_context(context_from, model)
        if context is None:
            raise no_context(where, model)

    cfg = BenchConfig(
        targets=[Target.parse(t, model) for t in targets],
        repo=repo,
        backends=backends or ("cpp", "triton"),
        protocols=protocols or ("http", "grpc"),
        model=model,
        batch_sizes=batch_sizes,
        concurrency=concurrency,
        rates=rates,
        candidates=candidates,
        form=form,
        context=context,
        warmup_s=warmup,
        duration_s=duration,
        requests=requests,
        processes=processes,
        output=output,
        plot=None if no_plot else plot,
    )
    run_bench(cfg, log=lambda line: click.echo(line))


COMMANDS = [serve, predict, bench]
