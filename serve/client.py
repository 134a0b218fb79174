"""Sending rec requests to a KServe v2 server (rec-server or Triton) with the stock tritonclient.

One wire format for every server: dense_features FP32 [B, D], sparse_lengths INT32 [B, F],
sparse_values INT64 [N] -> scores FP32 [B, T], any B up to the model's max_batch_size. A context
model (features.context, rec.contract.context) also takes the context form, `ContextRows`: the
context's columns once (context_*, batch 1) and N candidates (candidate_*) -> scores [N, T].
Requests are built once (tensors serialized into tritonclient's InferInput objects) and can be
sent any number of times, which keeps the client's own cost out of benchmarks; `request_bytes`
is what one takes on the wire, as tritonclient serializes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.utils import InferenceServerException

from rec.contract import random_request
from rec.contract.context import ContextSplit, repeat
from rec.contract.io import (
    CANDIDATE_DENSE,
    CANDIDATE_LENGTHS,
    CANDIDATE_STRINGS,
    CANDIDATE_VALUES,
    CONTEXT_DENSE,
    CONTEXT_LENGTHS,
    CONTEXT_STRINGS,
    CONTEXT_VALUES,
    DTYPES,
)
from rec.serve.repository import DENSE, LENGTHS, SCORES, STRINGS, VALUES, ServeError

PROTOCOLS = ("http", "grpc")
# Parameter of a served config carrying rec.json's feature names (set on the staged Triton
# model; any server whose config has it lets `rec predict` read files without --repo).
FEATURES_PARAMETER = "rec_features"


@dataclass(frozen=True)
class Features:
    """The model's inputs by name, in the column order of dense_features / sparse_lengths."""

    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    spec: dict | None = None
    """The model's feature spec (rec.features), when published."""
    tasks: tuple[str, ...] = ()
    """The model's task names, one per score column, when published."""
    context: dict | None = None
    """rec.json's context section (rec.contract.context), when published."""


@dataclass
class Rows:
    """B samples in the wire layout: dense [B, D] f32, lengths [B, F] i32, values [N] i64.

    With `tokens` (N strings) instead of `values`, the request carries them as sparse_strings
    (BYTES) and the server maps them to ids with the model's feature spec.
    """

    dense: np.ndarray
    lengths: np.ndarray
    values: np.ndarray | None
    tokens: list[str] | None = None

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def split(self, size: int) -> list[Rows]:
        """Consecutive chunks of at most `size` samples (values cut where their samples end)."""
        ends = np.cumsum(self.lengths.sum(axis=1, dtype=np.int64))
        chunks, start = [], 0
        for lo in range(0, len(self), size):
            hi = min(lo + size, len(self))
            stop = int(ends[hi - 1]) if hi > 0 else 0
            values = None if self.values is None else self.values[start:stop]
            tokens = None if self.tokens is None else self.tokens[start:stop]
            chunks.append(Rows(self.dense[lo:hi], self.lengths[lo:hi], values, tokens))
            start = stop
        return chunks

    def take(self, index: Any) -> Rows:
        """The samples at `index` (row numbers, in that order), each with its bags' values."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        per_row = self.lengths.sum(axis=1, dtype=np.int64)
        starts = np.cumsum(per_row) - per_row
        picked = _ranges(starts[index], per_row[index])
        values = None if self.values is None else self.values[picked]
        tokens = None if self.tokens is None else [self.tokens[i] for i in picked]
        return Rows(self.dense[index], self.lengths[index], values, tokens)

    def columns(self, dense: tuple[int, ...], sparse: tuple[int, ...]) -> Rows:
        """These dense and sparse columns of every sample (sparse ones with their values)."""
        keep = np.zeros(self.lengths.shape[1], dtype=bool)
        keep[list(sparse)] = True
        # Each value's sparse column, batch-major: a subset of columns keeps the values' order.
        column = np.repeat(np.tile(np.arange(len(keep)), len(self)), self.lengths.reshape(-1))
        mine = keep[column]
        values = None if self.values is None else self.values[mine]
        tokens = None if self.tokens is None else [self.tokens[i] for i in np.flatnonzero(mine)]
        return Rows(self.dense[:, list(dense)], self.lengths[:, list(sparse)], values, tokens)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start, start+1, ..., start+length-1 of each (start, length), end to end."""
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + within


