"""TorchScript format: quantize embeddings with FBGEMM TBE, FX-trace, script.

The straight line of torchrec/inference/dlrm_predict.py, with a sample batch after each step:

    float ServingModule -> quantize_inference_model (EBC -> QuantEmbeddingBagCollection over
    IntNBitTableBatchedEmbeddingBagsCodegen) -> sample batch -> torchrec.fx.symbolic_trace
    (TBE as a leaf) -> torch.jit.script -> sample batch

Streamed export builds the same quantized EBC without a float one: `empty_quantized_ebc` makes
the TBE with every table's storage allocated, and `TbeSink` fills it row chunk by row chunk
from the checkpoint (rec.export.stream); `quantize` (the whole float model in memory) stays as
the reference the tests compare it with, byte for byte.

The sample batch after quantization is what makes tracing work: the quantized EBC caches the
order in which it permutes the KeyedJaggedTensor's features on its first call
(`cache_features_order`, set by quantize_inference_model). Traced before any call, that order
is computed from the traced KJT's keys, i.e. from symbolic values, which is where "symbolically
traced variables cannot be used as inputs to control flow" comes from, and the proxies leak into
the eager module. After one eager call the order is a plain list of ints and the trace keeps it
as a constant. No TorchRec file is patched.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
    IntNBitTableBatchedEmbeddingBagsCodegen,
    rounded_row_size_in_bytes,
    unpadded_row_size_in_bytes,
)
from torch import nn
from torchrec.fx import symbolic_trace
from torchrec.inference.modules import quantize_inference_model
from torchrec.modules.embedding_configs import dtype_to_data_type
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC
from torchrec.quant.embedding_modules import quant_prep_customize_row_alignment

from rec.export.module import ServingModule
from rec.export.stream import quantize_rows

# Storage name (config) -> the weight dtype TorchRec's QuantConfig maps onto FBGEMM SparseType.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "int8": torch.qint8,
    "int4": torch.quint4x2,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
CPU_ROW_ALIGNMENT = 1
TBE_LEAF = IntNBitTableBatchedEmbeddingBagsCodegen.__name__


def quantize(module: ServingModule, table_dtypes: dict[str, str]) -> ServingModule:
    """Swaps `module`'s EBC, in place, for TorchRec's quantized one storing each table as
    `table_dtypes[name]` (every table listed): rowwise int8/int4 with an fp16 scale and bias per
    row, or fp16/fp32, in one FBGEMM IntNBitTableBatchedEmbeddingBagsCodegen. Returns `module`.
    """
    per_table = {name: TORCH_DTYPES[dtype] for name, dtype in table_dtypes.items()}
    # TorchRec pads every TBE row to 16 bytes (GPU alignment); FBGEMM's own default for a host
    # TBE is 1. Unpadded, an int8 row of dim 16 takes 20 bytes instead of 32 (0.31x fp32, not
    # 0.5x); scores are bit-identical (tested).
    quant_prep_customize_row_alignment(module, [EmbeddingBagCollection], CPU_ROW_ALIGNMENT)
    quantize_inference_model(module, per_table_weight_dtype=per_table)
    return module


def empty_quantized_ebc(ebc: EmbeddingBagCollection, table_dtypes: dict[str, str]) -> QuantEBC:
    """The QuantEBC that `quantize` would make of `ebc` (which may be on the meta device), with
    its TBE storage allocated and zeroed: TbeSink then fills it. Same constructor arguments as
    TorchRec's `from_float` under `quantize_inference_model`, so the module is the same."""
    configs = copy.deepcopy(ebc.embedding_bag_configs())
    placeholders = {}
    for c in configs:
        c.data_type = dtype_to_data_type(TORCH_DTYPES[table_dtypes[c.name]])
        # One zero row per table. FBGEMM's TBE assigns given weights with copy_, which
        # broadcasts it over the table; passing weights at all (rather than calling
        # initialize_weights afterwards) is what from_float does, and it fixes the order in
        # which the TBE registers its buffers, so the saved model.pt is byte for byte the same.
        codes, scale_bias = quantize_rows(torch.zeros(1, c.embedding_dim), table_dtypes[c.name])
        placeholders[c.name] = (torch.zeros_like(codes), scale_bias)
    return QuantEBC(
        configs,
        ebc.is_weighted(),
        device=torch.device("cpu"),
        output_dtype=torch.float,
        table_name_to_quantized_weights=placeholders,
        register_tbes=True,
        row_alignment=CPU_ROW_ALIGNMENT,
        cache_features_order=True,
    )


class TbeSink:
    """Writes streamed fp32 rows, quantized, into a QuantEBC's TBE storage (stream.TableSink)."""

    def __init__(self, qebc: QuantEBC) -> None:
        self._dest: dict[str, tuple[torch.Tensor, torch.Tensor | None, str]] = {}
        for tbe in qebc._emb_modules:
            for (name, _, _, weight_ty, _), (weight, scale_bias) in zip(
                tbe.embedding_specs, tbe.split_embedding_weights(), strict=True
            ):
                self._dest[name] = (weight, scale_bias, weight_ty.name.lower())

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        weight, scale_bias, dtype = self._dest[table]
        codes, sb = quantize_rows(rows, dtype)
        stop = start + rows.shape[0]
        weight[start:stop].copy_(codes)
        if scale_bias is not None:
            scale_bias[start:stop].copy_(sb)


def quantized_ebc(module: nn.Module) -> QuantEBC:
    found = [m for m in module.modules() if isinstance(m, QuantEBC)]
    if len(found) != 1:
        raise RuntimeError(f"expected one quantized EmbeddingBagCollection, found {len(found)}")
    return found[0]


def table_storage(module: nn.Module) -> dict[str, dict[str, Any]]:
    """Per table: stored dtype and bytes as the TBE holds them (rows padded to its alignment)."""
    out: dict[str, dict[str, Any]] = {}
    for tbe in quantized_ebc(module)._emb_modules:
        for name, rows, dim, weight_ty, _ in tbe.embedding_specs:
            out[name] = {
                "stored_dtype": weight_ty.name.lower(),
                "bytes_stored": rows * rounded_row_size_in_bytes(dim, weight_ty, tbe.row_alignment),
                "bytes_unpadded": rows * unpadded_row_size_in_bytes(dim, weight_ty),
            }
    return out


def to_torchscript(
    module: ServingModule, sample: tuple[torch.Tensor, ...]
) -> torch.jit.ScriptModule:
    """FX-traces (TBE as a leaf) and scripts a quantized ServingModule; checks the sample."""
    with torch.no_grad():
        eager = module(*sample)  # caches the EBC's feature order: see the module docstring
        graph = symbolic_trace(module, leaf_modules=[TBE_LEAF])
        traced = graph(*sample)
        scripted = torch.jit.script(graph)
        out = scripted(*sample)
    for stage, got in (("fx trace", traced), ("torch.jit.script", out)):
        if not torch.equal(got, eager):
            diff = (got - eager).abs().max().item()
            raise RuntimeError(f"{stage} changed the sample batch's scores (max diff {diff:g})")
    return scripted
