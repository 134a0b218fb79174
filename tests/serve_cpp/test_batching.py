"""Concurrent requests of different sizes are batched together and each gets exactly its rows."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient
from clients import assert_same_rows, infer_inputs, scores_concurrently
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
