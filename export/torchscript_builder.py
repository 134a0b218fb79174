"""TorchScript format: the served module (rec.export.served) over FBGEMM TBE storage, scripted.

    float model (dense weights) -> its head (DlrmHead; ConcatHead for dcn_v2, mmoe)
        with batch-invariant dense layers (rec::linear)
    make_tbe (storage allocated) <- TbeSink <- tables streamed from the checkpoint
    ServedModule(dense transform, TbeLookup, head) -> torch.jit.script -> sample batch checked

The module has no KeyedJaggedTensor, no TorchRec quantized EBC and no FBGEMM TBE module in it:
the lookup calls FBGEMM's op on the TBE's storage, so scripting needs no FX trace and model.pt
holds rec's own classes, the TBE's buffers and the dense weights.
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn
from torchrec.fx import symbolic_trace

from rec.config import ConfigError, RecConfig
from rec.contract.context import ContextSplit
from rec.export import served_context
from rec.export.dense import PackedLinear, swap_dense
from rec.export.id_maps import map_buffers
from rec.export.load import dense_copy
from rec.export.served import (
    DinHead,
    DinLookup,
    KjtLookup,
    ServedModule,
    TbeBagCollection,
    TbeGroup,
    TbeLookup,
    TbeSequenceLookup,
    make_head,
    make_tbe,
    table_buffers,
)
from rec.features import DenseTransform, feature_spec
from rec.model import ebc_features, ebc_path, replace_submodule


def served_module(model: nn.Module, cfg: RecConfig, table_dtypes: dict[str, str]):
    """(ServedModule, its TBE) for `model`'s dense weights (copied; its tables are not read and
    may be on the meta device), with the tables' storage allocated and zeroed. With
    features.context, the module is its context form (rec.export.served_context).

    A factory's model (rec.factory) is its own head: the copy keeps its forward, with its
    EmbeddingBagCollection swapped for a TbeBagCollection fed by a KjtLookup. din has two
    TBEs (pooled tables, sequence tables), returned as one TbeGroup."""
    path = ebc_path(model)
    order = ebc_features(model.get_submodule(path))
    tbe = make_tbe(cfg, table_dtypes, order)
    if cfg.model.factory:
        head = dense_copy(model)
        replace_submodule(head, path, TbeBagCollection(tbe, cfg, order))
        # The model gets its KeyedJaggedTensor in features.sparse order, as in training;
        # TbeBagCollection reorders it to the EBC's order, as TorchRec's EBC does.
        lookup: nn.Module = KjtLookup(cfg)
    elif cfg.model.arch == "din":  # a second TBE, unpooled, for the candidate and history
        sequence_order = [cfg.model.candidate, cfg.model.history]
        sequence_tbe = make_tbe(cfg, table_dtypes, sequence_order, sequences=True)
        lookup = DinLookup(
            TbeLookup(tbe, cfg, order), TbeSequenceLookup(sequence_tbe, cfg, sequence_order)
        )
        # Swapped first: DinHead pads a short history only for oneDNN (bf16) layers.
        dense = swap_dense(dense_copy(model), cfg.export.batch_invariant, cfg.export.dense_dtype)
        head = DinHead(dense)
        tbe = TbeGroup(tbe, sequence_tbe)
    else:
        head = make_head(dense_copy(model), cfg)
        lookup = TbeLookup(tbe, cfg, order)
    swap_dense(head, cfg.export.batch_invariant, cfg.export.dense_dtype)
    transform = DenseTransform(feature_spec(cfg).transforms)
    module = ServedModule(transform, lookup, head, cfg.export.batch_invariant)
    if cfg.features.context:  # the context form: the same modules and storage, other inputs
        split = ContextSplit.from_config(cfg)
        return served_context.context_module(module, cfg, split), tbe
    return module.eval(), tbe


class NotScriptableError(ConfigError):
    """The model (a factory's) cannot be compiled to TorchScript; names the module and construct."""


# rec's own modules in a factory's model, which FX must not trace into: they script as they are.
_LEAVES = ["TbeBagCollection", "PackedLinear", "InvariantLinear", "Int8Linear", "CrossNet"]


def script(module: nn.Module, what: str = "the model") -> torch.jit.ScriptModule:
    """torch.jit.script(module); if that fails, its head FX-traced by TorchRec's tracer (as
    TorchRec's own models need) and scripted again. When neither compiles, NotScriptableError
    with TorchScript's error (the construct and its line) and the module it is in."""
    try:
        return torch.jit.script(module)
    except Exception as e:  # TorchScript's frontend raises several error types
        error = str(e).strip() or type(e).__name__
    head = module.head
    try:
        module.head = symbolic_trace(head, leaf_modules=_LEAVES)
        return torch.jit.script(module)
    except Exception as e:
        traced = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    finally:
        module.head = head
    path, culprit = _module_at(head, error)
    where = f"at {path!r}" if path else "the model itself"
    raise NotScriptableError(
        f"{what} cannot be exported to TorchScript, scripted as it is or traced by torchrec.fx "
        f"first: module {type(culprit).__name__} ({where}) does not compile:\n{error}\n"
        f"(tracing it: {traced})"
    ) from None


_LOCATION = re.compile(r'File "(.+)", line (\d+)')


def _module_at(head: nn.Module, error: str) -> tuple[str, nn.Module]:
    """The innermost module of `head` whose class (or a base) holds the line TorchScript's
    error points at; `head` itself if the error names no line."""
    where = _LOCATION.search(error)
    if where is None:
        return "", head
    file, line = where.group(1), int(where.group(2))
    for path, m in reversed(list(head.named_modules())):  # children before their parents
        for cls in type(m).__mro__:
            try:
                lines, start = inspect.getsourcelines(cls)
                source = inspect.getsourcefile(cls)
            except (OSError, TypeError):  # builtins, classes made at runtime
                continue
            if source == file and start <= line < start + len(lines):
                return path, m
    return "", head


def to_torchscript(
    module: nn.Module, sample: tuple[torch.Tensor, ...], what: str = "the model"
) -> torch.jit.ScriptModule:
    """Scripts the served module and freezes it (below); raises if the script's scores for
    `sample` differ at all."""
    with torch.no_grad():
        eager = module(*sample)
        scripted = freeze(script(module, what), module)
        out = scripted(*sample)
    if not torch.equal(out, eager):
        diff = (out - eager).abs().max().item()
        raise RuntimeError(f"scripting changed the sample batch's scores (max diff {diff:g})")
    return scripted


def freeze(scripted: torch.jit.ScriptModule, module: nn.Module) -> torch.jit.ScriptModule:
    """torch.jit.freeze: the dense weights become constants of forward's graph and its
    submodules are inlined, so the interpreter runs no attribute lookups per call (about 10 %
    of a B = 1 call on the small model; the same bits). The tables stay attributes
    (preserved): freezing them would copy them, one more copy of the tables in export's memory.
    So do ZCH tables' id maps (rec.export.id_maps), which the update log will write in place.
    Not for a model with oneDNN-packed layers (PackedLinear: bf16, or plain fp32 when not batch
    invariant), whose packed weights must be repacked on the CPU that loads them (their
    __setstate__), which a frozen graph would skip.

    optimize_numerics=False: freeze's default folds conv/linear with a following batch norm or
    add/mul, which changes the arithmetic; the export must score as the trained module does, bit
    for bit, so a factory model with batch norm would otherwise be refused by the check above."""
    if any(isinstance(m, PackedLinear) for m in module.modules()):
        return scripted
    # A tiered model (rec.export.tiered) is called through its two exported methods.
    methods = [m for m in ("store_ids", "forward_with_rows") if hasattr(module, m)]
    return torch.jit.freeze(
        scripted.eval(),
        preserved_attrs=table_buffers(module) + map_buffers(module) + methods,
        optimize_numerics=False,
    )
