"""Tables as TorchRec declares them, from the config: what the model (rec.model) and a user's
factory model (rec.factory) are both built on. Kept apart from both so neither imports the
other to get them."""

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

from rec.config import RecConfig

_POOLING = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}


def embedding_configs(cfg: RecConfig) -> list[EmbeddingBagConfig]:
    """The pooled tables (the EmbeddingBagCollection's)."""
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.rows,
            feature_names=list(t.features),
            pooling=_POOLING[t.pooling],
        )
        for t in cfg.pooled_tables
    ]


def sequence_configs(cfg: RecConfig) -> list[EmbeddingConfig]:
    """The sequence tables (pooling none: the EmbeddingCollection's)."""
    return [
        EmbeddingConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=list(t.features)
        )
        for t in cfg.sequence_tables
    ]


def table_rows(cfg: RecConfig) -> torch.Tensor:
    """[F] rows of each sparse feature's table, in `cfg.features.sparse` order."""
    rows = {t.name: t.rows for t in cfg.tables}
    owner = cfg.feature_to_table()
    return torch.tensor([rows[owner[f]] for f in cfg.features.sparse], dtype=torch.int64)
