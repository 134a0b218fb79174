"""Export's checks of a context model (features.context; rec.export.served_context).

Every other check of the export scores flat batches (the float reference's held-out batches,
the ZCH probe, the raw-row round trip): `FlatScorer` gives them the context model as both
servers serve a flat request to it, B contexts of one candidate each (rec.contract.context's
split_flat). Two checks are the context form's own:

    context_vs_flat   each held-out batch given row 0's context: scored as one context of B
                      candidates and as the flat batch with that context repeated; any
                      difference refuses the export (run_checks)
    the probe         R = 3 contexts of 1, 3 and 5 candidates as one batch, against each
                      context's request alone and each candidate alone (rec.batch_probe's
                      context_variance); rec.json's batch_probe carries it for the servers
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from rec.batch import RecBatch
from rec.contract.context import ContextSplit, offsets, repeat, split_flat
from rec.contract.io import CANDIDATE_OFFSETS, INPUT_NAMES, context_io_manifest
from rec.export.module import sample_batch
from rec.export.verify import max_diff

PROBE_CANDIDATES = (1, 3, 5)
"""The context probe's candidates per context: one alone, and more than one."""


def input_names(split: ContextSplit) -> list[str]:
    """The context model's inputs, in its forward's order (zero-width ones left out)."""
    return [i["name"] for i in context_io_manifest(split, 1)["inputs"]]


def _tensors(split: ContextSplit, inputs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.ascontiguousarray(inputs[name]))
            for name in input_names(split)}  # fmt: skip


class FlatScorer:
    """A context model scoring flat requests (dense, lengths, values), as a server does: B
    contexts of one candidate each."""

    def __init__(self, model: Callable[..., torch.Tensor], split: ContextSplit) -> None:
        self.model = model
        self.split = split

    def __call__(
        self, dense: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        inputs = split_flat(self.split, dense.numpy(), lengths.numpy(), values.numpy())
        return self.model(*_tensors(self.split, inputs).values())


def context_sample(split: ContextSplit, flat: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A flat sample (export's Source.sample) as the context model's inputs: B contexts."""
    inputs = split_flat(split, *(t.numpy() for t in flat))
    return tuple(_tensors(split, inputs).values())


def probe_request(split: ContextSplit) -> dict[str, torch.Tensor]:
    """The context probe: len(PROBE_CANDIDATES) contexts and their candidates."""
    return context_request(split, list(PROBE_CANDIDATES), seed=7)


def context_request(split: ContextSplit, counts: list[int], seed: int) -> dict[str, torch.Tensor]:
    """len(counts) random contexts of counts[r] random candidates each (empty bags, multi-id
    bags, ids anywhere in int64), as the context model's inputs by name in forward's order."""
    contexts = sample_batch(split.num_dense, split.num_sparse, len(counts), seed=seed + 1)
    candidates = sample_batch(split.num_dense, split.num_sparse, sum(counts), seed=seed)
    ctx = split_flat(split, *(t.numpy() for t in contexts))
    inputs = split_flat(split, *(t.numpy() for t in candidates))
    inputs.update({k: v for k, v in ctx.items() if k.startswith("context_")})
    inputs[CANDIDATE_OFFSETS] = offsets(counts, len(split.cand_sparse))
    return _tensors(split, inputs)


def probe_section(request: dict[str, torch.Tensor], split: ContextSplit) -> dict[str, torch.Tensor]:
    """rec.json's batch_probe of a context model: the probe by the model's input names (what
    rec-server's load-time probe scores), then the same pairs as a flat request, each context
    repeated, under the flat inputs' names (what a reader of the flat form scores: a context
    model takes flat requests too; and what sections.BatchProbe requires today)."""
    flat = repeat(split, {k: v.numpy() for k, v in request.items()})
    named = zip(INPUT_NAMES, flat, strict=True)
    return {**request, **{n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in named}}


def one_context(
    split: ContextSplit, batch: RecBatch
) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """(row 0's context with the batch's B rows as its candidates, as the context model's
    inputs; the same pairs as a flat batch, row 0's context repeated)."""
    parts = split_flat(split, batch.dense.numpy(), batch.lengths.numpy(), batch.values.numpy())
    fn = len(split.cand_sparse)
    request = {k: v for k, v in parts.items() if k.startswith("candidate_")}
    request[CANDIDATE_OFFSETS] = offsets([batch.lengths.shape[0]], fn)
    if "context_dense" in parts:
        request["context_dense"] = parts["context_dense"][:1]
    if "context_lengths" in parts:
        first = parts["context_lengths"][:1]
        request["context_lengths"] = first
        request["context_values"] = parts["context_values"][: int(first.sum())]
    flat = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in repeat(split, request))
    return _tensors(split, request), flat


def context_vs_flat(
    model: Callable[..., torch.Tensor], split: ContextSplit, batches: Iterable[RecBatch]
) -> float:
    """Largest |difference| between each batch scored as one context (row 0's) of its B rows
    and as the flat batch with that context repeated (FlatScorer); 0.0 when every score has
    the same bits."""
    flat_scorer = FlatScorer(model, split)
    diff = 0.0
    with torch.no_grad():
        for batch in batches:
            request, flat = one_context(split, batch)
            got, want = model(*request.values()), flat_scorer(*flat)
            if not torch.equal(got, want):
                diff = max(diff, max_diff(got.double(), want.double()), 1e-45)
    return diff
