"""An AOTInductor package (model.pt2 written by `rec export --format aoti`) as a loader sees it:
the ISA it was compiled for and the check that this CPU has it, its tables memory-mapped from
tables.bin, and `AotiModel`, which scores requests with it. Export (to verify by reloading) and
the servers (rec's Triton model) both load packages through here; export also compiles them
(rec.export.aoti_builder).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rec.contract import model_file_in
from rec.contract.repository import aoti_tables_in, read_version_manifest
from rec.contract.sections import AotiSection
from rec.cpu import all_flags, cpu_info


@dataclass(frozen=True)
class CpuIsa:
    """A compile target: gcc's -march level, Inductor's vector width, and the CPU flags (as
    /proc/cpuinfo names them) a CPU needs to run the code."""

    march: str
    simdlen: int
    flags: tuple[str, ...]


CPU_ISAS = {
    "avx2": CpuIsa("x86-64-v3", 256, ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe")),
    "avx512": CpuIsa(
        "x86-64-v4",
        512,
        (
            "avx",
            "avx2",
            "fma",
            "f16c",
            "bmi1",
            "bmi2",
            "movbe",
            "avx512f",
            "avx512bw",
            "avx512cd",
            "avx512dq",
            "avx512vl",
        ),
    ),  # fmt: skip
}


class IsaError(RuntimeError):
    """A package compiled for an ISA this CPU lacks: running it would die with SIGILL."""


def missing_flags(flags: Sequence[str], have: Sequence[str] | None = None) -> list[str]:
    """The flags of `flags` this CPU (or `have`) lacks."""
    present = set(have if have is not None else all_flags())
    return [f for f in flags if f not in present]


def check_cpu(target: AotiSection | dict[str, Any], where: str) -> None:
    """Refuses to run a package (rec.json's "aoti" section `target`) on a CPU without its ISA."""
    if isinstance(target, dict):
        target = AotiSection.from_dict(target)
    lacking = missing_flags(target.required_cpu_flags)
    if lacking:
        raise IsaError(
            f"{where} was compiled for {target.cpu_isa} ({target.march}), which needs CPU "
            f"flags {', '.join(target.required_cpu_flags)}; this CPU, {cpu_info()['model']}, "
            f"lacks {', '.join(lacking)}. Export it again with export.cpu_isa: avx2, which runs "
            "on any x86-64 server since 2013"
        )


def map_tables(directory: Path) -> list[torch.Tensor]:
    """tables.bin's tables, memory-mapped read-only (private pages: nothing writes the file)."""
    path, index_file = aoti_tables_in(directory)
    index = json.loads(index_file.read_text())
    size = path.stat().st_size
    whole = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8) if size else None
    return [
        whole[t["offset"] : t["offset"] + t["bytes"]] if whole is not None
        else torch.empty(0, dtype=torch.uint8)
        for t in index
    ]  # fmt: skip


class AotiModel:
    """A model.pt2 version directory, loaded to score requests: (dense, lengths, values), or a
    context model's inputs, -> scores, as the served module. Refuses a CPU without the
    package's ISA (rec.json)."""

    def __init__(
        self, directory: str | Path, target: AotiSection | dict[str, Any] | None = None
    ) -> None:
        from torch._inductor import aoti_load_package

        import rec.ops  # noqa: F401  (rec::linear, which the package calls)

        directory = Path(directory)
        if target is None:
            manifest = read_version_manifest(directory)
            target = manifest.aoti if manifest is not None else None
        package = model_file_in(directory, "aoti")
        if target:
            check_cpu(target, str(package))
        self.tables = map_tables(directory)
        self.package = aoti_load_package(str(package))

    def __call__(self, *inputs: torch.Tensor):
        """The model's inputs in rec.json's order: (dense, lengths, values), or a context
        model's (rec.contract.io.context_io_manifest). Made contiguous: the compiled code reads
        each input with the row-major strides it was exported with and does not check them, so
        a column-major view (split_flat's, the Python backend's flat request on a context
        model) would be scored as other numbers."""
        inputs = tuple(t.contiguous() for t in inputs)
        out = self.package(*inputs, *self.tables)
        return out[0] if isinstance(out, (list, tuple)) else out
