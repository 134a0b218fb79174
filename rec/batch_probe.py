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

_DTYPES = (torch.float32, torch.int32, torch.int64)
Request = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def to_manifest(request: Request) -> dict[str, list]:
    """The probe request as rec.json stores it, by input name."""
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


def refusal(model: str, version: str, rows: int, diff: float, here: str, verified_on: str) -> str:
    """The message both servers give for a model that fails the probe (rec-server's words)."""
    return (
        f"model '{model}' version {version} is not batch invariant on this CPU, {here}: its "
        f"rec.json probe of {rows} samples scores them differently as one batch than one by one "
        f"(max diff {diff:g}); export verified it on {verified_on}"
    )
