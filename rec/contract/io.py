"""The served model's inputs and output, and the embedding dtypes a table may be stored in.

The model's I/O (docs/architecture.md#model-io; every format, both servers):

    dense_features  FP32  [B, num_dense]   raw dense values (the model applies the transforms)
    sparse_lengths  INT32 [B, num_sparse]  ids per sample per sparse feature
    sparse_values   INT64 [N]              raw ids, batch-major
    scores          FP32  [B, num_tasks]   a sigmoid per task

A request may carry `sparse_strings` (BYTES [N], tokens) in place of `sparse_values`: the
servers map them to ids with the model's feature spec; it is not an input of the model itself.

Each input has a role (dense, lengths, values): rec.json records it beside the name, so a
reader (rec-server among them) finds each input by what it is, not by its dtype and rank.

A context model (features.context; rec.contract.context) scores R requests of one context (the
user) and N candidates each, B candidates in all; its inputs, in forward order, each named as
its role, a zero-width one left out (`context_io_manifest`):

    context_dense      FP32  [R, Dc]   the context's dense values (Dc = 0: left out)
    context_lengths    INT32 [R, Fc]   ids per context per context sparse feature (Fc = 0: out)
    context_values     INT64 [m]       the context's ids, batch-major (Fc = 0: left out)
    candidate_dense    FP32  [B, Dn]   the candidates' dense values (Dn = 0: left out)
    candidate_lengths  INT32 [B, Fn]   ids per candidate per candidate sparse feature (Fn >= 1)
    candidate_values   INT64 [n]       the candidates' ids, batch-major
    candidate_offsets  INT32 [R+1]     Fn * (0, N1, N1+N2, ...): filled by the server, never sent

A request carries R = 1 context, and `context_strings` / `candidate_strings` (BYTES) may stand in
for the values as `sparse_strings` does. The flat inputs stay accepted; `scores` is [B, T].

Example:
    >>> io_manifest(13, 26, 1)["inputs"][2]
    {'name': 'sparse_values', 'role': 'values', 'dtype': 'INT64', 'shape': [-1]}
    >>> EMBEDDING_DTYPES["int4"].bytes_per_row(64)
    36.0
    >>> from rec.contract.context import ContextSplit
    >>> split = ContextSplit(dense=(0, 1), sparse=(2,), num_dense=2, num_sparse=4)
    >>> [i["name"] for i in context_io_manifest(split, 1)["inputs"]][2:]  # no candidate_dense
    ['context_values', 'candidate_lengths', 'candidate_values', 'candidate_offsets']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DENSE, LENGTHS, VALUES, SCORES = "dense_features", "sparse_lengths", "sparse_values", "scores"
STRINGS = "sparse_strings"
INPUT_NAMES = (DENSE, LENGTHS, VALUES)
OUTPUT_NAME = SCORES
# A context model's inputs, in the model's forward order; each name is also its role.
CONTEXT_DENSE, CONTEXT_LENGTHS = "context_dense", "context_lengths"
CONTEXT_VALUES = "context_values"
CANDIDATE_DENSE, CANDIDATE_LENGTHS = "candidate_dense", "candidate_lengths"
CANDIDATE_VALUES, CANDIDATE_OFFSETS = "candidate_values", "candidate_offsets"
CONTEXT_INPUT_NAMES = (CONTEXT_DENSE, CONTEXT_LENGTHS, CONTEXT_VALUES, CANDIDATE_DENSE,
                       CANDIDATE_LENGTHS, CANDIDATE_VALUES, CANDIDATE_OFFSETS)  # fmt: skip
# Request-only, in place of the values (as STRINGS).
CONTEXT_STRINGS, CANDIDATE_STRINGS = "context_strings", "candidate_strings"
# Triton's / KServe's dtype names (config.pbtxt writes them as TYPE_<name>).
DTYPES = {
    DENSE: "FP32", LENGTHS: "INT32", VALUES: "INT64", STRINGS: "BYTES", SCORES: "FP32",
    CONTEXT_DENSE: "FP32", CONTEXT_LENGTHS: "INT32", CONTEXT_VALUES: "INT64",
    CANDIDATE_DENSE: "FP32", CANDIDATE_LENGTHS: "INT32", CANDIDATE_VALUES: "INT64",
    CANDIDATE_OFFSETS: "INT32", CONTEXT_STRINGS: "BYTES", CANDIDATE_STRINGS: "BYTES",
}  # fmt: skip
# What each input is, as rec.json's "inputs" name it ("role").
ROLES = {DENSE: "dense", LENGTHS: "lengths", VALUES: "values"}
CONTEXT_ROLES = {name: name for name in CONTEXT_INPUT_NAMES}
# numpy's dtype of each Triton dtype the I/O uses (tritonclient takes and returns numpy arrays).
NUMPY_DTYPES = {"FP32": "float32", "INT32": "int32", "INT64": "int64", "BYTES": "object"}


def triton_dtype(name: str) -> str:
    """config.pbtxt's data_type of an input or output: TYPE_FP32, ... (BYTES is TYPE_STRING)."""
    dtype = DTYPES[name]
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def io_manifest(num_dense: int, num_sparse: int, num_tasks: int) -> dict[str, list[dict]]:
    """rec.json's "inputs" and "outputs": name, dtype and shape (-1: any size)."""
    shapes = {DENSE: [-1, num_dense], LENGTHS: [-1, num_sparse], VALUES: [-1]}
    return {
        "inputs": [
            {"name": n, "role": ROLES[n], "dtype": DTYPES[n], "shape": shapes[n]}
            for n in INPUT_NAMES
        ],
        "outputs": [{"name": SCORES, "dtype": DTYPES[SCORES], "shape": [-1, num_tasks]}],
    }


