"""The feature spec: how one raw row of the training data becomes the model's inputs.

Written once, from the config (rec.features.feature_spec), and carried everywhere the model
goes: the run directory (`feature_spec.json`), the model repository (rec.json's `feature_spec`),
and every reader of raw rows: the training readers, the event stream's decoder
(rec.contract.events), `rec predict`, export's verification and Triton's Python model. rec-server
reads the same spec from rec.json and has the one C++ port of `encode_tokens`
(cpp/src/common/feature_encoding.cpp); golden values in tests/data/hash_golden.json pin both.
Like the rest of rec.contract it imports no torch: the dense transforms run as a torch module
inside the exported model, and that module (rec.features.DenseTransform) is the one place they
are computed.

For each dense feature: its source column and its transform, applied *inside the exported
model*, so a request carries the raw number:

    identity   x
    log1p      log1p(max(x, 0)), computed in float64 from the float32 input, rounded to float32

For each sparse feature: its source column, the separator of multi-valued cells, and how a
token (one value, as text) becomes an int64 id:

    int_or_hash  a decimal integer (-?[0-9]+) in int64 range is its own id; any other string
                 (including "+5", " 7", "1_000") is hashed with HASH
    hex          1 to 16 hex digits, either case, read as uint64 and viewed as int64 (Criteo)

HASH is BLAKE2b with an 8-byte digest (no key, salt or personalisation) over the token's UTF-8
bytes, read as a little-endian signed int64. It is versioned: a model records the version it
was trained with, and a server refuses a spec whose version it does not implement.

A batch's ids are batch-major (`to_batch_major`): sample by sample, feature by feature within a
sample, as a request's `sparse_values` and a RecBatch's `values` hold them.

Example:
    >>> encode_tokens(["12", "apple", "-3"], "int_or_hash").tolist()[::2]
    [12, -3]
    >>> encode_tokens(["68fd1e64"], "hex").tolist()
    [1761418852]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SPEC_FILE = "feature_spec.json"
"""The spec's file in a run directory."""

HASH = {
    "algorithm": "blake2b",
    "digest_bytes": 8,
    "byte_order": "little",
    "signed": True,
    "input": "utf-8 bytes of the token",
    "version": 1,
}
TRANSFORMS = ("identity", "log1p")
"""The dense transforms (rec.features.DenseTransform computes them)."""
ENCODINGS = ("int_or_hash", "hex")

_DECIMAL = re.compile(r"-?[0-9]+\Z")
_HEX = re.compile(r"[0-9a-fA-F]{1,16}\Z")


class TokenError(ValueError):
    """A token that its feature's encoding cannot map (only `hex` has such tokens).

    From `FeatureSpec.encode_values`, `sample` and `feature` say where it was."""

    def __init__(self, message: str, sample: int = -1, feature: int = -1) -> None:
        super().__init__(message)
        self.sample, self.feature = sample, feature


# ---- sparse: tokens -> ids ------------------------------------------------------------------
def hash_id(token: str) -> int:
    """HASH of one token: of its UTF-8 bytes. A token decoded from bytes that are not UTF-8
    with errors="surrogateescape" (as Triton's model does) hashes as those original bytes,
    which is what rec-server hashes for the same request. TokenError for text with no byte
    form at all: a lone surrogate outside that escape range ("\\ud800" in JSON)."""
    try:
        data = token.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise TokenError(f"{token!r} is not valid Unicode text (a lone surrogate)") from None
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def string_id(token: str) -> int:
    """`int_or_hash` of one token: a decimal integer in int64 range as itself, else its hash."""
    if _DECIMAL.match(token):
        value = int(token)
        if -(2**63) <= value < 2**63:
            return value
    return hash_id(token)


def hex_id(token: str) -> int:
    """`hex` of one token; TokenError if it is not 1 to 16 hex digits."""
    if not _HEX.match(token):
        raise TokenError(f"{token!r} is not hex (1 to 16 hex digits)")
    return int.from_bytes(int(token, 16).to_bytes(8, "little"), "little", signed=True)


def encode_tokens(tokens: Sequence[str], encoding: str) -> np.ndarray:
    """int64 [n] ids of text tokens under `encoding` (see the module docstring).

    Raises TokenError for a token `hex` cannot read, and for text with no UTF-8 form (a lone
    surrogate), which `int_or_hash` cannot hash; it accepts every other string.
    """
    if not len(tokens):
        return np.zeros(0, dtype=np.int64)
    if encoding == "hex":
        return np.array([hex_id(t) for t in tokens], dtype=np.int64)
    if encoding != "int_or_hash":
        raise ValueError(f"unknown encoding {encoding!r}; known: {ENCODINGS}")
    arr = np.asarray(tokens, dtype=str)
    try:  # fast path: every token is a plain decimal integer
        ids = arr.astype(np.int64)
        # astype also reads " 7", "+5" and "1_000", which the encoding hashes: check the text.
        if (np.char.strip(arr, "-0123456789") == "").all() and not (
            np.char.find(arr, "-", 1) >= 0
        ).any():
            return ids
    except (ValueError, OverflowError):
        pass
    return np.array([string_id(t) for t in arr.tolist()], dtype=np.int64)


