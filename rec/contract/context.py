"""The context form (features.context): one request = one context (the user, the device, the
time) and N candidates, the context's features sent and looked up once instead of N times.

`ContextSplit` says which flat columns are context: indices into dense_features' columns
(features.dense_names) and sparse_lengths' columns (features.sparse), ascending; the rest are the
candidate's. rec.json carries it as its "context" section (`to_dict` / `from_dict`). The model's
inputs are named in rec.contract.io (CONTEXT_INPUT_NAMES); a zero-width one is left out.

Two conversions pin the meaning of a context request, and the servers' tests check both against
the model: a context request scores exactly as the flat batch with its context repeated per
candidate (`repeat`), and a flat batch of B rows is B contexts of one candidate each
(`split_flat`, what both servers do with a flat request to a context model). `offsets` gives
`candidate_offsets`, which the server fills: Fn * (0, N1, N1+N2, ...), the start of each
request's candidate bags in candidate_lengths' flat order.

numpy only, like the rest of rec.contract.

Example:
    >>> split = ContextSplit(dense=(0,), sparse=(1,), num_dense=2, num_sparse=2)
    >>> split.cand_dense, split.cand_sparse
    ((1,), (0,))
    >>> dense = np.array([[1, 2], [3, 4]], np.float32)
    >>> lengths = np.array([[1, 2], [1, 0]], np.int32)   # row 0: [10] [11, 12]; row 1: [20] []
    >>> values = np.array([10, 11, 12, 20])
    >>> parts = split_flat(split, dense, lengths, values)
    >>> parts["context_values"].tolist(), parts["candidate_values"].tolist()
    ([11, 12], [10, 20])
    >>> parts["candidate_offsets"].tolist()
    [0, 1, 2]
    >>> request = {"context_dense": np.array([[1]], np.float32),   # one context, 2 candidates
    ...            "context_lengths": np.array([[2]], np.int32),
    ...            "context_values": np.array([11, 12]),
    ...            "candidate_dense": np.array([[2], [4]], np.float32),
    ...            "candidate_lengths": np.array([[1], [1]], np.int32),
    ...            "candidate_values": np.array([10, 20])}
    >>> d, l, v = repeat(split, request)
    >>> d.tolist(), l.tolist(), v.tolist()
    ([[1.0, 2.0], [1.0, 4.0]], [[1, 2], [1, 2]], [10, 11, 12, 20, 11, 12])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rec.contract.io import (
    CANDIDATE_DENSE,
    CANDIDATE_LENGTHS,
    CANDIDATE_OFFSETS,
    CANDIDATE_STRINGS,
    CANDIDATE_VALUES,
    CONTEXT_DENSE,
    CONTEXT_INPUT_NAMES,
    CONTEXT_LENGTHS,
    CONTEXT_STRINGS,
    CONTEXT_VALUES,
    DENSE,
    DTYPES,
    LENGTHS,
    NUMPY_DTYPES,
    STRINGS,
    VALUES,
)
from rec.contract.sections import ManifestError, get, integer

VERSION = 1
"""rec.json's context.version: what `from_dict` reads."""

_DENSE = NUMPY_DTYPES[DTYPES[CONTEXT_DENSE]]
_LENGTHS = NUMPY_DTYPES[DTYPES[CONTEXT_LENGTHS]]
_OFFSETS = NUMPY_DTYPES[DTYPES[CANDIDATE_OFFSETS]]
FLAT_REQUEST_INPUTS = (DENSE, LENGTHS, VALUES, STRINGS)
CONTEXT_REQUEST_INPUTS = (*CONTEXT_INPUT_NAMES, CONTEXT_STRINGS, CANDIDATE_STRINGS)
"""What a request to a context model may carry, each form's in the I/O table's order (a mixed
request's refusal names the first of each)."""


