"""The served module of a context model (features.context, rec.contract.context): R requests of
one context (the user) and N candidates each, B candidates in all, scored in one call.

    context_dense [R, Dc], context_lengths [R, Fc], context_values [m],
    candidate_dense [B, Dn], candidate_lengths [B, Fn], candidate_values [n],
    candidate_offsets [R+1] = Fn * (0, N1, N1+N2, ...)  ->  scores [B, T]

The context's part runs once per request and is broadcast to its candidates (`index_select` by
`owner`, each candidate's request): its embedding bags (one TBE call over the context features:
`subset` of the flat TbeLookup, on the same storage), its dense transform, and when every dense
feature is context (Dn = 0) the bottom MLP; din's history rows are looked up once per request
too. The rest runs per pair (candidate), as in the flat module (rec.export.served.ServedModule):
the candidates' bags, and the head's top: DLRM's pairwise dots, the DCN cross layers, the over
arch, din's attention. Those read the context and the candidate together, and splitting their
sums would change the order of the fused multiply-adds (and int8's per-row activation scale
reads the whole row), so a split form would no longer score as the flat one.

Bit for bit the flat module's scores with the context repeated, because a TBE bag's sum reads
only that bag's rows, rec's dense layers (rec::linear, rec::linear_int8) give a row the same
bits in any batch, and cat / index_select only copy: the batch invariance rec.batch_probe checks.
bf16 layers (oneDNN) get no such guarantee.

The input names are TorchScript forward's argument names, so each combination of present
inputs (a zero-width one is left out) has its own thin class (`context_module` picks it).
"""

from types import SimpleNamespace

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import nn

from rec.config import RecConfig
from rec.contract.context import ContextSplit
from rec.export.served import (
    DinLookup,
    ServedModule,
    TbeLookup,
    candidate_and_history,
    sigmoid_scores,
)
from rec.features import DenseTransform, feature_spec

# No `from __future__ import annotations` here: TorchScript reads the annotations at runtime.


def subset(lookup: TbeLookup, cfg: RecConfig, features: list[str], columns: list[str]) -> TbeLookup:
    """`lookup`'s `features` alone, over requests whose sparse columns are `columns`
    (a context model's context or candidate side): the same storage (`weights_host`, one
    tensor, so model.pt holds the tables once), each feature's offset, type and dims
    sliced out of it. ZCH features keep their flat request column for the unknown counts."""
    picked = [lookup.keys.index(f) for f in features]
    index = torch.tensor(picked, dtype=torch.int64)
    dims = (lookup.D_offsets[1:] - lookup.D_offsets[:-1])[index]
    tys = lookup.weights_tys[index]
    # FBGEMM's max_*_D, per weight type (SparseType's ints), in TbeLookup.max_dims order.
    max_dims = [int(dims[tys == ty].max()) if bool((tys == ty).any()) else 0
                for ty in (4, 3, 2, 1, 0, 6)]  # fmt: skip
    view = SimpleNamespace(
        total_D=int(dims.sum()),
        max_int2_D=max_dims[0], max_int4_D=max_dims[1], max_int8_D=max_dims[2],
        max_float16_D=max_dims[3], max_float32_D=max_dims[4], max_float8_D=max_dims[5],
        output_dtype=lookup.output_dtype, pooling_mode=PoolingMode(lookup.pooling_mode),
        row_alignment=lookup.row_alignment, weights_host=lookup.weights_host,
        weights_placements=lookup.weights_placements[index],
        weights_offsets=lookup.weights_offsets[index], weights_tys=tys,
        D_offsets=torch.cat([dims.new_zeros(1), torch.cumsum(dims, 0)]).to(torch.int32),
    )  # fmt: skip
    return type(lookup)(view, cfg, features, columns)  # type: ignore[arg-type]


