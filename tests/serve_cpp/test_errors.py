"""Each bad request fails alone, 400 / INVALID_ARGUMENT naming the tensor; the server stays up."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import assert_same_rows, infer_inputs
from server import Server
from tiny_model import MAX_BATCH_SIZE, make_batch, write_model
from tritonclient.utils import InferenceServerException


def _drop(inputs, name):
    return {k: v for k, v in inputs.items() if k != name}


def _bad_cases():
    """(id, inputs dict (possibly with extra/wrong names), datatype overrides, expected text)."""
    ok = make_batch(3, seed=5)
    neg = {**ok, "sparse_lengths": ok["sparse_lengths"].copy()}
    neg["sparse_lengths"][1, 1] = -1
    big = make_batch(MAX_BATCH_SIZE + 1, seed=6)
    nan = {**ok, "dense_features": ok["dense_features"].copy()}
    nan["dense_features"][2, 1] = np.nan
    inf = {**ok, "dense_features": ok["dense_features"].copy()}
    inf["dense_features"][0, 0] = np.inf
    return [
        ("missing", _drop(ok, "sparse_values"), {}, "'sparse_values': missing"),
        ("unknown", {**ok, "bogus": ok["dense_features"]}, {}, "'bogus': unexpected input"),
        (
            "dtype",
            {**ok, "dense_features": ok["dense_features"].astype(np.float64)},
            {},
            "'dense_features': expected datatype FP32",
        ),
        (
            "shape",
            {**ok, "dense_features": ok["dense_features"][:, :2].copy()},
            {},
            "'dense_features': expected shape",
        ),
        (
            "rows differ",
            {**ok, "sparse_lengths": ok["sparse_lengths"][:2].copy()},
            {},
            "differs from other inputs",
        ),
        ("too big", big, {}, f"exceeds max_batch_size {MAX_BATCH_SIZE}"),
        ("negative", neg, {}, "'sparse_lengths': negative length"),
        ("nan dense", nan, {}, "'dense_features': value nan at [2, 1]"),
        ("infinite dense", inf, {}, "'dense_features': value inf at [0, 0]"),
        (
            "sum",
            {**ok, "sparse_values": ok["sparse_values"][:-1].copy()},
            {},
            "'sparse_values': has",
        ),
    ]


def _inputs(module, inputs):
    out = []
    for name, arr in inputs.items():
        dtype = {np.float32: "FP32", np.float64: "FP64", np.int32: "INT32", np.int64: "INT64"}[
            arr.dtype.type
        ]
        i = module.InferInput(name, list(arr.shape), dtype)
        i.set_data_from_numpy(arr)
        out.append(i)
    return out


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_http(server, reference, case):
    _, inputs, _, expected = case
    with httpclient.InferenceServerClient(server.http) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("rec", _inputs(httpclient, inputs))
        assert "400" in str(e.value.status()) and expected in e.value.message(), str(e.value)
        good = make_batch(2, seed=9)  # the same connection still serves
        np.testing.assert_array_equal(
            c.infer("rec", infer_inputs(httpclient, good)).as_numpy("scores"), reference(good)
        )


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_grpc(server, case):
    _, inputs, _, expected = case
    with grpcclient.InferenceServerClient(server.grpc) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("rec", _inputs(grpcclient, inputs))
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and expected in e.value.message()


def test_bad_request_does_not_disturb_its_batch(server, reference):
    goods = [make_batch(1 + i % 4, seed=300 + i) for i in range(20)]
    bad = {**goods[0], "sparse_values": goods[0]["sparse_values"][:0].copy()}
    bad["sparse_lengths"] = bad["sparse_lengths"] + 1

    def one(i):
        with grpcclient.InferenceServerClient(server.grpc) as c:
            try:
                return c.infer("rec", _inputs(grpcclient, goods[i] if i % 5 else bad)).as_numpy(
                    "scores"
                )
            except InferenceServerException as e:
                return e

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(one, range(20)))
    for i, r in enumerate(results):
        if i % 5:
            assert_same_rows(r, reference(goods[i]))
        else:
            assert isinstance(r, InferenceServerException)


def test_unknown_model_and_version(server):
    inputs = make_batch(1, seed=1)
    with httpclient.InferenceServerClient(server.http) as c:
        with pytest.raises(InferenceServerException, match="unknown model"):
            c.infer("nope", infer_inputs(httpclient, inputs))
        with pytest.raises(InferenceServerException, match="version 9"):
            c.infer("rec", infer_inputs(httpclient, inputs), model_version="9")
    with grpcclient.InferenceServerClient(server.grpc) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("nope", infer_inputs(grpcclient, inputs))
        assert e.value.status() == "StatusCode.NOT_FOUND"


def _raw_http(address: str, request: bytes) -> tuple[int, bytes]:
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"content-length" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    return int(data.split(b" ")[1]), body


def test_malformed_http(server):
    for body, expected in [
        (b"{not json", "not valid JSON"),
        (b'{"inputs": [{"name": "dense_features", "data": [1e400]}]}', "out_of_range"),
        (
            b'{"inputs": [{"name": "dense_features", "data": [NaN]}]}',
            "body is not valid JSON: [json.exception.parse_error.101]",
        ),
        (b'{"inputs": 3}', "'inputs' list"),
        (
            json.dumps(
                {"inputs": [{"name": "dense_features", "datatype": "FP32", "shape": [1, 4]}]}
            ).encode(),
            "no data",
        ),
    ]:
        req = (
            b"POST /v2/models/rec/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % len(body)
        )
        status, reply = _raw_http(server.http, req + body)
        assert status == 400 and expected in json.loads(reply)["error"]
    for path, want in [(b"/v2/models/%zz/ready", 404), (b"/v2/models/re%63/ready", 200)]:
        req = b"GET " + path + b" HTTP/1.1\r\nConnection: close\r\n\r\n"
        assert _raw_http(server.http, req)[0] == want
    status, reply = _raw_http(server.http, b"GET /v2/nothing HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 404 and "error" in json.loads(reply)
    req = (
        b"POST /v2/models/rec/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Encoding: gzip\r\n"
        b"Connection: close\r\n\r\nabc"
    )
    assert _raw_http(server.http, req)[0] == 400


def test_body_limit_and_full_queue(repo):
    s = Server(repo, "--max-body-bytes", "2000", "--max-queue-size", "1")
    try:
        with (
            httpclient.InferenceServerClient(s.http) as c,
            pytest.raises(InferenceServerException, match="exceeds the limit"),
        ):
            c.infer("rec", infer_inputs(httpclient, make_batch(200, seed=1)))
        with grpcclient.InferenceServerClient(s.grpc) as c:
            with pytest.raises(InferenceServerException) as e:
                c.infer("rec", infer_inputs(grpcclient, make_batch(200, seed=1)))
            assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        # Queue of one and 24 concurrent requests: some must be turned away at once with 503.
        small = make_batch(8, seed=2)

        def one(_):
            with httpclient.InferenceServerClient(s.http) as c:
                try:
                    c.infer("rec", infer_inputs(httpclient, small))
                    return 200
                except InferenceServerException as e:
                    assert "queue" in e.message(), e.message()
                    return int(e.status())

        with ThreadPoolExecutor(max_workers=24) as pool:
            codes = list(pool.map(one, range(96)))
        assert 503 in codes and 200 in codes
    finally:
        assert s.stop() == 0


def test_request_timeout(tmp_path):
    # A 1 s batching window and a 100 ms timeout: a lone request times out waiting for company.
    write_model(tmp_path, delay_us=1_000_000)
    s = Server(tmp_path, "--request-timeout-ms", "100", "--batch-window", "fixed")
    try:
        with httpclient.InferenceServerClient(s.http) as c:
            with pytest.raises(InferenceServerException, match="timed out") as e:
                c.infer("rec", infer_inputs(httpclient, make_batch(1, seed=1)))
            assert e.value.status() == "503"
        with grpcclient.InferenceServerClient(s.grpc) as c:
            with pytest.raises(InferenceServerException, match="timed out") as e:
                c.infer("rec", infer_inputs(grpcclient, make_batch(1, seed=1)))
            assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    finally:
        assert s.stop() == 0
