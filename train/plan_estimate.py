"""A step's time and a rank's memory on this CPU, from its calibration (train.calibration,
whose docstring has the formula) and the plan TorchRec's planner chose.

TorchRec's planner places the tables; its own perf and storage numbers model a GPU's
bandwidths and are not used here."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from torchrec.distributed.planner.types import ShardingOption

from rec.config import RecConfig
from rec.train.calibration import cores

FLOAT = 4
# Floats of optimizer state per row of `dim` (FBGEMM's fused ones; Adagrad for dense ones).
_STATE_FLOATS = {"rowwise_adagrad": lambda dim: 1, "adam": lambda dim: 2 * dim,
                 "sgd": lambda dim: 0, "adagrad": lambda dim: dim}  # fmt: skip
_TO_SHARDS = ("table_wise", "column_wise", "table_column_wise")


def _llc_bytes() -> int:
    """The last-level cache's size (sysfs), 32 MiB when unknown."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
        best = max(best, int(size.rstrip("KM")) * scale)
    return best or 32 << 20


def data_probe(cfg: RecConfig) -> dict[str, float | None]:
    """The config's own data, on synthetic data (a batch, about 0.5 s): ids per sample per
    feature, and the bytes of arrays its train and held-out sources hold once a batch is
    drawn (the sources a rank builds); None for files, which are not read here."""
    if cfg.data.source != "synthetic":
        return {"ids_per_feature": None, "source_bytes": None}
    from rec.data import make_source

    train, held_out = make_source(cfg, "train"), make_source(cfg, "eval")
    # Short final batches too: a split smaller than one batch (a tiny held-out set) has one.
    batch = next(iter(train.batches(cfg.training.batch_size, 0, 1, drop_last=False)), None)
    next(iter(held_out.batches(cfg.training.batch_size, 0, 1, drop_last=False)), None)
    if batch is None or not len(batch):
        return {"ids_per_feature": None, "source_bytes": _held_bytes([train, held_out], set())}
    ids = batch.values.numel() / (len(batch) * max(1, batch.lengths.shape[1]))
    if cfg.data.stream.url:
        # A stream run builds neither source (rec.train.trainer): it holds the batches its
        # read-ahead fetched and the one in flight. Counting the synthetic sources here made a
        # stream run's estimate 1.73x its peak RSS.
        from rec.data.stream_redis import READ_AHEAD_BATCHES

        held = (READ_AHEAD_BATCHES + 1) * _held_bytes(batch, set())
        return {"ids_per_feature": ids, "source_bytes": held}
    return {"ids_per_feature": ids, "source_bytes": _held_bytes([train, held_out], set())}


def _held_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the numpy arrays and tensors reachable from `obj`'s attributes and containers
    (each counted once): what it holds, whatever the allocator had free before."""
    import numpy as np
    import torch

    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.base is None else _held_bytes(obj.base, seen)
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(_held_bytes(v, seen) for v in obj)
    fields = getattr(obj, "__dict__", None)
    if fields is None or isinstance(obj, type) or obj.__class__.__module__.split(".")[0] != "rec":
        return 0
    return sum(_held_bytes(v, seen) for v in fields.values())


def dense_shape(cfg: RecConfig) -> dict[str, int]:
    """The dense model's parameters, matmul parameters and matmuls (2-D parameters), and the
    widths its activations take, from the model built on the meta device."""
    from rec.model import TrainModel, build_model, embedding_modules

    model = TrainModel(build_model(cfg, "meta"))
    tables = {id(p) for m in embedding_modules(model.model).values() for p in m.parameters()}
    dense = [p for p in model.parameters() if id(p) not in tables]
    mats = [p for p in dense if p.dim() == 2]
    return {"params": sum(p.numel() for p in dense), "matmul_params": sum(p.numel() for p in mats),
            "matmuls": len(mats), "widths": sum(sum(p.shape) for p in mats)}  # fmt: skip


def _ids(so: ShardingOption, shard, world: int, batch: int, per_feature: float | None) -> float:
    """Ids rank `shard.rank` looks up per step for this shard (module docstring of
    train.calibration): every rank's for a whole-table shard, its rows' share for a row-wise
    one, its own batch's for a data-parallel table."""
    per_sample = per_feature * so.num_inputs if per_feature else sum(so.input_lengths)
    if so.sharding_type == "data_parallel":
        return batch * per_sample
    ids = world * batch * per_sample
    if so.sharding_type in _TO_SHARDS:
        return ids
    return ids * shard.size[0] / so.tensor.shape[0]


