"""A request to a context model (features.context, rec.contract.context), decoded and checked
as rec-server checks it (cpp/src/model/context_request.cpp), with the same messages.

A context model takes both forms. The context form is one context (context_dense [1, Dc],
context_lengths [1, Fc], context_values or context_strings) and N candidates (candidate_dense
[N, Dn], candidate_lengths [N, Fn], candidate_values or candidate_strings); the flat form
(dense_features, sparse_lengths, sparse_values or sparse_strings) is split into B contexts of
one candidate each (`split_flat`). Which form, and the refusals both servers share (both forms
at once, candidate_offsets sent, a context batch other than 1, no candidate, too many) come
from rec.contract.context.request_form, the reference both servers follow; the rest (missing
inputs, widths, candidates that disagree, non-finite dense values, lengths against values) is
this module's, worded as rec-server words it. A side's strings are encoded with that side's
features (their encodings differ: a hex item beside an int_or_hash user). The Feed holds the
model's inputs with candidate_offsets [0, N * Fn] filled; inputs.concatenate joins requests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rec.contract.context import (
    ContextSplit,
    RequestError,
    offsets,
    request_form,
    split_flat,
)
from rec.contract.io import (
    CANDIDATE_DENSE,
    CANDIDATE_LENGTHS,
    CANDIDATE_OFFSETS,
    CANDIDATE_STRINGS,
    CANDIDATE_VALUES,
    CONTEXT_DENSE,
    CONTEXT_LENGTHS,
    CONTEXT_STRINGS,
    CONTEXT_VALUES,
    DENSE,
    LENGTHS,
    VALUES,
    context_io_manifest,
)
from rec.features import FeatureSpec

from .inputs import (
    INVALID_ARG,
    Failure,
    Feed,
    Inputs,
    OnTokens,
    Refusal,
    check_finite,
    check_jagged,
    decode,
    encode_strings,
    pick_values,
)

NO_LIMIT = 2**31 - 1
"""max_batch_size when the config sets none (max_rows 0)."""
_CONTEXTS = (CONTEXT_DENSE, CONTEXT_LENGTHS)
# The order rec-server checks shapes in: lengths first, so a refusal of the batch names the
# input every request has.
_SHAPE_ORDER = (CONTEXT_LENGTHS, CONTEXT_DENSE, CANDIDATE_LENGTHS, CANDIDATE_DENSE,
                CONTEXT_VALUES, CANDIDATE_VALUES)  # fmt: skip
_STRINGS = {CONTEXT_VALUES: CONTEXT_STRINGS, CANDIDATE_VALUES: CANDIDATE_STRINGS}


@dataclass(frozen=True)
class Side:
    """One side's sparse inputs: the context's or the candidates'."""

    lengths: str
    values: str
    strings: str
    spec: FeatureSpec | None
    """The feature spec of this side's columns, in their order (None: the model has none)."""


