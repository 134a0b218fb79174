"""AOTInductor format: the served module through torch.export and AOTInductor, PyTorch's
supported successor to TorchScript.

    served module (rec.export.served, the same one TorchScript scripts)
      -> TablesAsInputs: the TBE storage made inputs, not constants
      -> torch.export (batch 1 ... export.max_batch_size, any number of ids)
      -> AOTInductor, compiled for export.cpu_isa -> model.pt2
    the TBE storage -> tables.bin, beside it (raw bytes, each table 64-byte aligned)

Why the tables are not in the package: AOTInductor embeds constants in its compiled library
by default, which copies GB-sized tables through the compiler and loads them into memory a
second time. Here they are inputs of the compiled graph: a loader memory-maps tables.bin
(read-only pages shared with the page cache, loaded as ids touch them) and hands the mapped
tensors to every call, which costs a pointer. The dense weights (MBs) stay compiled in.

ZCH tables' id maps (rec.export.id_maps) go the same way, after the tables: tables.bin holds
their bytes and the graph views them as int64 keys and bool flags. Not constants: a map is as
large as 9 bytes a slot (90 MB at 10M slots), which would go through the compiler into the
library; as inputs it loads with the tables, memory-mapped, and a server that applies the update
log can change a slot in place as it changes a row, which a compiled-in constant would not
allow. rec-server and rec's Triton model pass tables.json's spans in order, so they need no
change for it.

The ISA: Inductor compiles for the CPU it runs on (-march=native) unless told otherwise, and a
package compiled for AVX-512 dies with SIGILL on a CPU without it. export.cpu_isa picks the
target (`avx2`: x86-64-v3, any x86-64 server since 2013; `avx512`: x86-64-v4); rec.json
records it with the CPU flags it needs, and loading refuses a CPU that lacks one, naming both.

Not exportable: oneDNN-packed dense layers (export.dense_dtype bf16, or the fp32 cross net with
batch_invariant false): their weight is an opaque oneDNN tensor packed at load, which an
exported graph cannot hold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

# The loading side (ISA table and check, tables.bin mapping, AotiModel) is rec.aoti_package,
# shared with the servers; re-exported here for export's callers.
from rec.aoti_package import (  # noqa: F401
    CPU_ISAS,
    AotiModel,
    CpuIsa,
    IsaError,
    check_cpu,
    map_tables,
    missing_flags,
)
from rec.config import ConfigError, RecConfig
from rec.contract.repository import aoti_tables_in
from rec.cpu import cpu_info
from rec.export.dense import PackedLinear
from rec.export.id_maps import map_buffers
from rec.export.module import sample_batch
from rec.export.served import table_buffers

_ALIGN = 64


class TablesAsInputs(nn.Module):
    """`module` with the buffers `names` taken from the call's trailing arguments, so that an
    exported graph reads them as inputs instead of holding them as constants. The first
    `num_inputs` arguments are the model's own (three flat ones, or a context model's)."""

    def __init__(self, module: nn.Module, names: Sequence[str], num_inputs: int = 3) -> None:
        super().__init__()
        self.module = module
        self.names = list(names)
        self.num_inputs = num_inputs

    def forward(self, *inputs):
        buffers = dict(zip(self.names, inputs[self.num_inputs :], strict=True))
        args = inputs[: self.num_inputs]
        # tie_weights (the default): a buffer shared by several lookups (a context model's two
        # sides read one table storage) is one input, for every name it has.
        return torch.func.functional_call(self.module, buffers, args, strict=False)


def refuse_unexportable(module: nn.Module, cfg: RecConfig) -> None:
    if any(isinstance(m, PackedLinear) for m in module.modules()):
        raise ConfigError(
            "export.format aoti cannot hold oneDNN-packed dense layers (export.dense_dtype bf16, "
            "or the fp32 cross net with export.batch_invariant: false): their weight is packed "
            "at load into an opaque oneDNN tensor, which torch.export cannot trace. Use "
            f"dense_dtype fp32 or int8 with batch_invariant: true (this run: dense_dtype "
            f"{cfg.export.dense_dtype}, batch_invariant {cfg.export.batch_invariant})"
        )


def export_program(module: nn.Module, cfg: RecConfig) -> torch.export.ExportedProgram:
    """torch.export of `module` with its tables as inputs: batch 1 ... export.max_batch_size.

    Traced and compiled with 64-byte stand-ins for the tables (their size a dynamic dimension):
    nothing reads their values before run time, and AOTInductor keeps a copy of its example
    inputs, which for real tables doubled the export's memory. The module's own table buffers
    are swapped for the stand-ins too while it is traced, then put back."""
    names = input_buffers(module)
    maps = set(map_buffers(module))
    aliases = buffer_aliases(module)
    real = {n: module.get_buffer(n) for names_of in aliases.values() for n in names_of}
    # A map's stand-in is its bytes' size: static, so that Inductor knows the slots (the
    # remainder's divisor) as a constant.
    stand_ins = tuple(torch.zeros(_nbytes(real[n]) if n in maps else _ALIGN, dtype=torch.uint8)
                      for n in names)  # fmt: skip
    sample, shapes = _example(cfg)
    sizes = tuple(None if n in maps else {0: torch.export.Dim(f"table_bytes_{i}", min=2)}
                  for i, n in enumerate(names))  # fmt: skip
    try:
        for name, t in zip(names, stand_ins, strict=True):
            for alias in aliases[name]:
                _set_buffer(module, alias, t)
        with torch.no_grad():
            return torch.export.export(
                TablesAsInputs(module, names, len(sample)), sample + stand_ins, strict=False,
                dynamic_shapes=((*shapes, *sizes),),
            )  # fmt: skip
    finally:
        for name, t in real.items():
            _set_buffer(module, name, t)


def _example(cfg: RecConfig) -> tuple[tuple[torch.Tensor, ...], tuple[dict, ...]]:
    """The example inputs torch.export traces and their dynamic dimensions. Export specializes
    sizes 0 and 1, so neither may appear: 8 samples; a context model's 3 contexts of 8
    candidates (requests carry one context, the batches rec-server makes several)."""
    if not cfg.features.context:
        sample = sample_batch(cfg.features.dense, len(cfg.features.sparse), 8, seed=3)
        batch = torch.export.Dim("batch", min=1, max=max(2, cfg.export.max_batch_size))
        ids = torch.export.Dim("ids")
        return sample, ({0: batch}, {0: batch}, {0: ids})
    from rec.contract.context import ContextSplit
    from rec.export import context_checks

    request = context_checks.context_request(ContextSplit.from_config(cfg), [3, 1, 4], seed=3)
    limit = max(3, cfg.export.max_batch_size)
    contexts = torch.export.Dim("contexts", min=1, max=limit)
    candidates = torch.export.Dim("candidates", min=1, max=limit)
    dims = {"context_dense": {0: contexts}, "context_lengths": {0: contexts},
            "context_values": {0: torch.export.Dim("context_ids")},
            "candidate_dense": {0: candidates}, "candidate_lengths": {0: candidates},
            "candidate_values": {0: torch.export.Dim("candidate_ids")},
            "candidate_offsets": {0: contexts + 1}}  # fmt: skip
    return tuple(request.values()), tuple(dims[name] for name in request)


def input_buffers(module: nn.Module) -> list[str]:
    """The buffers the package takes as inputs, in order: the tables, then the ZCH tables' id
    maps (keys, used; rec.export.id_maps), all as raw bytes from tables.bin; a buffer shared
    by several lookups once, by its first name."""
    return list(buffer_aliases(module))


def buffer_aliases(module: nn.Module) -> dict[str, list[str]]:
    """Each input buffer's first name -> every name it has in `module`."""
    first: dict[int, str] = {}
    out: dict[str, list[str]] = {}
    for name in table_buffers(module) + map_buffers(module):
        key = id(module.get_buffer(name))
        out.setdefault(first.setdefault(key, name), []).append(name)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _set_buffer(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner), leaf, value)


