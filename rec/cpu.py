"""What CPU this is, as artifacts record it: a model's batch invariance is verified on one CPU
and re-checked where it is served (rec.json `dense.verified_on`, the servers' load probe).

`REC_MAX_CPU_ISA` (avx512, avx2 or scalar) is the seam that makes rec see a smaller CPU than it
runs on: rec's ops (cpp/ops) hold their kernels at or below it, and every check here (the flags,
bf16, AMX) answers as such a CPU would. The CPUs rec runs on differ (AVX2 only, AVX-512 with
VNNI and BF16, AVX-512 with AMX), so a refusal or fallback that only one kind would reach is
tested on all of them through this variable. It holds rec's own decisions and kernels; what
oneDNN or MKL pick inside torch is theirs (ONEDNN_MAX_CPU_ISA caps oneDNN)."""

import os
import platform
from pathlib import Path

# The flags that decide which kernels the served model's ops run (rec::linear and
# rec::linear_int8, oneDNN, FBGEMM): recorded so that a difference can be traced to them.
KERNEL_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip

CAP_ENV = "REC_MAX_CPU_ISA"
CAPS = ("avx512", "avx2", "scalar")


def isa_cap() -> str | None:
    """REC_MAX_CPU_ISA's value (avx512, avx2 or scalar), or None when unset."""
    cap = os.environ.get(CAP_ENV, "").strip().lower()
    if not cap:
        return None
    if cap not in CAPS:
        raise ValueError(f"{CAP_ENV}={cap!r}: expected one of {', '.join(CAPS)}")
    return cap


def _hidden(flag: str, cap: str | None) -> bool:
    """Whether a CPU held to `cap` lacks `flag`: AMX is above avx512, AVX-512 above avx2 and
    every vector extension above scalar."""
    if cap is None:
        return False
    if flag.startswith("amx"):
        return True
    if flag.startswith("avx512"):
        return cap in ("avx2", "scalar")
    return cap == "scalar" and flag.startswith(("avx", "fma", "f16c"))


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
    """Every flag /proc/cpuinfo lists (what a compiled package may require), less those above
    REC_MAX_CPU_ISA."""
    cap = isa_cap()
    return [f for f in _read_cpuinfo()[1] if not _hidden(f, cap)]


def has_amx() -> bool:
    """AMX tiles (Intel Xeon since Sapphire Rapids), unless REC_MAX_CPU_ISA holds it below."""
    return "amx_tile" in all_flags()


def bf16_inner_product() -> bool:
    """Whether oneDNN runs a bf16 inner product here (AVX-512 BW/VL/DQ or AVX-NE-CONVERT);
    never under REC_MAX_CPU_ISA=avx2 or scalar, as on an AVX2-only AMD EPYC."""
    if isa_cap() in ("avx2", "scalar"):
        return False
    import torch  # only here: the rest of this module is read by torch-free tools

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_info() -> dict:
    """{"model": lscpu's model name, "flags": the KERNEL_FLAGS it has, "machine": x86_64...};
    "isa_cap" too when REC_MAX_CPU_ISA is set."""
    model, _ = _read_cpuinfo()
    flags = all_flags()
    info = {
        "model": model,
        "machine": platform.machine(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }
    if isa_cap():
        info["isa_cap"] = isa_cap()
    return info


def describe(info: dict) -> str:
    """'AMD EPYC (avx512f, avx512_vnni, ..., no AMX)' for messages."""
    amx = "with AMX" if "amx_tile" in info.get("flags", []) else "no AMX"
    cap = f", held to {info['isa_cap']}" if info.get("isa_cap") else ""
    return f"{info.get('model', 'unknown CPU')} ({amx}{cap})"
