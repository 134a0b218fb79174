"""This CPU's training costs, measured once and cached: what `rec plan` and the end of every
`rec train` estimate a step's time and a rank's memory with (train.plan_estimate), instead of
TorchRec's planner's numbers (its perf model is a GPU's bandwidths: 0.04 ms for the default
model's step, which takes tens of ms here).

Measured (5-20 s, once per cache key; `rec plan --calibrate` measures again):

- loop: the real training step of a tiny model (rec's model, planner, DistributedModelParallel,
  fused optimizer, train pipeline and synthetic data, built as rec.train.trainer builds them)
  on 2 gloo ranks forked from this process, with the threads a rank has, at 2 and at 8 tables,
  for both train pipelines, in turns; the median step, its own compute taken out, is a step's
  fixed cost (Python, TorchRec's input and output dists, gloo's round trips, DDP, threads that
  wait on each other) at 2 and 8 features. Then what else a rank does (a profiled window, an
  evaluation's forward, a checkpoint) and each rank's peak RSS: the process baseline.
- comm: gloo's all-to-all, bytes per second one rank sends (4 MB buffers, 2 ranks).
- tbe: FBGEMM's CPU TBE forward and backward with a fused optimizer (each one a config uses),
  one thread: us per call and per table, ns per (id x dim) in a table that fits the cache and
  in one that does not (1M x 64).
- dense: a Linear's forward and backward on one thread, FLOP/s (B = 512, 512 x 512) and the
  fixed cost of a small one; the dense optimizer's ns per parameter.
- data: rec's synthetic source and `to_torchrec`, us per sample and per id.

A step on rank r, in ms (the estimate is the slowest rank's):

    step = fixed(pipeline, F)
         + (B x data_per_sample + B x F x ids x data_per_id) x slow
         + (tbe_call x sharding types on r + sum over r's shards: tbe_table
            + ids_r x dim x ns(cache or DRAM)) x slow
         + (6 x B x matmul_params / (FLOP/s x fast) + matmuls x layer) x slow
         + dense_params x dense_optimizer_per_param x slow
         + (bytes r sends per step + DDP's all-reduce) / gloo's rate

fixed(pipeline, F) is on the line through the loop's two points, held at their values outside
them (plan_estimate._loop_ms says why); B the batch per rank, F the sparse features, ids the
ids per sample per feature (the synthetic data's mean, measured; the planner's pooling factor
for files), ids_r the ids rank r's shard looks up (a table-wise or column-wise shard: every
rank's, W x B x ids; a row-wise one: its rows' share; a data-parallel table: its own B x ids).
Ranks on one host share its cores: a rank gets cores / local ranks of them; below one
everything is that much slower (`slow`), above one its matmuls are faster, up to its threads
(`fast`).

A rank's memory, in bytes:

    memory = baseline + sum over r's shards: rows x dim x 4 + optimizer state
             (row-wise Adagrad rows x 4, Adam 2 x rows x dim x 4; a data-parallel table adds
             its gradient) + dense_params x 4 x (parameter, gradient, DDP bucket, optimizer
             state) + 3 x B x layer widths x 4 (activations) + the arrays the config's
             synthetic sources hold (measured; files: not counted) + every ZCH table's id
             map, on every rank (slots x 57 bytes: rec.train.zch.MAP_BYTES_PER_SLOT)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from rec.config import RecConfig, config_from_dict
from rec.cpu import cpu_info

CACHE_VERSION = 4  # raise when what is measured or how changes: old entries are re-measured
# 3: the loop's ranks run their share of the cores as threads (rec.train.distributed), as
# training ranks now do, instead of torch's default of every core each.
LOOP_TABLES = (2, 8)  # the tiny model's tables: the loop's cost per feature from two points
LOOP_BATCH = 32
LOOP_STEPS = 20
PROFILE_STEPS = 10  # training.profile_steps' default: a run profiles that many steps
PIPELINES = ("sparse_dist", "base")
BIG_ROWS = 1_000_000  # x dim 64 x 4 bytes = 256 MB: beyond any last-level cache here

Progress = Callable[[str], None]


# ---- the cache ----------------------------------------------------------------------------------
def cache_dir() -> Path:
    """$REC_CACHE_DIR, else $XDG_CACHE_HOME/rec, else ~/.cache/rec."""
    if os.environ.get("REC_CACHE_DIR"):
        return Path(os.environ["REC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rec"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def launch_threads() -> int:
    """The intra-op threads a process of this launch may use: OMP_NUM_THREADS when set, else
    the cores. Not torch.get_num_threads(): a training rank lowers its own to its share of the
    cores (rec.train.distributed.set_rank_threads), and its key must stay the one `rec train`
    calibrated under before it launched the ranks, or the end of the run finds no calibration."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return cores()


