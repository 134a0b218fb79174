"""The stock tritonclient (HTTP and gRPC; sync, asyncio, streaming) against rec-server."""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from clients import assert_same_rows, infer_inputs
from server import Server
from tiny_model import DENSE, MAX_BATCH_SIZE, NUM_TASKS, SPARSE, make_batch
from tritonclient.utils import InferenceServerException


def test_health_and_metadata_http(server):
    with httpclient.InferenceServerClient(server.http) as c:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("rec")
        assert c.is_model_ready("rec", "1") and not c.is_model_ready("nope")
        assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
        meta = c.get_model_metadata("rec")
        assert meta["versions"] == ["1"]
        shapes = {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]}
        assert shapes == {
            "dense_features": ("FP32", [-1, len(DENSE)]),
            "sparse_lengths": ("INT32", [-1, len(SPARSE)]),
            "sparse_values": ("INT64", [-1]),
        }
        assert meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, NUM_TASKS]}]
        config = c.get_model_config("rec")
        assert config["max_batch_size"] == MAX_BATCH_SIZE
        assert config["input"][0]["dims"] == [len(DENSE)]
        assert c.get_model_repository_index()[0]["state"] == "READY"


def test_health_and_metadata_grpc(server):
    with grpcclient.InferenceServerClient(server.grpc) as c:
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("rec")
        assert not c.is_model_ready("rec", "7")
        meta = c.get_model_metadata("rec", as_json=True)
        assert meta["versions"] == ["1"]
        assert [i["name"] for i in meta["inputs"]] == [
            "dense_features",
            "sparse_lengths",
            "sparse_values",
        ]
        config = c.get_model_config("rec", as_json=True)["config"]
        assert config["max_batch_size"] == MAX_BATCH_SIZE
        assert c.get_server_metadata().name == "rec-server"
        stats = c.get_inference_statistics("rec", as_json=True)
        assert stats["model_stats"][0]["name"] == "rec"


@pytest.mark.parametrize("batch", [1, 7, MAX_BATCH_SIZE])
def test_http_binary_scores_equal_in_process(server, reference, batch):
    inputs = make_batch(batch, seed=batch)
    with httpclient.InferenceServerClient(server.http) as c:
        result = c.infer("rec", infer_inputs(httpclient, inputs))
        assert result.get_response()["model_version"] == "1"
        np.testing.assert_array_equal(result.as_numpy("scores"), reference(inputs))


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_http_json_tensors_and_compression(server, reference, compression):
    inputs = make_batch(5, seed=11)
    outputs = [httpclient.InferRequestedOutput("scores", binary_data=False)]
    with httpclient.InferenceServerClient(server.http) as c:
        result = c.infer(
            "rec",
            infer_inputs(httpclient, inputs, binary=False),
            outputs=outputs,
            request_compression_algorithm=compression,
        )
        # JSON carries floats as decimal text; float32 round trip is exact with enough digits.
        np.testing.assert_allclose(result.as_numpy("scores"), reference(inputs), rtol=1e-6)


def test_grpc_scores_equal_in_process(server, reference):
    inputs = make_batch(33, seed=3)
    with grpcclient.InferenceServerClient(server.grpc) as c:
        result = c.infer("rec", infer_inputs(grpcclient, inputs), request_id="abc")
        assert result.get_response().id == "abc"
        np.testing.assert_array_equal(result.as_numpy("scores"), reference(inputs))


def test_asyncio_clients(server, reference):
    batches = [make_batch(b, seed=100 + b) for b in (1, 2, 3, 4, 5, 6)]

    async def run():
        async with httpaio.InferenceServerClient(server.http) as h:
            http_results = await asyncio.gather(
                *(h.infer("rec", infer_inputs(httpclient, b)) for b in batches)
            )
        g = grpcaio.InferenceServerClient(server.grpc)
        try:
            grpc_results = await asyncio.gather(
                *(g.infer("rec", infer_inputs(grpcclient, b)) for b in batches)
            )
        finally:
            await g.close()
        return http_results, grpc_results

    http_results, grpc_results = asyncio.run(run())
    for b, hr, gr in zip(batches, http_results, grpc_results, strict=True):
        np.testing.assert_array_equal(hr.as_numpy("scores"), reference(b))
        np.testing.assert_array_equal(gr.as_numpy("scores"), reference(b))


def test_grpc_streaming(server, reference):
    batches = {f"r{i}": make_batch(1 + i % 5, seed=200 + i) for i in range(12)}
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, b in batches.items():
            c.async_stream_infer("rec", infer_inputs(grpcclient, b), request_id=request_id)
        bad = make_batch(2, seed=1)
        bad["sparse_lengths"] = bad["sparse_lengths"] + 1
        c.async_stream_infer("rec", infer_inputs(grpcclient, bad), request_id="bad")
        got = [answers.get(timeout=30) for _ in range(len(batches) + 1)]
        c.stop_stream()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "sparse_values" in str(errors[0])
    for result, error in got:
        if error is None:
            request_id = result.get_response().id
            np.testing.assert_array_equal(result.as_numpy("scores"), reference(batches[request_id]))


def test_grpc_unimplemented_methods_answer_unimplemented(server):
    with grpcclient.InferenceServerClient(server.grpc) as c:
        for call in (c.get_cuda_shared_memory_status, lambda: c.unload_model("rec")):
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert c.is_server_live()  # and the server goes on


def test_grpc_concurrent_streams(server, reference):
    """Four streams at once, each with 25 requests in flight: every answer reaches its stream."""

    def one_stream(k: int) -> None:
        batches = {f"s{k}r{i}": make_batch(1 + i % 3, seed=1000 * k + i) for i in range(25)}
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(server.grpc) as c:
            c.start_stream(callback=lambda result, error: answers.put((result, error)))
            for request_id, b in batches.items():
                c.async_stream_infer("rec", infer_inputs(grpcclient, b), request_id=request_id)
            got = [answers.get(timeout=30) for _ in batches]
            c.stop_stream()
        for result, error in got:
            assert error is None, error
            request_id = result.get_response().id
            assert_same_rows(result.as_numpy("scores"), reference(batches[request_id]))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one_stream, range(4)))


def test_grpc_stream_dropped_with_requests_in_flight(repo, reference):
    """A client that goes away mid-stream costs the server nothing: it keeps answering and
    shuts down cleanly."""
    s = Server(repo)
    try:
        for _ in range(3):
            c = grpcclient.InferenceServerClient(s.grpc)
            c.start_stream(callback=lambda result, error: None)
            for i in range(20):
                c.async_stream_infer("rec", infer_inputs(grpcclient, make_batch(4, seed=i)))
            c.close()  # cancels the stream with answers still to come
        batch = make_batch(3, seed=7)
        with grpcclient.InferenceServerClient(s.grpc) as c:
            result = c.infer("rec", infer_inputs(grpcclient, batch))
        np.testing.assert_array_equal(result.as_numpy("scores"), reference(batch))
    finally:
        assert s.stop() == 0, s.stderr()