@dataclass
class ContextRows:
    """One request of the context form: the context's columns once and N candidates' own.

    `context` is one sample of the context columns (ContextSplit.dense / .sparse), `candidates`
    N samples of the candidate columns; with tokens the request carries context_strings and
    candidate_strings. Scores come back one row per candidate, as the flat rows `flat` gives.
    """

    context: Rows
    candidates: Rows

    def __len__(self) -> int:
        return len(self.candidates)

    @classmethod
    def from_flat(cls, split: ContextSplit, rows: Rows) -> ContextRows:
        """Flat rows as one context request: row 0's context columns, every row's candidate
        columns (the rows are taken to share their context; rec predict checks it)."""
        context = rows.take([0]).columns(split.dense, split.sparse)
        return cls(context, rows.columns(split.cand_dense, split.cand_sparse))

    def flat(self, split: ContextSplit) -> Rows:
        """The flat rows this request means: the context repeated per candidate
        (rec.contract.context.repeat, the meaning both servers' scores are checked against)."""
        inputs = {name: array for name, array, _ in request_tensors(self)}
        dense, lengths, values = repeat(split, inputs)
        if self.candidates.tokens is None:
            return Rows(dense, lengths, values)
        return Rows(dense, lengths, None, [t.decode() for t in values])


def _sparse(rows: Rows, ids: str, strings: str) -> tuple[str, np.ndarray, str]:
    if rows.tokens is not None:
        return strings, np.array([t.encode() for t in rows.tokens], dtype=object), DTYPES[strings]
    return ids, rows.values, DTYPES[ids]


def request_tensors(rows: Rows | ContextRows) -> list[tuple[str, np.ndarray, str]]:
    """(input name, array, Triton dtype) of a request, in the model's input order; a context
    request leaves out its zero-width inputs, as the model's inputs do."""
    if isinstance(rows, Rows):
        return [(DENSE, rows.dense, DTYPES[DENSE]), (LENGTHS, rows.lengths, DTYPES[LENGTHS]),
                _sparse(rows, VALUES, STRINGS)]  # fmt: skip
    ctx, cand = rows.context, rows.candidates
    out = []
    if ctx.dense.shape[1]:
        out.append((CONTEXT_DENSE, ctx.dense, DTYPES[CONTEXT_DENSE]))
    if ctx.lengths.shape[1]:
        out.append((CONTEXT_LENGTHS, ctx.lengths, DTYPES[CONTEXT_LENGTHS]))
        out.append(_sparse(ctx, CONTEXT_VALUES, CONTEXT_STRINGS))
    if cand.dense.shape[1]:
        out.append((CANDIDATE_DENSE, cand.dense, DTYPES[CANDIDATE_DENSE]))
    out.append((CANDIDATE_LENGTHS, cand.lengths, DTYPES[CANDIDATE_LENGTHS]))
    out.append(_sparse(cand, CANDIDATE_VALUES, CANDIDATE_STRINGS))
    return out


def infer_inputs(mod, rows: Rows | ContextRows, binary: bool = True) -> tuple[list, list]:
    """tritonclient's InferInputs of `mod` (tritonclient.http, .grpc or their aio) with the
    data serialized, and the requested output. `binary` is HTTP's binary tensor extension
    (False: the tensors in the JSON body); gRPC always sends raw bytes."""
    inputs = []
    http = mod.__name__.startswith("tritonclient.http")
    for name, array, dtype in request_tensors(rows):
        tensor = mod.InferInput(name, list(array.shape), dtype)
        data = np.ascontiguousarray(array)
        if http:
            tensor.set_data_from_numpy(data, binary_data=binary)
        else:
            tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    if http:
        return inputs, [mod.InferRequestedOutput(SCORES, binary_data=binary)]
    return inputs, [mod.InferRequestedOutput(SCORES)]


def request_bytes(
    rows: Rows | ContextRows, protocol: str, binary: bool = True, model: str = "rec"
) -> int:
    """Bytes of the request's body as tritonclient sends it: HTTP's JSON (with the tensors in
    it, or after it with `binary`) from generate_request_body, gRPC's ModelInferRequest
    message (ByteSize; `binary` does not apply). Transport headers are not counted.

    Example:
        >>> rows = synthetic_rows(2, 3, batch=4)
        >>> request_bytes(rows, "http") < request_bytes(rows, "http", binary=False)
        True
    """
    if protocol == "http":
        inputs, outputs = infer_inputs(httpclient, rows, binary)
        body, _ = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        return len(body)
    if protocol != "grpc":
        raise ServeError(f"protocol {protocol!r} is not one of {PROTOCOLS}")
    inputs, outputs = infer_inputs(grpcclient, rows)
    request = grpc_utils._get_inference_request(
        model, inputs, "", "", outputs, 0, False, False, 0, None, None
    )
    return int(request.ByteSize())


def synthetic_rows(
    num_dense: int,
    num_sparse: int,
    batch: int,
    seed: int = 0,
    hotness: tuple[tuple[int, int], ...] | None = None,
) -> Rows:
    """Random samples: N(0,1) dense values, 1..3 ids per sparse feature (or `hotness`' (low,
    high) per feature, inclusive), ids in [0, 2^31)."""
    r = random_request(num_dense, num_sparse, batch, seed, ids_per_bag=(1, 3),
                       id_range=(0, 2**31), hotness=hotness)  # fmt: skip
    return Rows(r[DENSE], r[LENGTHS], r[VALUES])


