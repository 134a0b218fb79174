"""One inference request's inputs, decoded and checked as rec-server checks them.

Triton's own checks see each input's type and shape against the config; what they cannot see
is the jagged pair (lengths against the values), non-finite dense values, negative lengths and
the exported max_batch_size. The messages match the C++ server's (cpp/src/model/request.cpp),
so clients see one wording whichever server answers.

A request may carry its ids as strings (`sparse_strings`, BYTES) instead of `sparse_values`;
they are mapped with the model's feature spec by rec.features, the code the training readers
use. A valid request becomes a Feed: the model's inputs, ready to be joined with the other
requests of a batch (`concatenate`). This module decodes the flat form; context_inputs.py the
context form of a context model (features.context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rec.contract import DENSE, LENGTHS, STRINGS, VALUES
from rec.contract.io import CANDIDATE_OFFSETS
from rec.features import FeatureSpec, TokenError

INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"
"""A Failure's code: the name of pb_utils.TritonError's code the adapter answers with."""

OnTokens = Callable[[np.ndarray, list[str], FeatureSpec], None]
"""Hears a valid string request's tokens: (lengths, tokens, the spec of lengths' columns)."""


@dataclass(frozen=True)
class Inputs:
    """A request's tensors by input name, as numpy arrays: what it carries, nothing more."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def flat(cls, dense=None, lengths=None, values=None, strings=None) -> Inputs:
        """The flat form's inputs (None: not sent). values: int64 [N] or [1, N] (batching
        clients send it so); strings: BYTES, a numpy object array of bytes as Triton gives it."""
        named = {DENSE: dense, LENGTHS: lengths, VALUES: values, STRINGS: strings}
        return cls({name: a for name, a in named.items() if a is not None})

    def get(self, name: str) -> np.ndarray | None:
        return self.tensors.get(name)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: a.shape for name, a in self.tensors.items()}


@dataclass(frozen=True)
class Feed:
    """A valid request as the model takes it: its inputs by name in the model's forward order
    (ids encoded; a context model's candidate_offsets filled), and its rows of scores."""

    tensors: dict[str, np.ndarray]
    rows: int


@dataclass(frozen=True)
class Failure:
    """A request's error response: its message and code."""

    message: str
    code: str = INTERNAL


class Refusal(ValueError):
    """A request's INVALID_ARG message, raised by the checks and answered as its Failure."""


def concatenate(feeds: list[Feed]) -> dict[str, np.ndarray]:
    """The requests' inputs joined into one batch (copies: Triton's input buffers are
    read-only, which torch.from_numpy wants anyway). Every input is batch-major, so it joins on
    dim 0; candidate_offsets, each request's Fn * (0, N1, ...), continue from the running total
    (rec-server's ConcatenateOffsets), so each request keeps its own contexts."""
    out = {}
    for name in feeds[0].tensors:
        parts = [f.tensors[name] for f in feeds]
        if name != CANDIDATE_OFFSETS:
            out[name] = np.concatenate(parts)
            continue
        ends = np.cumsum([0] + [int(p[-1]) for p in parts[:-1]], dtype=parts[0].dtype)
        shifted = [p[1:] + e for p, e in zip(parts, ends, strict=True)]
        out[name] = np.concatenate([parts[0][:1], *shifted])
    return out


def check_finite(name: str, dense: np.ndarray) -> None:
    """Refusal for a NaN or infinity, naming its [row, column]."""
    bad = np.argwhere(~np.isfinite(dense.reshape(dense.shape[0], -1)))
    if bad.size:
        r, c = (int(x) for x in bad[0])
        v = dense.reshape(dense.shape[0], -1)[r, c]
        what = "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
        raise Refusal(f"input '{name}': value {what} at [{r}, {c}]: every value must be a "
                      "finite number")  # fmt: skip


