"""model.factory functions for tests: each breaks the contract (rec/factory.py) one way, or
keeps it with a construct TorchScript cannot compile."""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection


class Pooled(nn.Module):
    """A contract-keeping model: a linear layer over the pooled embeddings and dense values."""

    def __init__(self, ebc: EmbeddingBagCollection, cfg, tasks: int = 1) -> None:
        super().__init__()
        self.ebc = ebc
        width = sum(c.embedding_dim * len(c.feature_names) for c in ebc.embedding_bag_configs())
        self.out = nn.Linear(width + cfg.features.dense, tasks)

    def forward(self, dense_features, sparse_features):
        by_name = self.ebc(sparse_features).to_dict()  # not .values(): see rec/factory.py
        pooled = torch.cat([by_name[f] for f in sorted(by_name)], 1)
        return self.out(torch.cat([dense_features, pooled], 1))


def good(ebc, cfg):
    return Pooled(ebc, cfg, cfg.model.num_tasks)


def returns_tensor(ebc, cfg):
    return torch.zeros(1)


def ignores_ebc(ebc, cfg):
    own = EmbeddingBagCollection(tables=ebc.embedding_bag_configs(), device=torch.device("cpu"))
    return Pooled(own, cfg)


class Flat(Pooled):
    def forward(self, dense_features, sparse_features):
        return super().forward(dense_features, sparse_features)[:, 0]  # [B], not [B, 1]


def wrong_shape(ebc, cfg):
    return Flat(ebc, cfg)


class ThreeInputs(Pooled):
    def forward(self, dense_features, sparse_features, extra):
        return super().forward(dense_features, sparse_features)


def three_inputs(ebc, cfg):
    return ThreeInputs(ebc, cfg)


def raises(ebc, cfg):
    raise ValueError("this factory wants 3 tables")


class ThroughNumpy(Pooled):
    """Trains in eager mode, but computes a part in numpy: neither scriptable nor traceable."""

    def forward(self, dense_features, sparse_features):
        clipped = torch.from_numpy(dense_features.numpy().clip(-5, 5))
        return super().forward(clipped, sparse_features)


def through_numpy(ebc, cfg):
    return ThroughNumpy(ebc, cfg)