def require_target(isa: str) -> CpuIsa:
    """export.cpu_isa's target, refused when this CPU cannot run it: the package is verified
    by running it here."""
    target = CPU_ISAS[isa]
    lacking = missing_flags(target.flags)
    if lacking:
        raise ConfigError(
            f"export.cpu_isa: {isa} needs a CPU with {', '.join(target.flags)} to compile and "
            f"verify on; this one, {cpu_info()['model']}, lacks {', '.join(lacking)}. Use "
            "export.cpu_isa: avx2"
        )
    return target


def compile_package(program: torch.export.ExportedProgram, out: Path, isa: str) -> dict[str, Any]:
    """AOTInductor: `program` -> the package `out` (model.pt2), compiled for `isa`; returns
    rec.json's record of the target."""
    from torch._inductor import aoti_compile_and_package
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    target = require_target(isa)
    # The vector ISA Inductor will pick at this width: its flags join the required ones.
    vec = next((v for v in valid_vec_isa_list() if v.bit_width() == target.simdlen), None)
    vec_flags = str(vec).split() if vec else []
    started = time.perf_counter()
    # Deterministic: Inductor's own index_add (din's candidate ids and attention summed per
    # sample) adds with atomics across threads, in whatever order they come, so a score
    # changed from call to call (seen with a 3-id candidate on 2 threads); in this mode it
    # calls ATen's, which adds in index order, as the TorchScript module does.
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        aoti_compile_and_package(
            program,
            package_path=str(out),
            inductor_configs={
                "cpp.simdlen": target.simdlen,
                "cpp.march": target.march,
                # Folds the dense weights' constant arithmetic once, at compile time.
                "freezing": True,
            },
        )
    finally:
        torch.use_deterministic_algorithms(was)
    return {
        "cpu_isa": isa,
        "march": target.march,
        "vector_isa": str(vec) if vec else "none",
        "required_cpu_flags": sorted(set(target.flags) | set(vec_flags)),
        "compiled_on": cpu_info(),
        "compile_seconds": round(time.perf_counter() - started, 1),
        "package_bytes": out.stat().st_size,
    }


def write_tables(module: nn.Module, directory: Path) -> list[dict[str, Any]]:
    """The module's TBE storage into tables.bin (64-byte aligned) and its index tables.json;
    returns the index."""
    index, offset = [], 0
    tables_file, index_file = aoti_tables_in(directory)
    with open(tables_file, "wb") as f:
        for name in input_buffers(module):
            data = module.get_buffer(name).contiguous().view(torch.uint8).numpy()
            pad = -offset % _ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(memoryview(data))
            index.append({"name": name, "offset": offset, "bytes": int(data.nbytes)})
            offset += data.nbytes
    index_file.write_text(json.dumps(index, indent=1) + "\n")
    return index