def cache_key() -> dict[str, Any]:
    """What the numbers depend on: the CPU (model, every ISA flag), cores, the libraries."""
    import fbgemm_gpu
    import torchrec

    from rec.cpu import all_flags

    info = cpu_info()
    return {
        "version": CACHE_VERSION,
        "cpu": info["model"],
        "machine": info["machine"],
        "isa_flags_sha": hashlib.sha256(" ".join(sorted(all_flags())).encode()).hexdigest()[:16],
        "cores": cores(),
        "threads": launch_threads(),
        "torch": torch.__version__,
        "torchrec": torchrec.__version__,
        "fbgemm_gpu": fbgemm_gpu.__version__,
    }


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"calibration-{digest}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process measures at a time (parallel tests, ranks): the others wait, then read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load(
    optimizer: str = "rowwise_adagrad",
    dense_optimizer: str = "adam",
    force: bool = False,
    progress: Progress | None = None,
    measure: bool = True,
) -> dict[str, Any] | None:
    """This CPU's calibration from the cache; measured and cached when missing (or `force`d),
    None then if not `measure`. Each optimizer is measured the first time a config uses it.
    The tiny models of the loop train with row-wise Adagrad, so that one is always there."""
    key = cache_key()
    path = cache_path(key)
    if not force and not measure:
        cal = _read(path, key)
        ok = cal and optimizer in cal["tbe"] and dense_optimizer in cal["dense_optimizer_ns"]
        return cal if ok else None
    progress = progress or _stderr
    with _locked(path):
        cal = None if force else _read(path, key)
        t0, changed = time.perf_counter(), cal is None
        if cal is None:
            progress(f"calibrating this CPU ({key['cpu']}), once; cached in {path}")
            # The machine's load then: a step's time moves with it (a shared machine).
            cal = {"key": key, "tbe": {}, "dense_optimizer_ns": {}, "load_avg": os.getloadavg()[0]}
            cal.update(measure_loop(progress))  # first: its ranks are forked from here
            cal.update(measure_dense(progress))
            cal.update(measure_data(progress))
        for opt in {"rowwise_adagrad", optimizer} - set(cal["tbe"]):
            cal["tbe"][opt], changed = measure_tbe(opt, progress), True
        if dense_optimizer not in cal["dense_optimizer_ns"]:
            cal["dense_optimizer_ns"][dense_optimizer] = measure_dense_optimizer(dense_optimizer)
            changed = True
        if changed:
            cal["measured_s"] = round(time.perf_counter() - t0 + cal.get("measured_s", 0), 2)
            cal["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cal, indent=1))
            tmp.replace(path)
    return cal


def _read(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    try:
        cal = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cal if cal.get("key") == key and "loop" in cal else None


def _stderr(msg: str) -> None:
    print(f"[rec] {msg}", file=sys.stderr, flush=True)


def _timed(fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of `fn` over `reps` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- measurements -------------------------------------------------------------------------------
def _optim_type(optimizer: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {"rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "adam": EmbOptimType.ADAM,
            "sgd": EmbOptimType.EXACT_SGD}[optimizer]  # fmt: skip


def _tbe_seconds(optimizer: str, tables: int, rows: int, dim: int, ids: int) -> float:
    """One forward + backward (the fused update included) of a CPU TBE: `ids` per table."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables,
        optimizer=_optim_type(optimizer), learning_rate=0.01)  # fmt: skip
    indices = torch.randint(0, rows, (tables * ids,))
    offsets = torch.arange(tables * ids + 1)  # one id per bag

    def step() -> None:
        tbe(indices, offsets).sum().backward()

    return _timed(step, 5)


def measure_tbe(optimizer: str, progress: Progress) -> dict[str, float]:
    """FBGEMM TBE on CPU, fused `optimizer`: us per call and per table, ns per id x dim."""
    progress(f"  embedding lookup + fused {optimizer} (FBGEMM TBE)")
    with _threads(1):
        one = _tbe_seconds(optimizer, 1, 1000, 16, 64)
        eight = _tbe_seconds(optimizer, 8, 1000, 16, 64)
        cached = _tbe_seconds(optimizer, 1, 1000, 64, 8192)
        dram = _tbe_seconds(optimizer, 1, BIG_ROWS, 64, 8192)
    return tbe_costs(one, eight, cached, dram)


def tbe_costs(one: float, eight: float, cached: float, dram: float) -> dict[str, float]:
    """measure_tbe's costs from its four timings (seconds): 1 and 8 small tables of 64 ids,
    then 8,192 ids x dim 64 in a table that fits the cache and in one that does not. Noise can
    order the timings either way on a shared machine; no cost comes out negative then, and a
    table beyond the cache never costs less than one inside it."""
    table = max(0.0, (eight - one) / 7)
    call = max(0.0, one - table)
    per_elem = max(1e-12, (cached - call - table) / (8192 * 64))
    per_elem_dram = max(per_elem, (dram - call - table) / (8192 * 64))
    return {"call_us": call * 1e6, "table_us": table * 1e6, "ns_per_elem_cached":
            per_elem * 1e9, "ns_per_elem_dram": per_elem_dram * 1e9}  # fmt: skip


def measure_dense(progress: Progress) -> dict[str, Any]:
    """A Linear's forward + backward on one thread: FLOP/s when large, the fixed cost small."""
    progress("  dense layers (matmul forward + backward)")
    from torch import nn

    def fwd_bwd(batch: int, width: int) -> float:
        layer = nn.Linear(width, width)
        x = torch.randn(batch, width, requires_grad=True)
        return _timed(lambda: layer(x).relu().sum().backward(), 5)

    with _threads(1):
        big, small = fwd_bwd(512, 512), fwd_bwd(32, 16)
    flops = 6 * 512 * 512 * 512
    return {"dense": {"gflops": flops / max(big - small, 1e-9) / 1e9, "layer_us": small * 1e6}}


def measure_dense_optimizer(optimizer: str) -> float:
    """ns per parameter of one step of the dense optimizer (a 1M-parameter tensor)."""
    from rec.train.optim import _DENSE_OPTIMIZERS

    p = torch.nn.Parameter(torch.zeros(1 << 20))
    p.grad = torch.ones_like(p)
    opt = _DENSE_OPTIMIZERS[optimizer]([p], lr=1e-3)
    with _threads(1):
        return _timed(opt.step, 5) / p.numel() * 1e9


def tiny_config(tables: int, pipeline: str, batch: int = LOOP_BATCH,
                 steps: int = LOOP_STEPS + PROFILE_STEPS + 8) -> RecConfig:  # fmt: skip
    return config_from_dict({
        "tables": [{"name": f"t{i}", "rows": 100, "dim": 8, "features": [f"cat_{i}"]}
                   for i in range(tables)],
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": {"synthetic": {"train_samples": batch * 2 * steps, "eval_samples": batch}},
        "training": {"batch_size": batch, "pipeline": pipeline, "steps": steps},
    })  # fmt: skip


def _data_seconds(cfg: RecConfig, batch: int) -> tuple[float, int]:
    """Seconds per batch of the source and to_torchrec, and the ids a batch holds."""
    from rec.data import make_source
    from rec.model import table_rows

    keys, rows = list(cfg.features.sparse), table_rows(cfg)
    source = make_source(cfg, "train")
    it = iter(source.batches(batch, 0, 1))
    first = next(it)
    ids = int(first.values.numel())
    return _timed(lambda: next(it).to_torchrec(keys, rows), 4), ids


def measure_data(progress: Progress) -> dict[str, Any]:
    """rec's synthetic source + to_torchrec: us per sample and per id (8 and 26 features)."""
    progress("  data (synthetic batches, to_torchrec)")
    with _threads(1):
        t8, ids8 = _data_seconds(tiny_config(8, "base", 512, 12), 512)
        t26, ids26 = _data_seconds(tiny_config(26, "base", 512, 12), 512)
    per_id = max(0.0, (t26 - t8) / max(ids26 - ids8, 1))
    per_sample = max(0.0, (t8 - per_id * ids8) / 512)
    return {"data": {"us_per_sample": per_sample * 1e6, "us_per_id": per_id * 1e6,
                     "ids_per_feature": ids8 / (512 * 8)}}  # fmt: skip


def _vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# What a rank holds once it has imported what it runs, read in a fresh interpreter.
_RANK_IMPORTS = (
    "import pathlib, rec.train.trainer; print(next(line.split()[1] for line in "
    "pathlib.Path('/proc/self/status').read_text().splitlines() if line.startswith('VmRSS:')))"
)


def _fresh_rank_rss() -> int:
    """VmRSS of a fresh interpreter that imported rec's trainer (torch, TorchRec, FBGEMM): a
    rank's footprint before it builds anything. The calibrating process's own RSS is not: it
    may be a test run or a launcher holding data, and a baseline taken from it made every
    later estimate of this machine 1.35-1.4x the ranks' peak RSS."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _RANK_IMPORTS], capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    return int(out.stdout.split()[-1]) * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loop_worker(rank: int, port: int, out) -> None:
    """One of 2 gloo ranks: every tiny config's step time, then this process's peak RSS."""
    import traceback

    import torch.distributed as dist

    start_rss = _vm_rss()
    # TorchRec's and DDP's lines from two ranks would interleave with the caller's output.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE="2")
        from rec.train.distributed import set_rank_threads

        set_rank_threads(2)  # as a training rank sets them (rec.train.distributed)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        steps = {f"{p}/{t}": _step_fn(tiny_config(t, p), rank)
                 for p in PIPELINES for t in LOOP_TABLES}  # fmt: skip
        # Round robin, so that another process's burst of CPU slows every config alike.
        times: dict[str, list[float]] = {k: [] for k in steps}
        for i in range(LOOP_STEPS):
            for k, step in steps.items():
                t = time.perf_counter()
                step()
                if i >= 3:  # the first steps build the pipeline and warm caches
                    times[k].append(time.perf_counter() - t)
        result: dict[str, Any] = {}
        small, large = LOOP_TABLES
        for p in PIPELINES:
            # The larger model's cost over the smaller's from the same rounds' pairs: a burst
            # of other work that slows a round slows both of its steps, and cancels out.
            pairs = zip(times[f"{p}/{large}"], times[f"{p}/{small}"], strict=True)
            result[f"{p}/{small}"] = statistics.median(times[f"{p}/{small}"])
            result[f"{p}/{large}"] = result[f"{p}/{small}"] + statistics.median(
                a - b for a, b in pairs
            )
        result["a2a_bytes_per_s"] = _a2a_rate()
        _rest_of_a_run(steps[f"base/{LOOP_TABLES[0]}"])  # sparse_dist owns its forward
        result["rss_growth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start_rss
        out.send(result)
        dist.destroy_process_group()
    except BaseException:
        out.send({"error": traceback.format_exc()})
    os._exit(0)  # no interpreter teardown in a fork of the caller


def _step_fn(cfg: RecConfig, rank: int) -> Callable[[], Any]:
    """One training step of `cfg` per call, the model built as rec.train.trainer builds it."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
    from torchrec.distributed.types import ShardingEnv

    from rec.data import make_source
    from rec.model import TrainModel, build_model, embedding_modules, table_rows
    from rec.train import sharding
    from rec.train.optim import attach_embedding_optimizer, make_optimizer

    model = TrainModel(build_model(cfg, "meta"))
    for tables in embedding_modules(model.model).values():
        attach_embedding_optimizer(tables, cfg.training)
    planner = sharding.make_planner(cfg, 2, "cpu")
    sharders = sharding.make_sharders()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan,
                                   env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
                                   sharders=sharders)  # type: ignore[arg-type]  # fmt: skip
    optimizer = make_optimizer(dmp, cfg.training)
    cls = TrainPipelineSparseDist if cfg.training.pipeline == "sparse_dist" else TrainPipelineBase
    pipeline = cls(dmp, optimizer, torch.device("cpu"))
    keys, rows = list(cfg.features.sparse), table_rows(cfg)
    source = make_source(cfg, "train").batches(cfg.training.batch_size, rank, 2)
    batches = (b.to_torchrec(keys, rows) for b in source)

    def step() -> Any:
        return pipeline.progress(batches)

    step.state = lambda: {"model": dmp.state_dict(), "optimizer": optimizer.state_dict()}
    step.forward = lambda: dmp(next(batches))
    return step


def _rest_of_a_run(step) -> None:
    """What a rank does besides steps and holds memory for: a profiled window
    (train.step_profile), an evaluation's forward and a checkpoint (torch.distributed's)."""
    import tempfile

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from rec.train.checkpoint import NoCopySavePlanner
    from rec.train.step_profile import StepProfiler

    profiler = StepProfiler(0, PROFILE_STEPS)
    for i in range(PROFILE_STEPS):
        profiler.before(i)
        step()
        profiler.after(i + 1)
    with torch.no_grad():
        for _ in range(4):
            step.forward()
    path = [tempfile.mkdtemp(prefix="rec-calibration-")]
    dist.broadcast_object_list(path, src=0)
    dcp.save(step.state(), checkpoint_id=path[0], planner=NoCopySavePlanner())
    dist.barrier()
    if dist.get_rank() == 0:
        import shutil

        shutil.rmtree(path[0], ignore_errors=True)


def _a2a_rate() -> float:
    """Bytes per second one rank sends through gloo's all-to-all (4 MB each way)."""
    import torch.distributed as dist

    x, y = torch.ones(1 << 20), torch.empty(1 << 20)
    seconds = _timed(lambda: dist.all_to_all_single(y, x), 5)
    return x.numel() * 4 / 2 / seconds  # half of the buffer goes to the peer


def measure_loop(progress: Progress) -> dict[str, Any]:
    """The tiny model's real training step on 2 gloo ranks forked from this process."""
    import multiprocessing

    progress("  a training step on 2 gloo ranks (tiny model, both train pipelines)")
    ctx = multiprocessing.get_context("fork")  # spawn would pay torch's imports again
    port = _free_port()
    pipes, procs = [], []
    for rank in range(2):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_loop_worker, args=(rank, port, send), daemon=True)
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    results = []
    for recv, proc in zip(pipes, procs, strict=True):
        if not recv.poll(300):
            raise RuntimeError("calibration: a 2-rank training step did not finish in 300 s")
        results.append(recv.recv())
        proc.join(30)
        if "error" in results[-1]:
            error = results[-1]["error"]
            raise RuntimeError(f"calibration: a 2-rank training step failed:\n{error}")
    loop = {k: max(r[k] for r in results) for k in results[0] if k != "rss_growth"}
    # A fork starts with the pages of the caller's heap but not those of the libraries'
    # code and data it has touched (the kernel maps those in again on use): a fresh rank's
    # imports plus what a forked rank grew by while it trained.
    growth = max(r["rss_growth"] for r in results)
    return {"loop": loop, "baseline_rss": _fresh_rank_rss() + growth}
