"""This CPU's peak multiply-accumulate rates, one thread: what an int8 dense layer can gain over
fp32 here before any kernel is written.

    .venv/bin/python benchmarks/isa_peak.py        # ~10 s; gcc builds benchmarks/isa_peak.c

Each instruction runs 12 independent accumulators in a loop (throughput, not latency), best of
three. Rows: fp32 FMA (vfmadd231ps, 8 products, 16 with AVX-512); vpmaddwd (int16 pairs into
int32: 16 exact products); vpmaddwd + vpaddd (rec::linear_int8's AVX2 step: the products added
into int32 accumulators, exact); vpmaddubsw (u8 x s8 pairs into int16, 32 products, saturating:
the AVX2 form of ONNX Runtime and FBGEMM, not exact for every code pair); vpdpbusd (AVX-512
VNNI: 64 exact products into int32); tdpbssd (AMX-INT8: a 16x64 by 64x16 s8 tile product into
int32, 16,384 exact products, four accumulator tiles). The ratio to fp32 FMA (the same vector
width) bounds what an int8 GEMM can gain on this CPU.

Writes benchmarks/results/isa_peak.json (one entry per kind of CPU) and prints a Markdown table.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from rec.cpu import cpu_info, describe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ROWS = [
    ("vfmadd231ps_ymm", "fp32 FMA, 256-bit", "vfmadd231ps_ymm"),
    ("vpmaddwd_ymm", "int16 pairs into int32 (vpmaddwd), exact", "vfmadd231ps_ymm"),
    ("vpmaddwd_vpaddd_ymm", "vpmaddwd + vpaddd: rec's AVX2 int8 step, exact", "vfmadd231ps_ymm"),
    ("vpmaddubsw_ymm", "u8 x s8 pairs into int16 (vpmaddubsw), saturating", "vfmadd231ps_ymm"),
    ("vfmadd231ps_zmm", "fp32 FMA, 512-bit", "vfmadd231ps_zmm"),
    ("vpdpbusd_zmm", "AVX-512 VNNI (vpdpbusd), exact", "vfmadd231ps_zmm"),
    ("tdpbssd_amx", "AMX-INT8 (tdpbssd, 16x16x64 tiles), exact", "vfmadd231ps_zmm"),
]


def measure() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "isa_peak"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(ROOT / "benchmarks" / "isa_peak.c")],
                       check=True)  # fmt: skip
        return json.loads(subprocess.run([str(exe)], check=True, capture_output=True,
                                         text=True).stdout)  # fmt: skip


def markdown(cpu: str, peaks: dict[str, float]) -> str:
    head = ["| instruction | G products/s | / fp32 FMA |", "|---|---|---|"]
    lines = [f"{cpu}, one thread:", "", *head]
    for key, label, base in ROWS:
        if peaks.get(key):
            lines.append(f"| {label} | {peaks[key] / 1e9:.1f} | {peaks[key] / peaks[base]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    info = cpu_info()
    cpu = describe(info)
    peaks = {k: v for k, v in measure().items() if v}  # 0: the CPU lacks the instruction
    path = RESULTS / "isa_peak.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    # Keyed by model name and flags: both AMD EPYC kinds here report the same model name.
    key = f"{info['model']} ({', '.join(info['flags'])})"
    results[key] = {"cpu": cpu, "flags": info["flags"], "products_per_s": peaks}
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(cpu, peaks))


if __name__ == "__main__":
    main()