@dataclass(frozen=True)
class ContextSplit:
    """Which flat columns belong to the context; the others are each candidate's own."""

    dense: tuple[int, ...]
    """dense_features' columns that are context, ascending."""
    sparse: tuple[int, ...]
    """sparse_lengths' columns (sparse features) that are context, ascending."""
    num_dense: int
    """dense_features' width (D)."""
    num_sparse: int
    """sparse_lengths' width (F)."""

    @property
    def cand_dense(self) -> tuple[int, ...]:
        """dense_features' columns that are the candidate's, ascending."""
        return tuple(i for i in range(self.num_dense) if i not in self.dense)

    @property
    def cand_sparse(self) -> tuple[int, ...]:
        """sparse_lengths' columns that are the candidate's, ascending (at least one)."""
        return tuple(i for i in range(self.num_sparse) if i not in self.sparse)

    @classmethod
    def from_config(cls, cfg: Any) -> ContextSplit:
        """From a RecConfig's features.context (names checked there); empty when it is empty."""
        features = cfg.features
        context = set(features.context)
        dense = tuple(i for i, n in enumerate(features.dense_names) if n in context)
        sparse = tuple(i for i, n in enumerate(features.sparse) if n in context)
        return cls(dense, sparse, len(features.dense_names), len(features.sparse))

    def to_dict(self) -> dict[str, Any]:
        """rec.json's "context" section."""
        return {
            "version": VERSION,
            "dense": list(self.dense),
            "sparse": list(self.sparse),
            "num_dense": self.num_dense,
            "num_sparse": self.num_sparse,
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> ContextSplit:
        """Checks rec.json's "context" section; ManifestError names the field at fault."""
        if not isinstance(data, dict):
            raise ManifestError(source, "context", "an object or null", data)
        version = get(data, "version")
        if version != VERSION or type(version) is not int:
            raise ManifestError(source, "context.version", str(VERSION), version)
        widths = []
        for key in ("num_dense", "num_sparse"):
            value = get(data, key)
            if not integer(value, 0):
                raise ManifestError(source, f"context.{key}", "an integer in [0, 2^30]", value)
            widths.append(value)
        columns = []
        for key, width in zip(("dense", "sparse"), widths, strict=True):
            value = get(data, key)
            if not (isinstance(value, list) and all(type(i) is int for i in value)
                    and all(0 <= a < b for a, b in zip(value[:-1], value[1:], strict=True))
                    and all(0 <= i < width for i in value)):  # fmt: skip
                want = f"ascending distinct column indices in [0, num_{key}={width})"
                raise ManifestError(source, f"context.{key}", want, value)
            columns.append(tuple(value))
        split = cls(columns[0], columns[1], widths[0], widths[1])
        if not split.dense and not split.sparse:
            raise ManifestError(source, "context", "at least one context column", data)
        if not split.cand_sparse:
            want = f"fewer than num_sparse={widths[1]} columns (a candidate needs a sparse feature)"
            raise ManifestError(source, "context.sparse", want, list(split.sparse))
        return split


def offsets(counts: Sequence[int] | np.ndarray, fn: int) -> np.ndarray:
    """candidate_offsets of requests with `counts` candidates each, `fn` candidate sparse
    features: fn * (0, N1, N1+N2, ...), int32."""
    total = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
    return (fn * total).astype(_OFFSETS)


def _bag_starts(lengths: np.ndarray) -> np.ndarray:
    """Where each bag of a batch-major [rows, F] lengths starts in its values, same shape."""
    flat = lengths.reshape(-1).astype(np.int64)
    return (np.cumsum(flat) - flat).reshape(lengths.shape)


def _gather_bags(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The value indices of bags (start, length) laid end to end."""
    lens = lens.astype(np.int64)
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    return np.repeat(starts, lens) + within


def split_flat(
    split: ContextSplit, dense: np.ndarray, lengths: np.ndarray, values: np.ndarray
) -> dict[str, np.ndarray]:
    """A flat batch of B rows as B contexts of one candidate each: the context model's inputs
    (candidate_offsets included, zero-width ones left out), keyed by input name. `values` may
    be ids or strings (they are only moved)."""
    rows = lengths.shape[0]
    context = np.zeros(split.num_sparse, dtype=bool)
    context[list(split.sparse)] = True
    # Each value's feature column, in batch-major order; a subset of columns keeps that order.
    column = np.repeat(np.tile(np.arange(split.num_sparse), rows), lengths.reshape(-1))
    mine = context[column]
    parts = {
        CONTEXT_DENSE: dense[:, list(split.dense)].astype(_DENSE),
        CONTEXT_LENGTHS: lengths[:, list(split.sparse)].astype(_LENGTHS),
        CONTEXT_VALUES: values[mine],
        CANDIDATE_DENSE: dense[:, list(split.cand_dense)].astype(_DENSE),
        CANDIDATE_LENGTHS: lengths[:, list(split.cand_sparse)].astype(_LENGTHS),
        CANDIDATE_VALUES: values[~mine],
        CANDIDATE_OFFSETS: offsets([1] * rows, len(split.cand_sparse)),
    }
    widths = {CONTEXT_DENSE: len(split.dense), CONTEXT_LENGTHS: len(split.sparse),
              CONTEXT_VALUES: len(split.sparse),
              CANDIDATE_DENSE: len(split.cand_dense)}  # fmt: skip
    return {name: a for name, a in parts.items() if widths.get(name, 1) > 0}


def _values(inputs: dict[str, np.ndarray], ids: str, strings: str) -> np.ndarray:
    return inputs[ids] if ids in inputs else inputs.get(strings, np.zeros(0, np.int64))


def repeat(
    split: ContextSplit, inputs: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Context inputs (a request: R = 1 context, N candidates; or R contexts with
    candidate_offsets) as the flat batch (dense, lengths, values) of B = N rows, each
    candidate's row holding its context's columns. Values may be ids or strings
    (context_strings / candidate_strings)."""
    cand_lengths = np.asarray(inputs[CANDIDATE_LENGTHS])
    rows, fn = cand_lengths.shape[0], len(split.cand_sparse)
    if CANDIDATE_OFFSETS in inputs:
        counts = np.diff(np.asarray(inputs[CANDIDATE_OFFSETS], dtype=np.int64)) // fn
    else:
        counts = np.array([rows])
    contexts = len(counts)
    ctx_dense = inputs.get(CONTEXT_DENSE, np.zeros((contexts, 0), _DENSE))
    ctx_lengths = inputs.get(CONTEXT_LENGTHS, np.zeros((contexts, 0), _LENGTHS))
    if int(counts.sum()) != rows or {len(ctx_dense), len(ctx_lengths)} != {contexts}:
        raise ValueError(
            f"{contexts} contexts of {counts.tolist()} candidates do not match "
            f"{len(ctx_dense)} context rows and {rows} candidate rows"
        )
    owner = np.repeat(np.arange(contexts), counts)

    dense = np.zeros((rows, split.num_dense), _DENSE)
    dense[:, list(split.dense)] = np.asarray(ctx_dense)[owner]
    dense[:, list(split.cand_dense)] = inputs.get(CANDIDATE_DENSE, np.zeros((rows, 0), _DENSE))
    lengths = np.zeros((rows, split.num_sparse), _LENGTHS)
    lengths[:, list(split.sparse)] = np.asarray(ctx_lengths)[owner]
    lengths[:, list(split.cand_sparse)] = cand_lengths

    # Every flat bag (row, column), batch-major, as (start, length) in ctx ++ cand values.
    ctx_values = np.asarray(_values(inputs, CONTEXT_VALUES, CONTEXT_STRINGS)).reshape(-1)
    cand_values = np.asarray(_values(inputs, CANDIDATE_VALUES, CANDIDATE_STRINGS)).reshape(-1)
    starts = np.zeros((rows, split.num_sparse), np.int64)
    starts[:, list(split.sparse)] = _bag_starts(np.asarray(ctx_lengths))[owner]
    starts[:, list(split.cand_sparse)] = _bag_starts(cand_lengths) + len(ctx_values)
    pool = np.concatenate([ctx_values, cand_values])
    values = pool[_gather_bags(starts.reshape(-1), lengths.reshape(-1))]
    return dense, lengths, values


class RequestError(ValueError):
    """A request to a context model that both servers refuse, with their text."""


def request_form(shapes: dict[str, Sequence[int]], max_batch_size: int) -> str:
    """ "flat" or "context": the form of a request to a context model, given its inputs' shapes,
    or RequestError with the text both servers give (tests/data/request_golden.json). Checked in
    this order: both forms at once, candidate_offsets sent, a context batch other than 1, no
    candidate, more than `max_batch_size`. Dtypes, widths and lengths against values are the
    servers' own checks, as for a flat request."""
    flat = [n for n in FLAT_REQUEST_INPUTS if n in shapes]
    context = [n for n in CONTEXT_REQUEST_INPUTS if n in shapes]
    if flat and context:
        raise RequestError(
            f"a request carries either the flat inputs ({DENSE}, {LENGTHS}, {VALUES}) or the "
            f"context form (context_*, candidate_*), not both: got {flat[0]!r} and {context[0]!r}"
        )
    if not context:
        return "flat"
    if CANDIDATE_OFFSETS in shapes:
        raise RequestError(f"input {CANDIDATE_OFFSETS!r}: filled by the server, do not send it")
    for name in (CONTEXT_DENSE, CONTEXT_LENGTHS):
        rows = list(shapes.get(name, [1]))[:1]
        if rows != [1]:
            got = rows[0] if rows else "a scalar"
            raise RequestError(
                f"input {name!r}: a request carries one context (batch 1), got {got}"
            )
    candidates = list(shapes.get(CANDIDATE_LENGTHS, [1]))[:1]
    if candidates == [0]:
        raise RequestError(
            f"input {CANDIDATE_LENGTHS!r}: a request needs at least one candidate, got 0"
        )
    if candidates and candidates[0] > max_batch_size:
        raise RequestError(
            f"request has {candidates[0]} candidates, above max_batch_size {max_batch_size}"
        )
    return "context"
