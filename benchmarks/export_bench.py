"""Export benchmark: per embedding dtype, bytes, file size, eval AUC and in-process latency.

One invocation exports a run at fp32, fp16, int8 and int4 (TorchScript and ONNX each), reads the
sizes and eval AUC from the manifests export wrote, and times B = 1, 64, 512 requests in this
process for the float eager model, each TorchScript file and each ONNX Runtime session, all with
one intra-op thread (the servers run one thread per model instance). Then the dense-part
variants of the int8 TorchScript model: plain Linear vs batch-invariant bmm (the default),
torch.jit.freeze + optimize_for_inference, dynamic int8 Linear, bf16.

    .venv/bin/python benchmarks/export_bench.py --run runs/default   # a `rec train` run dir

Writes benchmarks/results/export.json and prints Markdown tables. Latency: median of timed calls
after warm-up; compare rows of one run as ratios (2 shared cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rec.export import onnx as onnx_lib
from rec.export import torchscript
from rec.export.load import load_run
from rec.export.module import ServingModule, make_batch_invariant, sample_batch
from rec.export.pipeline import export_run, table_dtypes
from rec.model import table_rows

RESULTS = Path(__file__).parent / "results" / "export.json"
BATCHES = (1, 64, 512)
DTYPES = ("fp32", "fp16", "int8", "int4")


def latency_us(fn: Callable, request, budget_s: float = 0.4) -> float:
    """Median microseconds per call of fn(*request) after warm-up."""
    with torch.no_grad():
        for _ in range(10):
            fn(*request)
        times = []
        start = time.perf_counter()
        while time.perf_counter() - start < budget_s or len(times) < 20:
            t0 = time.perf_counter()
            fn(*request)
            times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 1)


def latencies(fn: Callable, requests: dict[int, tuple]) -> dict[int, float]:
    return {b: latency_us(fn, r) for b, r in requests.items()}


def export_all(run: Path, repo: Path, requests) -> list[dict]:
    rows = []
    for dtype in DTYPES:
        result = export_run(run, repo, quantize=dtype, fmt="both", log=lambda _: None)
        for fmt, vdir in result.models.items():
            m = result.manifests[fmt]
            path = vdir / ("model.pt" if fmt == "torchscript" else "model.onnx")
            if fmt == "torchscript":
                model = torch.jit.load(str(path))
            else:
                session = onnx_lib.onnx_session(path)
                model = lambda *b, s=session: onnx_lib.run_onnx(s, *b)  # noqa: E731
            ev = m["verification"]["eval"]
            rows.append({
                "format": fmt, "dtype": dtype,
                "embedding_bytes": m["embedding_bytes"]["stored"],
                "embedding_ratio": m["embedding_bytes"]["ratio"],
                "file_bytes": path.stat().st_size,
                "auc": ev[fmt]["auc"], "auc_ratio": ev[fmt]["auc_ratio"],
                "max_abs_diff_vs_float": ev[fmt]["max_abs_diff_vs_float"],
                "latency_us": latencies(model, requests),
            })  # fmt: skip
            print(f"  {fmt} {dtype}: {rows[-1]['latency_us']}", flush=True)
        rows.append({"float_auc": ev["float"]["auc"], "dtype": dtype, "format": "float"})
    return rows


def dense_variants(run: Path, requests, trace_sample) -> list[dict]:
    """The int8 model with each treatment of the dense part; latency and agreement."""
    loaded = load_run(run)
    cfg = loaded.cfg
    float_module = ServingModule(loaded.model, cfg.features.sparse, table_rows(cfg)).eval()
    sample = requests[64]
    with torch.no_grad():
        reference = float_module(*sample)

    def build(batch_invariant: bool, prepare=None, finish=None):
        module = copy.deepcopy(float_module)
        if batch_invariant:
            make_batch_invariant(module)
        if prepare:
            module = prepare(module)
        scripted = torchscript.to_torchscript(
            torchscript.quantize(module, table_dtypes(cfg)), trace_sample
        )
        return finish(scripted) if finish else scripted

    def freeze(s):
        return torch.jit.optimize_for_inference(torch.jit.freeze(s.eval()))

    def dynamic_int8(m):
        dense = torch.ao.quantization.quantize_dynamic(m.model.dense_arch, {torch.nn.Linear})
        over = torch.ao.quantization.quantize_dynamic(m.model.over_arch, {torch.nn.Linear})
        m.model.dense_arch, m.model.over_arch = dense, over
        return m

    variants = {
        "plain Linear (fp32)": lambda: build(False),
        "batch-invariant bmm (default)": lambda: build(True),
        "plain + freeze + optimize_for_inference": lambda: build(False, finish=freeze),
        "batch-invariant + freeze + optimize_for_inference": lambda: build(True, finish=freeze),
        "dynamic int8 Linear": lambda: build(False, prepare=dynamic_int8),
    }
    rows = []
    for name, make in variants.items():
        try:
            model = make()
        except Exception as e:  # a treatment that does not script is a result, not a crash
            rows.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        with torch.no_grad():
            diff = float((model(*sample) - reference).abs().max())
        rows.append({"variant": name, "max_abs_diff_vs_float": diff,
                     "latency_us": latencies(model, requests)})  # fmt: skip
        print(f"  {name}: {rows[-1]['latency_us']}", flush=True)
    rows.append(bf16_row(float_module, requests, reference))
    return rows


def bf16_row(float_module, requests, reference) -> dict:
    """bf16 dense part, measured eagerly on the float model (no scripting needed to judge it)."""
    module = copy.deepcopy(float_module)
    module.model.dense_arch.to(torch.bfloat16)
    module.model.over_arch.to(torch.bfloat16)
    model = module.model

    def run(dense, lengths, values):
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        from rec.batch import feature_major, map_ids

        lf, vf = feature_major(lengths, values)
        ids = map_ids(lf, vf, module.rows)
        kjt = KeyedJaggedTensor(keys=module.feature_names, values=ids, lengths=lf.int())
        emb_dense = model.dense_arch(dense.to(torch.bfloat16)).float()
        sparse = model.sparse_arch(kjt)
        inter = model.inter_arch(dense_features=emb_dense, sparse_features=sparse)
        return torch.sigmoid(model.over_arch(inter.to(torch.bfloat16)).float())

    with torch.no_grad():
        diff = float((run(*requests[64]) - reference).abs().max())
    base = {b: latency_us(float_module, r) for b, r in requests.items()}
    return {"variant": "bf16 dense (eager, vs fp32 eager)", "max_abs_diff_vs_float": diff,
            "latency_us": latencies(run, requests), "fp32_eager_latency_us": base}  # fmt: skip


def markdown(rows: list[dict], float_latency: dict, dense: list[dict]) -> str:
    head = "| model | emb bytes | vs fp32 | file | eval AUC | AUC ratio | " + " | ".join(
        f"B={b} µs" for b in BATCHES
    )
    lines = [head + " |", "|" + "---|" * (6 + len(BATCHES))]
    float_auc = next(r["float_auc"] for r in rows if r["format"] == "float")
    lines.append(f"| float eager (fp32) | | | | {float_auc:.5f} | 1 | "
                 + " | ".join(str(float_latency[b]) for b in BATCHES) + " |")  # fmt: skip
    for r in rows:
        if r["format"] == "float":
            continue
        name = f"{'TorchScript' if r['format'] == 'torchscript' else 'ONNX Runtime'} {r['dtype']}"
        lines.append(
            f"| {name} | {r['embedding_bytes']:,} | {r['embedding_ratio']:.3f}x | "
            f"{r['file_bytes']:,} | {r['auc']:.5f} | {r['auc_ratio']:.5f} | "
            + " | ".join(str(r["latency_us"][b]) for b in BATCHES) + " |"
        )  # fmt: skip
    lines += ["", "| int8 TorchScript, dense part | max abs diff vs float | "
              + " | ".join(f"B={b} µs" for b in BATCHES) + " |",
              "|---|---|" + "---|" * len(BATCHES)]  # fmt: skip
    for d in dense:
        if "error" in d:
            lines.append(f"| {d['variant']} | {d['error']} |" + " |" * len(BATCHES))
            continue
        lines.append(f"| {d['variant']} | {d['max_abs_diff_vs_float']:.2e} | "
                     + " | ".join(str(d["latency_us"][b]) for b in BATCHES) + " |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a `rec train` run directory")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_run(args.run).cfg
    num_dense, num_sparse = cfg.features.dense, len(cfg.features.sparse)
    requests = {b: sample_batch(num_dense, num_sparse, b, seed=b) for b in (8, *BATCHES)}
    timed = {b: requests[b] for b in BATCHES}
    loaded = load_run(args.run)
    float_module = ServingModule(loaded.model, cfg.features.sparse, table_rows(cfg)).eval()
    float_latency = latencies(float_module, timed)
    print(f"float eager: {float_latency}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = export_all(args.run, Path(tmp) / "repo", timed)
    dense = dense_variants(args.run, timed, requests[8])
    out = {
        "run": str(args.run.resolve()),
        "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim} for t in cfg.tables],
        "threads": 1, "machine": platform.machine(), "torch": torch.__version__,
        "float_eager_latency_us": float_latency, "exports": rows, "dense_variants": dense,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(markdown(rows, float_latency, dense))


if __name__ == "__main__":
    main()