def negative_ints(tokens: Sequence[str]) -> np.ndarray:
    """bool [n]: the tokens that are negative decimal integers ("-3"), a categorical value
    below zero (features.negative), as opposed to a string whose hash is negative."""
    out = np.zeros(len(tokens), dtype=bool)
    if not len(tokens):
        return out
    minus = np.char.startswith(np.asarray(tokens, dtype=str), "-")
    for i in np.flatnonzero(minus).tolist():  # only the tokens that start with "-"
        token = tokens[i]
        out[i] = bool(_DECIMAL.match(token)) and int(token) < 0
    return out


def _shorten(token: str, limit: int = 40) -> str:
    return token if len(token) <= limit else token[:limit] + "..."


# ---- the spec -------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseFeature:
    name: str
    column: str
    transform: str


@dataclass(frozen=True)
class SparseFeature:
    name: str
    column: str
    encoding: str
    separator: str | None
    """Between the tokens of a multi-valued text cell; None where a cell holds one token."""


@dataclass(frozen=True)
class FeatureSpec:
    format: str
    """The training data's format: synthetic, criteo_tsv, csv or parquet."""
    labels: list[str]
    dense: list[DenseFeature]
    sparse: list[SparseFeature]
    hash: dict[str, Any]
    delimiter: str = ","
    """Between the fields of a CSV line (data.delimiter)."""

    @property
    def transforms(self) -> list[str]:
        return [d.transform for d in self.dense]

    def encode(self, feature: int, tokens: Sequence[str]) -> np.ndarray:
        """Ids of sparse feature `feature`'s tokens."""
        return encode_tokens(tokens, self.sparse[feature].encoding)

    def encode_values(self, lengths: np.ndarray, tokens: Sequence[str]) -> np.ndarray:
        """A request's `sparse_strings` -> its `sparse_values`: int64 ids [N].

        Args:
            lengths: [B, F] values per sample per feature (the request's sparse_lengths).
            tokens: N tokens, batch-major like sparse_values: sample 0's feature 0, feature 1,
                ..., then sample 1.
        Raises TokenError naming the feature, the value's flat index and the token.
        """
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, len(self.sparse))
        feature = np.repeat(np.tile(np.arange(len(self.sparse)), len(lengths)), lengths.ravel())
        if feature.size != len(tokens):
            raise TokenError(f"{len(tokens)} tokens for {feature.size} values (sum of lengths)")
        ids = np.zeros(len(tokens), dtype=np.int64)
        ends = np.cumsum(lengths.sum(axis=1))  # value k belongs to the first sample ending past k
        for f in np.unique(feature).tolist():
            at = np.flatnonzero(feature == f)
            part = [tokens[i] for i in at.tolist()]
            try:
                ids[at] = self.encode(f, part)
            except TokenError:
                i = next(k for k, t in enumerate(part) if not _HEX.match(t))
                sample = int(np.searchsorted(ends, at[i], side="right"))
                raise TokenError(
                    f"sample {sample}, feature {self.sparse[f].name!r}, value at flat index "
                    f"{int(at[i])}: {_shorten(part[i])!r} is not hex (1 to 16 hex digits)",
                    sample,
                    f,
                ) from None
        return ids

    def negative_counts(self, lengths: np.ndarray, tokens: Sequence[str]) -> dict[str, int]:
        """Negative integer values per sparse feature (by name) among a request's tokens
        (batch-major, as `encode_values` takes them); `hex` features have none."""
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, len(self.sparse))
        feature = np.repeat(np.tile(np.arange(len(self.sparse)), len(lengths)), lengths.ravel())
        counts = np.bincount(feature[negative_ints(tokens)], minlength=len(self.sparse))
        return {
            s.name: int(n) if s.encoding == "int_or_hash" else 0
            for s, n in zip(self.sparse, counts.tolist(), strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FeatureSpec:
        version = data.get("hash", {}).get("version")
        if version != HASH["version"]:
            raise ValueError(
                f"feature spec hash version {version!r}; this rec implements {HASH['version']}"
            )
        return FeatureSpec(
            format=data["format"],
            labels=list(data["labels"]),
            dense=[DenseFeature(**d) for d in data["dense"]],
            sparse=[SparseFeature(**s) for s in data["sparse"]],
            hash=dict(data["hash"]),
            delimiter=data.get("delimiter", ","),
        )


# ---- the layout of a batch's ids ----------------------------------------------------------
def to_batch_major(lengths: np.ndarray, per_feature: list[np.ndarray]) -> np.ndarray:
    """Interleaves per-feature ids into the batch-major `values` of a RecBatch.

    Args:
        lengths: [n, F] ids per sample per feature.
        per_feature: F arrays; array f holds feature f's ids, sample after sample.
    Returns:
        values [sum(lengths)] i64: sample by sample, feature by feature within a sample.
    """
    flat = lengths.reshape(-1).astype(np.int64)
    starts = (np.cumsum(flat) - flat).reshape(lengths.shape)  # where bag (b, f) starts
    values = np.empty(int(flat.sum()), dtype=np.int64)
    for f, ids in enumerate(per_feature):
        n_f = lengths[:, f].astype(np.int64)
        if ids.size:
            # Value j of feature f belongs to sample b; it goes to starts[b, f] + its rank in b.
            shift = np.repeat(starts[:, f] - (np.cumsum(n_f) - n_f), n_f)
            values[shift + np.arange(ids.size)] = ids
    return values