def _tbe_ms(shards: list[tuple[ShardingOption, Any]], tbe: dict[str, float], world: int,
            batch: int, per_feature: float | None) -> float:  # fmt: skip
    """A rank's lookups, pooling and fused updates: one TBE call per sharding type."""
    llc = _llc_bytes()
    us = tbe["call_us"] * len({so.sharding_type for so, _ in shards})
    for so, shard in shards:
        rows, dim = shard.size
        ns = tbe["ns_per_elem_dram"] if rows * dim * FLOAT > llc else tbe["ns_per_elem_cached"]
        us += tbe["table_us"] + _ids(so, shard, world, batch, per_feature) * dim * ns / 1e3
    return us / 1e3


def _loop_ms(cal: dict[str, Any], pipeline: str, features: int) -> float:
    """The measured tiny step's fixed cost at `features`, its own compute taken out: on the
    line through the two tiny models (LOOP_TABLES features), and outside them the nearer one's.
    The tiny model's cost per feature is mostly threads waiting on each other, which a
    contended machine inflates: extrapolated 3x to Criteo's 26 features it overshot the
    Kaggle-size step 2-4x, while staying at 8 features' cost the estimate held."""
    from rec.train.calibration import LOOP_BATCH, LOOP_TABLES, tiny_config

    points = []
    for n in LOOP_TABLES:
        d = dense_shape(tiny_config(n, pipeline))
        tbe = cal["tbe"]["rowwise_adagrad"]  # the tiny models' optimizer
        own = d["matmuls"] * cal["dense"]["layer_us"] + tbe["call_us"] + n / 2 * tbe["table_us"]
        own += LOOP_BATCH * cal["data"]["us_per_sample"]
        points.append(max(0.0, cal["loop"][f"{pipeline}/{n}"] * 1e3 - own / 1e3))
    (x0, y0), (x1, y1) = zip(LOOP_TABLES, points, strict=True)
    x = min(max(features, x0), x1)
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _shares(local: int, threads: int) -> tuple[float, float]:
    """(slowdown of a rank's compute, speedup of its matmuls) with `local` ranks on this
    host's cores: each gets cores / local of them; a matmul uses up to `threads`."""
    share = cores() / max(1, local)
    return max(1.0, 1 / share), max(1.0, min(share, threads))


def step_ms(
    cfg: RecConfig,
    plan: list[ShardingOption],
    cal: dict[str, Any],
    world: int,
    local: int,
    batch: int,
    probe: dict[str, Any],
    sends: list[int],
) -> list[dict]:
    """Per rank, the parts of a step in ms and their `total` (train.calibration's formula);
    `sends` is each rank's bytes sent per step (plan_stats.send_buffers, summed)."""
    t = cfg.training
    dense = dense_shape(cfg)
    per_feature = probe.get("ids_per_feature")
    features = len(cfg.features.sparse)
    ids = batch * features * (per_feature or 1.0)
    here = min(local, world)  # the ranks that share this host's cores
    slow, fast = _shares(here, cal["key"]["threads"])
    loop = _loop_ms(cal, t.pipeline, features) * max(1.0, here / max(2, cores()))
    data_us = batch * cal["data"]["us_per_sample"] + ids * cal["data"]["us_per_id"]
    matmul_ms = 6 * batch * dense["matmul_params"] / (cal["dense"]["gflops"] * fast) / 1e6
    dense_ms = matmul_ms + dense["matmuls"] * cal["dense"]["layer_us"] / 1e3
    optimizer_ms = dense["params"] * cal["dense_optimizer_ns"][t.dense_optimizer] / 1e6
    allreduce = dense["params"] * FLOAT * 2 * (world - 1) / world if world > 1 else 0
    tbe = cal["tbe"][t.embedding_optimizer]
    out = []
    for r in range(world):
        shards = [(so, s) for so in plan for s in so.shards if s.rank == r]
        parts = {
            "loop": loop,
            "data": data_us / 1e3 * slow,
            "embeddings": _tbe_ms(shards, tbe, world, batch, per_feature) * slow,
            "dense": dense_ms * slow,
            "optimizer": optimizer_ms * slow,
            "communication": (sends[r] + allreduce) / cal["loop"]["a2a_bytes_per_s"] * 1e3,
        }
        parts["total"] = sum(parts.values())
        out.append({k: round(v, 3) for k, v in parts.items()})
    return out