@dataclass(frozen=True)
class ContextModel:
    """What a request to a context model is checked against (the derived views are computed
    once, at load, not per request)."""

    split: ContextSplit
    max_rows: int
    """The exported max_batch_size, in candidates (0: no limit)."""
    spec: FeatureSpec | None = None
    """The flat feature spec, for strings."""

    @cached_property
    def names(self) -> tuple[str, ...]:
        """The model's inputs in forward order (zero-width ones left out), offsets last."""
        return tuple(i["name"] for i in context_io_manifest(self.split, 1)["inputs"])

    @cached_property
    def widths(self) -> dict[str, int]:
        s = self.split
        return {
            CONTEXT_DENSE: len(s.dense),
            CONTEXT_LENGTHS: len(s.sparse),
            CANDIDATE_DENSE: len(s.cand_dense),
            CANDIDATE_LENGTHS: len(s.cand_sparse),
        }

    @cached_property
    def sides(self) -> tuple[Side, ...]:
        """The sides with sparse inputs: the context's when it has sparse features, then the
        candidates'."""
        out = []
        for cols, names in ((self.split.sparse, (CONTEXT_LENGTHS, CONTEXT_VALUES, CONTEXT_STRINGS)),
                            (self.split.cand_sparse, (CANDIDATE_LENGTHS, CANDIDATE_VALUES,
                                                      CANDIDATE_STRINGS))):  # fmt: skip
            if cols:
                spec = self.spec
                if spec is not None:
                    spec = dataclasses.replace(spec, sparse=[spec.sparse[i] for i in cols])
                out.append(Side(*names, spec))
        return tuple(out)

    @cached_property
    def request_inputs(self) -> tuple[str, ...]:
        """What a context-form request may carry (the model's inputs but the offsets, and each
        side's strings when the model has a feature spec)."""
        strings = tuple(s.strings for s in self.sides) if self.spec is not None else ()
        return (*(n for n in self.names if n != CANDIDATE_OFFSETS), *strings)

    def decode(self, inputs: Inputs, on_tokens: OnTokens | None = None) -> Feed | Failure:
        """The request's Feed (the model's inputs, candidate_offsets filled), or its
        INVALID_ARG Failure with rec-server's message."""
        try:
            form = request_form(inputs.shapes(), self.max_rows or NO_LIMIT)
        except RequestError as e:
            return Failure(str(e), INVALID_ARG)
        if form == "flat":
            flat = decode(inputs, self.max_rows, self.spec, on_tokens)
            if isinstance(flat, Failure):
                return flat
            t = flat.tensors
            return Feed(split_flat(self.split, t[DENSE], t[LENGTHS], t[VALUES]), flat.rows)
        try:
            return self._context(inputs, on_tokens)
        except Refusal as e:
            return Failure(str(e), INVALID_ARG)

    def _context(self, inputs: Inputs, on_tokens: OnTokens | None) -> Feed:
        allowed = self.request_inputs
        for name in inputs.tensors:
            if name not in allowed:
                raise Refusal(f"input '{name}': unexpected input name")
        strings = {s.values: pick_values(inputs, s.values, s.strings, s.spec)
                   for s in self.sides}  # fmt: skip
        for name in self.names:
            if name != CANDIDATE_OFFSETS and name not in inputs.tensors and not strings.get(name):
                raise Refusal(f"input '{name}': missing")
        t = dict(inputs.tensors)
        candidates = self._check_shapes(t)
        for name in (CONTEXT_DENSE, CANDIDATE_DENSE):
            if name in t:
                check_finite(name, t[name])
        for side in self.sides:
            lengths = t[side.lengths]
            if strings[side.values]:
                t[side.values] = encode_strings(side.spec, side.lengths, lengths, side.strings,
                                                t.pop(side.strings), on_tokens)  # fmt: skip
            else:
                check_jagged(side.lengths, lengths, side.values, t[side.values].size)
        t[CANDIDATE_OFFSETS] = offsets([candidates], len(self.split.cand_sparse))
        return Feed({name: t[name] for name in self.names}, candidates)

    def _check_shapes(self, t: dict[str, np.ndarray]) -> int:
        """The request's candidate count, each input's shape checked (ragged ids made [n]);
        Refusal with rec-server's message (CheckContextShape) otherwise."""
        widths, candidates = self.widths, -1
        # A side's strings are checked where its values would be.
        present = [n if n in t else _STRINGS.get(n, "") for n in _SHAPE_ORDER]
        for name in (n for n in present if n in t):
            a = t[name]
            if name not in widths:  # ids or tokens: [n], or [1, n] from batching clients
                if a.ndim == 2 and a.shape[0] == 1:
                    t[name] = a = a.reshape(-1)
                if a.ndim != 1:
                    raise Refusal(f"input '{name}': expected shape [n], got {_shape(a.shape)}")
                continue
            rows = "1" if name in _CONTEXTS else "N"
            if a.ndim != 2 or a.shape[1] != widths[name]:
                raise Refusal(f"input '{name}': expected shape [{rows}, {widths[name]}], got "
                              f"{_shape(a.shape)}")  # fmt: skip
            n = int(a.shape[0])
            if name in _CONTEXTS:
                if n != 1:
                    raise Refusal(f"input '{name}': a request carries one context (batch 1), "
                                  f"got {n}")  # fmt: skip
                continue
            if n < 1:
                raise Refusal(f"input '{name}': a request needs at least one candidate, got {n}")
            if candidates >= 0 and n != candidates:
                raise Refusal(f"input '{name}': {n} candidates, other inputs have {candidates}")
            if n > (self.max_rows or NO_LIMIT):
                raise Refusal(f"request has {n} candidates, above max_batch_size "
                              f"{self.max_rows}")  # fmt: skip
            candidates = n
        return candidates


def _shape(shape: tuple[int, ...]) -> str:
    """rec-server's ShapeString: [3, 2]."""
    return "[" + ", ".join(str(d) for d in shape) + "]"
