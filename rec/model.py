"""The recommendation model: TorchRec's DLRM or DLRM-DCN over one EmbeddingBagCollection.

`build_model` returns the float model (what training shards and export quantizes); the loss
lives in `TrainModel`, a wrapper, not in the model. The checkpoint stores the wrapper's state
dict, so every key starts with `model.` (see `MODEL_PREFIX`).
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

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


def build_model(cfg: RecConfig, device: torch.device | str = "cpu") -> DLRM:
    """DLRM (or DLRM-DCN) with its embedding tables on `device` ("meta" for sharding later).

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