def context_io_manifest(split: Any, num_tasks: int) -> dict[str, list[dict]]:
    """rec.json's "inputs" and "outputs" of a context model: its inputs in forward order, a
    zero-width one (no context dense, no candidate dense, no context sparse) left out. `split`
    is a rec.contract.context.ContextSplit (not imported here: context imports this module)."""
    widths = {
        CONTEXT_DENSE: len(split.dense),
        CONTEXT_LENGTHS: len(split.sparse),
        CONTEXT_VALUES: len(split.sparse),
        CANDIDATE_DENSE: len(split.cand_dense),
        CANDIDATE_LENGTHS: len(split.cand_sparse),
        CANDIDATE_VALUES: len(split.cand_sparse),
        CANDIDATE_OFFSETS: 1,
    }
    one_dim = (CONTEXT_VALUES, CANDIDATE_VALUES, CANDIDATE_OFFSETS)
    return {
        "inputs": [
            {
                "name": n,
                "role": CONTEXT_ROLES[n],
                "dtype": DTYPES[n],
                "shape": [-1] if n in one_dim else [-1, widths[n]],
            }
            for n in CONTEXT_INPUT_NAMES
            if widths[n] > 0
        ],
        "outputs": [{"name": SCORES, "dtype": DTYPES[SCORES], "shape": [-1, num_tasks]}],
    }


@dataclass(frozen=True)
class EmbeddingDtype:
    """How a table's rows are stored in the exported model."""

    bits: int
    """Per value."""
    rowwise: bool
    """Quantized per row, with an fp16 scale and bias (4 bytes) after each row's codes."""
    auc_ratio_bar: float
    """The exported / float held-out AUC a model with such tables must reach (MLPerf DLRM's
    high-accuracy ratio for 8 bits and more; 99 % for int4)."""

    def bytes_per_row(self, dim: int) -> float:
        return dim * self.bits / 8 + (4 if self.rowwise else 0)

    @property
    def dim_multiple(self) -> int:
        """What a table's dim must be a multiple of: FBGEMM's rowwise quantizer packs a row's
        codes into whole fp16 words (2 bytes), so int8 needs an even dim and int4 one of 4."""
        return 16 // self.bits if self.rowwise else 1


EMBEDDING_DTYPES = {
    "int8": EmbeddingDtype(8, True, 0.999),
    "int4": EmbeddingDtype(4, True, 0.99),
    "fp16": EmbeddingDtype(16, False, 0.999),
    "fp32": EmbeddingDtype(32, False, 0.999),
}
