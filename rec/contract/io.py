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

Example:
    >>> io_manifest(13, 26, 1)["inputs"][2]
    {'name': 'sparse_values', 'role': 'values', 'dtype': 'INT64', 'shape': [-1]}
    >>> EMBEDDING_DTYPES["int4"].bytes_per_row(64)
    36.0
"""

from __future__ import annotations

from dataclasses import dataclass

DENSE, LENGTHS, VALUES, SCORES = "dense_features", "sparse_lengths", "sparse_values", "scores"
STRINGS = "sparse_strings"
INPUT_NAMES = (DENSE, LENGTHS, VALUES)
OUTPUT_NAME = SCORES
# Triton's / KServe's dtype names (config.pbtxt writes them as TYPE_<name>).
DTYPES = {DENSE: "FP32", LENGTHS: "INT32", VALUES: "INT64", STRINGS: "BYTES", SCORES: "FP32"}
# What each input is, as rec.json's "inputs" name it ("role").
ROLES = {DENSE: "dense", LENGTHS: "lengths", VALUES: "values"}
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
