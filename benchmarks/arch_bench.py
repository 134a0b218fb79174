"""Architecture benchmark: in-process latency of each `model.arch`'s served TorchScript model at
B = 1, 64, 512, on the small default tables and Criteo Kaggle's, side by side in one run.

Models (one intra-op thread, int8 tables, the default batch-invariant export):
  default  dlrm (rec's embedded default), dlrm_dcn (the same tables), dcn_v2 (the same tables
           at the dims of examples/mixed_dims.yaml), mmoe (examples/mmoe.yaml: two tasks, four
           experts), custom (examples/custom_model.yaml: DeepFM by model.factory), din
           (examples/din.yaml: a 5,000-item sequence table beside four pooled tables)
  kaggle   dlrm_dcn (examples/criteo_kaggle.yaml as it is: 26 tables at dim 64), dlrm (its
           tables and layers, dot interaction), dcn_v2 (its tables, each at a dim that grows
           with its rows: 6 x rows^(1/4) rounded to a multiple of 8, 8 to 64; the DCN settings
           of criteo_kaggle.yaml), mmoe (those mixed-dim tables, two tasks, four experts of
           [512, 256], towers [128, 1]), custom (DeepFM over the 26 tables at dim 64, deep
           layers [1024, 512, 256]), din (those mixed-dim tables and a 10M-item sequence
           table at dim 32, attention [64], criteo_kaggle.yaml's dense and over arches)

Requests carry 0-3 ids per bag; din's also one candidate and a history of HISTORY ids.

Latency does not depend on what the weights are, so the models are not trained: the dense
layers keep their initial weights and the tables are zero (export's served module with its TBE
storage allocated, as `rec export` builds it before streaming the tables in). Each model's
resident size is the process RSS it added when built. Models take turns in short blocks
(rec.benchmarking.measure), so bursts of other work on the shared cores hit all alike.

    .venv/bin/python benchmarks/arch_bench.py    # from the repo root; ~80 s, 14.5 GB peak RSS
    .venv/bin/python benchmarks/arch_bench.py --kaggle-scale 0.05   # a quick look

Writes benchmarks/results/arch.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import platform
import time
from pathlib import Path

import torch
import yaml

from rec.benchmarking import BATCHES, RESULTS, ROOT, measure
from rec.cpu import cpu_info, describe
from rec.malloc import keep_freed_memory

HISTORY = 20
"""din: history ids per sample in the timed requests."""


def dim_for(rows: int) -> int:
    """A table's dim by the common rule of thumb, 6 x rows^(1/4), in multiples of 8 up to 64."""
    return int(min(64, max(8, 8 * round(6 * rows**0.25 / 8))))


def configs(kaggle_scale: float) -> dict[str, dict[str, dict]]:
    """model -> arch -> config dict."""
    from rec.config import default_config

    default = default_config().to_dict()
    mixed = yaml.safe_load((ROOT / "examples" / "mixed_dims.yaml").read_text())
    kaggle = yaml.safe_load((ROOT / "examples" / "criteo_kaggle.yaml").read_text())
    for t in kaggle["tables"]:
        t["rows"] = max(1, int(t["rows"] * kaggle_scale))
    out: dict[str, dict[str, dict]] = {"default": {}, "kaggle": {}}
    out["default"]["dlrm"] = default
    out["default"]["dlrm_dcn"] = copy.deepcopy(default)
    out["default"]["dlrm_dcn"]["model"]["arch"] = "dlrm_dcn"
    out["default"]["dcn_v2"] = {**copy.deepcopy(default), "tables": mixed["tables"],
                                "model": mixed["model"]}  # fmt: skip
    out["kaggle"]["dlrm_dcn"] = kaggle
    out["kaggle"]["dlrm"] = copy.deepcopy(kaggle)
    out["kaggle"]["dlrm"]["model"]["arch"] = "dlrm"
    v2 = copy.deepcopy(kaggle)
    v2["model"]["arch"] = "dcn_v2"
    for t in v2["tables"]:
        t["dim"] = dim_for(t["rows"])
    out["kaggle"]["dcn_v2"] = v2
    din = copy.deepcopy(v2)
    din["tables"].append(
        {
            "name": "item",
            "rows": max(1, int(10_000_000 * kaggle_scale)),
            "dim": 32,
            "pooling": "none",
            "features": ["candidate", "history"],
        }
    )
    din["model"] = {"arch": "din", "dense_arch": kaggle["model"]["dense_arch"],
                    "over_arch": kaggle["model"]["over_arch"], "candidate": "candidate",
                    "history": "history", "attention_arch": [64]}  # fmt: skip
    out["kaggle"]["din"] = din
    for example in ("mmoe", "custom_model", "din"):
        ex = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
        arch = "custom" if example == "custom_model" else example
        out["default"][arch] = {**copy.deepcopy(default), "tables": ex["tables"],
                                "features": ex["features"], "model": ex["model"]}  # fmt: skip
    mmoe = copy.deepcopy(v2)
    mmoe["model"] = {"arch": "mmoe", "dense_arch": kaggle["model"]["dense_arch"],
                     "tasks": ["click", "purchase"], "num_experts": 4,
                     "expert_arch": [512, 256], "over_arch": [128, 1]}  # fmt: skip
    out["kaggle"]["mmoe"] = mmoe
    custom = copy.deepcopy(kaggle)
    custom["model"] = {"factory": "examples.custom_model:build",
                       "factory_args": {"deep_layers": [1024, 512, 256]}}  # fmt: skip
    out["kaggle"]["custom"] = custom
    return out


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def served(data: dict):
    """(scripted served module, facts) for config `data`, int8 tables (zeroed)."""
    from rec.config import config_from_dict
    from rec.export import torchscript_builder
    from rec.export.module import sample_batch
    from rec.model import build_model

    cfg = config_from_dict(data)
    before = rss_bytes()
    model = build_model(cfg, "meta")  # dense layers on the CPU, tables never materialized
    module, _ = torchscript_builder.served_module(model, cfg, {t.name: "int8" for t in cfg.tables})
    scripted = torchscript_builder.to_torchscript(
        module, sample_batch(cfg.features.dense, len(cfg.features.sparse))
    )
    del model, module
    gc.collect()
    facts = {
        "tables": len(cfg.tables),
        "rows": sum(t.rows for t in cfg.tables),
        "dims": sorted({t.dim for t in cfg.tables}),
        "embedding_width": sum(t.dim * len(t.features) for t in cfg.tables),
        "fp32_table_bytes": sum(t.rows * t.dim * 4 for t in cfg.tables),
        "rss_added_bytes": rss_bytes() - before,
    }
    return scripted, facts, cfg


