"""The float model's own scores on the verification batches, without the float tables.

Verification compares the exported model with the float model on the held-out batches. Those
batches read only some rows of each table, and the float model's score of a sample depends only
on the rows it reads. So the reference keeps, per table, just the rows the batches touch
(gathered while the tables stream past, rec.export.stream), in a float EmbeddingBagCollection
of that many rows, and maps each id to its position there after the usual modulo. The pooled
sums add the same vectors in the same order as the full float model: the reference's scores
are the float model's, bit for bit (tested), at a fraction of its memory.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.batch import RecBatch, feature_major, map_ids
from rec.config import RecConfig
from rec.export.id_maps import IdMaps, remap
from rec.export.load import dense_copy
from rec.features import DenseTransform, feature_spec
from rec.model import embedding_modules, replace_submodule, table_rows


def touched_rows(
    cfg: RecConfig, batches: Iterable[RecBatch], id_maps: IdMaps | None = None
) -> dict[str, torch.Tensor]:
    """Per table, the sorted distinct rows (after the id mapping: the modulo, or a ZCH table's
    map in `id_maps`, rec.export.id_maps.reference_maps) that `batches` read."""
    rows = table_rows(cfg)
    owner = cfg.feature_to_table()
    features = list(cfg.features.sparse)
    found: dict[str, list[torch.Tensor]] = {t.name: [] for t in cfg.tables}
    for b in batches:
        parts = _rows_per_feature(b.lengths, b.values, rows, id_maps)
        for f, part in zip(features, parts, strict=True):
            found[owner[f]].append(part)
    return {t: torch.unique(torch.cat(p)) if p else torch.zeros(0, dtype=torch.int64)
            for t, p in found.items()}  # fmt: skip


class ReferenceSink:
    """Gathers the touched rows of each table as they stream past (stream.TableSink)."""

    def __init__(self, cfg: RecConfig, touched: dict[str, torch.Tensor]) -> None:
        self.touched = touched
        dims = {t.name: t.dim for t in cfg.tables}
        # At least one row per table, so an untouched table still makes a valid EmbeddingBag.
        self.weights = {
            name: torch.zeros(max(1, rows.numel()), dims[name]) for name, rows in touched.items()
        }
        self.filled = {name: 0 for name in touched}

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        wanted = self.touched[table]
        lo = int(torch.searchsorted(wanted, start))
        hi = int(torch.searchsorted(wanted, start + rows.shape[0]))
        if hi > lo:
            self.weights[table][lo:hi] = rows[wanted[lo:hi] - start]
            self.filled[table] += hi - lo

    def complete(self) -> bool:
        return all(self.filled[t] == r.numel() for t, r in self.touched.items())


class ReferenceModule(nn.Module):
    """The float FloatReference's scores from the gathered rows only (eager; never exported).

    Args:
        dense_model: the DLRM with the checkpoint's dense weights (its tables may be on meta).
        cfg: the run's config.
        sink: a complete ReferenceSink.
        id_maps: the ZCH tables' maps (rec.export.id_maps.reference_maps), or None.
    """

    def __init__(self, dense_model: nn.Module, cfg: RecConfig, sink: ReferenceSink,
                 id_maps: IdMaps | None = None) -> None:  # fmt: skip
        super().__init__()
        if not sink.complete():
            raise RuntimeError("the reference rows were not all gathered from the checkpoint")
        self.model = dense_copy(dense_model)
        for path, tables in embedding_modules(dense_model).items():
            replace_submodule(self.model, path, _compact(tables, sink.weights))
        self.features = list(cfg.features.sparse)
        owner = cfg.feature_to_table()
        self.touched = [sink.touched[owner[f]] for f in self.features]
        self.register_buffer("rows", table_rows(cfg))
        self.id_maps = id_maps
        self.transform = DenseTransform(feature_spec(cfg).transforms)

    @torch.no_grad()
    def forward(self, dense: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor):
        compact = []
        for f, part in enumerate(_rows_per_feature(lengths, values, self.rows, self.id_maps)):
            table = self.touched[f]
            pos = torch.searchsorted(table, part)
            inside = bool((pos < table.numel()).all())
            if not inside or not torch.equal(table[pos], part):
                raise RuntimeError(
                    f"feature {self.features[f]!r} reads a row the reference did not gather"
                )
            compact.append(pos)
        lengths_fm = lengths.t().reshape(-1).to(torch.int32)  # feature-major bag lengths
        kjt = KeyedJaggedTensor(keys=self.features, values=torch.cat(compact), lengths=lengths_fm)
        return torch.sigmoid(self.model(self.transform(dense), kjt))


def _compact(tables: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """An EmbeddingBagCollection (or EmbeddingCollection) like `tables`, holding `weights`."""
    bags = isinstance(tables, EmbeddingBagCollection)
    configs = copy.deepcopy(tables.embedding_bag_configs() if bags else tables.embedding_configs())
    for c in configs:
        c.num_embeddings = weights[c.name].shape[0]
    kind = EmbeddingBagCollection if bags else EmbeddingCollection
    module = kind(tables=configs, device=torch.device("cpu"))
    with torch.no_grad():
        for name, table in (module.embedding_bags if bags else module.embeddings).items():
            table.weight.copy_(weights[name])
    return module


def _rows_per_feature(lengths: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                      id_maps: IdMaps | None):  # fmt: skip
    """The table rows a batch-major request reads, split by feature (feature-major order)."""
    lengths_fm, values_fm = feature_major(lengths, values)
    ids = remap(id_maps, lengths_fm, values_fm, map_ids(lengths_fm, values_fm, rows))
    return torch.split(ids, lengths_fm.reshape(rows.numel(), -1).sum(1).tolist())
