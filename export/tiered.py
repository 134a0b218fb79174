"""The served module when some tables live in the embedding store (rec.contract.store): the same
FBGEMM op over the same rows, with the stored tables' rows passed in per batch.

    store_ids(sparse_lengths, sparse_values) -> keys int64 [U]
        the distinct rows this batch reads from the store, sorted, each `table << 40 | row`
        (table: its index in rec.json's store.tables order)
    forward_with_rows(dense, lengths, values, rows uint8 [sum of row_bytes])
        -> scores, `rows` holding the rows of store_ids' keys in that order, each as the store
        keeps it (codes, then fp16 scale and bias)

forward_with_rows runs the in-process tables' TBE as ServedModule does, and the stored tables'
TBE op over a buffer made of the fetched rows alone: each stored table's region holds its fetched
rows in key order, and every id of the batch is mapped to its row's place there. The kernel, the
rows and their order in each bag are those of the in-process model, so every pooled value, and
so every score, is bit for bit the same (tests/store/test_store_export.py).
"""

import copy

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import rounded_row_size_in_bytes
from torch import nn

from rec.config import RecConfig
from rec.contract.store import TABLE_SHIFT, row_bytes
from rec.export.served import (
    _SPARSE_TYPES,
    ServedModule,
    TbeLookup,
    TbeSequenceLookup,
    candidate_and_history,
    feature_major_ids,
    make_tbe,
    table_indices,
)

# No `from __future__ import annotations` here: TorchScript reads the annotations at runtime.


