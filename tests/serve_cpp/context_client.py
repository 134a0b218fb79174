"""What test_context.py and test_context_aoti.py share: a context model's requests (the context
form, and its flat form with the context repeated), sent with a fresh stock client, the server
they start, and the check that both forms batched together each get their solo scores."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server

from rec.contract import random_request
from rec.contract.context import ContextSplit, repeat, split_flat
from rec.contract.io import DTYPES, INPUT_NAMES

# features.sparse of the seeded run (tests/export/conftest.py EXPORT_TINY) is [e, a, c, b, d]:
# a, c and d are the user's (c shares table t1 with the candidates' b), and 2 of 4 dense.
CONTEXT = ["dense_0", "dense_2", "a", "c", "d"]
PROTOCOLS = ["http_json", "http_binary", "grpc"]


def context_server(repo: Path) -> Iterator[Server]:
    """A module fixture's body: rec-server on `repo`, its context batch probe passed on this
    CPU, stopped cleanly after the module's tests."""
    # A fixed window (the config's max_queue_delay): the batching test's requests, released
    # together, then share a forward however fast the recent ones were (adaptive's shortcut).
    s = Server(repo, "--executor-threads", "2", "--http-threads", "4", "--batch-window", "fixed")
    assert "version 1: batch probe passed on" in s.stderr()
    yield s
    assert s.stop() == 0, s.stderr()


def context_request(split: ContextSplit, candidates: int, user: int) -> dict[str, np.ndarray]:
    """One user's context (from seed `user`) and `candidates` candidates, by input name."""
    d, f = split.num_dense, split.num_sparse
    ctx = split_flat(split, *random_request(d, f, 1, seed=user).values())
    cand = split_flat(split, *random_request(d, f, candidates, seed=10_000 + user).values())
    request = {k: v for k, v in ctx.items() if k.startswith("context_")}
    request |= {k: v for k, v in cand.items() if k.startswith("candidate_")}
    del request["candidate_offsets"]  # the server's to fill
    return request


def infer(
    server,
    protocol: str,
    inputs: dict[str, np.ndarray],
    model: str = "rec",
    barrier: threading.Barrier | None = None,
) -> np.ndarray:
    """Scores `inputs` (any form, by name) with `model` and a fresh stock client of `protocol`;
    with a barrier, the request leaves once every party's client is connected and ready."""
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc if protocol == "grpc" else server.http
    infer_inputs = []
    for name, arr in inputs.items():
        i = module.InferInput(name, list(arr.shape), DTYPES[name])
        if module is httpclient:
            i.set_data_from_numpy(arr, binary_data=protocol == "http_binary")
        else:
            i.set_data_from_numpy(arr)
        infer_inputs.append(i)
    with module.InferenceServerClient(url) as client:
        if barrier is not None:
            client.is_server_live()  # connected before the others are released
            barrier.wait(timeout=60)
        return client.infer(model, infer_inputs).as_numpy("scores")


def flat_form(split: ContextSplit, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request's pairs as a flat batch, the context repeated per candidate."""
    return dict(zip(INPUT_NAMES, repeat(split, request), strict=True))


def check_both_forms_batched(server, split: ContextSplit, model: str, first_user: int) -> None:
    """24 requests (N of 1 to 64, one in four in the flat form, each another user from
    `first_user` on, over the three protocols in turn) sent at once: each gets the scores it
    gets alone, the inference count grows by their pairs and some were batched together."""
    sizes = [1, 7, 64, 1, 7, 64, 3, 1] * 3
    requests: list[dict[str, np.ndarray]] = []
    for i, n in enumerate(sizes):
        request = context_request(split, n, user=first_user + i)
        requests.append(flat_form(split, request) if i % 4 == 3 else request)
    solo = [infer(server, PROTOCOLS[i % 3], r, model) for i, r in enumerate(requests)]

    def stats() -> dict:
        with httpclient.InferenceServerClient(server.http) as c:
            return c.get_inference_statistics(model)["model_stats"][0]

    before = stats()
    # Released together, so that their arrivals fall within one batching window whatever the
    # machine's load (connecting 24 fresh clients spreads them over milliseconds).
    barrier = threading.Barrier(len(requests))
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [
            pool.submit(infer, server, PROTOCOLS[i % 3], r, model, barrier)
            for i, r in enumerate(requests)
        ]
        together = [f.result() for f in futures]
    after = stats()
    for got, want in zip(together, solo, strict=True):
        np.testing.assert_array_equal(got, want)
    pairs = sum(len(r.get("candidate_lengths", r.get("sparse_lengths"))) for r in requests)
    assert after["inference_count"] - before["inference_count"] == pairs  # counted in pairs
    assert after["execution_count"] - before["execution_count"] < len(requests), "none batched"
