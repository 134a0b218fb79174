"""The served module: the model's I/O (docs/architecture.md#model-io) in the fewest ops per call.

    dense_features f32 [B, num_dense], sparse_lengths i32 [B, F], sparse_values i64 [N]
        -> scores f32 [B, T] (sigmoid)

`ServedModule` is a lookup (the three request tensors -> pooled embeddings [B, F, D]) and a
head (the DLRM's dense, interaction and over arches -> logits), then a sigmoid. Each format
brings its lookup: `TbeLookup` here for TorchScript (one FBGEMM TBE call), the plain-op
`GatherLookup` in rec.export.onnx_builder for ONNX; the head is the same DLRM modules in both, with
their dense layers packed for oneDNN in TorchScript (rec.export.dense).

What TbeLookup does per call, and nothing more: the batch-major ids reordered feature-major
(into the order the DLRM's SparseArch emits features) with their offsets, every raw id mapped
into its table by a non-negative modulo (a ZCH table's: the slot its id map gives, or the
default row; rec.export.id_maps), one FBGEMM IntNBit TBE call over all tables (any mix of
int8 / int4 / fp16 / fp32) returning [B, F * D]. TorchRec's quantized EBC, which the export
used before, builds and permutes a KeyedJaggedTensor and a KeyedTensor per call (~150 us here).
The TBE's bounds check is off: the modulo already guarantees every row it reads is inside its
table (tests/export/test_served.py holds that guarantee on extreme ids).
"""

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
    IntNBitTableBatchedEmbeddingBagsCodegen,
    rounded_row_size_in_bytes,
    unpadded_row_size_in_bytes,
)
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rec.config import CONCAT_ARCHS, RecConfig
from rec.contract import INPUT_NAMES, OUTPUT_NAME  # noqa: F401  (the I/O the module has)
from rec.export.dense import padding_rows
from rec.export.id_maps import IdMaps
from rec.model import table_rows
from rec.quantize import quantize_rows

# No `from __future__ import annotations` here: TorchScript reads the annotations at runtime.

_SPARSE_TYPES = {
    "int8": SparseType.INT8,
    "int4": SparseType.INT4,
    "fp16": SparseType.FP16,
    "fp32": SparseType.FP32,
}
# FBGEMM's own default alignment for a host TBE (TorchRec pads rows to 16 bytes, for GPUs).
CPU_ROW_ALIGNMENT = 1