def request(cfg, batch: int) -> tuple[torch.Tensor, ...]:
    """A request of `batch` samples: 0-3 ids per bag (sample_batch), and for din one candidate
    and a history of HISTORY ids per sample."""
    from rec.export.module import sample_batch

    dense, lengths, values = sample_batch(cfg.features.dense, len(cfg.features.sparse), batch,
                                          seed=batch)  # fmt: skip
    if cfg.model.arch != "din":
        return dense, lengths, values
    sparse = cfg.features.sparse
    lengths[:, sparse.index(cfg.model.candidate)] = 1
    lengths[:, sparse.index(cfg.model.history)] = HISTORY
    g = torch.Generator().manual_seed(batch)
    return dense, lengths, torch.randint(0, 2**62, (int(lengths.sum()),), generator=g)


def markdown(results: dict) -> str:
    lines = ["| model | arch | dims | fp32 tables GB | RSS added GB | "
             + " | ".join(f"B={b} µs" for b in BATCHES) + " | B=512 vs dlrm_dcn |",
             "|---|---|---|---|---|" + "---|" * len(BATCHES) + "---|"]  # fmt: skip
    for name, archs in results["models"].items():
        base = archs["dlrm_dcn"]["latency_us"][512]
        for arch, m in archs.items():
            dims = m["dims"]
            dims_text = str(dims[0]) if len(dims) == 1 else f"{dims[0]}-{dims[-1]}"
            lat = m["latency_us"]
            lines.append(
                f"| {name} | {arch} | {dims_text} | {m['fp32_table_bytes'] / 1e9:.3f} | "
                f"{m['rss_added_bytes'] / 1e9:.2f} | "
                + " | ".join(f"{lat[b]:,.1f}" for b in BATCHES)
                + f" | {lat[512] / base:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kaggle-scale", type=float, default=1.0,
                        help="rows of every Kaggle table x this (1.0: 33.8M rows)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as rec-server and Triton's model do (rec/malloc.py)
    results = {"machine": platform.machine(), "cpu": describe(cpu_info()), "cpu_info": cpu_info(),
               "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "threads": 1,
               "kaggle_scale": args.kaggle_scale, "models": {}}  # fmt: skip
    for name, archs in configs(args.kaggle_scale).items():
        fns, entry, cfgs = {}, {}, {}
        for arch, data in archs.items():
            print(f"[{name}] building {arch}", flush=True)
            fns[arch], entry[arch], cfgs[arch] = served(data)
        print(f"[{name}] timing", flush=True)
        for b in BATCHES:  # each model its own request (din's has two more columns)
            calls = {arch: functools.partial(fn, *request(cfgs[arch], b))
                     for arch, fn in fns.items()}  # fmt: skip
            latency = measure(calls, {b: ()}, args.rounds)
            for arch in archs:
                entry[arch].setdefault("latency_us", {})[b] = latency[arch][b]
        results["models"][name] = entry
        del fns
        gc.collect()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "arch.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['cpu']}, {results['date']}:")
    print(markdown(results))


if __name__ == "__main__":
    main()