def synthetic_request(
    split: ContextSplit,
    candidates: int,
    form: str = "context",
    seed: int = 0,
    hotness: tuple[tuple[int, int], ...] | None = None,
) -> Rows | ContextRows:
    """One context and `candidates` candidates of random samples (synthetic_rows' values; the
    context row 0's): the context form, or ("flat") the same pairs as flat rows."""
    rows = synthetic_rows(split.num_dense, split.num_sparse, candidates, seed, hotness)
    request = ContextRows.from_flat(split, rows)
    return request if form == "context" else request.flat(split)


class ScoreClient:
    """A tritonclient for one model over HTTP or gRPC.

    Example:
        >>> client = ScoreClient("127.0.0.1:8000", "http", "rec")  # doctest: +SKIP
        >>> client.score(synthetic_rows(13, 26, batch=4)).shape  # doctest: +SKIP
        (4, 1)
    """

    def __init__(self, url: str, protocol: str = "http", model: str = "rec", timeout: float = 60):
        if protocol not in PROTOCOLS:
            raise ServeError(f"protocol {protocol!r} is not one of {PROTOCOLS}")
        url = url.split("://", 1)[-1]  # tritonclient wants host:port
        self.url, self.protocol, self.model = url, protocol, model
        self._mod = httpclient if protocol == "http" else grpcclient
        if protocol == "http":
            self._client = httpclient.InferenceServerClient(
                url, connection_timeout=timeout, network_timeout=timeout
            )
        else:
            self._client = grpcclient.InferenceServerClient(url)
        self._timeout = timeout

    def close(self) -> None:
        self._client.close()

    def prepare(self, rows: Rows | ContextRows) -> tuple[list, list]:
        """InferInputs with the data serialized (either form), and the requested output;
        reusable."""
        return infer_inputs(self._mod, rows)

    def send(self, prepared: tuple[list, list]) -> np.ndarray:
        """Sends prepared inputs; raises InferenceServerException on a server error."""
        inputs, outputs = prepared
        if self.protocol == "http":
            result = self._client.infer(self.model, inputs, outputs=outputs)
        else:
            result = self._client.infer(
                self.model, inputs, outputs=outputs, client_timeout=self._timeout
            )
        return result.as_numpy(SCORES)

    def score(self, rows: Rows | ContextRows) -> np.ndarray:
        return self.send(self.prepare(rows))

    def model_config(self) -> dict:
        """The served model's config as a dict (Triton's JSON form over both protocols)."""
        try:
            if self.protocol == "http":
                return self._client.get_model_config(self.model)
            return self._client.get_model_config(self.model, as_json=True)["config"]
        except InferenceServerException as e:
            why = self.not_ready_reason()
            why = f" (the server's repository index: {why})" if why else ""
            raise ServeError(f"cannot read model {self.model!r} from {self.url}: {e}{why}") from e

    def not_ready_reason(self) -> str | None:
        """Why the model is not loaded, from Triton's repository index (its state and reason),
        or None: loaded, not in the index, or a server without the index (rec-server's own
        errors name the reason). Triton answers a request to a model whose load failed with
        "no version available" alone; the reason, a store that did not answer for example,
        is only in the index."""
        try:
            if self.protocol == "http":
                index = self._client.get_model_repository_index()
            else:
                index = self._client.get_model_repository_index(as_json=True).get("models", [])
        except InferenceServerException:
            return None
        for entry in index:
            if entry.get("name") == self.model and entry.get("state") not in (None, "READY"):
                return f"{entry['state']}: {entry.get('reason', '')}".rstrip(": ")
        return None

    def input_dims(self) -> dict[str, list[int]]:
        """Each input of the served config and its dims."""
        return {i["name"]: [int(d) for d in i["dims"]] for i in self.model_config()["input"]}

    def max_batch_size(self) -> int:
        """The served config's max_batch_size (0: the `none` form, whose limit is rec.json's)."""
        return int(self.model_config().get("max_batch_size", 0))

    def input_sizes(self) -> tuple[int, int]:
        """(D, F): the last dim of dense_features and sparse_lengths in the served config."""
        dims = self.input_dims()
        try:
            return dims[DENSE][-1], dims[LENGTHS][-1]
        except KeyError as e:
            raise ServeError(f"model {self.model!r} at {self.url} has no input {e}") from e

    def features(self) -> Features | None:
        """Feature names the server publishes (parameter rec_features), or None."""
        params = self.model_config().get("parameters", {})
        text = params.get(FEATURES_PARAMETER, {}).get("string_value")
        if not text:
            return None
        spec = json.loads(text)
        return Features(tuple(spec["dense"]), tuple(spec["sparse"]), spec.get("feature_spec"),
                        tuple(spec.get("tasks") or ()), spec.get("context"))  # fmt: skip
