"""The Prometheus endpoint counts exactly what was sent."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import infer_inputs
from server import Server
from tiny_model import make_batch
from tritonclient.utils import InferenceServerException


def scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r'^(\w+)\{model="rec",version="\d+"(?:,le="([^"]+)")?\} (\S+)$', line)
        if m:
            name = m.group(1) + (f"[{m.group(2)}]" if m.group(2) else "")
            values[name] = float(m.group(3))
    return values


@pytest.fixture(scope="module")
def fresh(repo):
    s = Server(repo)
    yield s
    assert s.stop() == 0


def test_metrics_count_what_was_sent(fresh):
    http_sizes, grpc_sizes = [1, 2, 3, 4, 5], [6, 7, 8]
    started = time.monotonic()
    with httpclient.InferenceServerClient(fresh.http) as c:
        for i, b in enumerate(http_sizes):
            c.infer("rec", infer_inputs(httpclient, make_batch(b, seed=i)))
        bad = make_batch(2, seed=0)
        bad["sparse_lengths"][0, 0] = -3
        with pytest.raises(InferenceServerException):
            c.infer("rec", infer_inputs(httpclient, bad))
    with grpcclient.InferenceServerClient(fresh.grpc) as c:
        for i, b in enumerate(grpc_sizes):
            c.infer("rec", infer_inputs(grpcclient, make_batch(b, seed=i)))
        with pytest.raises(InferenceServerException):
            c.infer("rec", infer_inputs(grpcclient, bad))

    sending_us = (time.monotonic() - started) * 1e6
    m = scrape(fresh.metrics)
    sent = len(http_sizes) + len(grpc_sizes)
    assert m["nv_inference_request_success"] == sent
    assert m["nv_inference_request_failure"] == 2
    assert m["nv_inference_count"] == sum(http_sizes) + sum(grpc_sizes)
    assert m["nv_inference_exec_count"] == sent  # one at a time: nothing to batch
    assert m["rec_batch_window_us"] == 0  # so the adaptive window stays shut (batcher.h)
    assert m["nv_inference_pending_request_count"] == 0
    # A request's duration runs from its enqueueing to its answer (batcher.cpp): its queue
    # wait and forward pass are parts of it, and one request at a time, their sum is inside
    # the time this test took to send them.
    request_us = m["nv_inference_request_duration_us"]
    assert m["nv_inference_compute_infer_duration_us"] > 0
    assert (m["nv_inference_queue_duration_us"] + m["nv_inference_compute_infer_duration_us"]
            <= request_us < sending_us)  # fmt: skip
    assert m["rec_request_latency_us_count"] == sent
    assert m["rec_request_latency_us_bucket[+Inf]"] == sent
    assert m["rec_batch_size_count"] == sent
    assert m["rec_batch_size_bucket[1]"] == 1 and m["rec_batch_size_bucket[4]"] == 4

    with httpclient.InferenceServerClient(fresh.http) as c:
        stats = c.get_inference_statistics("rec")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == sent
    assert stats["inference_stats"]["fail"]["count"] == 2
    assert stats["inference_stats"]["queue"]["count"] == sent  # the refused two never queued
    assert stats["inference_count"] == sum(http_sizes) + sum(grpc_sizes)