def memory_bytes(
    cfg: RecConfig,
    plan: list[ShardingOption],
    cal: dict[str, Any],
    world: int,
    batch: int,
    probe: dict[str, Any],
) -> list[dict[str, int]]:
    """Per rank, the parts of its resident memory in bytes and their `total`."""
    from rec.train.zch import MAP_BYTES_PER_SLOT

    t = cfg.training
    dense = dense_shape(cfg)
    state = _STATE_FLOATS[t.embedding_optimizer]
    dense_state = _STATE_FLOATS[t.dense_optimizer](1)
    # Every rank holds every ZCH table's id map whole, with its counts and candidates.
    id_maps = sum(tc.zch.slots * MAP_BYTES_PER_SLOT for tc in cfg.tables if tc.zch)
    out = []
    for r in range(world):
        tables = 0
        for so in plan:
            for s in (s for s in so.shards if s.rank == r):
                rows, dim = s.size
                grad = rows * dim if so.sharding_type == "data_parallel" else 0
                tables += (rows * dim + rows * state(dim) + grad) * FLOAT
        parts = {
            "process": cal["baseline_rss"],
            "tables_and_optimizer": tables,
            # parameters, gradients, optimizer state, DDP's gradient buckets
            "dense": dense["params"] * FLOAT * (3 + dense_state),
            "activations": 3 * batch * dense["widths"] * FLOAT,
            "data": probe.get("source_bytes") or 0,
        }
        if id_maps:
            parts["id_maps"] = id_maps
        parts["total"] = sum(parts.values())
        out.append({k: int(v) for k, v in parts.items()})
    return out


def _probe_path(cfg: RecConfig) -> Path:
    from rec.train.calibration import cache_dir

    what = {"data": cfg.to_dict()["data"], "features": cfg.to_dict()["features"],
            "tables": cfg.to_dict()["tables"], "batch": cfg.training.batch_size}  # fmt: skip
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
    return cache_dir() / f"data-{digest[:16]}.json"


def cached_probe(cfg: RecConfig, measure: bool) -> dict[str, Any]:
    """data_probe(cfg), cached by the config's data, features, tables and batch: a training
    rank reads what the launching process measured, which its own sources would blur."""
    path = _probe_path(cfg)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    if not measure:
        return {}
    probe = data_probe(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(probe))
    tmp.replace(path)
    return probe


def estimate(cfg: RecConfig, plan: list[ShardingOption], world: int, local: int, batch: int,
             sends: list[int], measure: bool = True) -> dict[str, Any] | None:  # fmt: skip
    """The calibrated step and memory per rank (None when this CPU is not calibrated and
    `measure` is False: a training rank never measures, its launcher did)."""
    from rec.train import calibration

    t = cfg.training
    cal = calibration.load(t.embedding_optimizer, t.dense_optimizer, measure=measure)
    if cal is None:
        return None
    probe = cached_probe(cfg, measure)
    steps = step_ms(cfg, plan, cal, world, local, batch, probe, sends)
    memory = memory_bytes(cfg, plan, cal, world, batch, probe)
    return {
        "cpu": cal["key"]["cpu"],
        "calibration": str(calibration.cache_path(cal["key"])),
        "measured_at": cal.get("measured_at"),
        "load_avg": cal.get("load_avg"),
        "ids_per_feature": probe.get("ids_per_feature"),
        # Not in the memory estimate: what torch.profiler holds over the profiled window
        # (train.step_profile), about 0.2 GiB per rank on the Kaggle-size model.
        "profile_steps": t.profile_steps,
        "step_ms": max(s["total"] for s in steps),
        "ranks": [{"step_ms": s, "memory_bytes": m} for s, m in zip(steps, memory, strict=True)],
    }