class StoreLookup(TbeLookup):
    """TbeLookup over stored tables: the op's storage comes with each batch. Built from a TBE
    whose tables have one row (their specs; the rows live in the store), with the real row
    counts from `cfg` for the id mapping.

    `tables` is every stored table in store order (the key's table index), `dtypes` their
    stored dtypes: the rows passed in may hold the rows of other lookups' tables too (din's
    pooled and sequence tables share one batch of keys), and each lookup finds its own.

    `raw_keyed`: the stored tables keyed by raw id (ZCH tables, rec.store/2). With any, the
    keys are (table, id) pairs, int64 [U, 2], the id a raw-keyed table's raw id as the request
    sent it (the store is its map: no id map here) and another table's row."""

    maps_ids = False  # a stored table's ids are keyed as the store keys them, never remapped

    def __init__(self, tbe, cfg: RecConfig, feature_order: list[str], tables: list[str],
                 dtypes: dict[str, str], raw_keyed: list[str] | None = None) -> None:  # fmt: skip
        super().__init__(tbe, cfg, feature_order)
        self.weights_host = torch.empty(0, dtype=torch.uint8)  # no storage of its own
        owner = cfg.feature_to_table()
        by_name = {t.name: t for t in cfg.tables}
        self.num_tables = len(tables)
        self.table_shift = TABLE_SHIFT
        # The store's table index of each feature.
        self.register_buffer(
            "feature_table", torch.tensor([tables.index(owner[f]) for f in feature_order])
        )
        self.row_bytes = [row_bytes(by_name[n].dim, dtypes[n]) for n in tables]
        self.tbe_stride = [
            rounded_row_size_in_bytes(by_name[n].dim, _SPARSE_TYPES[dtypes[n]], tbe.row_alignment)
            for n in tables
        ]
        self.sb_first = [dtypes[n] in ("int8", "int4") for n in tables]
        raw = set(raw_keyed or [])
        self.pairs = bool(raw)
        self.register_buffer(
            "raw_feature", torch.tensor([owner[f] in raw for f in feature_order], dtype=torch.bool)
        )

    def paired(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(each id's store key as a (table, id) pair, int64 [N, 2]; the TBE's offsets)."""
        column_of: torch.Tensor | None = None if self.columns_in_order else self.column_of
        ids, indices, offsets = feature_major_ids(lengths, values, self.rows, column_of)
        feature_ends = offsets[lengths.shape[0] :: lengths.shape[0]].contiguous()
        feature = torch.bucketize(torch.arange(indices.shape[0]), feature_ends, right=True)
        field = torch.where(self.raw_feature[feature], ids, indices)
        return torch.stack([self.feature_table[feature], field], 1), offsets

    def keyed(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(each id's store key, table << 40 | row; the TBE's feature-major offsets)."""
        column_of: torch.Tensor | None = None if self.columns_in_order else self.column_of
        indices, offsets = table_indices(lengths, values, self.rows, column_of)
        feature_ends = offsets[lengths.shape[0] :: lengths.shape[0]].contiguous()
        feature = torch.bucketize(torch.arange(indices.shape[0]), feature_ends, right=True)
        return (self.feature_table[feature] << self.table_shift) | indices, offsets

    def store_keys(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The batch's distinct store keys (table << 40 | row; with raw-keyed tables (table,
        id) pairs [U, 2]), sorted."""
        if self.pairs:
            return self.paired_places(lengths, values)[0]
        return torch.unique(self.keyed(lengths, values)[0], sorted=True)

    def paired_places(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the batch's distinct pairs [U, 2], sorted, each id's place among them, offsets).
        Table by table, a 1-D unique of its ids: torch.unique(dim=0) on the pairs gives the
        same, 16x slower (38 ms against 2.4 ms for 13,312 ids of 8 tables, one thread, Xeon
        with AVX-512 at load 10 on 2 cores; the 1-D keys of rec.store/1 took 1.4 ms)."""
        pairs, offsets = self.paired(lengths, values)
        table, field = pairs[:, 0], pairs[:, 1]
        inverse = torch.empty_like(field)
        parts: list[torch.Tensor] = []
        at = 0
        for t in range(self.num_tables):
            mine = (table == t).nonzero().squeeze(1)
            uniq, inv = torch.unique(field.index_select(0, mine), sorted=True, return_inverse=True)
            inverse.index_copy_(0, mine, inv + at)
            parts.append(torch.stack([torch.full_like(uniq, t), uniq], 1))
            at += uniq.shape[0]
        return torch.cat(parts), inverse, offsets

    def looked_up(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the op's output over the batch's rows, offsets). `rows` holds the rows of `uniq`
        (the batch's sorted distinct keys; None: this lookup's own) in that order."""
        if self.pairs:  # uniq: din's union is refused with raw-keyed tables (tiered_served_module)
            uniq, inverse, offsets = self.paired_places(lengths, values)
            table_of = uniq[:, 0]
        else:
            keyed, offsets = self.keyed(lengths, values)
            if uniq is None:
                uniq, inverse = torch.unique(keyed, sorted=True, return_inverse=True)
            else:
                inverse = torch.searchsorted(uniq, keyed)
            table_of = uniq >> self.table_shift
        counts = torch.bincount(table_of, minlength=self.num_tables)
        first = torch.cumsum(counts, 0) - counts  # each table's first key in uniq
        # Each table's region of the op's storage: its fetched rows in the TBE's layout.
        parts: list[torch.Tensor] = []
        starts: list[int] = []
        at, read = 0, 0
        for t in range(self.num_tables):
            n = int(counts[t])
            width = self.row_bytes[t]
            block = rows[read : read + n * width].view(n, width)
            read += n * width
            if self.sb_first[t]:
                block = torch.cat([block[:, width - 4 :], block[:, : width - 4]], 1)
            stride = self.tbe_stride[t]
            if stride > width:
                block = torch.cat([block, block.new_zeros(n, stride - width)], 1)
            parts.append(block.reshape(-1))
            starts.append(at)
            at += n * stride
        storage = torch.cat(parts) if len(parts) > 0 else rows.new_zeros(0)
        local = inverse - first[table_of[inverse]]
        offsets_by_table = torch.tensor(starts, dtype=torch.int64)
        # The op takes one offset per feature (a table's features share its rows).
        weights_offsets = offsets_by_table.index_select(0, self.feature_table)
        return self.lookup_in(storage, weights_offsets, local, offsets), offsets

    def pooled_with_rows(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        pooled, offsets = self.looked_up(lengths, values, rows, uniq)
        return self.finish(pooled, offsets, lengths.shape[0])


class StoreSequenceLookup(StoreLookup):
    """din's candidate and history (TbeSequenceLookup) from a stored sequence table."""

    def forward(  # type: ignore[override]
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        looked, offsets = self.looked_up(lengths, values, rows, uniq)
        return candidate_and_history(looked, offsets, lengths.shape[0])


def _feature_perm(keys: list[str], dims: list[int], order: list[str], flat: bool) -> list[int]:
    """Where each of the head's features (flat: each column) is in the output of features
    `keys` of `dims`."""
    if not flat:
        return [keys.index(f) for f in order]
    start, at = {}, 0
    for f, d in zip(keys, dims, strict=True):
        start[f] = at
        at += d
    width = dict(zip(keys, dims, strict=True))
    return [start[f] + i for f in order for i in range(width[f])]


class SplitLookup(nn.Module):
    """The in-process tables' TbeLookup and the stored tables' StoreLookup, their outputs put
    back in the head's feature order."""

    def __init__(self, local: TbeLookup, stored: StoreLookup, order: list[str]) -> None:
        super().__init__()
        self.local = local
        self.stored = stored
        self.flat = local.flat
        keys, dims = list(local.keys) + list(stored.keys), list(local.dims) + list(stored.dims)
        perm = _feature_perm(keys, dims, order, self.flat)
        self.register_buffer("perm", torch.tensor(perm, dtype=torch.int64))

    def forward(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        stored = self.stored.pooled_with_rows(lengths, values, rows, uniq)
        both = torch.cat([self.local(lengths, values), stored], 1)
        return both.index_select(1, self.perm)

    def store_keys(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.stored.store_keys(lengths, values)


class AllStoredLookup(nn.Module):
    """SplitLookup when every table is in the store: the stored tables' lookup alone."""

    def __init__(self, stored: StoreLookup, order: list[str]) -> None:
        super().__init__()
        self.stored = stored
        perm = _feature_perm(list(stored.keys), list(stored.dims), order, stored.flat)
        self.register_buffer("perm", torch.tensor(perm, dtype=torch.int64))

    def forward(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        pooled = self.stored.pooled_with_rows(lengths, values, rows, uniq)
        return pooled.index_select(1, self.perm)

    def store_keys(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.stored.store_keys(lengths, values)


class InProcessLookup(nn.Module):
    """An in-process lookup (a TbeLookup, or din's TbeSequenceLookup) called as the stored ones
    are: in din, when its pooled tables, or its sequence table, are all in the model."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    # No return annotation: TorchScript infers each instance's (pooled, or the candidate and
    # history), so one class serves both.
    def forward(
        self,
        lengths: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        uniq: torch.Tensor | None = None,
    ):
        return self.inner(lengths, values)

    def store_keys(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)


class TieredDinLookup(nn.Module):
    """DinLookup with stored tables: the pooled lookup (Split, AllStored or InProcess) and the
    sequence lookup (StoreSequenceLookup or InProcessLookup) read one batch of rows, the
    rows of the union of their keys."""

    def __init__(self, pooled: nn.Module, sequences: nn.Module) -> None:
        super().__init__()
        self.pooled = pooled
        self.sequences = sequences

    def store_keys(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        keys = [self.pooled.store_keys(lengths, values), self.sequences.store_keys(lengths, values)]
        return torch.unique(torch.cat(keys), sorted=True)

    def forward(
        self, lengths: torch.Tensor, values: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        uniq = self.store_keys(lengths, values)
        candidate, items, owner = self.sequences(lengths, values, rows, uniq)
        return self.pooled(lengths, values, rows, uniq), candidate, items, owner


class TieredServedModule(ServedModule):
    """ServedModule whose lookup is a SplitLookup: forward_with_rows scores a batch with the
    stored rows it was given; store_ids says which rows those are."""

    @torch.jit.export
    def store_ids(self, sparse_lengths: torch.Tensor, sparse_values: torch.Tensor) -> torch.Tensor:
        return self.lookup.store_keys(sparse_lengths, sparse_values)

    @torch.jit.export
    def forward_with_rows(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
        rows: torch.Tensor,
    ) -> torch.Tensor:
        dense_features = self.transform(dense_features)
        batch = dense_features.shape[0]
        dense_features, sparse_lengths = self.padded(dense_features, sparse_lengths)
        logits = self.head(dense_features, self.lookup(sparse_lengths, sparse_values, rows))
        return self.scores(logits[:batch])

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        raise RuntimeError(
            "this model's stored tables are in the embedding store: call forward_with_rows with "
            "the rows of store_ids (rec-server and rec.store do)"
        )


def split_tbes(cfg: RecConfig, dtypes: dict[str, str], order: list[str], stored: list[str],
               sequences: bool = False):  # fmt: skip
    """(local TBE over the in-process tables' features, stored TBE over the stored tables' with
    one-row tables, local feature order, stored feature order); a TBE is None where it would
    have no table (FBGEMM's TBE needs one). `sequences`: din's sequence tables, unpooled."""
    owner = cfg.feature_to_table()
    local_order = [f for f in order if owner[f] not in stored]
    stored_order = [f for f in order if owner[f] in stored]
    local_cfg = copy.deepcopy(cfg)
    local_cfg.tables = [t for t in cfg.tables if t.name not in stored]
    one_row = copy.deepcopy(cfg)
    one_row.tables = [t for t in one_row.tables if t.name in stored]
    for t in one_row.tables:
        t.rows = 1
    local = make_tbe(local_cfg, dtypes, local_order, sequences) if local_order else None
    store = make_tbe(one_row, dtypes, stored_order, sequences) if stored_order else None
    return local, store, local_order, stored_order


def _pooled_lookup(cfg: RecConfig, dtypes: dict[str, str], order: list[str], stored: list[str],
                   raw_keyed: list[str]):  # fmt: skip
    """(the pooled features' lookup with rows passed in, its local TBE or None)."""
    local_tbe, store_tbe, local_order, stored_order = split_tbes(cfg, dtypes, order, stored)
    if store_tbe is None:
        return InProcessLookup(TbeLookup(local_tbe, cfg, local_order)), local_tbe
    store_lookup = StoreLookup(store_tbe, cfg, stored_order, stored, dtypes, raw_keyed)
    if local_tbe is None:
        return AllStoredLookup(store_lookup, order), None
    return SplitLookup(TbeLookup(local_tbe, cfg, local_order), store_lookup, order), local_tbe


def _sequence_lookup(cfg: RecConfig, dtypes: dict[str, str], stored: list[str]):
    """(din's candidate-and-history lookup with rows passed in, its local TBE or None)."""
    order = [cfg.model.candidate, cfg.model.history]
    local_tbe, store_tbe, local_order, _ = split_tbes(cfg, dtypes, order, stored, sequences=True)
    if store_tbe is None:
        return InProcessLookup(TbeSequenceLookup(local_tbe, cfg, order)), local_tbe
    if local_tbe is not None:  # candidate and history on two tables, one of them stored
        raise NotImplementedError(
            f"din's candidate and history tables go to the embedding store together or not at "
            f"all ({', '.join(local_order)} would stay in the model)"
        )
    return StoreSequenceLookup(store_tbe, cfg, order, stored, dtypes), None


def tiered_served_module(model: nn.Module, cfg: RecConfig, dtypes: dict[str, str],
                         stored: list[str], raw_keyed: list[str] | None = None):  # fmt: skip
    """(TieredServedModule, local TBE) for `model`'s dense weights, the tables `stored` (in
    rec.contract.store.store_order) looked up from rows passed in; the local TBE's storage is
    allocated and zeroed, to be filled as rec.export.served.served_module's is (None when every
    table is stored; din's local TBEs as one TbeGroup). `raw_keyed`: the stored tables keyed by
    raw id (ZCH tables, rec.store/2)."""
    from rec.export.dense import swap_dense
    from rec.export.load import dense_copy
    from rec.export.served import DinHead, TbeGroup, make_head
    from rec.features import DenseTransform, feature_spec
    from rec.model import ebc_features, ebc_path

    if cfg.model.factory:
        raise NotImplementedError("the embedding store serves rec's own architectures for now")
    raw_keyed = raw_keyed or []
    if raw_keyed and cfg.model.arch == "din":
        raise NotImplementedError(
            f"din with ZCH tables {raw_keyed} in the embedding store: its pooled and sequence "
            "lookups share one batch of keys, not yet (table, raw id) pairs; keep them in the model"
        )
    order = ebc_features(model.get_submodule(ebc_path(model)))
    lookup, local_tbe = _pooled_lookup(cfg, dtypes, order, stored, raw_keyed)
    if cfg.model.arch == "din":
        sequences, sequence_tbe = _sequence_lookup(cfg, dtypes, stored)
        lookup = TieredDinLookup(lookup, sequences)
        local = [tbe for tbe in (local_tbe, sequence_tbe) if tbe is not None]
        local_tbe = TbeGroup(*local) if local else None
        # Swapped first: DinHead pads a short history only for oneDNN (bf16) layers.
        dense = swap_dense(dense_copy(model), cfg.export.batch_invariant, cfg.export.dense_dtype)
        head: nn.Module = DinHead(dense)
    else:
        if isinstance(lookup, InProcessLookup):
            raise ValueError("tiered_served_module: no pooled table is stored")
        head = make_head(dense_copy(model), cfg)
    swap_dense(head, cfg.export.batch_invariant, cfg.export.dense_dtype)
    transform = DenseTransform(feature_spec(cfg).transforms)
    module = TieredServedModule(transform, lookup, head, cfg.export.batch_invariant)
    return module.eval(), local_tbe


class TieredScorer:
    """A tiered model as a plain scorer (dense, lengths, values) -> scores: its store_ids, the
    rows read from the store (a rec.store.reader.StoreReader), forward_with_rows. What export's
    verification and the tests score a tiered version with."""

    def __init__(self, model, reader) -> None:
        self.model, self.reader = model, reader

    def __call__(self, dense, lengths, values) -> torch.Tensor:
        rows = self.reader.rows(self.model.store_ids(lengths, values))
        return self.model.forward_with_rows(dense, lengths, values, rows)


def to_torchscript(module: nn.Module, sample, reader) -> torch.jit.ScriptModule:
    """rec.export.torchscript_builder.to_torchscript for a tiered module: scripted and frozen
    (its two methods kept), its scores of `sample` with rows from `reader` (a
    rec.store.reader.StoreReader) the eager module's exactly."""
    from rec.export.torchscript_builder import freeze, script

    with torch.no_grad():
        eager = TieredScorer(module, reader)(*sample)
        scripted = freeze(script(module), module)
        out = TieredScorer(scripted, reader)(*sample)
    if not torch.equal(out, eager):
        diff = (out - eager).abs().max().item()
        raise RuntimeError(f"scripting changed the sample batch's scores (max diff {diff:g})")
    return scripted
