"""The float model behind the model's I/O (docs/architecture.md#model-io), eagerly, and
requests in that layout.

    dense_features f32 [B, num_dense], sparse_lengths i32 [B, F], sparse_values i64 [N]
        -> scores f32 [B, T] (sigmoid)

`FloatReference` is the reference the exported models are compared with: batch-major ids to
TorchRec's feature-major KeyedJaggedTensor, every raw id mapped into its table (non-negative
modulo; a ZCH table's by its id map), the float DLRM with its EmbeddingBagCollection, a
sigmoid. It is not exported: the served module (rec.export.served) computes the same without
the KeyedJaggedTensor.
"""

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.batch import feature_major, map_ids, split_requests  # noqa: F401 (re-exported)
from rec.export.id_maps import IdMaps, remap


class FloatReference(nn.Module):
    """Wraps a float DLRM into the served I/O (eager; the reference, never exported).

    Args:
        model: DLRM or DLRM_DCN taking (dense [B, D], KeyedJaggedTensor) and returning logits.
        feature_names: sparse feature names in `sparse_lengths` column order.
        rows: [F] int64 row count of each feature's table, same order.
        id_maps: the ZCH tables' maps over `feature_names` (rec.export.id_maps.reference_maps),
            or None: a ZCH feature's ids read the slot their map gives, or the default row.

    Example:
        >>> from rec.config import default_config
        >>> from rec.model import build_model, table_rows
        >>> cfg = default_config()
        >>> m = FloatReference(build_model(cfg), cfg.features.sparse, table_rows(cfg))
        >>> m(torch.zeros(2, 13), torch.ones(2, 8, dtype=torch.int32), torch.arange(16)).shape
        torch.Size([2, 1])
    """

    def __init__(self, model: nn.Module, feature_names: list[str], rows: torch.Tensor,
                 id_maps: IdMaps | None = None) -> None:  # fmt: skip
        super().__init__()
        self.model = model
        self.feature_names: list[str] = list(feature_names)
        self.register_buffer("rows", rows.to(torch.int64).clone())
        self.id_maps = id_maps

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        lengths_fm, values_fm = feature_major(sparse_lengths, sparse_values)
        ids = remap(self.id_maps, lengths_fm, values_fm, map_ids(lengths_fm, values_fm, self.rows))
        features = KeyedJaggedTensor(
            keys=self.feature_names, values=ids, lengths=lengths_fm.to(torch.int32)
        )
        return torch.sigmoid(self.model(dense_features, features))


def sample_batch(
    num_dense: int, num_sparse: int, batch_size: int = 8, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A request in the I/O table's layout: empty bags, multi-id bags, negative and huge ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (batch_size, num_sparse), dtype=torch.int32, generator=g)
    n = int(lengths.sum())
    values = torch.randint(-(2**62), 2**62, (n,), dtype=torch.int64, generator=g)
    return torch.randn(batch_size, num_dense, generator=g), lengths, values
