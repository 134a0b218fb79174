"""Optimizers: fused (in-backward, FBGEMM) for embedding tables, a KeyedOptimizer for the MLPs.

The embedding optimizer is attached to the table parameters before sharding; TorchRec's sharder
then fuses it into the FBGEMM TBE kernel, so the tables are updated during backward and their
optimizer state lives in the sharded module (and in its checkpoint shards).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rec.config import TrainingConfig

_EMBEDDING_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}
_DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}


def attach_embedding_optimizer(embedding_module: nn.Module, cfg: TrainingConfig) -> None:
    """Marks the tables for a fused optimizer; call before DistributedModelParallel."""
    _apply_optimizer_in_backward(
        _EMBEDDING_OPTIMIZERS[cfg.embedding_optimizer],
        embedding_module.parameters(),
        {"lr": cfg.embedding_lr},
    )


def make_optimizer(model: nn.Module, cfg: TrainingConfig) -> CombinedOptimizer:
    """The fused embedding optimizer of the sharded model and the dense one, as one optimizer."""
    dense_cls = _DENSE_OPTIMIZERS[cfg.dense_optimizer]
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: dense_cls(params, lr=cfg.dense_lr),
    )
    return CombinedOptimizer([model.fused_optimizer, dense])  # type: ignore[attr-defined]


def lr_factor(step: int, total_steps: int, cfg: TrainingConfig) -> float:
    """Multiplier of the dense learning rate at `step`: linear warm-up, then the schedule."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant" or total_steps <= cfg.warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    if cfg.lr_schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def set_dense_lr(optimizer: CombinedOptimizer, factor: float, cfg: TrainingConfig) -> None:
    # The dense optimizer is the last one combined; the fused one keeps its own adaptive step.
    _, dense = optimizer.optimizers[-1]
    for group in dense.param_groups:
        group["lr"] = cfg.dense_lr * factor
