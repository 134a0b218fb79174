"""`rec bench`: throughput and tail latency of one or more serving targets, swept over request
batch size and concurrency (closed loop) and over offered load (open loop).

Targets are running servers (`name=http://host:port`, `name=grpc://host:port`), or, with a
repository, servers that bench starts itself one backend at a time (so two servers never share
the cores during a measurement) and stops afterwards. Results go to a JSON file and a PNG of
p99 latency against throughput; each point prints one progress line as it finishes.

With `candidates` (a context model, features.context), the sweep is over requests of one context
and N candidates instead of batch sizes, in the context form, the flat form (the context
repeated per candidate) or both; rows add pairs_per_s and request_bytes (the request's body as
tritonclient sends it on the target's protocol: HTTP with binary tensors, or gRPC).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from rec.contract.context import ContextSplit
from rec.contract.io import CANDIDATE_LENGTHS
from rec.serve.client import (
    ContextRows,
    Rows,
    ScoreClient,
    request_bytes,
    synthetic_request,
    synthetic_rows,
)
from rec.serve.loadgen import Job, Outcome, run_job
from rec.serve.repository import ServeError

PERCENTILES = (50, 95, 99, 99.9)
FORMS = {"context": ("context",), "flat": ("flat",), "both": ("context", "flat")}


@dataclass(frozen=True)
class Target:
    """A server endpoint to measure, e.g. Target("cpp-grpc", "127.0.0.1:8001", "grpc")."""

    name: str
    url: str
    protocol: str
    model: str = "rec"

    @staticmethod
    def parse(spec: str, model: str = "rec") -> Target:
        """NAME=PROTOCOL://HOST:PORT, e.g. triton-http=http://127.0.0.1:8000."""
        name, sep, rest = spec.partition("=")
        protocol, sep2, url = rest.partition("://")
        if not (sep and sep2 and name and url) or protocol not in ("http", "grpc"):
            raise ServeError(
                f"target {spec!r} is not NAME=http://HOST:PORT or NAME=grpc://HOST:PORT"
            )
        return Target(name, url, protocol, model)


@dataclass
class BenchConfig:
    targets: list[Target] = field(default_factory=list)
    repo: Path | None = None
    """Start servers on this repository (one backend at a time) and add their targets."""
    backends: tuple[str, ...] = ("cpp", "triton")
    protocols: tuple[str, ...] = ("http", "grpc")
    model: str = "rec"
    batch_sizes: tuple[int, ...] = (1, 256)
    """Samples per request."""
    candidates: tuple[int, ...] = ()
    """Candidates per request of one context, swept in place of batch_sizes (a context
    model's requests; () keeps the batch-size sweep)."""
    form: str = "context"
    """With candidates: "context", "flat" (the context repeated per candidate) or "both"."""
    context: ContextSplit | None = None
    """With candidates: the requests' context columns; default the model's, from cfg.repo's
    rec.json or as the server publishes them (set it to send a plain model the same pairs)."""
    hotness: tuple[tuple[int, int], ...] | None = None
    """Ids per bag of the synthetic requests, (low, high) per sparse feature (a user history
    of 20 beside an item's one id); None: 1 to 3 ids for each."""
    concurrency: tuple[int, ...] = (1, 4, 16)
    """Closed-loop points: requests kept in flight."""
    rates: tuple[float, ...] = ()
    """Open-loop points: offered requests per second (run at the largest concurrency)."""
    warmup_s: float = 1.0
    duration_s: float = 5.0
    requests: int = 0
    """If > 0, measure this many requests per point instead of duration_s."""
    processes: int = 2
    """Client processes per point (each runs concurrency / processes requests in flight)."""
    seed: int = 0
    output: Path = Path("bench.json")
    plot: Path | None = Path("bench.png")

    def __post_init__(self) -> None:
        for name, values in (("batch size", self.batch_sizes), ("concurrency", self.concurrency)):
            if not values or min(values) < 1:
                raise ServeError(f"every {name} must be >= 1, got {list(values)}")
        if self.candidates and min(self.candidates) < 1:
            raise ServeError(f"every candidate count must be >= 1, got {list(self.candidates)}")
        if self.form not in FORMS:
            raise ServeError(f"--form {self.form!r} is not one of {tuple(FORMS)}")
        if self.processes < 1 or self.duration_s <= 0 or self.warmup_s < 0:
            raise ServeError("processes >= 1, duration > 0 and warm-up >= 0 are required")
        if not self.targets and self.repo is None:
            raise ServeError("give --target NAME=PROTOCOL://HOST:PORT (repeatable) or --repo")


@dataclass(frozen=True)
class Point:
    """One measurement of a target: its requests, and the load they are sent at."""

    batch: int
    """Samples (pairs) per request."""
    concurrency: int
    rate: float
    """Offered requests per second (open loop); 0 is closed loop."""
    form: str = ""
    """"" for `batch` independent rows; "context" or "flat" for one context and `batch`
    candidates (BenchConfig.candidates)."""