class DlrmHead(nn.Module):
    """A DLRM's dense arch, interaction arch and over arch: (dense, pooled [B, F, D]) -> logits.

    Takes the modules themselves (no copy): pass a copy when the model is still needed."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.dense_arch = model.dense_arch
        self.inter_arch = model.inter_arch
        self.over_arch = model.over_arch

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top(self.embed_dense(dense), pooled)

    def embed_dense(self, dense: torch.Tensor) -> torch.Tensor:
        """The dense arch (bottom MLP): row by row, so a context's runs once for its candidates
        (rec.export.served_context)."""
        return self.dense_arch(dense)

    def top(self, embedded: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """The interaction and over arch of the embedded dense and pooled features -> logits."""
        concatenated = self.inter_arch(dense_features=embedded, sparse_features=pooled)
        return self.over_arch(concatenated)


class ConcatHead(DlrmHead):
    """A rec.model.ConcatModel's (DCN-v2's, MMoE's) dense arch, interaction and over arch:
    (dense, pooled [B, sum of the features' dims]) -> logits. Takes the modules themselves."""

    def top(self, embedded: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.over_arch(self.inter_arch(torch.cat([embedded, pooled], 1)))


def make_head(model: nn.Module, cfg: RecConfig) -> nn.Module:
    """The head of `model`'s architecture, over `model`'s own modules (pass a copy to keep it).

    Its lookup must be flat ([B, sum of dims]) for CONCAT_ARCHS and [B, F, D] for the DLRMs:
    `flat_lookup(cfg)` says which."""
    return ConcatHead(model) if flat_lookup(cfg) else DlrmHead(model)


def flat_lookup(cfg: RecConfig) -> bool:
    """Whether the architecture takes the pooled embeddings side by side, [B, sum of dims]
    (a factory's model takes them as a KeyedTensor, whose values are that)."""
    return cfg.model.arch in CONCAT_ARCHS or bool(cfg.model.factory)


class ServedModule(nn.Module):
    """transform(dense) and lookup(sparse_lengths, sparse_values) -> head -> sigmoid.

    transform: the feature spec's dense transforms (rec.features.DenseTransform), so a request
    carries raw values and every server computes the model's inputs the same way.

    batch_invariant: batches are zero-padded to rec.export.dense.padding_rows when the head has
    oneDNN (bf16) layers, which give every row the same result only from there on, and the
    sigmoid reads its input so that a score's result does not depend on its position."""

    def __init__(
        self, transform: nn.Module, lookup: nn.Module, head: nn.Module, batch_invariant: bool
    ) -> None:
        super().__init__()
        self.transform = transform
        self.lookup = lookup
        self.head = head
        self.batch_invariant = batch_invariant
        self.min_rows = padding_rows(head) if batch_invariant else 1

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        dense_features = self.transform(dense_features)
        batch = dense_features.shape[0]
        dense_features, sparse_lengths = self.padded(dense_features, sparse_lengths)
        logits = self.head(dense_features, self.lookup(sparse_lengths, sparse_values))
        return self.scores(logits[:batch])

    def padded(
        self, dense: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """dense and lengths with zero rows (empty bags and zero features) added up to
        min_rows; the caller drops their logits."""
        batch = dense.shape[0]
        if batch < self.min_rows:
            pad = self.min_rows - batch
            dense = torch.cat([dense, dense.new_zeros(pad, dense.shape[1])])
            lengths = torch.cat([lengths, lengths.new_zeros(pad, lengths.shape[1])])
        return dense, lengths

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """The sigmoid of the request's logits [B, T]."""
        return sigmoid_scores(logits, self.batch_invariant)


def sigmoid_scores(logits: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """The sigmoid of logits [B, T], each score's bits the same for every B if batch_invariant."""
    if not batch_invariant:
        return torch.sigmoid(logits)
    # ATen's vectorized sigmoid and its scalar tail loop differ in the last bit, and which
    # scores fall in the tail of a contiguous [B, T] depends on B. Read through a view
    # whose rows are not adjacent, every row is its own loop: score (b, t) takes the same
    # path for every B.
    tasks = logits.shape[1]
    return torch.sigmoid(torch.cat([logits, logits], 1)[:, :tasks])


def table_indices(
    lengths: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    column_of: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, offsets) of `feature_major_ids`: the modulo only, no id map."""
    _, indices, offsets = feature_major_ids(lengths, values, rows, column_of)
    return indices, offsets


def feature_major_ids(
    lengths: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    column_of: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A request's ids as the TBE reads them: (raw ids, indices, offsets) of F * B
    feature-major bags (a ZCH table's IdMap then replaces its features' indices).

    Args:
        lengths: [B, C] int32 ids per sample per request column. values: [N] int64 raw ids,
            batch-major.
        rows: [F] rows of the table each TBE feature reads.
        column_of: [F] request column of each TBE feature; None when feature k is column k.
    Returns:
        ids [N]: the raw ids, feature-major.
        indices [N]: every id mapped into its table, `id mod rows` (non-negative), so each is
        in [0, rows) whatever the request holds: the TBE runs without bounds checks on this.
        offsets [F * B + 1] int64: bag k * B + b (feature k, sample b) is
        indices[offsets[k * B + b] : offsets[k * B + b + 1]].
    """
    batch, columns = lengths.shape[0], lengths.shape[1]
    # When every column is read, the permuted ids are all the ids (a known size under
    # torch.export), and rec's op does it all in one pass: the ops below were 14 interpreter
    # calls, ~15 us of a ~40 us B = 1 forward (cpp/ops/feature_major.cpp). din's lookups read
    # a subset of the columns, whose count is the data's.
    every_column = column_of is None or column_of.shape[0] == columns
    if every_column:
        ids, indices, offsets = torch.ops.rec.feature_major_ids(lengths, values, rows, column_of)
        return ids, indices, offsets
    # Request bag b * columns + c; TBE bag k * B + b is request bag b * columns + column_of[k].
    order = torch.arange(batch * columns, dtype=torch.int32).view(batch, columns).t()
    if column_of is not None:
        order = order.index_select(0, column_of)
    total: int | None = None
    lengths_fm, ids, _ = torch.ops.fbgemm.permute_1D_sparse_data(
        order.reshape(-1), lengths.reshape(-1), values, None, total
    )
    offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths_fm.to(torch.int64))
    # Feature k's ids end at offsets[(k + 1) * B]: each id's feature by binary search
    # (repeat_interleave costs ~12 us a call here, this ~3).
    feature_ends = offsets[batch::batch].contiguous()
    feature = torch.bucketize(torch.arange(ids.shape[0]), feature_ends, right=True)
    return ids, torch.remainder(ids, rows[feature]), offsets


def make_tbe(
    cfg: RecConfig,
    table_dtypes: dict[str, str],
    feature_order: list[str],
    sequences: bool = False,
) -> IntNBitTableBatchedEmbeddingBagsCodegen:
    """FBGEMM's IntNBit TBE over the pooled tables of `cfg` (SUM pooling), or its sequence
    tables (`sequences`: no pooling, one row per id), stored as `table_dtypes`, one feature per
    entry of `feature_order`, fp32 output; storage allocated and zeroed."""
    owner = cfg.feature_to_table()
    tables = cfg.sequence_tables if sequences else cfg.pooled_tables
    table_index = {t.name: i for i, t in enumerate(tables)}
    specs = [
        (t.name, t.rows, t.dim, _SPARSE_TYPES[table_dtypes[t.name]], EmbeddingLocation.HOST)
        for t in tables
    ]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        feature_table_map=[table_index[owner[f]] for f in feature_order],
        pooling_mode=PoolingMode.NONE if sequences else PoolingMode.SUM,
        device="cpu",
        bounds_check_mode=BoundsCheckMode.NONE,
        output_dtype=SparseType.FP32,
        row_alignment=CPU_ROW_ALIGNMENT,
        indices_dtype=torch.int64,
    )
    tbe.initialize_weights()
    return tbe


class TbeLookup(nn.Module):
    """Pooled embeddings of batch-major jagged ids, by one FBGEMM lookup op: [B, F, D] for
    the DLRMs, or side by side, [B, sum of the features' dims], for CONCAT_ARCHS (`flat_lookup`).

    Args:
        tbe: `make_tbe`'s TBE; its storage is shared, not copied (TbeSink fills it).
        cfg: the run's config (sparse feature columns, tables, pooling).
        feature_order: the TBE's features, in the order the head wants them (the DLRM's
            SparseArch order); every name is a column of `cfg.features.sparse`.

    The op is called with the TBE's buffers directly rather than through the TBE module, whose
    TorchScript forward runs ~20 checks for caches, pruning and devices a host TBE never uses
    (and whose random uuid made every model.pt different). Bounds checks are off: the modulo
    keeps every id inside its table.
    """

    # Plain attributes, not torch.jit.Final constants: TorchScript writes constants in set
    # order, which changes with Python's hash seed, so model.pt would differ between exports.

    def __init__(
        self,
        tbe: IntNBitTableBatchedEmbeddingBagsCodegen,
        cfg: RecConfig,
        feature_order: list[str],
        columns: list[str] | None = None,
    ) -> None:
        super().__init__()
        # The request's columns: features.sparse, or a context model's side
        # (rec.export.served_context.subset).
        columns = list(cfg.features.sparse) if columns is None else columns
        owner = cfg.feature_to_table()
        by_name = {t.name: t for t in cfg.tables}
        self.num_features = len(feature_order)
        self.flat = flat_lookup(cfg)
        self.dim = 0 if self.flat else cfg.embedding_dim
        self.total_dim = tbe.total_D
        self.max_dims = (tbe.max_int2_D, tbe.max_int4_D, tbe.max_int8_D, tbe.max_float16_D,
                         tbe.max_float32_D, tbe.max_float8_D)  # fmt: skip
        self.output_dtype = tbe.output_dtype
        self.pooling_mode = int(tbe.pooling_mode.value)  # FBGEMM's op takes the enum's int
        self.row_alignment = tbe.row_alignment
        for name in ("weights_host", "weights_placements", "weights_offsets", "weights_tys",
                     "D_offsets"):  # fmt: skip
            self.register_buffer(name, getattr(tbe, name))
        self.register_buffer("no_weights", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("no_cache", torch.empty(0, dtype=torch.int32))
        column_of = [columns.index(f) for f in feature_order]
        self.columns_in_order = column_of == list(range(len(columns)))
        self.register_buffer("column_of", torch.tensor(column_of, dtype=torch.int64))
        rows = [by_name[owner[f]].rows for f in feature_order]
        self.register_buffer("rows", torch.tensor(rows, dtype=torch.int64))
        mean = [by_name[owner[f]].pooling == "mean" for f in feature_order]
        self.has_mean = any(mean)
        self.register_buffer("is_mean", torch.tensor(mean, dtype=torch.bool))
        # The feature of each output column (a feature's dim columns are adjacent).
        dims = [by_name[owner[f]].dim for f in feature_order]
        self.keys, self.dims = list(feature_order), dims  # TbeBagCollection's KeyedTensor
        column = torch.repeat_interleave(torch.arange(len(dims)), torch.tensor(dims))
        self.register_buffer("column_feature", column)
        # ZCH tables' maps (rec.export.id_maps); none where the ids come mapped already.
        self.id_maps = IdMaps(cfg, feature_order if self.maps_ids else [])

    maps_ids = True
    """Whether forward maps raw ids (TbeBagCollection gets them mapped by KjtLookup)."""

    def indices(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's (indices, offsets): the modulo, or a ZCH table's map."""
        column_of: torch.Tensor | None = None if self.columns_in_order else self.column_of
        ids, indices, offsets = feature_major_ids(lengths, values, self.rows, column_of)
        return self.id_maps(ids, indices, offsets, lengths.shape[0]), offsets

    def forward(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        indices, offsets = self.indices(lengths, values)
        return self.pool(indices, offsets, lengths.shape[0])

    def lookup(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The op on the TBE's storage: [B, sum of dims] pooled, or [N, D] for a sequence TBE."""
        return self.lookup_in(self.weights_host, self.weights_offsets, indices, offsets)

    def lookup_in(
        self,
        storage: torch.Tensor,
        weights_offsets: torch.Tensor,
        indices: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        """The op on `storage`, feature k's table's row 0 at byte weights_offsets[k]
        (rec.export.tiered passes the rows fetched for one batch)."""
        return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
            dev_weights=storage,
            uvm_weights=self.no_weights,
            weights_placements=self.weights_placements,
            weights_offsets=weights_offsets,
            weights_tys=self.weights_tys,
            D_offsets=self.D_offsets,
            total_D=self.total_dim,
            max_int2_D=self.max_dims[0],
            max_int4_D=self.max_dims[1],
            max_int8_D=self.max_dims[2],
            max_float16_D=self.max_dims[3],
            max_float32_D=self.max_dims[4],
            indices=indices,
            offsets=offsets,
            pooling_mode=self.pooling_mode,  # SUM (MEAN features divided in pool) or NONE
            indice_weights=None,
            output_dtype=self.output_dtype,
            lxu_cache_weights=self.no_weights,
            lxu_cache_locations=self.no_cache,
            row_alignment=self.row_alignment,
            max_float8_D=self.max_dims[5],
            fp8_exponent_bits=-1,
            fp8_exponent_bias=-1,
        )

    def pool(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """The TBE's pooled bags of table rows `indices` (feature-major `offsets`)."""
        return self.finish(self.lookup(indices, offsets), offsets, batch)

    def finish(self, pooled: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """The op's sums as the head takes them: means divided, [B, F, D] for the DLRMs."""
        if self.flat:
            if self.has_mean:
                lengths_fm = offsets[1:] - offsets[:-1]
                count = torch.clamp(lengths_fm.view(self.num_features, batch).t(), min=1)
                count = count.index_select(1, self.column_feature).to(pooled.dtype)
                is_mean = self.is_mean.index_select(0, self.column_feature)
                pooled = torch.where(is_mean.view(1, -1), pooled / count, pooled)
            return pooled
        pooled = pooled.view(batch, self.num_features, self.dim)
        if self.has_mean:
            lengths_fm = offsets[1:] - offsets[:-1]
            count = torch.clamp(lengths_fm.view(self.num_features, batch).t(), min=1)
            mean = pooled / count.unsqueeze(2).to(pooled.dtype)
            pooled = torch.where(self.is_mean.view(1, -1, 1), mean, pooled)
        return pooled


class TbeSequenceLookup(TbeLookup):
    """din's candidate and history from a sequence TBE (no pooling: one row per id), built
    with feature_order [candidate, history]: (candidate [B, D], its ids summed; the history's
    rows [N, D] in order; the sample of each [N]), what rec.model.SequenceArch gives in
    training."""

    def forward(  # type: ignore[override]
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        indices, offsets = self.indices(lengths, values)
        return candidate_and_history(self.lookup(indices, offsets), offsets, lengths.shape[0])


def candidate_and_history(
    rows: torch.Tensor, offsets: torch.Tensor, batch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sequence TBE's rows [N, D] of features [candidate, history] (feature-major `offsets`)
    as (candidate [B, D], its ids summed; the history's rows in order; the sample of each)."""
    counts = (offsets[1:] - offsets[:-1]).view(2, batch)
    samples = torch.arange(batch)
    # The candidate's ids come first (feature-major): there are `first` of them.
    if torch.jit.is_scripting():
        first = int(offsets[batch])
    else:  # torch.export: a count read from the data, which lies within the ids
        first = offsets[batch].item()
        torch._check(first >= 0)
        torch._check(first <= rows.shape[0])
    # output_size: the sizes known, so that an exported graph need not read them again.
    owner = torch.repeat_interleave(samples, counts[0], output_size=first)
    candidate = rows.new_zeros(batch, rows.shape[1]).index_add(0, owner, rows[:first])
    history = torch.repeat_interleave(samples, counts[1], output_size=rows.shape[0] - first)
    return candidate, rows[first:], history


class DinLookup(nn.Module):
    """din's lookup: the pooled features side by side, and the candidate and history."""

    def __init__(self, pooled: TbeLookup, sequences: TbeSequenceLookup) -> None:
        super().__init__()
        self.pooled = pooled
        self.sequences = sequences

    def forward(
        self, lengths: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        candidate, items, owner = self.sequences(lengths, values)
        return self.pooled(lengths, values), candidate, items, owner


class DinHead(nn.Module):
    """rec.model.Din's dense arch, attention and over arch over DinLookup's output (the same
    computation as Din.forward after its lookups). Takes the modules themselves."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.dense_arch = model.dense_arch
        self.inter_arch = model.inter_arch
        self.over_arch = model.over_arch
        self.min_rows = padding_rows(self)

    def forward(
        self,
        dense: torch.Tensor,
        looked: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        return self.top(self.embed_dense(dense), looked)

    def embed_dense(self, dense: torch.Tensor) -> torch.Tensor:
        return self.dense_arch(dense)

    def top(
        self,
        embedded: torch.Tensor,
        looked: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """DinLookup's output with the embedded dense -> logits."""
        pooled, candidate, items, owner = looked
        x0 = torch.cat([embedded, pooled], 1)
        # min_rows first: a history's length is data-dependent, which torch.export cannot test.
        if self.min_rows > 1 and items.shape[0] < self.min_rows:
            # The attention's layers see one row per history item; oneDNN's (bf16) are batch
            # invariant from MIN_ROWS rows on. Zero rows added to sample 0 add w * 0 = 0.
            pad = self.min_rows - items.shape[0]
            items = torch.cat([items, items.new_zeros(pad, items.shape[1])])
            owner = torch.cat([owner, owner.new_zeros(pad)])
        interest = self.inter_arch(candidate, items, owner)
        return self.over_arch(torch.cat([x0, candidate, interest, candidate * interest], 1))


class TbeGroup:
    """Several TBEs as one for TbeSink and table_storage (din: the pooled and the sequence
    tables' TBEs)."""

    def __init__(self, *tbes: IntNBitTableBatchedEmbeddingBagsCodegen) -> None:
        self.tbes = tbes
        self.embedding_specs = [spec for tbe in tbes for spec in tbe.embedding_specs]
        self.row_alignment = tbes[0].row_alignment

    def split_embedding_weights(self) -> list:
        return [w for tbe in self.tbes for w in tbe.split_embedding_weights()]


class KjtLookup(nn.Module):
    """A request's ids as the KeyedJaggedTensor a factory's model (rec.factory) takes, as
    training gives it: features.sparse's features in that order, each id mapped into its table
    (non-negative modulo)."""

    def __init__(self, cfg: RecConfig) -> None:
        super().__init__()
        self.keys = list(cfg.features.sparse)
        self.register_buffer("rows", table_rows(cfg))
        self.id_maps = IdMaps(cfg, self.keys)

    def forward(self, lengths: torch.Tensor, values: torch.Tensor) -> KeyedJaggedTensor:
        ids, indices, offsets = feature_major_ids(lengths, values, self.rows, None)
        indices = self.id_maps(ids, indices, offsets, lengths.shape[0])
        return KeyedJaggedTensor(keys=self.keys, values=indices, offsets=offsets)


class TbeBagCollection(TbeLookup):
    """What a factory's model holds in place of its EmbeddingBagCollection in the export:
    KeyedJaggedTensor of table rows -> KeyedTensor of pooled embeddings, by one TBE call over
    every table (KjtLookup has mapped the ids already)."""

    maps_ids = False

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:  # type: ignore[override]
        if features.keys() != self.keys:  # the model passed its own order: the EBC's, as TorchRec
            features = features.permute([features.keys().index(k) for k in self.keys])
        pooled = self.pool(features.values(), features.offsets(), features.stride())
        return KeyedTensor(keys=self.keys, length_per_key=self.dims, values=pooled)


class TbeSink:
    """Writes streamed fp32 rows, quantized, into a TBE's storage (stream.TableSink)."""

    def __init__(
        self, tbe: IntNBitTableBatchedEmbeddingBagsCodegen, skip: frozenset[str] = frozenset()
    ) -> None:
        """skip: tables streamed past this TBE (those of the embedding store)."""
        self._skip = skip
        self._dest: dict[str, tuple[torch.Tensor, torch.Tensor | None, str]] = {}
        for (name, _, _, weight_ty, _), (weight, scale_bias) in zip(
            tbe.embedding_specs, tbe.split_embedding_weights(), strict=True
        ):
            self._dest[name] = (weight, scale_bias, weight_ty.name.lower())

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        if table in self._skip:
            return
        weight, scale_bias, dtype = self._dest[table]
        codes, sb = quantize_rows(rows, dtype)
        stop = start + rows.shape[0]
        weight[start:stop].copy_(codes)
        if scale_bias is not None:
            scale_bias[start:stop].copy_(sb)


def table_buffers(module: nn.Module) -> list[str]:
    """The names of the served module's TBE storage buffers (each TbeLookup's `weights_host`:
    the tables), in a fixed order; every name of one shared by several lookups (a context
    model's two sides), which freeze must keep as attributes, not fold into constants."""
    named = module.named_buffers(remove_duplicate=False)
    return [name for name, _ in named if name.endswith("weights_host")]


def table_storage(tbe: IntNBitTableBatchedEmbeddingBagsCodegen) -> dict[str, dict]:
    """Per table: stored dtype and bytes as the TBE holds them (rows padded to its alignment)."""
    out: dict[str, dict] = {}
    for name, rows, dim, weight_ty, _ in tbe.embedding_specs:
        out[name] = {
            "stored_dtype": weight_ty.name.lower(),
            "bytes_stored": rows * rounded_row_size_in_bytes(dim, weight_ty, tbe.row_alignment),
            "bytes_unpadded": rows * unpadded_row_size_in_bytes(dim, weight_ty),
        }
    return out


def update_layout(module: nn.Module, tbe) -> dict[str, dict]:
    """Where each table's rows lie in the served module's storage, for a server that writes
    published rows into it (rec.contract.updates): per table, the buffer (by its name in the
    module), the byte offset of row 0, the bytes from one row to the next, and how a row is
    laid out there. FBGEMM's int-N-bit TBE keeps a row's fp16 scale and bias before its codes
    (the update log sends them after); fp16/fp32 rows are their values. Rows are padded to the
    TBE's row alignment."""
    buffers = {buf.data_ptr(): name for name, buf in module.named_buffers()
               if name.endswith("weights_host")}  # fmt: skip
    out: dict[str, dict] = {}
    for one in getattr(tbe, "tbes", (tbe,)):
        buffer = buffers[one.weights_host.data_ptr()]
        # Per table: weights_offsets is per feature (a table's features share its rows, and
        # features need not come in table order).
        offsets = [int(o) for o in one.weights_physical_offsets]
        for t, (name, rows, dim, weight_ty, _) in enumerate(one.embedding_specs):
            dtype = weight_ty.name.lower()
            out[name] = {
                "buffer": buffer,
                "offset": int(offsets[t]),
                "row_stride": rounded_row_size_in_bytes(dim, weight_ty, one.row_alignment),
                "rows": rows,
                "dim": dim,
                "dtype": dtype,
                "scale_bias": "first" if dtype in ("int8", "int4") else "none",
            }
    return out
