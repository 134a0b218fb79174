"""ONNX: plain-op tables and dense layers in model.onnx (tables in external data when large),
for ONNX Runtime and Triton's `onnxruntime_onnx` backend."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from rec.contract import FORMATS
from rec.export.formats import Format

if TYPE_CHECKING:  # the registry is read at config load: heavy imports wait for a build
    from pathlib import Path

    from rec.export import build as b


def build(src: b.Source, out: Path) -> b.Built:
    """Plain-op tables filled from the streamed tables -> ONNX; the torch module scored and
    released, then ONNX Runtime scored."""
    import torch

    from rec.export import build as b
    from rec.export import onnx_builder
    from rec.export import verify as v

    cfg = src.cfg
    module = onnx_builder.onnx_module(src.loaded.model, cfg, b.table_dtypes(cfg))
    zch = src.zch_sections(module)
    src.stream_into(onnx_builder.OnnxSink(module.lookup))
    onnx_builder.export_onnx(module, src.sample, out)
    with torch.no_grad():
        sample_scores = module(*src.sample)
    scores = b.score(module, src.batches)
    dtypes = b.table_dtypes(cfg)
    tables = {
        name: {"stored_dtype": dtypes[name], "bytes_stored": n, "bytes_unpadded": n}
        for name, n in module.lookup.table_bytes.items()
    }
    del module  # its tables: make room for ONNX Runtime's copy
    gc.collect()
    session = onnx_builder.onnx_session(out)

    def run(*batch):
        return onnx_builder.run_onnx(session, *batch)

    v.check_close(
        "ONNX Runtime vs the module it was exported from (sample)",
        run(*src.sample), sample_scores, v.ONNX_TOLERANCE,
    )  # fmt: skip
    batching = b.check_batching("onnx", run, b.batching_request(cfg), False)
    return b.Built(scores, b.score(run, src.batches), batching, tables, sections=zch,
                   checks=src.score_zch(run))  # fmt: skip


def verify(built: dict[str, b.Built], checks: dict[str, Any]) -> None:
    """Its `scores` are the torch module the file was exported from; also against TorchScript
    when that was built too."""
    from rec.export import verify as v

    mine = built["onnx"]
    checks["onnx_runtime_vs_source_max_abs_diff"] = v.check_close(
        "ONNX Runtime vs the module it was exported from",
        mine.reloaded, mine.scores, v.ONNX_TOLERANCE,
    )  # fmt: skip
    if "torchscript" in built:
        checks["onnx_vs_torchscript_max_abs_diff"] = v.check_close(
            "ONNX Runtime vs TorchScript",
            mine.reloaded, built["torchscript"].scores, v.ONNX_TOLERANCE,
        )  # fmt: skip


FORMAT = Format(
    spec=FORMATS["onnx"],
    load_requires="onnxruntime (standard ONNX ops only)",
    build=build,
    verify=verify,
)
