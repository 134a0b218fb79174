"""Your own model through rec's pipeline: `model.factory: package.module:function`.

The contract. rec builds the EmbeddingBagCollection from `tables` (so it can shard, checkpoint
and quantize it) and calls

    function(ebc, cfg, **cfg.model.factory_args) -> nn.Module

The module must:
  - hold `ebc` itself as a submodule, at any attribute path, and no other
    EmbeddingBagCollection: rec shards it in training and swaps it for the quantized lookup in
    the export;
  - take forward(dense_features: Tensor [B, features.dense] float32 (after the feature spec's
    dense transforms), sparse_features: KeyedJaggedTensor) and return logits (not
    probabilities): a float Tensor [B, number of tasks] (len(model.tasks), or 1). The ids in
    the KeyedJaggedTensor are rows of their tables already; pass it to `ebc` and read the
    pooled KeyedTensor by feature name (`to_dict()`): in training the EBC is sharded, and a
    sharded EBC's `.values()` holds the columns in the sharding plan's order, which is not
    the order the exported lookup gives;
  - build its dense layers on the CPU (rec builds the tables on the meta device for
    sharding and materializes them itself).

For export it must also be TorchScript: scriptable as it is, or traceable by TorchRec's FX
tracer (torchrec.fx.symbolic_trace, what TorchRec's own DLRM needs) and the trace scriptable.
That rules out Python control flow on tensor values, Python-only calls (print, numpy) in
forward, and *args / **kwargs. rec export refuses such a model naming the module and the
construct TorchScript could not compile.

And it may not mix samples: a sample's score must depend on that sample only (no batch
statistics in eval mode, no ops across the batch dimension), because servers batch
requests and the export checks batched == one sample at a time, bit for bit. nn.Linear layers
are swapped for batch-invariant ones (rec.export.dense) like the built-in architectures'.

The export is TorchScript only (ONNX has no KeyedJaggedTensor). `rec train` checks all of the
above that can be checked without training before it launches any process (`check`).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.config import ConfigError, RecConfig
from rec.tables import embedding_configs


def load_factory(spec: str) -> Callable[..., nn.Module]:
    """The function `spec` ("package.module:function") names; ConfigError if it cannot be had.

    The current directory is searched too (as `python -m` does), so a model file next to
    where rec runs needs no installing."""
    module_name, _, attr = spec.partition(":")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own code failing on import
        raise ConfigError(
            f"model.factory={spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e} "
            "(it must be importable where rec runs: installed, on PYTHONPATH, or under the "
            "current directory)"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(
            f"model.factory={spec!r}: module {module_name!r} has no function {attr!r}"
        )
    return fn


def build_custom(cfg: RecConfig, ebc: EmbeddingBagCollection) -> nn.Module:
    """The factory's module for `ebc`; ConfigError naming what breaks the contract."""
    spec = cfg.model.factory
    fn = load_factory(spec)
    try:
        model = fn(ebc, cfg, **cfg.model.factory_args)
    except Exception as e:
        raise ConfigError(f"model.factory={spec!r} raised {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.factory={spec!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    held = [name for name, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]
    if not any(m is ebc for m in model.modules()):
        raise ConfigError(
            f"model.factory={spec!r}: {type(model).__name__} does not hold the "
            "EmbeddingBagCollection it was given (store it as a submodule: rec shards, "
            "checkpoints and quantizes that one)"
        )
    if len(held) != 1:
        raise ConfigError(
            f"model.factory={spec!r}: {type(model).__name__} holds {len(held)} "
            f"EmbeddingBagCollections ({', '.join(held)}); it may hold only the one it was given"
        )
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    if len(params) != 2:
        raise ConfigError(
            f"model.factory={spec!r}: {type(model).__name__}.forward takes "
            f"({', '.join(p.name for p in params)}); it must take (dense_features, "
            "sparse_features)"
        )
    return model


def check(cfg: RecConfig) -> None:
    """Builds the factory's model on tiny tables and runs one forward on two samples, before
    training launches anything: ConfigError if it cannot be imported, returns the wrong thing,
    fails on a batch, or returns other than float logits [B, number of tasks]."""
    if not cfg.model.factory:
        return
    tiny = copy.deepcopy(cfg)
    for t in tiny.tables:
        t.rows = min(t.rows, 16)
    spec, tasks = cfg.model.factory, cfg.model.num_tasks
    # What rec.model.build_model does for a factory, on the tiny tables (rec.model imports this
    # module, so this one builds the EmbeddingBagCollection itself).
    ebc = EmbeddingBagCollection(tables=embedding_configs(tiny), device=torch.device("cpu"))
    model = build_custom(tiny, ebc).eval()
    features = list(cfg.features.sparse)
    batch = 2
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=features,
        values=torch.zeros(len(features) * batch, dtype=torch.int64),
        lengths=torch.ones(len(features) * batch, dtype=torch.int32),
    )
    dense = torch.zeros(batch, cfg.features.dense)
    try:
        with torch.no_grad():
            out = model(dense, kjt)
    except Exception as e:
        raise ConfigError(
            f"model.factory={spec!r}: {type(model).__name__}.forward failed on a batch of "
            f"{batch} samples: {type(e).__name__}: {e}"
        ) from None
    if not (isinstance(out, torch.Tensor) and out.is_floating_point()
            and tuple(out.shape) == (batch, tasks)):  # fmt: skip
        got = (f"a {out.dtype} tensor of shape {tuple(out.shape)}"
               if isinstance(out, torch.Tensor) else f"a {type(out).__name__}")  # fmt: skip
        raise ConfigError(
            f"model.factory={spec!r}: {type(model).__name__}.forward returned {got}; it must "
            f"return float logits [B, {tasks}] (B samples x {tasks} task(s), model.tasks)"
        )
