"""ZCH tables served: what the id maps' remap costs rec-server, against the same model with
modulo tables (issue #50 item 7's serving part), on the default model and the Kaggle-size one.

    .venv/bin/python benchmarks/zch_serve_bench.py                  # default model, ~2 min
    .venv/bin/python benchmarks/zch_serve_bench.py --model kaggle   # ~10 min, ~11 GB of RAM
    .venv/bin/python benchmarks/zch_serve_bench.py --model all      # both, one after the other
    .venv/bin/python benchmarks/zch_serve_bench.py --model kaggle --kaggle-scale 0.01  # a look

A model's config twice: as it is (modulo) and with every table `ids: {zch: {}}` (16 probes, or
the slots of a smaller table), each from a seeded checkpoint (latency does not depend on
training), its maps half full of random ids, exported to TorchScript (int8 tables; the Kaggle
model as examples/criteo_kaggle.yaml exports it: three tables int4, int8 dense layers, and
without its data_parallel constraints, which a ZCH table refuses). For each, with one intra-op
thread:
- in process (Python): the scripted model's forward at B = 1 and B = 512 (median of many
  calls), on requests whose ids are half admitted, half unknown;
- the remap alone at B = 512: the model's own IdMaps module (one rec::zch_remap_counted
  call), scripted, on the same batch's feature-major ids, against the whole forward (issue #50's
  target: <= 10 %); and what counting unknown ids adds to it (`--counting` measures only that,
  into zch_serve_counting.json);
- rec-bench's in-process C++ forward and rec-server over HTTP, B = 1 and B = 512 p50 with one
  client. rec-bench's ids are random, so a ZCH table reads its default row for nearly all of
  them: every probe of the window is compared, the remap's worst case;
- training's remap (rec.train.zch.ZchTables.remap, tensor ops, one thread) of the same B = 512
  request, for its ids/s per core.
Writes benchmarks/results/zch_serve.json (the Kaggle model: zch_serve_kaggle.json), with the
load average before and after, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import yaml

from rec import run_dir
from rec.benchmarking import RESULTS, Server, bench
from rec.config import config_from_dict, default_config
from rec.contract import ModelDir
from rec.contract.sections import ZCH_MAP_LAYOUT
from rec.cpu import cpu_info
from rec.export import id_maps
from rec.export.pipeline import export_run
from rec.export.served import feature_major_ids
from rec.model import TrainModel, build_model, ebc_features, ebc_path
from rec.train.zch import ZchTables
from rec.zch import CHECKPOINT_LAYOUT_KEY, home

LOAD = 0.5  # share of each map's slots that hold an id
KAGGLE = Path(__file__).resolve().parent.parent / "examples" / "criteo_kaggle.yaml"
RESULT_FILES = {"default": "zch_serve.json", "kaggle": "zch_serve_kaggle.json"}


def _config(zch: bool, model: str = "default", kaggle_scale: float = 1.0):
    if model == "default":
        data = default_config().to_dict()
    else:
        data = yaml.safe_load(KAGGLE.read_text())
        for t in data["tables"]:
            t["rows"] = max(3, round(t["rows"] * kaggle_scale))
        # Seeded, not trained: int8 dense layers' AUC check against the float model means
        # nothing on an untrained model (and latency does not depend on training).
        data["export"]["accept_quality_loss"] = True
        constraints = data["sharding"]["constraints"]
        data["sharding"]["constraints"] = {  # a ZCH table is never data_parallel
            k: v for k, v in constraints.items() if "data_parallel" not in v["sharding_types"]
        }
    if zch:
        for t in data["tables"]:
            t["ids"] = {"zch": {"probes": min(16, t["rows"] - 1)}}
    return config_from_dict(data)


def _maps(cfg, g: torch.Generator) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each ZCH table's map, LOAD of its slots holding random ids, each in the first slot of its
    window that is free when its probe comes: all ids try their home slot, then the ones left
    their next, ... (vectorised: 10M slots in seconds; the default model's earlier runs placed
    them one at a time, the same distribution)."""
    out = {}
    for t in cfg.tables:
        slots, probes = t.zch.slots, t.zch.probes
        keys, used = np.zeros(slots, dtype=np.int64), np.zeros(slots, dtype=bool)
        ids = torch.randint(-(2**62), 2**62, (max(1, int(slots * LOAD)),), generator=g)
        first = home(ids, slots).numpy()
        ids_np, pending = ids.numpy(), np.arange(ids.numel())
        for k in range(probes):
            slot = (first[pending] + k) % slots
            free = ~used[slot]
            slot, who = slot[free], pending[free]
            slot, at = np.unique(slot, return_index=True)  # one id per free slot
            keys[slot], used[slot] = ids_np[who[at]], True
            pending = np.setdiff1d(pending, who[at], assume_unique=True)
            if pending.size == 0:
                break
        out[t.name] = (torch.from_numpy(keys), torch.from_numpy(used))
    return out


