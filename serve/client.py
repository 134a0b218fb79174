"""Sending rec requests to a KServe v2 server (rec-server or Triton) with the stock tritonclient.

One wire format for every server: dense_features FP32 [B, D], sparse_lengths INT32 [B, F],
sparse_values INT64 [N] -> scores FP32 [B, T], any B up to the model's max_batch_size.
`Requests` are built once (tensors serialized into tritonclient's InferInput objects) and can be
sent any number of times, which keeps the client's own cost out of benchmarks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from rec.contract import random_request
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


def synthetic_rows(num_dense: int, num_sparse: int, batch: int, seed: int = 0) -> Rows:
    """Random samples: N(0,1) dense values, 1..3 ids per sparse feature, ids in [0, 2^31)."""
    r = random_request(num_dense, num_sparse, batch, seed, ids_per_bag=(1, 3), id_range=(0, 2**31))
    return Rows(r[DENSE], r[LENGTHS], r[VALUES])


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

    def prepare(self, rows: Rows) -> tuple[list, list]:
        """InferInputs with the data serialized, and the requested output; reusable."""
        if rows.tokens is not None:
            sparse = (STRINGS, np.array([t.encode() for t in rows.tokens], dtype=object), "BYTES")
        else:
            sparse = (VALUES, rows.values, "INT64")
        inputs = []
        for name, array, dtype in (
            (DENSE, rows.dense, "FP32"),
            (LENGTHS, rows.lengths, "INT32"),
            sparse,
        ):
            tensor = self._mod.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(np.ascontiguousarray(array))
            inputs.append(tensor)
        return inputs, [self._mod.InferRequestedOutput(SCORES)]

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

    def score(self, rows: Rows) -> np.ndarray:
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

    def input_sizes(self) -> tuple[int, int]:
        """(D, F): the last dim of dense_features and sparse_lengths in the served config."""
        dims = {i["name"]: [int(d) for d in i["dims"]] for i in self.model_config()["input"]}
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
                        tuple(spec.get("tasks") or ()))  # fmt: skip
