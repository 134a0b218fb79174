"""rec-bench --candidates N --form context|flat (#61) against a real rec-server on a context
model: both forms of one user's N candidates are served without a failure, over HTTP and gRPC,
and the in-process forward takes both (through rec-server's own request validation); at N = 128
the context form's request is the smaller, as the context is sent once instead of N times."""

from __future__ import annotations

import json
import subprocess

import pytest
from server import BINARY, Server

from rec.export.pipeline import export_run
from tests.export.conftest import write_seeded_run
from tests.helpers import write_config

REC_BENCH = BINARY.parent / "rec-bench"
# As tests/serve_cpp/test_context.py: of features.sparse [e, a, c, b, d], a, c and d are the
# user's, and 2 of the 4 dense features.
CONTEXT = ["dense_0", "dense_2", "a", "c", "d"]
CANDIDATES = 128

pytestmark = pytest.mark.skipif(not REC_BENCH.exists(), reason=f"{REC_BENCH} is not built")


@pytest.fixture(scope="module")
def context_repo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rec_bench_context")
    run = write_seeded_run(tmp / "run")
    config = write_config(tmp / "c.yaml", {"features": {"context": CONTEXT}})
    return export_run(run, tmp / "ctx", config=config, fmt="torchscript", log=lambda _: None).repo


@pytest.fixture(scope="module")
def server(context_repo):
    s = Server(context_repo, "--executor-threads", "1", "--http-threads", "2")
    yield s
    assert s.stop() == 0, s.stderr()


def rec_bench(repo, mode: str, *args: str) -> subprocess.CompletedProcess:
    argv = [str(REC_BENCH), mode, "--model-repository", str(repo), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def bench(repo, mode: str, target: str | None, form: str) -> dict:
    """One short closed-loop run of `form` at N = CANDIDATES; its JSON line."""
    where = ["--target", target] if target else []
    args = ["--candidates", str(CANDIDATES), "--form", form, "--concurrency", "2", "--seconds", "1"]
    done = rec_bench(repo, mode, *where, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mode", ["http", "grpc", "forward"])
def test_both_forms_are_served_and_the_context_request_is_smaller(context_repo, server, mode):
    target = {"http": server.http, "grpc": server.grpc}.get(mode)
    rows = {form: bench(context_repo, mode, target, form) for form in ("context", "flat")}
    for form, row in rows.items():
        assert row["failures"] == 0, row
        assert row["requests"] > 0, row
        assert (row["form"], row["candidates"], row["batch"]) == (form, CANDIDATES, CANDIDATES)
        assert row["rows_per_s"] == pytest.approx(row["requests_per_s"] * CANDIDATES)
    assert 0 < rows["context"]["request_bytes"] < rows["flat"]["request_bytes"], rows


def test_the_server_counted_each_forms_pairs_and_no_failure(context_repo, server):
    """Both forms reached the model as pairs: the server's inference count (samples) grows by at
    least CANDIDATES per request rec-bench counted (its warm-up requests come on top), and its
    failure count stays."""
    before = {m: server.metric(m) for m in ("nv_inference_count", "nv_inference_request_failure")}
    for form in ("context", "flat"):
        count = server.metric("nv_inference_count")
        row = bench(context_repo, "http", server.http, form)
        assert server.metric("nv_inference_count") - count >= row["requests"] * CANDIDATES, form
    assert server.metric("nv_inference_request_failure") == before["nv_inference_request_failure"]


def test_refusals_name_what_to_do(context_repo, repo):
    """`repo` is the flat tiny model of conftest.py."""
    done = rec_bench(context_repo, "forward", "--form", "context")
    assert done.returncode == 1
    assert "--form context needs --candidates N" in done.stderr
    done = rec_bench(context_repo, "forward", "--candidates", "4", "--form", "wide")
    assert done.returncode == 1
    assert "--form takes context or flat, got 'wide'" in done.stderr
    done = rec_bench(repo, "forward", "--candidates", "4", "--form", "context")
    assert done.returncode == 1
    assert "--form context: model 'rec' has no \"context\" section in rec.json" in done.stderr
