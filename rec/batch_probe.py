"""The batched-vs-single probe: does a model score a batch exactly as its samples one by one,
here, on this CPU?

Export runs it before it writes a model it calls batch invariant, and stores its request in
rec.json (`batch_probe`, with the CPU in `dense.verified_on`); rec-server (cpp/src/model/
batch_probe.cpp) and Triton's Python model run it again when they load the model, so a model
carried to a CPU where it is not invariant is refused (or served with a warning and the
rec_model_batch_variant metric when the operator allows it), never silently.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rec.batch import split_requests
from rec.contract import INPUT_NAMES, Manifest
from rec.contract.io import (
    CANDIDATE_DENSE,
    CANDIDATE_LENGTHS,
    CANDIDATE_OFFSETS,
    CANDIDATE_VALUES,
    CONTEXT_DENSE,
    CONTEXT_LENGTHS,
    CONTEXT_VALUES,
)

_DTYPES = (torch.float32, torch.int32, torch.int64)
Request = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def to_manifest(request: Request | dict[str, torch.Tensor]) -> dict[str, list]:
    """The probe request as rec.json stores it, by input name: a flat request's three tensors,
    or a context model's inputs by name (`context_variance`)."""
    if isinstance(request, dict):
        return {name: t.tolist() for name, t in request.items()}
    return {name: t.tolist() for name, t in zip(INPUT_NAMES, request, strict=True)}


def from_manifest(manifest: Manifest | None) -> Request | None:
    """The probe request of a rec.json, or None when there is none, the model is not claimed
    batch invariant or it carries no probe (an older export)."""
    if manifest is None or manifest.dense is None or not manifest.dense.batch_invariant:
        return None
    if manifest.batch_probe is None:
        return None
    stored = manifest.batch_probe.inputs
    return tuple(  # type: ignore[return-value]
        torch.tensor(stored[name], dtype=dtype)
        for name, dtype in zip(INPUT_NAMES, _DTYPES, strict=True)
    )


def batch_variance(scorer: Callable[..., torch.Tensor], request: Request) -> float:
    """Largest |difference| between the batch's scores and its samples' scores one by one;
    0.0 exactly when every score has the same bits (a tiny nonzero value when only the bits
    of equal numbers differ, e.g. -0.0)."""
    with torch.inference_mode():
        batched = scorer(*request)
        singles = torch.cat([scorer(*r) for r in split_requests(*request)])
    if torch.equal(batched, singles):
        return 0.0
    diff = (batched.double() - singles.double()).abs().nan_to_num(float("inf")).max().item()
    return max(diff, 1e-45)


def context_variance(
    scorer: Callable[..., torch.Tensor], request: dict[str, torch.Tensor], fn: int
) -> float:
    """batch_variance of a context model: R contexts of N_r candidates each (`request` by input
    name in the model's forward order, candidate_offsets included; `fn` candidate sparse
    features) scored as one batch, against each context's request alone and each candidate
    alone with its context (R = 1, N = 1)."""
    offsets = request[CANDIDATE_OFFSETS].to(torch.int64)
    counts = ((offsets[1:] - offsets[:-1]) // fn).tolist()
    with torch.inference_mode():
        batched = scorer(*request.values())
        alone = [scorer(*r.values()) for r in context_requests(request, counts)]
        ones = [1] * sum(counts)
        each = [scorer(*r.values()) for r in context_requests(request, ones, counts)]
    diff = 0.0
    for singles in (torch.cat(alone), torch.cat(each)):
        if not torch.equal(batched, singles):
            d = (batched.double() - singles.double()).abs().nan_to_num(float("inf")).max().item()
            diff = max(diff, d, 1e-45)
    return diff


def context_requests(
    request: dict[str, torch.Tensor], counts: list[int], contexts: list[int] | None = None
) -> list[dict[str, torch.Tensor]]:
    """`request` cut into requests of `counts` candidates each, each with its one context
    (`contexts`: the candidates of each of the request's contexts, default `counts`: one
    request per context)."""
    contexts = counts if contexts is None else contexts
    owner = torch.repeat_interleave(torch.arange(len(contexts)), torch.tensor(contexts))
    cand = _rows(request, CANDIDATE_LENGTHS, CANDIDATE_VALUES, CANDIDATE_DENSE)
    ctx = _rows(request, CONTEXT_LENGTHS, CONTEXT_VALUES, CONTEXT_DENSE)
    fn = request[CANDIDATE_LENGTHS].shape[1]
    out, start = [], 0
    for n in counts:
        r = int(owner[start])
        part = {**ctx(r, r + 1), **cand(start, start + n)}
        part[CANDIDATE_OFFSETS] = torch.tensor([0, fn * n], dtype=torch.int32)
        out.append({name: part[name] for name in request})  # the forward's order
        start += n
    return out


def _rows(request: dict[str, torch.Tensor], lengths: str, values: str, dense: str):
    """A function (start, stop) -> rows start..stop of one side's inputs (those present)."""
    starts = [0]  # where each row's ids start in its values
    if lengths in request:
        starts += torch.cumsum(request[lengths].sum(1, dtype=torch.int64), 0).tolist()

    def rows(start: int, stop: int) -> dict[str, torch.Tensor]:
        out = {}
        if dense in request:
            out[dense] = request[dense][start:stop]
        if lengths in request:
            out[lengths] = request[lengths][start:stop]
            out[values] = request[values][starts[start] : starts[stop]]
        return out

    return rows


def refusal(model: str, version: str, rows: int, diff: float, here: str, verified_on: str) -> str:
    """The message both servers give for a model that fails the probe (rec-server's words)."""
    return (
        f"model '{model}' version {version} is not batch invariant on this CPU, {here}: its "
        f"rec.json probe of {rows} samples scores them differently as one batch than one by one "
        f"(max diff {diff:g}); export verified it on {verified_on}"
    )
