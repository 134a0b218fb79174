"""The whole path (train -> export -> serve) at several sizes of the Criteo Kaggle model.

Every size is examples/criteo_kaggle.yaml with all table rows scaled by a factor (1.0 = Criteo
Kaggle's 33.8M rows, 8.64 GB of fp32 tables), next to the small embedded default, all measured
in one run on this machine. For each: wall time and peak RSS of every stage (each training rank,
the TorchScript and the ONNX export, the C++ server), checkpoint and model sizes, server load
time, in-process forward latency at B = 1 / 64 / 512 (rec-bench forward: LibTorch, one thread)
and the server's HTTP throughput. The memory bars of the scale issue are checked per size:

    training rank peak <= 1.3 x (its share of tables + optimizer state) + 1 GiB
    export peak        <= 0.6 x the fp32 table bytes (stretch 0.35 x)

    .venv/bin/python benchmarks/scale.py                       # default + 0.125 ... 1.5, ~15 min
    .venv/bin/python benchmarks/scale.py --sizes default,0.125  # a quick look

Writes benchmarks/results/scale.json (after every size, so a long run keeps what it measured),
scale_memory.png and scale_time.png, and prints the table of benchmarks/README.md. Runs go to
runs/scale/ and each size's checkpoint is deleted once measured (--keep keeps them). Large runs
belong here, never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from rec.benchmarking import TreeWatch, run_watched
from rec.contract import ModelDir

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REC = str(Path(sys.executable).parent / "rec")
REC_BENCH = ROOT / "build" / "cpp" / "rec-bench"
KAGGLE = ROOT / "examples" / "criteo_kaggle.yaml"
GIB = 1 << 30


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def size_config(size: str) -> dict:
    """The config of one size: 'default' (the embedded small model) or a row factor."""
    if size == "default":
        return {
            "training": {"steps": 40, "batch_size": 512, "pipeline": "base", "eval_every": 0},
            "data": {"synthetic": {"train_samples": 40960, "eval_samples": 8192}},
            "checkpoint": {"every_steps": 0, "keep_last": 1},
            "export": {"eval_batches": 16},
        }
    cfg = yaml.safe_load(KAGGLE.read_text())
    for t in cfg["tables"]:
        t["rows"] = max(1, round(t["rows"] * float(size)))
    return cfg


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rank_shares(run: Path) -> dict[int, int]:
    """Bytes of tables + row-wise Adagrad state each rank holds, from plan.json."""
    plan = json.loads((run / "plan.json").read_text())
    shares: dict[int, int] = {}
    for table in plan["tables"]:
        for shard in table["shards"]:
            rows, dim = shard["sizes"]
            shares[shard["rank"]] = shares.get(shard["rank"], 0) + rows * dim * 4 + rows * 4
    return shares


def rec_bench(mode: str, repo: Path, batch: int, concurrency: int, seconds: float,
              target: str | None = None) -> dict:  # fmt: skip
    argv = [str(REC_BENCH), mode, "--model-repository", str(repo), "--batch", str(batch),
            "--concurrency", str(concurrency), "--seconds", str(seconds)]  # fmt: skip
    if target:
        argv += ["--target", target]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_server(repo: Path) -> dict:
    from rec.serve.cpp import start_cpp

    t0 = time.perf_counter()
    server = start_cpp(repo, model="rec", http_port=0, grpc_port=0, metrics_port=0,
                       ready_timeout=600)  # fmt: skip
    load_s = time.perf_counter() - t0
    watch = TreeWatch(server.proc.pid)
    try:
        http = server.endpoints.http
        big = rec_bench("http", repo, 512, 2, 5, http)
        small = rec_bench("http", repo, 1, 16, 5, http)
        # The user's last step: the stock tritonclient through `rec predict`, both protocols.
        for proto, url in (("http", http), ("grpc", server.endpoints.grpc)):
            argv = [REC, "predict", "--url", url, "--protocol", proto, "--synthetic", "4"]
            argv += ["--repo", str(repo)]
            subprocess.run(argv, check=True, capture_output=True, timeout=300)
    finally:
        time.sleep(0.3)
        peaks = watch.stop()
        server.stop()
    return {
        "load_s": round(load_s, 2),
        "peak_rss": max(b for _, b in peaks.values()),
        "http_b512_c2_rows_per_s": big.get("rows_per_s"),
        "http_b1_c16_rows_per_s": small.get("rows_per_s"),
        "http_b1_c16_p50_us": small.get("p50_us"),
        "predict_http_and_grpc": "ok",
    }


def measure(size: str, root: Path, keep: bool) -> dict:
    work = root / size
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(size_config(size), sort_keys=False))
    from rec.config import load_config

    cfg = load_config(cfg_path)
    fp32 = sum(t.rows * t.dim * 4 for t in cfg.tables)
    out: dict = {"size": size, "rows": sum(t.rows for t in cfg.tables), "fp32_table_bytes": fp32}
    run, repo = work / "run", work / "repo"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    log(f"{size}: train ({fp32 / 1e9:.2f} GB fp32 tables, 2 ranks)")
    wall, watch = run_watched([REC, "train", "-c", str(cfg_path), "--run-dir", str(run),
                               "--nproc", "2"], work / "train.log", env=env)  # fmt: skip
    shares, peaks = rank_shares(run), watch.ranks()
    out["train"] = {
        "wall_s": round(wall, 1),
        "rank_peak_rss": {str(r): peaks.get(r, 0) for r in sorted(shares)},
        "rank_share_bytes": {str(r): b for r, b in sorted(shares.items())},
        "rank_bar_ratio": max(peaks.get(r, 0) / (1.3 * b + GIB) for r, b in shares.items()),
    }
    step = next((run / "checkpoints").glob("step_*"))
    out["checkpoint_bytes"] = dir_bytes(step)

    for fmt in ("torchscript", "onnx"):
        log(f"{size}: export {fmt}")
        wall, watch = run_watched([REC, "export", str(run), "--repo", str(repo), "--format", fmt],
                                  work / f"export_{fmt}.log", env=env)  # fmt: skip
        model = ModelDir.of(repo, "rec" if fmt == "torchscript" else "rec_onnx")
        manifest = model.read_manifest(1).data
        peak = watch.largest()
        out[f"export_{fmt}"] = {
            "wall_s": round(wall, 1),
            "peak_rss": peak,
            "peak_vs_fp32": round(peak / fp32, 3),
            "model_bytes": sum(p.stat().st_size for p in model.version(1).glob("model.*")),
            "auc_ratio": manifest["verification"]["eval"].get(fmt, {}).get("auc_ratio"),
        }
    if not keep:
        shutil.rmtree(run / "checkpoints", ignore_errors=True)

    log(f"{size}: in-process forward (rec-bench forward, one thread)")
    out["forward_p50_us"] = {
        str(b): rec_bench("forward", repo, b, 1, 4)["p50_us"] for b in (1, 64, 512)
    }
    log(f"{size}: C++ server")
    out["server"] = measure_server(repo)
    if not keep:
        shutil.rmtree(repo / "rec_onnx", ignore_errors=True)
    log(f"{size}: done {json.dumps(out)}")
    return out


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}" if n >= 1e7 else f"{n / 1e9:.4f}"


def ratio(r: dict, value: float) -> str:
    """A ratio to the fp32 tables, where the tables are big enough for it to mean something."""
    return f"{value:.2f}" if r["fp32_table_bytes"] >= 1e8 else "n/a"


def table(results: list[dict]) -> str:
    head = ("| size | fp32 tables GB | train s | train rank peak GB (share GB) | vs bar | "
            "ckpt GB | export s | export peak GB | vs fp32 | ONNX export peak GB | vs fp32 | "
            "model.pt GB | server load s | server RSS GB | fwd B=1 / 64 / 512 µs | "
            "HTTP B=512 rows/s |")  # fmt: skip
    lines = [
        head,
        "|" + "---|" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1),
    ]
    for r in results:
        t, ts, ox, sv = r["train"], r["export_torchscript"], r["export_onnx"], r["server"]
        top = max(t["rank_share_bytes"], key=lambda k: t["rank_peak_rss"][k])
        fwd = " / ".join(f"{v:,.0f}" for v in r["forward_p50_us"].values())
        lines.append(
            f"| {r['size']} | {gb(r['fp32_table_bytes'])} | {t['wall_s']} | "
            f"{gb(t['rank_peak_rss'][top])} ({gb(t['rank_share_bytes'][top])}) | "
            f"{t['rank_bar_ratio']:.2f} | {gb(r['checkpoint_bytes'])} | {ts['wall_s']} | "
            f"{gb(ts['peak_rss'])} | {ratio(r, ts['peak_vs_fp32'])} | {gb(ox['peak_rss'])} | "
            f"{ratio(r, ox['peak_vs_fp32'])} | {gb(ts['model_bytes'])} | {sv['load_s']} | "
            f"{gb(sv['peak_rss'])} | {fwd} | {sv['http_b512_c2_rows_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = sorted(results, key=lambda r: r["fp32_table_bytes"])
    x = [r["fp32_table_bytes"] / 1e9 for r in rs]
    series_mem = {
        "train, largest rank": [max(r["train"]["rank_peak_rss"].values()) / 1e9 for r in rs],
        "export TorchScript": [r["export_torchscript"]["peak_rss"] / 1e9 for r in rs],
        "export ONNX": [r["export_onnx"]["peak_rss"] / 1e9 for r in rs],
        "rec-server": [r["server"]["peak_rss"] / 1e9 for r in rs],
    }
    series_time = {
        "train (40 steps, 2 ranks)": [r["train"]["wall_s"] for r in rs],
        "export TorchScript": [r["export_torchscript"]["wall_s"] for r in rs],
        "export ONNX": [r["export_onnx"]["wall_s"] for r in rs],
        "rec-server load": [r["server"]["load_s"] for r in rs],
    }
    for name, series, ylabel, extra in (
        ("scale_memory.png", series_mem, "peak RSS (GB)", True),
        ("scale_time.png", series_time, "wall time (s)", False),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, ys in series.items():
            ax.plot(x, ys, marker="o", label=label)
        if extra:
            ax.plot(x, [0.6 * v for v in x], "k--", lw=1, label="export bar: 0.6 x fp32 tables")
            ax.plot(x, x, "k:", lw=1, label="fp32 tables")
        ax.set_xlabel("fp32 table bytes (GB)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"rec at scale: Criteo Kaggle x factor ({ylabel.split(' (')[0]})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="default,0.125,0.25,0.5,1.0,1.5")
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "scale")
    p.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    p.add_argument("--keep", action="store_true", help="keep checkpoints and ONNX models")
    p.add_argument("--report", action="store_true", help="only redraw plots and table from --out")
    args = p.parse_args()
    if args.report:
        results = json.loads(args.out.read_text())["results"]
        plot(results, args.out.parent)
        print(table(results))
        return
    if not REC_BENCH.is_file():
        sys.exit(f"{REC_BENCH} is missing: run make setup")
    results = []
    for size in args.sizes.split(","):
        results.append(measure(size, args.root, args.keep))
        doc = {
            "machine": f"{os.cpu_count()} cores",
            "measured": time.strftime("%Y-%m-%d"),
            "command": "benchmarks/scale.py --sizes " + args.sizes,
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(results, args.out.parent)
    print(table(results))


if __name__ == "__main__":
    main()
