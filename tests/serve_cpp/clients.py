"""Building tritonclient requests from numpy inputs, for both protocols."""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tiny_model import DATATYPES, INPUT_NAMES
from tritonclient.grpc import service_pb2, service_pb2_grpc

STRINGS = "sparse_strings"


def infer_inputs(
    module, inputs: dict[str, np.ndarray], binary: bool = True, names=INPUT_NAMES
) -> list:
    """tritonclient InferInput objects (module: tritonclient.http or tritonclient.grpc)."""
    out = []
    for name in names:
        arr = inputs[name]
        i = module.InferInput(name, list(arr.shape), DATATYPES[name])
        if module is httpclient:
            i.set_data_from_numpy(arr, binary_data=binary)
        else:
            i.set_data_from_numpy(arr)
        out.append(i)
    return out


def string_inputs(module, inputs: dict[str, np.ndarray], tokens: list, binary: bool = True) -> list:
    """InferInputs carrying `tokens` (str or bytes) as sparse_strings (BYTES) in place of
    sparse_values: HTTP JSON strings (binary=False) or binary data, gRPC raw contents."""
    out = infer_inputs(module, inputs, binary, names=("dense_features", "sparse_lengths"))
    arr = np.array([t.encode() if isinstance(t, str) else t for t in tokens], dtype=np.object_)
    i = module.InferInput(STRINGS, [len(tokens)], "BYTES")
    if module is httpclient:
        i.set_data_from_numpy(arr, binary_data=binary)
    else:
        i.set_data_from_numpy(arr)
    return [*out, i]


def grpc_typed_strings_request(
    model: str, inputs: dict[str, np.ndarray], tokens: list
) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with every input in typed contents, the tokens in bytes_contents
    (tritonclient always sends raw_input_contents, so this form is built by hand)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, field in (
        ("dense_features", "FP32", "fp32_contents"),
        ("sparse_lengths", "INT32", "int_contents"),
    ):
        t = request.inputs.add(name=name, datatype=datatype, shape=list(inputs[name].shape))
        getattr(t.contents, field).extend(inputs[name].ravel().tolist())
    t = request.inputs.add(name=STRINGS, datatype="BYTES", shape=[len(tokens)])
    t.contents.bytes_contents.extend(x.encode() if isinstance(x, str) else x for x in tokens)
    return request


def grpc_call(url: str, request: service_pb2.ModelInferRequest) -> np.ndarray:
    """Sends a hand-built request on a plain gRPC stub; the FP32 scores it answers."""
    with grpc.insecure_channel(url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    shape = list(reply.outputs[0].shape)
    return np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(shape)


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


def http_post(address: str, route: str, body: bytes) -> tuple[int, str]:
    """POSTs raw bytes (bodies the stock client would not send); the status and the text."""
    request = urllib.request.Request(f"http://{address}{route}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
