"""TorchScript format: the served module (rec.export.served) over FBGEMM TBE storage, scripted.

    float model (dense weights) -> its head (DlrmHead; ConcatHead for dcn_v2)
        with batch-invariant oneDNN dense layers
    make_tbe (storage allocated) <- TbeSink <- tables streamed from the checkpoint
    ServedModule(dense transform, TbeLookup, head) -> torch.jit.script -> sample batch checked

The module has no KeyedJaggedTensor, no TorchRec quantized EBC and no FBGEMM TBE module in it:
the lookup calls FBGEMM's op on the TBE's storage, so scripting needs no FX trace and model.pt
holds rec's own classes, the TBE's buffers and the dense weights.
"""

from __future__ import annotations

import torch
from torch import nn

from rec.config import RecConfig
from rec.export.dense import swap_dense
from rec.export.load import dense_copy
from rec.export.served import ServedModule, TbeLookup, make_head, make_tbe
from rec.features import feature_spec


def served_module(model: nn.Module, cfg: RecConfig, table_dtypes: dict[str, str]):
    """(ServedModule, its TBE) for `model`'s dense weights (copied; its tables are not read and
    may be on the meta device), with the tables' storage allocated and zeroed."""
    order = list(model.sparse_arch.sparse_feature_names)
    tbe = make_tbe(cfg, table_dtypes, order)
    head = make_head(dense_copy(model), cfg)
    swap_dense(head, cfg.export.batch_invariant, cfg.export.dense_dtype)
    transform = feature_spec(cfg).dense_transform()
    module = ServedModule(transform, TbeLookup(tbe, cfg, order), head, cfg.export.batch_invariant)
    return module.eval(), tbe


def to_torchscript(module: nn.Module, sample: tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    """Scripts the served module; raises if the script's scores for `sample` differ at all."""
    with torch.no_grad():
        eager = module(*sample)
        scripted = torch.jit.script(module)
        out = scripted(*sample)
    if not torch.equal(out, eager):
        diff = (out - eager).abs().max().item()
        raise RuntimeError(f"scripting changed the sample batch's scores (max diff {diff:g})")
    return scripted