def _sides(lookup: TbeLookup, cfg: RecConfig, split: ContextSplit):
    """(context lookup or None, candidate lookup, the trained order of cat([context, candidate])
    on dim 1): `lookup`'s features split by side, each over its side's request columns."""
    names = list(cfg.features.sparse)
    ctx_cols = [names[i] for i in split.sparse]
    cand_cols = [names[i] for i in split.cand_sparse]
    ctx = [f for f in lookup.keys if f in ctx_cols]
    cand = [f for f in lookup.keys if f in cand_cols]
    joined = ctx + cand
    if lookup.flat:  # [B, sum of dims]: a feature's columns move together
        width = dict(zip(lookup.keys, lookup.dims, strict=True))
        start, at = {}, 0
        for f in joined:
            start[f], at = at, at + width[f]
        perm = [start[f] + j for f in lookup.keys for j in range(width[f])]
    else:  # [B, F, D]: whole features
        perm = [joined.index(f) for f in lookup.keys]
    ctx_lookup = subset(lookup, cfg, ctx, ctx_cols) if ctx else None
    return ctx_lookup, subset(lookup, cfg, cand, cand_cols), torch.tensor(perm)


class ContextLookup(nn.Module):
    """The pooled bags of both sides in the flat lookup's layout ([B, F, D] or [B, sum of
    dims], trained order): the context's looked up once per context, then copied to its
    candidates; the candidates' each their own."""

    def __init__(self, lookup: TbeLookup, cfg: RecConfig, split: ContextSplit) -> None:
        super().__init__()
        self.ctx, self.cand, perm = _sides(lookup, cfg, split)
        self.register_buffer("perm", perm)

    def forward(
        self,
        ctx_lengths: torch.Tensor | None,
        ctx_values: torch.Tensor | None,
        cand_lengths: torch.Tensor,
        cand_values: torch.Tensor,
        owner: torch.Tensor,
    ) -> torch.Tensor:
        cand = self.cand(cand_lengths, cand_values)
        if self.ctx is not None and ctx_lengths is not None and ctx_values is not None:
            ctx = self.ctx(ctx_lengths, ctx_values).index_select(0, owner)
            return torch.cat([ctx, cand], 1).index_select(1, self.perm)
        return cand.index_select(1, self.perm)

    @torch.jit.export
    def padded(self, pooled: torch.Tensor, rows: int) -> torch.Tensor:
        """forward's output as the head's top takes it (Pairs), padded to `rows`."""
        return _padded(pooled, rows)


