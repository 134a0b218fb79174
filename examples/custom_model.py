"""A model of your own through rec (`model.factory`): DeepFM (Guo et al., 2017).

    rec train --config examples/custom_model.yaml --run-dir runs/deepfm   # from the repo root
    rec export runs/deepfm --repo artifacts/deepfm/model_repository

rec calls `build(ebc, cfg, **model.factory_args)`; the module it returns holds `ebc` (rec
shards, checkpoints and quantizes it) and maps (dense [B, D], KeyedJaggedTensor) to logits
[B, tasks]. The whole contract is in rec/factory.py and the README ("Your own model").
"""

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class DeepFm(nn.Module):
    """logit_t = FM(fields) + deep_t(fields): the fields are every sparse feature's pooled
    embedding and one projection of the dense features, all at the tables' one dim; FM is
    the sum of their pairwise dot products (shared by the tasks), deep an MLP over all of them
    side by side with one output per task."""

    def __init__(
        self,
        ebc: EmbeddingBagCollection,
        num_dense: int,
        dim: int,
        deep_layers: list[int],
        num_tasks: int,
    ) -> None:
        super().__init__()
        self.ebc = ebc
        self.dim = dim
        self.features = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]
        num_fields = 1 + len(self.features)
        self.dense_field = nn.Linear(num_dense, dim)
        self.deep = nn.Sequential(
            MLP(num_fields * dim, deep_layers), nn.Linear(deep_layers[-1], num_tasks)
        )

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor):
        # By name: a sharded EBC's .values() is in the sharding plan's order, not the tables'.
        pooled = self.ebc(sparse_features).to_dict()
        fields = [self.dense_field(dense_features)] + [pooled[f] for f in self.features]
        fields = torch.cat(fields, 1)
        stacked = fields.view(fields.shape[0], -1, self.dim)  # [B, F + 1, dim]
        # Pairwise dot products in O(F): ((sum v)^2 - sum v^2) / 2, summed over the dim.
        square_of_sum = stacked.sum(1) ** 2
        sum_of_squares = (stacked * stacked).sum(1)
        fm = 0.5 * (square_of_sum - sum_of_squares).sum(1, keepdim=True)
        return fm + self.deep(fields)  # [B, tasks]


def build(ebc: EmbeddingBagCollection, cfg, deep_layers=(256, 128)) -> nn.Module:
    """rec's factory: the tables come built (`ebc`), the rest is read from the config."""
    dims = {c.embedding_dim for c in ebc.embedding_bag_configs()}
    if len(dims) != 1:
        raise ValueError(f"DeepFM's dot products need one dim for every table, got {dims}")
    return DeepFm(ebc, cfg.features.dense, dims.pop(), list(deep_layers), cfg.model.num_tasks)
