"""What CPU this is, as artifacts record it: a model's batch invariance is verified on one CPU
and re-checked where it is served (rec.json `dense.verified_on`, the servers' load probe)."""

import platform
from pathlib import Path

# The flags that decide which kernels the served model's ops run (rec::linear and
# rec::linear_int8, oneDNN, FBGEMM): recorded so that a difference can be traced to them.
KERNEL_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


def _read_cpuinfo() -> tuple[str, list[str]]:
    """(model name, every flag) of the first CPU in /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("unknown", platform.processor()):
                model = value.strip()
            elif key.strip() == "flags":
                flags = value.split()
                break
    except OSError:
        pass
    return model, flags


def all_flags() -> list[str]:
    """Every flag /proc/cpuinfo lists (what a compiled package may require)."""
    return _read_cpuinfo()[1]


def cpu_info() -> dict:
    """{"model": lscpu's model name, "flags": the KERNEL_FLAGS it has, "machine": x86_64...}."""
    model, flags = _read_cpuinfo()
    return {
        "model": model,
        "machine": platform.machine(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }


def describe(info: dict) -> str:
    """'AMD EPYC (avx512f, avx512_vnni, ..., no AMX)' for messages."""
    amx = "with AMX" if "amx_tile" in info.get("flags", []) else "no AMX"
    return f"{info.get('model', 'unknown CPU')} ({amx})"
