"""The recommendation model over one EmbeddingBagCollection: TorchRec's DLRM or DLRM-DCN
(every table at one dim), or DCN-v2 over the concatenated embeddings (tables of any dims).

`build_model` returns the float model (what training shards and export quantizes); the loss
lives in `TrainModel`, a wrapper, not in the model. The checkpoint stores the wrapper's state
dict, so every key starts with `model.` (see `MODEL_PREFIX`).
"""

# No `from __future__ import annotations`: FX writes forward's annotations into the traced code,
# which TorchScript then reads; they must be types, not strings.
import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DenseArch, OverArch
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.config import RecConfig

MODEL_PREFIX = "model."
_POOLING = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}


def embedding_configs(cfg: RecConfig) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.rows,
            feature_names=list(t.features),
            pooling=_POOLING[t.pooling],
        )
        for t in cfg.tables
    ]


class ConcatSparseArch(nn.Module):
    """Every feature's pooled embedding side by side: [B, sum of the features' dims].

    Named like TorchRec's SparseArch (`embedding_bag_collection`, `sparse_feature_names`), so
    the checkpoint's keys and export's code are those of the DLRMs; unlike it, the tables may
    have different dims. Features are in the EBC's order (table by table), as its KeyedTensor
    holds them, sharded or not."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        self.sparse_feature_names = [f for c in configs for f in c.feature_names]
        self.width = sum(c.embedding_dim * len(c.feature_names) for c in configs)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.embedding_bag_collection(features).values()


class DcnV2(nn.Module):
    """DCN-v2 (Wang et al., 2021) over the concatenation, for tables of any dims.

    x0 = [dense_arch(dense), e_1, ..., e_F] (each pooled embedding at its table's dim), then
    `num_layers` low-rank cross layers x_{l+1} = x0 * (W_l V_l x_l + b_l) + x_l (TorchRec's
    LowRankCrossNet), then the over arch to one logit per task. The same parts and attribute
    names as TorchRec's DLRM_DCN (sparse_arch, dense_arch, inter_arch, over_arch); the
    difference is the interaction's input: DLRM_DCN needs every embedding at the dense arch's
    output dim, this takes them as they are."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.sparse_arch = ConcatSparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, dense_device)
        width = dense_arch_layer_sizes[-1] + self.sparse_arch.width
        self.inter_arch = LowRankCrossNet(width, dcn_num_layers, dcn_low_rank_dim)
        self.over_arch = OverArch(width, over_arch_layer_sizes, dense_device)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        x0 = torch.cat([self.dense_arch(dense_features), self.sparse_arch(sparse_features)], 1)
        return self.over_arch(self.inter_arch(x0))


def build_model(cfg: RecConfig, device: torch.device | str = "cpu") -> nn.Module:
    """DLRM, DLRM-DCN or DCN-v2 with its embedding tables on `device` ("meta" for sharding
    later).

    Example:
        >>> from rec.config import default_config
        >>> model = build_model(default_config())
        >>> type(model).__name__
        'DLRM'
    """
    device = torch.device(device)
    ebc = EmbeddingBagCollection(tables=embedding_configs(cfg), device=device)
    dense_device = torch.device("cpu") if device.type == "meta" else device
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.features.dense,
        dense_arch_layer_sizes=list(cfg.model.dense_arch),
        over_arch_layer_sizes=list(cfg.model.over_arch),
        dense_device=dense_device,
    )
    if cfg.model.arch == "dcn_v2":
        return DcnV2(
            dcn_num_layers=cfg.model.dcn_num_layers,
            dcn_low_rank_dim=cfg.model.dcn_low_rank_dim,
            **common,
        )
    if cfg.model.arch == "dlrm_dcn":
        return DLRM_DCN(
            dcn_num_layers=cfg.model.dcn_num_layers,
            dcn_low_rank_dim=cfg.model.dcn_low_rank_dim,
            **common,
        )
    return DLRM(**common)


def table_rows(cfg: RecConfig) -> torch.Tensor:
    """[F] rows of each sparse feature's table, in `cfg.features.sparse` order."""
    rows = {t.name: t.rows for t in cfg.tables}
    owner = cfg.feature_to_table()
    return torch.tensor([rows[owner[f]] for f in cfg.features.sparse], dtype=torch.int64)


class TrainModel(nn.Module):
    """The model plus its loss, in the (loss, output) form TorchRec's train pipelines expect."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        loss = self.loss_fn(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)
