"""Building tritonclient requests from numpy inputs, for both protocols."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tiny_model import DATATYPES, INPUT_NAMES


def infer_inputs(module, inputs: dict[str, np.ndarray], binary: bool = True) -> list:
    """tritonclient InferInput objects (module: tritonclient.http or tritonclient.grpc)."""
    out = []
    for name in INPUT_NAMES:
        arr = inputs[name]
        i = module.InferInput(name, list(arr.shape), DATATYPES[name])
        if module is httpclient:
            i.set_data_from_numpy(arr, binary_data=binary)
        else:
            i.set_data_from_numpy(arr)
        out.append(i)
    return out


def http_scores(url: str, inputs: dict[str, np.ndarray], **kwargs) -> np.ndarray:
    with httpclient.InferenceServerClient(url) as c:
        return c.infer("rec", infer_inputs(httpclient, inputs), **kwargs).as_numpy("scores")


def grpc_scores(url: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as c:
        return c.infer("rec", infer_inputs(grpcclient, inputs)).as_numpy("scores")


def scores_concurrently(server, batches: list[dict[str, np.ndarray]], workers: int = 16) -> list:
    """Scores each batch from its own thread and client (tritonclient clients are not shared),
    alternating HTTP and gRPC, so the server sees concurrent requests of both protocols."""

    def one(i: int) -> np.ndarray:
        if i % 2:
            return grpc_scores(server.grpc, batches[i])
        return http_scores(server.http, batches[i])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(batches))))


def assert_same_rows(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to float rounding: a row scored inside a bigger batch may differ in the last bit
    (the matmul blocks differently), while a wrong row differs by far more."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
