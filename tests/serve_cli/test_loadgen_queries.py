"""rec.serve.loadgen's Job.queries (benchmarks/mlperf_shape.py): a worker sends several context
requests in turn, each its own N and its own user, and counts the pairs scored."""

from __future__ import annotations

import json
import time

import numpy as np

from rec.contract import ModelDir
from rec.contract.context import ContextSplit
from rec.serve.client import ScoreClient
from rec.serve.loadgen import Job, run_job

QUERIES = (3, 9, 5)


def job(server, split: ContextSplit, form: str, seed: int = 100) -> Job:
    return Job(url=server.endpoints.grpc, protocol="grpc", model="rec",
               num_dense=split.num_dense, num_sparse=split.num_sparse, batch=0, in_flight=2,
               rate=0.0, start_at=time.monotonic(), warmup_s=0.0, duration_s=60.0,
               max_requests=7, seed=seed, candidates=max(QUERIES), form=form, context=split,
               queries=QUERIES)  # fmt: skip


def split_of(repo) -> ContextSplit:
    manifest = json.loads(ModelDir.of(repo, "rec").manifest.read_text())
    return ContextSplit.from_dict(manifest["context"])


def test_each_query_its_own_size_and_user(cpp_context, context_repo):
    split = split_of(context_repo)
    context, flat = job(cpp_context, split, "context"), job(cpp_context, split, "flat")
    requests = context.requests()
    assert [len(r) for r in requests] == list(QUERIES) == [len(r) for r in flat.requests()]
    users = {r.context.values.tobytes() + r.context.dense.tobytes() for r in requests}
    assert len(users) == len(QUERIES)  # no two share a context
    # The flat form holds the very pairs of the context form, and both score them alike.
    client = ScoreClient(cpp_context.endpoints.grpc, "grpc")
    try:
        for ctx, rows in zip(requests, flat.requests(), strict=True):
            expected = ctx.flat(split)
            assert np.array_equal(rows.values, expected.values)
            assert np.array_equal(client.score(ctx), client.score(rows))
    finally:
        client.close()


def test_pairs_counted_over_the_requests_sent_in_turn(cpp_context, context_repo):
    """7 measured requests over 2 slots cycle through N = 3, 9, 5: the pairs are theirs."""
    split = split_of(context_repo)
    for form in ("context", "flat"):
        outcome = run_job(job(cpp_context, split, form))
        assert not outcome.errors and len(outcome.latencies_s) >= 7
        n = len(outcome.latencies_s)
        sent = [QUERIES[k % len(QUERIES)] for k in range(n)]
        # Requests answer out of order across slots, but every one sent in the window counts.
        assert outcome.pairs == sum(sent), (form, n, outcome.pairs)