def check_jagged(lengths_name: str, lengths: np.ndarray, values_name: str, count: int) -> None:
    """Refusal for a negative length or `count` values that are not the lengths' sum."""
    negative = np.flatnonzero(lengths.reshape(-1) < 0)
    if negative.size:
        i = int(negative[0])
        raise Refusal(f"input '{lengths_name}': negative length {int(lengths.reshape(-1)[i])} "
                      f"at flat index {i}")  # fmt: skip
    total = int(lengths.sum(dtype=np.int64))
    if count != total:
        raise Refusal(f"input '{values_name}': has {count} values but sum of '{lengths_name}' "
                      f"is {total}")  # fmt: skip


def pick_values(inputs: Inputs, values: str, strings: str, spec: FeatureSpec | None) -> bool:
    """Whether the request sends `strings` in place of `values`; Refusal for both or neither,
    or strings to a model without a feature spec."""
    given, has_values = strings in inputs.tensors, values in inputs.tensors
    if given and spec is None:  # the staged config declares no strings then: Triton refuses first
        raise Refusal(f"input '{strings}': this model's rec.json has no feature_spec")
    if given == has_values:
        if spec is None:  # ids are the only form then: what is missing is the ids
            raise Refusal(f"input '{values}': missing")
        both = "both" if given else "neither"
        raise Refusal(f"a request carries either '{values}' (INT64 ids) or '{strings}' "
                      f"(BYTES tokens); this one has {both}")  # fmt: skip
    return given


def encode_strings(
    spec: FeatureSpec,
    lengths_name: str,
    lengths: np.ndarray,
    strings_name: str,
    strings: np.ndarray,
    on_tokens: OnTokens | None = None,
) -> np.ndarray:
    """The ids of a side's tokens (`spec`: its features, `lengths`: its [rows, F] lengths),
    checked against the lengths first, with the message its values would get."""
    tokens = [t.decode("utf-8", errors="surrogateescape") for t in strings.reshape(-1).tolist()]
    check_jagged(lengths_name, lengths, strings_name, len(tokens))
    try:
        values = spec.encode_values(lengths, tokens)
    except TokenError as e:
        raise Refusal(f"input '{strings_name}': {e}") from None
    if on_tokens is not None:
        on_tokens(lengths, tokens, spec)
    return values


def check(dense, lengths, values, max_rows: int, values_name: str = VALUES) -> str | None:
    """A flat request's message for what Triton's own shape checks cannot see (the jagged
    pair), or None."""
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
    try:
        check_finite(DENSE, dense)
        check_jagged(LENGTHS, lengths, values_name, values.size)
    except Refusal as e:
        return str(e)
    return None


def decode(
    inputs: Inputs,
    max_rows: int,
    spec: FeatureSpec | None = None,
    on_tokens: OnTokens | None = None,
) -> Feed | Failure:
    """A flat request's Feed (dense_features, sparse_lengths, sparse_values [N]), or its
    INVALID_ARG Failure. `on_tokens` hears a valid string request's tokens (the negative-id
    counts)."""
    try:
        for name in (DENSE, LENGTHS):  # optional in a context model's config, which has both forms
            if name not in inputs.tensors:
                raise Refusal(f"input '{name}': missing")
        dense, lengths = inputs.get(DENSE), inputs.get(LENGTHS)
        if pick_values(inputs, VALUES, STRINGS, spec):
            # Shapes and counts first, with the messages sparse_values gets, naming this input.
            count = np.empty(inputs.get(STRINGS).size)
            problem = check(dense, lengths, count, max_rows, STRINGS)
            if problem is not None:
                raise Refusal(problem)
            values = encode_strings(spec, LENGTHS, lengths, STRINGS, inputs.get(STRINGS),
                                    on_tokens)  # fmt: skip
        else:
            values = inputs.get(VALUES).reshape(-1)  # [1, N] from batching clients, or [N]
        problem = check(dense, lengths, values, max_rows)
        if problem is not None:
            raise Refusal(problem)
    except Refusal as e:
        return Failure(str(e), INVALID_ARG)
    return Feed({DENSE: dense, LENGTHS: lengths, VALUES: values}, int(dense.shape[0]))