class DinContextLookup(nn.Module):
    """din's lookup (DinLookup's output) of both sides. The candidate feature is always the
    candidate's (config); the history may be either side's. A context's history rows are
    looked up once and each candidate gets a copy of its context's (a jagged index_select);
    the attention over them runs per pair, as in the flat module."""

    def __init__(self, lookup: DinLookup, cfg: RecConfig, split: ContextSplit) -> None:
        super().__init__()
        self.pooled = ContextLookup(lookup.pooled, cfg, split)
        names = list(cfg.features.sparse)
        candidate, history = lookup.sequences.keys
        self.ctx_history = names.index(history) in split.sparse
        sides = [[names[i] for i in cols] for cols in (split.sparse, split.cand_sparse)]
        seq = lookup.sequences
        own = [candidate] if self.ctx_history else [candidate, history]
        self.cand_seq = subset(seq, cfg, own, sides[1])
        self.ctx_seq = subset(seq, cfg, [history], sides[0]) if self.ctx_history else None

    def forward(
        self,
        ctx_lengths: torch.Tensor | None,
        ctx_values: torch.Tensor | None,
        cand_lengths: torch.Tensor,
        cand_values: torch.Tensor,
        owner: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        pooled = self.pooled(ctx_lengths, ctx_values, cand_lengths, cand_values, owner)
        batch = cand_lengths.shape[0]
        indices, offsets = self.cand_seq.indices(cand_lengths, cand_values)
        rows = self.cand_seq.lookup(indices, offsets)
        if self.ctx_seq is not None and ctx_lengths is not None and ctx_values is not None:
            candidate = _summed(rows, offsets[1:] - offsets[:-1], batch)
            ctx_indices, ctx_offsets = self.ctx_seq.indices(ctx_lengths, ctx_values)
            history = self.ctx_seq.lookup(ctx_indices, ctx_offsets)  # once per context
            items, item_owner = _broadcast_jagged(history, ctx_offsets, owner)
            return pooled, candidate, items, item_owner
        candidate, items, item_owner = candidate_and_history(rows, offsets, batch)
        return pooled, candidate, items, item_owner

    @torch.jit.export
    def padded(
        self, looked: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward's output as DinHead's top takes it (Pairs): the per-candidate rows padded
        to `rows`; the history items stay as they are (their owners index the real rows)."""
        pooled, candidate, items, item_owner = looked
        return _padded(pooled, rows), _padded(candidate, rows), items, item_owner


class Pairs(nn.Module):
    """Per pair: both sides' bags (ContextLookup or DinContextLookup) and the head's top ->
    logits [B, T], the top's inputs padded to min_rows as ServedModule pads its batch."""

    def __init__(self, lookup: nn.Module, head: nn.Module, min_rows: int) -> None:
        super().__init__()
        self.lookup = lookup
        self.head = head
        self.min_rows = min_rows

    def forward(
        self,
        embedded: torch.Tensor,
        ctx_lengths: torch.Tensor | None,
        ctx_values: torch.Tensor | None,
        cand_lengths: torch.Tensor,
        cand_values: torch.Tensor,
        owner: torch.Tensor,
    ) -> torch.Tensor:
        looked = self.lookup(ctx_lengths, ctx_values, cand_lengths, cand_values, owner)
        rows, batch = self.min_rows, cand_lengths.shape[0]
        return self.head.top(_padded(embedded, rows), self.lookup.padded(looked, rows))[:batch]


def _summed(rows: torch.Tensor, counts: torch.Tensor, batch: int) -> torch.Tensor:
    """Each sample's rows summed into [batch, D] (din's candidate: one id, or none)."""
    owner = torch.repeat_interleave(torch.arange(batch), counts, output_size=rows.shape[0])
    return rows.new_zeros(batch, rows.shape[1]).index_add(0, owner, rows)


def _broadcast_jagged(
    rows: torch.Tensor, offsets: torch.Tensor, owner: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context r's rows rows[offsets[r]:offsets[r+1]] once for each candidate b of it
    (owner[b] = r), candidates in order: (the rows, the candidate of each)."""
    counts = (offsets[1:] - offsets[:-1]).index_select(0, owner)
    starts = offsets[:-1].index_select(0, owner)
    if torch.jit.is_scripting():
        total = int(counts.sum())
    else:  # torch.export: a count read from the data
        total = counts.sum().item()
        torch._check(total >= 0)
    item_owner = torch.repeat_interleave(torch.arange(owner.shape[0]), counts, output_size=total)
    ends = torch.cumsum(counts, 0)
    within = torch.arange(total) - (ends - counts).index_select(0, item_owner)
    return rows.index_select(0, starts.index_select(0, item_owner) + within), item_owner


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x with zero rows added up to `rows` (oneDNN's bf16 layers' minimum; see ServedModule)."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros([rows - x.shape[0]] + list(x.shape[1:]))])


class ContextServedModule(nn.Module):
    """The context form of `flat` (a ServedModule of rec's architectures), its modules shared:
    `score` takes every input, None for the ones a model has not; subclasses fix forward."""

    def __init__(self, flat: ServedModule, cfg: RecConfig, split: ContextSplit) -> None:
        super().__init__()
        transforms = feature_spec(cfg).transforms
        self.ctx_transform = DenseTransform([transforms[i] for i in split.dense])
        self.cand_transform = DenseTransform([transforms[i] for i in split.cand_dense])
        joined = list(split.dense) + list(split.cand_dense)
        self.register_buffer("dense_perm", torch.tensor([joined.index(i) for i in
                                                          range(split.num_dense)]))  # fmt: skip
        # Every dense feature the context's: the bottom MLP runs once per context.
        self.dense_once = len(split.cand_dense) == 0
        self.num_cand_sparse = len(split.cand_sparse)
        self.head = flat.head
        self.min_rows = flat.min_rows
        if isinstance(flat.lookup, DinLookup):
            lookup: nn.Module = DinContextLookup(flat.lookup, cfg, split)
        else:
            lookup = ContextLookup(flat.lookup, cfg, split)
        self.pairs = Pairs(lookup, flat.head, self.min_rows)
        self.batch_invariant = flat.batch_invariant

    def score(
        self,
        ctx_dense: torch.Tensor | None,
        ctx_lengths: torch.Tensor | None,
        ctx_values: torch.Tensor | None,
        cand_dense: torch.Tensor | None,
        cand_lengths: torch.Tensor,
        cand_values: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        batch, contexts = cand_lengths.shape[0], offsets.shape[0] - 1
        counts = torch.div(offsets[1:] - offsets[:-1], self.num_cand_sparse, rounding_mode="floor")
        owner = torch.repeat_interleave(torch.arange(contexts), counts, output_size=batch)
        embedded = self.embedded(ctx_dense, cand_dense, owner, contexts, batch)
        logits = self.pairs(embedded, ctx_lengths, ctx_values, cand_lengths, cand_values, owner)
        return sigmoid_scores(logits, self.batch_invariant)

    def embedded(
        self,
        ctx_dense: torch.Tensor | None,
        cand_dense: torch.Tensor | None,
        owner: torch.Tensor,
        contexts: int,
        batch: int,
    ) -> torch.Tensor:
        """The bottom MLP's output per candidate: of the context's rows, copied to its
        candidates, when every dense feature is the context's; else of each candidate's row."""
        ctx = torch.zeros(contexts, 0) if ctx_dense is None else self.ctx_transform(ctx_dense)
        if self.dense_once or cand_dense is None:
            once = self.head.embed_dense(_padded(ctx, self.min_rows))[:contexts]
            return once.index_select(0, owner)
        dense = torch.cat([ctx.index_select(0, owner), self.cand_transform(cand_dense)], 1)
        dense = dense.index_select(1, self.dense_perm)
        return self.head.embed_dense(_padded(dense, self.min_rows))[:batch]


# The forward signatures, one per set of present inputs (rec.contract.io's names and order).
class ContextModule(ContextServedModule):
    def forward(
        self,
        context_dense: torch.Tensor,
        context_lengths: torch.Tensor,
        context_values: torch.Tensor,
        candidate_dense: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            context_dense,
            context_lengths,
            context_values,
            candidate_dense,
            candidate_lengths,
            candidate_values,
            candidate_offsets,
        )


class ContextModuleNoCandDense(ContextServedModule):
    def forward(
        self,
        context_dense: torch.Tensor,
        context_lengths: torch.Tensor,
        context_values: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            context_dense,
            context_lengths,
            context_values,
            None,
            candidate_lengths,
            candidate_values,
            candidate_offsets,
        )


class ContextModuleNoCtxDense(ContextServedModule):
    def forward(
        self,
        context_lengths: torch.Tensor,
        context_values: torch.Tensor,
        candidate_dense: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            None,
            context_lengths,
            context_values,
            candidate_dense,
            candidate_lengths,
            candidate_values,
            candidate_offsets,
        )


class ContextModuleNoDense(ContextServedModule):
    def forward(
        self,
        context_lengths: torch.Tensor,
        context_values: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            None,
            context_lengths,
            context_values,
            None,
            candidate_lengths,
            candidate_values,
            candidate_offsets,
        )


class ContextModuleDenseOnly(ContextServedModule):
    """The context is dense features alone (no context sparse feature)."""

    def forward(
        self,
        context_dense: torch.Tensor,
        candidate_dense: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            context_dense,
            None,
            None,
            candidate_dense,
            candidate_lengths,
            candidate_values,
            candidate_offsets,
        )


class ContextModuleDenseOnlyNoCandDense(ContextServedModule):
    """The context is every dense feature and no sparse one."""

    def forward(
        self,
        context_dense: torch.Tensor,
        candidate_lengths: torch.Tensor,
        candidate_values: torch.Tensor,
        candidate_offsets: torch.Tensor,
    ) -> torch.Tensor:
        return self.score(
            context_dense, None, None, None, candidate_lengths, candidate_values, candidate_offsets
        )


_SIGNATURES = {  # (context dense, context sparse, candidate dense) present -> class
    (True, True, True): ContextModule,
    (True, True, False): ContextModuleNoCandDense,
    (False, True, True): ContextModuleNoCtxDense,
    (False, True, False): ContextModuleNoDense,
    (True, False, True): ContextModuleDenseOnly,
    (True, False, False): ContextModuleDenseOnlyNoCandDense,
}


def context_module(flat: ServedModule, cfg: RecConfig, split: ContextSplit) -> ContextServedModule:
    """The context form of the flat served module `flat` (its modules and storage shared), with
    forward taking exactly the inputs rec.contract.io.context_io_manifest lists."""
    present = (bool(split.dense), bool(split.sparse), bool(split.cand_dense))
    return _SIGNATURES[present](flat, cfg, split).eval()
