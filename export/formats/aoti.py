"""AOTInductor: the served module (as for TorchScript) through torch.export and AOTInductor into
model.pt2, its tables in tables.bin beside it (memory-mapped at load; rec.export.aoti_builder).
Served by rec-server, rec's Triton Python model and Triton's `torch_aoti` platform (beta from
26.03)."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from rec.contract import AOTI_TABLES_FILE, FORMATS
from rec.export.formats import Format

if TYPE_CHECKING:  # the registry is read at config load: heavy imports wait for a build
    from pathlib import Path

    from rec.export import build as b


def build(src: b.Source, out: Path) -> b.Built:
    """torch.export -> AOTInductor -> model.pt2 and tables.bin; the in-memory module scored and
    released, then the package loaded from disk (tables memory-mapped) and scored."""
    from rec.contract.context import ContextSplit
    from rec.export import aoti_builder, context_checks, raw_rows, served, torchscript_builder
    from rec.export import build as b
    from rec.export import verify as v

    cfg = src.cfg
    split = ContextSplit.from_config(cfg) if cfg.features.context else None

    def scorer(model):  # a context model scores flat batches as servers do (B contexts)
        return model if split is None else context_checks.FlatScorer(model, split)

    module, tbe = torchscript_builder.served_module(src.loaded.model, cfg, b.table_dtypes(cfg))
    zch = src.zch_sections(module)
    aoti_builder.refuse_unexportable(module, cfg)
    aoti_builder.require_target(cfg.export.cpu_isa)
    layers = b.dense_layer_dtypes(module)
    src.stream_into(served.TbeSink(tbe))
    tables = served.table_storage(tbe)
    program = aoti_builder.export_program(module, cfg)
    src.log(f"aoti: exported; compiling for {cfg.export.cpu_isa} (AOTInductor, ~1 min)")
    target = aoti_builder.compile_package(program, out, cfg.export.cpu_isa)
    del program
    index = aoti_builder.write_tables(module, out.parent)
    updates = b.updates_section(src, served.update_layout(module, tbe))
    scores = b.score(scorer(module), src.batches)
    del module, tbe  # the TBE storage: the package reads tables.bin's mapping instead
    gc.collect()
    package = aoti_builder.AotiModel(out.parent, target)
    reloaded = scorer(package)
    checks = {"raw_rows": raw_rows.round_trip(cfg, reloaded), **src.score_zch(reloaded)}
    if split is not None:
        request = context_checks.probe_request(split)
        batching = b.check_context_batching("aoti", package, request, split,
                                            cfg.export.batch_invariant)  # fmt: skip
        checks["context_vs_flat"] = context_checks.context_vs_flat(package, split, src.batches)
        request = context_checks.probe_section(request, split)
    else:
        request = b.batching_request(cfg)
        batching = b.check_batching("aoti", reloaded, request, cfg.export.batch_invariant)
    reloaded_scores = b.score(reloaded, src.batches)
    diff = v.check_close(
        "the AOTInductor package vs the in-memory module",
        reloaded_scores, scores, v.AOTI_TOLERANCE,
    )  # fmt: skip
    section = {**target, "tables_file": AOTI_TABLES_FILE, "tables": index,
               "max_abs_diff_vs_module": diff, "tolerance": v.AOTI_TOLERANCE}  # fmt: skip
    return b.Built(
        scores, reloaded_scores, batching, tables,
        sections={**b.dense_sections(cfg, layers, request), "aoti": section, "updates": updates,
                  **zch},
        checks=checks,
    )  # fmt: skip


def verify(built: dict[str, b.Built], checks: dict[str, Any]) -> None:
    """Checked against its module while building (within AOTI_TOLERANCE); recorded here."""
    mine = built["aoti"]
    checks["aoti_vs_module_max_abs_diff"] = mine.sections["aoti"]["max_abs_diff_vs_module"]
    checks.setdefault("raw_rows", mine.checks["raw_rows"])


FORMAT = Format(
    spec=FORMATS["aoti"],
    load_requires="torch's AOTInductor package loader (torch._inductor.aoti_load_package in "
    "Python, torch::inductor::AOTIModelPackageLoader in C++) with FBGEMM's and rec's op "
    "libraries loaded as for torchscript, a CPU with the package's ISA (the `aoti` section), and "
    "tables.bin memory-mapped and passed after the model's inputs (rec.export.aoti_builder)",
    build=build,
    verify=verify,
)