def _run(cfg, path: Path, maps) -> Path:
    torch.manual_seed(0)
    model = TrainModel(build_model(cfg))
    state = {"model": model.state_dict()}
    if maps:
        state["zch"] = {n: {"keys": k, "used": u} for n, (k, u) in maps.items()}
    dcp.save(state, checkpoint_id=str(run_dir.checkpoints_dir(path) / "step_1"))
    # The maps were placed by this rec's home(): the layout a ZCH checkpoint must name.
    meta = {"world_size": 1, CHECKPOINT_LAYOUT_KEY: ZCH_MAP_LAYOUT} if maps else {"world_size": 1}
    run_dir.commit_checkpoint(path, 1, meta)
    (path / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    return path


def _request(cfg, maps, batch: int, g: torch.Generator):
    """One id per feature per sample: half the ZCH ids admitted, the rest random."""
    f = len(cfg.features.sparse)
    values = torch.randint(-(2**62), 2**62, (batch, f), generator=g)
    owner = cfg.feature_to_table()
    for k, feat in enumerate(cfg.features.sparse):
        if owner[feat] in maps:
            keys, used = maps[owner[feat]]
            held = keys[used]
            pick = held[torch.randint(0, held.numel(), (batch,), generator=g)]
            values[: batch // 2, k] = pick[: batch // 2]
    dense = torch.rand(batch, cfg.features.dense, generator=g)
    return dense, torch.ones(batch, f, dtype=torch.int32), values.reshape(-1)


def _median_us(fn, reps: int) -> float:
    for _ in range(min(20, reps)):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _remap_us(cfg, maps, request) -> float:
    """The model's IdMaps, scripted, on the request's feature-major ids (its TBE order)."""
    model = build_model(cfg, "meta")
    order = ebc_features(model.get_submodule(ebc_path(model)))
    holder = id_maps.IdMaps(cfg, order)
    id_maps.fill(holder, {n: id_maps.TableMap(*m) for n, m in maps.items()})
    scripted = torch.jit.script(holder)
    _, lengths, values = request
    columns = list(cfg.features.sparse)
    column_of = torch.tensor([columns.index(f) for f in order])
    rows = torch.tensor([next(t.rows for t in cfg.tables if f in t.features) for f in order])
    ids, indices, offsets = feature_major_ids(lengths, values, rows, column_of)
    batch = lengths.shape[0]
    return _median_us(lambda: scripted(ids, indices.clone(), offsets, batch), 200)


def _counting_us(cfg, maps, request, rounds: int = 15) -> dict[str, float]:
    """What counting the unknown ids costs the remap (docs/zch.md, "Unknown ids"): the model's
    remap, rec::zch_remap_counted, against the same call of rec::zch_remap (no counts), and the
    server's take of the counts after a forward, at B = 512. Interleaved rounds of 200 calls
    each, so that the shared machine's drift hits both alike; medians of the rounds."""
    model = build_model(cfg, "meta")
    order = ebc_features(model.get_submodule(ebc_path(model)))
    holder = id_maps.IdMaps(cfg, order)
    id_maps.fill(holder, {n: id_maps.TableMap(*m) for n, m in maps.items()})
    _, lengths, values = request
    columns = list(cfg.features.sparse)
    column_of = torch.tensor([columns.index(f) for f in order])
    rows = torch.tensor([next(t.rows for t in cfg.tables if f in t.features) for f in order])
    ids, indices, offsets = feature_major_ids(lengths, values, rows, column_of)
    keys = [m.keys for m in holder.maps.values()]
    used = [m.used for m in holder.maps.values()]
    args = (ids, indices, offsets, keys, used, holder.probes, holder.table_of)
    ops = torch.ops.rec
    calls = {
        "counted": lambda: ops.zch_remap_counted(*args, holder.columns),
        "uncounted": lambda: ops.zch_remap(*args),
        "take": ops.zch_take_unknowns,
    }
    rounds_us: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            rounds_us[name].append(_median_us(fn, 200))
    out = {f"remap_{k}_b512_us": statistics.median(v) for k, v in rounds_us.items()}
    counted, uncounted = out["remap_counted_b512_us"], out["remap_uncounted_b512_us"]
    out["counting_share_of_remap"] = counted / uncounted - 1
    return out


def counting_only() -> None:
    """`--counting`: only _counting_us, on the ZCH default model (no export; ~1 min)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    cfg = _config(True)
    maps = _maps(cfg, g)
    r = _counting_us(cfg, maps, _request(cfg, maps, 512, g))
    r["cpu"] = cpu_info()
    (RESULTS / "zch_serve_counting.json").write_text(json.dumps(r, indent=1) + "\n")
    print(f"CPU: {r['cpu'].get('model')}")
    print(
        f"remap B=512: counted {r['remap_counted_b512_us']:.1f} us, uncounted "
        f"{r['remap_uncounted_b512_us']:.1f} us ({100 * r['counting_share_of_remap']:+.1f} %); "
        f"the server's take {r['remap_take_b512_us']:.2f} us"
    )


def _train_remap_us(cfg, maps, request) -> float:
    """Training's remap (rec.train.zch.ZchTables.remap: tensor ops over every ZCH feature) of
    the request's ids, feature-major as the data path hands them over."""
    z = ZchTables(cfg, list(cfg.features.sparse))
    for name, (keys, used) in maps.items():
        z.maps[name].keys.copy_(keys)
        z.maps[name].used.copy_(used)
    _, lengths, values = request
    batch, f = lengths.shape
    lengths_fm = lengths.t().reshape(-1)
    raw = values.view(batch, f).t().reshape(-1)
    rows = torch.zeros_like(raw)
    return _median_us(lambda: z.remap(lengths_fm, raw, rows), 100)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _measure(cfg, maps, repo: Path, g: torch.Generator) -> dict:
    """One exported model: in-process forward, remap, rec-bench and rec-server latencies."""
    model = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
    r: dict = {}
    with torch.inference_mode():
        for batch, reps in ((1, 2000), (512, 200)):
            req = _request(cfg, maps, batch, g)
            r[f"forward_b{batch}_us"] = _median_us(lambda m=model, q=req: m(*q), reps)
    del model
    if maps:
        req = _request(cfg, maps, 512, g)
        r["remap_b512_us"] = _remap_us(cfg, maps, req)
        r["remap_share_of_b512_forward"] = r["remap_b512_us"] / r["forward_b512_us"]
        # One thread: the remap's rate per core; the served map's bytes per slot
        # (keys and used, as the artifact holds them; training's is rec plan's 57).
        r["remap_ids_b512"] = int(req[2].numel())
        r["remap_ids_per_s_per_core"] = r["remap_ids_b512"] / (r["remap_b512_us"] * 1e-6)
        slots = sum(m[0].numel() for m in maps.values())
        held = sum(m[0].nbytes + m[1].nbytes for m in maps.values())
        r["slots"] = slots
        r["served_map_bytes_per_slot"] = held / slots
        r["train_remap_b512_us"] = _train_remap_us(cfg, maps, req)
        r["train_remap_ids_per_s_per_core"] = r["remap_ids_b512"] / (
            r["train_remap_b512_us"] * 1e-6
        )
        r.update(_counting_us(cfg, maps, req, rounds=5))
    for batch in (1, 512):  # rec-bench's own in-process forward (C++), its requests
        res = bench("forward", repo, "rec", batch, 1, 3.0, "--intra-op-threads", 1)
        r[f"cpp_forward_b{batch}_p50_us"] = res["p50_us"]
    server = Server(repo, "rec", intra_op_threads=1)
    try:
        for batch in (1, 512):
            res = bench("http", repo, "rec", batch, 1, 3.0, "--target", server.http)
            r[f"server_http_b{batch}_p50_us"] = res["p50_us"]
    finally:
        server.stop()
    return r


def run_model(model: str, kaggle_scale: float = 1.0, passes: int = 2) -> dict:
    """Modulo and ZCH of `model` ("default" or "kaggle"): seeded and exported (each checkpoint
    deleted once exported: the Kaggle model's are 9 GB), then measured in `passes` passes each,
    in the order modulo, ZCH, ZCH, modulo, ..., so that the shared machine's drift hits both
    alike; each figure is the mean of its passes (the passes are kept under `passes`)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    out: dict = {"cpu": cpu_info(), "python": platform.python_version(), "load": LOAD,
                 "model": model, "load_before": _load()}  # fmt: skip
    if model == "kaggle":
        out["kaggle_scale"] = kaggle_scale
    with tempfile.TemporaryDirectory(dir=os.environ.get("REC_BENCH_TMP")) as tmp:
        built = {}
        for name in ("modulo", "zch"):
            cfg = _config(name == "zch", model, kaggle_scale)
            maps = _maps(cfg, g) if name == "zch" else {}
            t0 = time.perf_counter()
            run = _run(cfg, Path(tmp) / name / "run", maps)
            repo = Path(tmp) / name / "repo"
            export_run(run, repo, fmt="torchscript", log=lambda _: None)
            shutil.rmtree(run)
            print(f"{model} {name}: seeded and exported in {time.perf_counter() - t0:.0f} s, "
                  f"load {_load()}", flush=True)  # fmt: skip
            built[name] = (cfg, maps, repo)
        runs: dict[str, list[dict]] = {"modulo": [], "zch": []}
        order = [n for k in range(passes) for n in (("modulo", "zch"), ("zch", "modulo"))[k % 2]]
        for name in order:
            r = _measure(*built[name], g)
            r["load_after"] = _load()
            runs[name].append(r)
        for name, rs in runs.items():
            out[name] = {k: statistics.mean(r[k] for r in rs) for k in rs[0]}
            out[name]["passes"] = rs
    out["load_after"] = _load()
    name = RESULT_FILES[model]
    if kaggle_scale != 1.0:  # a quick look: not the results file
        name = name.replace(".json", f"_x{kaggle_scale:g}.json")
    (RESULTS / name).write_text(json.dumps(out, indent=1) + "\n")
    return out


def report(out: dict) -> None:
    print(f"{out.get('model', 'default')} model, CPU: {out['cpu'].get('model')}, load average "
          f"{out.get('load_before', '?')} -> {out.get('load_after', '?')}")  # fmt: skip
    print("| tables | forward B=1 | forward B=512 | remap B=512 | C++ forward B=1 / B=512 p50 "
          "| rec-server HTTP B=1 / B=512 p50 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in ("modulo", "zch"):
        r = out[name]
        remap = (f"{r['remap_b512_us']:.0f} us ({100 * r['remap_share_of_b512_forward']:.1f} %)"
                 if "remap_b512_us" in r else "-")  # fmt: skip
        print(
            f"| {name} | {r['forward_b1_us']:.0f} us | {r['forward_b512_us']:.0f} us | {remap} "
            f"| {r['cpp_forward_b1_p50_us']:.0f} / {r['cpp_forward_b512_p50_us']:.0f} us "
            f"| {r['server_http_b1_p50_us']:.0f} / {r['server_http_b512_p50_us']:.0f} us |"
        )
    z = out["zch"]
    print(f"remap: {z['remap_ids_b512']} ids in {z['remap_b512_us']:.0f} us, "
          f"{z['remap_ids_per_s_per_core'] / 1e6:.0f} M ids/s on one core; served map "
          f"{z['served_map_bytes_per_slot']:.0f} bytes per slot (training's: 57)")  # fmt: skip
    if "train_remap_b512_us" in z:
        print(f"training's remap: {z['train_remap_b512_us']:.0f} us, "
              f"{z['train_remap_ids_per_s_per_core'] / 1e6:.1f} M ids/s on one core")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("default", "kaggle", "all"), default="default")
    p.add_argument("--counting", action="store_true", help="only the counting's cost (default)")
    p.add_argument(
        "--kaggle-scale",
        type=float,
        default=1.0,
        help="row factor of Kaggle's tables (a quick look; its own results file)",
    )
    p.add_argument("--report", action="store_true", help="the table again from the results")
    args = p.parse_args()
    if args.counting:
        counting_only()
        return
    models = ("default", "kaggle") if args.model == "all" else (args.model,)
    for model in models:
        if args.report:
            report(json.loads((RESULTS / RESULT_FILES[model]).read_text()))
        else:
            report(run_model(model, args.kaggle_scale))


if __name__ == "__main__":
    main()
