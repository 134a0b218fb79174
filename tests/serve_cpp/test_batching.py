"""Concurrent requests of different sizes are batched together and each gets exactly its rows."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import assert_same_rows, infer_inputs, scores_concurrently
from server import Server, run_to_exit
from tiny_model import make_batch


def stats(url: str) -> dict:
    with httpclient.InferenceServerClient(url) as c:
        return c.get_inference_statistics("rec")["model_stats"][0]


def test_many_concurrent_clients_get_their_own_rows(server, reference):
    sizes = [1, 2, 3, 5, 8, 13, 1, 1, 4, 64, 2, 7] * 4
    batches = [make_batch(b, seed=1000 + i) for i, b in enumerate(sizes)]
    expected = [reference(b) for b in batches]
    before = stats(server.http)

    results = scores_concurrently(server, batches)
    for got, want in zip(results, expected, strict=True):
        assert_same_rows(got, want)

    after = stats(server.http)
    requests = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    executions = after["execution_count"] - before["execution_count"]
    assert requests == len(batches)
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert executions < len(batches), "no two requests were batched together"


def test_many_requests_on_one_keep_alive_connection(server, reference):
    batches = [make_batch(1 + i % 3, seed=2000 + i) for i in range(50)]
    with httpclient.InferenceServerClient(server.http) as c:
        for b in batches:
            scores = c.infer("rec", infer_inputs(httpclient, b)).as_numpy("scores")
            np.testing.assert_array_equal(scores, reference(b))


@pytest.mark.parametrize("busy_poll_us", ["0", "1000000"])
def test_every_protocol_answers_whether_threads_poll_or_sleep(repo, reference, busy_poll_us):
    """--busy-poll-us 0: every hand-off between threads sleeps and is woken; a poll longer than
    the test: none does. Both ways, concurrent HTTP and gRPC calls and a gRPC stream get their
    own rows."""
    server = Server(repo, "--busy-poll-us", busy_poll_us, "--executor-threads", "2")
    try:
        batches = [make_batch(1 + i % 4, seed=3000 + i) for i in range(24)]
        for got, b in zip(scores_concurrently(server, batches), batches, strict=True):
            assert_same_rows(got, reference(b))
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(server.grpc) as c:
            c.start_stream(callback=lambda result, error: answers.put((result, error)))
            for i, b in enumerate(batches[:8]):
                c.async_stream_infer("rec", infer_inputs(grpcclient, b), request_id=str(i))
            got = [answers.get(timeout=30) for _ in range(8)]
            c.stop_stream()
        for result, error in got:
            assert error is None, error
            b = batches[int(result.get_response().id)]
            assert_same_rows(result.as_numpy("scores"), reference(b))
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.mark.parametrize(("flag", "value"), [("--busy-poll-us", "-1"), ("--batch-window", "wide")])
def test_batching_flags_are_checked(flag, value):
    out = run_to_exit("--model-repository", "/tmp", flag, value)
    assert out.returncode == 2 and flag in out.stderr and value in out.stderr, out.stderr
