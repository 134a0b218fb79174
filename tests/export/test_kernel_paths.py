"""Every CPU path of rec's dense ops gives the same bits: rec::linear (fp32; AVX-512, AVX2,
scalar) and rec::linear_int8 with its fused cross layer (AMX where the CPU has it, AVX-512 VNNI
and at::_int_mm, our AVX2 kernel, the scalar fallback). A model then scores the same on an
AVX2-only server as on an AVX-512 or AMX one.

REC_MAX_CPU_ISA holds the ops below what the CPU has (rec/cpu.py); they read it once per process,
so each cap is a fresh interpreter. One interpreter serves both ops, and it prints a digest of
each output rather than the floats: an interpreter costs more to start (torch, fbgemm_gpu) than
the outputs cost to compute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAPS = ("native", "avx512", "avx2", "scalar")

_SCRIPT = """
import hashlib, json, sys, torch
import rec.ops
from rec.export.dense import InvariantLinear, Int8Linear

def digest(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()

def inputs(k, n, seed, rows=600):
    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen)
    return weight, bias, torch.randn(rows, k, generator=gen) * 3, gen

out = {"fp32_isa": rec.ops.linear_isa(), "fp32": [], "int8": []}
# K past one 16/64-wide step with tails of every length, a 1-output layer, the criteo cross
# net's 1728; batch sizes on both sides of each kernel's small-batch limit.
for k, n in [(46, 48), (1728, 512), (17, 33), (13, 512), (100, 3)]:
    weight, bias, x, gen = inputs(k, n, seed=k + n)
    layer = InvariantLinear(weight, bias)
    out["fp32"] += [digest(layer(x[:m])) for m in (1, 5, 37, 600)]
for k, n in [(84, 46), (1728, 512), (17, 33), (100, 3)]:
    weight, bias, x, gen = inputs(k, n, seed=k + n)
    layer = Int8Linear(weight, bias)
    x0, res = torch.randn(300, n, generator=gen), torch.randn(300, n, generator=gen)
    for m in (1, 5, 16, 17, 37, 300):
        out["int8"] += [digest(layer(x[:m])), digest(layer.cross(x[:m], x0[:m], res[:m]))]
json.dump(out, sys.stdout)
"""


def _outputs(cap: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "REC_MAX_CPU_ISA"}
    if cap != "native":
        env["REC_MAX_CPU_ISA"] = cap
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_kernel_path_gives_the_same_bits():
    results = {cap: _outputs(cap) for cap in CAPS}
    assert results["scalar"]["fp32_isa"] == "scalar"
    isas = {r["fp32_isa"] for r in results.values()}
    assert len(isas) >= 2, f"only {isas} ran"  # any x86-64 CPU here has AVX2 at least
    want = results["scalar"]
    for cap, got in results.items():
        assert got["fp32"] == want["fp32"], f"rec::linear on {cap} ({got['fp32_isa']}) differs"
        assert got["int8"] == want["int8"], f"rec::linear_int8 on {cap} differs from scalar"