def summarize(target: Target, batch: int, concurrency: int, rate: float, outcomes) -> dict:
    """One result row from the outcomes of a point's worker processes."""
    lat = np.concatenate([o.latencies_s for o in outcomes]) * 1e3
    errors: dict[str, int] = {}
    for o in outcomes:
        for k, v in o.errors.items():
            errors[k] = errors.get(k, 0) + v
    started = [o.first_send for o in outcomes if o.first_send]
    window = max((o.last_done for o in outcomes), default=0.0) - min(started, default=0.0)
    ok = int(lat.size)
    rps = ok / window if window > 0 else 0.0
    latency = {f"p{p:g}": float(np.percentile(lat, p)) if ok else None for p in PERCENTILES}
    latency["mean"] = float(lat.mean()) if ok else None
    latency["max"] = float(lat.max()) if ok else None
    return {
        "target": target.name,
        "protocol": target.protocol,
        "batch": batch,
        "concurrency": concurrency,
        "offered_rps": rate or None,
        "ok": ok,
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "window_s": window,
        "throughput_rps": rps,
        "throughput_samples_per_s": rps * batch,
        "latency_ms": latency,
    }


def progress_line(i: int, n: int, row: dict) -> str:
    lat = row["latency_ms"]
    load = f"rate={row['offered_rps']:g}/s" if row["offered_rps"] else f"c={row['concurrency']}"
    shape = f"N={row['batch']} {row['form']}" if "form" in row else f"B={row['batch']}"
    if not row["ok"]:
        return f"[{i}/{n}] {row['target']} {shape} {load}: no successful request"
    return (
        f"[{i}/{n}] {row['target']} {shape} {load}: {row['throughput_rps']:,.1f} req/s "
        f"({row['throughput_samples_per_s']:,.0f} samples/s) p50 {lat['p50']:.2f} ms "
        f"p99 {lat['p99']:.2f} ms p99.9 {lat['p99.9']:.2f} ms errors {row['errors']}"
    )


