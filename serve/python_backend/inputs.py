"""One inference request's inputs, decoded and checked as rec-server checks them.

Triton's own checks see each input's type and shape against the config; what they cannot see
is the jagged pair (lengths against the values), non-finite dense values, negative lengths and
the exported max_batch_size. The messages match the C++ server's (cpp/src/model/request.cpp),
so clients see one wording whichever server answers.

A request may carry its ids as strings (`sparse_strings`, BYTES) instead of `sparse_values`;
they are mapped with the model's feature spec by rec.features, the code the training readers
use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rec.contract import DENSE, LENGTHS, STRINGS, VALUES
from rec.features import FeatureSpec, TokenError

INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"
"""A Failure's code: the name of pb_utils.TritonError's code the adapter answers with."""


@dataclass(frozen=True)
class Inputs:
    """A request's tensors as numpy arrays; an input the request lacks is None."""

    dense: np.ndarray
    """float32 [B, D]"""
    lengths: np.ndarray
    """int32 [B, F]"""
    values: np.ndarray | None = None
    """int64 [N] or [1, N] (batching clients send it so)"""
    strings: np.ndarray | None = None
    """BYTES [N] or [1, N]: numpy object array of bytes, as Triton gives it"""


@dataclass(frozen=True)
class Failure:
    """A request's error response: its message and code."""

    message: str
    code: str = INTERNAL


def check(dense, lengths, values, max_rows: int, values_name: str = VALUES) -> str | None:
    """Message for what Triton's own shape checks cannot see (the jagged pair), or None."""
    if dense.shape[0] < 1:
        width = dense.shape[1]
        return f"input '{DENSE}': expected shape [B,{width}] with B >= 1, got [0,{width}]"
    if 0 < max_rows < dense.shape[0]:
        return f"input '{DENSE}': batch size {dense.shape[0]} exceeds max_batch_size {max_rows}"
    if dense.shape[0] != lengths.shape[0]:
        return (
            f"input '{LENGTHS}': batch size {lengths.shape[0]} differs from other inputs' "
            f"{dense.shape[0]}"
        )
    bad = np.argwhere(~np.isfinite(dense))
    if bad.size:
        r, c = (int(x) for x in bad[0])
        what = "nan" if np.isnan(dense[r, c]) else ("inf" if dense[r, c] > 0 else "-inf")
        return f"input '{DENSE}': value {what} at [{r}, {c}]: every value must be a finite number"
    negative = np.flatnonzero(lengths.reshape(-1) < 0)
    if negative.size:
        i = int(negative[0])
        return f"input '{LENGTHS}': negative length {int(lengths.reshape(-1)[i])} at flat index {i}"
    total = int(lengths.sum(dtype=np.int64))
    if values.size != total:
        return f"input '{values_name}': has {values.size} values but sum of '{LENGTHS}' is {total}"
    return None


def decode(
    inputs: Inputs,
    max_rows: int,
    spec: FeatureSpec | None = None,
    on_tokens: Callable[[np.ndarray, list[str]], None] | None = None,
) -> np.ndarray | Failure:
    """The request's sparse_values, int64 [N], or its INVALID_ARG Failure. `on_tokens(lengths,
    tokens)` hears a valid string request's tokens (the negative-id counts)."""
    values, problem = _values(inputs, max_rows, spec, on_tokens)
    if problem is None:
        problem = check(inputs.dense, inputs.lengths, values, max_rows)
    return Failure(problem, INVALID_ARG) if problem is not None else values


def _values(inputs, max_rows, spec, on_tokens):
    """(sparse_values [N] int64, None), or (None, message)."""
    if (inputs.values is None) == (inputs.strings is None):
        both = "both" if inputs.values is not None else "neither"
        return None, (
            f"a request carries either '{VALUES}' (INT64 ids) or '{STRINGS}' "
            f"(BYTES tokens); this one has {both}"
        )
    if inputs.values is not None:
        # Ragged ids arrive as [1, N] from batching clients or [N]; the model wants [N].
        return inputs.values.reshape(-1), None
    if spec is None:  # the staged config declares no sparse_strings then: Triton refuses first
        return None, f"input '{STRINGS}': this model's rec.json has no feature_spec"
    tokens = [t.decode("utf-8", errors="surrogateescape") for t in
              inputs.strings.reshape(-1).tolist()]  # fmt: skip
    # Shapes and counts first, with the messages sparse_values gets, naming this input.
    problem = check(inputs.dense, inputs.lengths, np.empty(len(tokens)), max_rows, STRINGS)
    if problem is not None:
        return None, problem
    try:
        values = spec.encode_values(inputs.lengths, tokens)
    except TokenError as e:
        return None, f"input '{STRINGS}': {e}"
    if on_tokens is not None:
        on_tokens(inputs.lengths, tokens)
    return values, None