def measure(pool, target: Target, sizes, point: Point, split, cfg: BenchConfig) -> dict:
    """Runs one point in up to cfg.processes worker processes and summarizes it."""
    batch, concurrency, rate = point.batch, point.concurrency, point.rate
    procs = min(cfg.processes, concurrency)
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    start_at = time.monotonic() + 0.2  # every worker is already running; this aligns their windows
    per_process = -(-cfg.requests // procs) if cfg.requests else 0  # ceil: at least requests
    jobs = [
        Job(
            url=target.url,
            protocol=target.protocol,
            model=target.model,
            num_dense=sizes[0],
            num_sparse=sizes[1],
            batch=batch,
            in_flight=share,
            rate=rate * share / concurrency,
            start_at=start_at,
            warmup_s=cfg.warmup_s,
            duration_s=cfg.duration_s,
            max_requests=per_process,
            seed=cfg.seed + i,
            candidates=batch if point.form else 0,
            form=point.form or "context",
            context=split if point.form else None,
            hotness=cfg.hotness,
        )
        for i, share in enumerate(shares)
    ]
    outcomes: list[Outcome] = list(pool.map(run_job, jobs))
    row = summarize(target, batch, concurrency, rate, outcomes)
    if point.form:
        row["candidates"], row["form"] = batch, point.form
        request = point_request(point, sizes, split, jobs[0].seed, cfg.hotness)
        row["request_bytes"] = request_bytes(request, target.protocol, True, target.model)
    if rate and not cfg.requests:
        # Open loop sends on a schedule: the window is the scheduled one, not first-to-last
        # answer (which for few requests would inflate the rate).
        row["window_s"] = cfg.duration_s
        row["throughput_rps"] = row["ok"] / cfg.duration_s
        row["throughput_samples_per_s"] = row["throughput_rps"] * batch
    if point.form:
        row["pairs_per_s"] = row["throughput_samples_per_s"]
    return row


def points(cfg: BenchConfig) -> list[Point]:
    """Every point of one target, in run order."""
    if cfg.candidates:
        shapes = [(n, form) for n in cfg.candidates for form in FORMS[cfg.form]]
    else:
        shapes = [(b, "") for b in cfg.batch_sizes]
    out = [Point(b, c, 0.0, form) for b, form in shapes for c in cfg.concurrency]
    out += [Point(b, max(cfg.concurrency), r, form) for b, form in shapes for r in cfg.rates]
    return out


def context_split(client: ScoreClient, sizes: tuple[int, int], cfg: BenchConfig) -> ContextSplit:
    """The context columns of a --candidates sweep on this target (cfg.context, else the
    model's), checked against the target's inputs so that no point is all errors."""
    from rec.serve.predict import context_split as model_split

    split = cfg.context
    if split is None:
        try:
            split = model_split(client, cfg.repo)
        except ServeError as e:
            raise ServeError(f"--candidates: {e} (rec bench: or --context-from REPO)") from None
    if (split.num_dense, split.num_sparse) != sizes:
        raise ServeError(
            f"the context columns are of {split.num_dense} dense and {split.num_sparse} sparse "
            f"features; model {client.model!r} at {client.url} has {sizes[0]} and {sizes[1]}"
        )
    if "context" in FORMS[cfg.form] and CANDIDATE_LENGTHS not in client.input_dims():
        raise ServeError(
            f"model {client.model!r} at {client.url} has no context inputs (exported without "
            "features.context): measure it with --form flat"
        )
    return split


def point_request(point: Point, sizes, split, seed: int, hotness) -> Rows | ContextRows:
    """A request of this point's shape (as a worker with this seed sends it)."""
    if point.form:
        return synthetic_request(split, point.batch, point.form, seed, hotness)
    return synthetic_rows(*sizes, point.batch, seed, hotness)


def prime(target: Target, request: Rows | ContextRows, requests: int = 5) -> None:
    """A few requests of this point's shape before the timed warm-up: TorchScript's profiling
    executor re-optimizes on the first calls with a new shape (about a second each here),
    which a short time-based warm-up at concurrency 1 would not absorb."""
    client = ScoreClient(target.url, target.protocol, target.model)
    prepared = client.prepare(request)
    try:
        for _ in range(requests):
            client.send(prepared)
    except (InferenceServerException, OSError):
        pass  # a target that rejects these requests is measured (as errors), not primed
    finally:
        client.close()


def bench_targets(pool, targets: list[Target], cfg: BenchConfig, log) -> list[dict]:
    rows = []
    plan = points(cfg)
    for target in targets:
        client = ScoreClient(target.url, target.protocol, target.model)
        try:
            sizes = client.input_sizes()  # also fails fast if the target is not serving
            split = context_split(client, sizes, cfg) if cfg.candidates else None
        finally:
            client.close()
        for i, point in enumerate(plan, start=1):
            prime(target, point_request(point, sizes, split, 12345, cfg.hotness))
            row = measure(pool, target, sizes, point, split, cfg)
            rows.append(row)
            log(progress_line(i, len(plan), row))
    return rows


def run_bench(cfg: BenchConfig, log=print) -> dict:
    """Measures every target (starting servers on cfg.repo if given); writes JSON and PNG."""
    spawn = multiprocessing.get_context("spawn")  # grpc does not survive fork
    rows: list[dict] = []
    servers_used, peak_rss = [], {}
    load_before = os.getloadavg()  # other work on the machine skews results; recorded with them
    with concurrent.futures.ProcessPoolExecutor(cfg.processes, mp_context=spawn) as pool:
        list(pool.map(_ping, range(cfg.processes)))  # start the workers before measuring
        if cfg.targets:
            rows += bench_targets(pool, cfg.targets, cfg, log)
        if cfg.repo is not None:
            for backend in cfg.backends:
                backend_rows, peak_rss[backend] = _bench_backend(pool, backend, cfg, log)
                rows += backend_rows
                servers_used.append(backend)
                log(f"{backend} peak RSS: {peak_rss[backend] / 1e9:.2f} GB")
    meta = _meta(cfg, servers_used)
    meta["server_peak_rss_bytes"] = peak_rss
    meta["load_average_1m"] = {"start": load_before[0], "end": os.getloadavg()[0]}
    result = {"meta": meta, "results": rows}
    cfg.output.parent.mkdir(parents=True, exist_ok=True)
    cfg.output.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {cfg.output}")
    if cfg.plot is not None:
        from rec.serve.bench_plot import plot_results

        plot_results(rows, cfg.plot)
        log(f"wrote {cfg.plot}")
    return result


def _bench_backend(pool, backend: str, cfg: BenchConfig, log) -> tuple[list[dict], int]:
    """The rows of a server started on cfg.repo, and its peak RSS (with its child processes:
    Triton's Python-backend model runs in one) over the start and every point."""
    from rec.serve.launch import ServeConfig, start_server

    log(f"starting {backend} on {cfg.repo}")
    server = start_server(ServeConfig(cfg.repo, backend, cfg.model, "127.0.0.1", 0, 0, 0))
    try:
        ep = server.endpoints
        targets = [
            Target(f"{backend}-{p}", ep.http if p == "http" else ep.grpc, p, cfg.model)
            for p in cfg.protocols
        ]
        rows = bench_targets(pool, targets, cfg, log)
        return rows, server.tree_peak_rss_bytes()
    finally:
        server.stop()


def _ping(_: int) -> int:
    return os.getpid()


def _meta(cfg: BenchConfig, servers: list[str]) -> dict:
    from rec.cpu import cpu_info, describe

    config = asdict(cfg)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in config.items()}
    return {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": describe(cpu_info()),
        "cpu_flags": cpu_info()["flags"],
        "python": sys.version.split()[0],
        "servers_started": servers,
        "config": config,
    }
