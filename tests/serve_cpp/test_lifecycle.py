"""Startup checks, SIGTERM draining, and hot swap of a new version under traffic."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import assert_same_rows, infer_inputs
from server import Server, run_to_exit
from tiny_model import DENSE, Reference, make_batch, write_model
from tritonclient.utils import InferenceServerException

from rec.contract.repository import ModelDir


def test_help_and_bad_flags():
    out = run_to_exit("--help")
    assert out.returncode == 0
    for flag in (
        "--model-repository",
        "--fbgemm-lib-dir",
        "--poll-repository-s",
        "--max-queue-size",
    ):
        assert flag in out.stdout
    out = run_to_exit("--model-repository", "/tmp", "--http-port", "x")
    assert out.returncode == 2 and "--http-port expects an integer" in out.stderr
    assert "required" in run_to_exit().stderr
    # A node list is read through the cluster's slot map (#60); a bad node in it is named.
    out = run_to_exit("--model-repository", "/tmp", "--updates", "redis://127.0.0.1:1,h/s")
    assert out.returncode == 2, out.stderr
    assert "'h' is not HOST:PORT" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "breakage, expected",
    [
        ("missing repository", "is not a directory"),
        ("config disagrees", "disagrees with config.pbtxt"),
        ("manifest disagrees", "rec.json lists"),
        ("no fbgemm", "cannot load"),
        ("no version", "no version directory"),
        ("malformed serving", 'rec.json: "serving.max_batch_size" must be an integer'),
    ],
)
def test_startup_refuses_with_a_clear_message(repo, tmp_path, breakage, expected):
    bad = tmp_path / "repo"
    shutil.copytree(repo, bad)
    args = ["--model-repository", str(bad)]
    config = ModelDir.of(bad, "rec").config
    if breakage == "missing repository":
        args = ["--model-repository", str(tmp_path / "nowhere")]
    elif breakage == "config disagrees":
        # rec.json would catch this first; without it, the warm-up batch does.
        ModelDir.of(bad, "rec").manifest.unlink()
        config.write_text(config.read_text().replace("dims: [ 2 ]", "dims: [ 3 ]"))
    elif breakage == "manifest disagrees":
        manifest = ModelDir.of(bad, "rec").manifest
        manifest.write_text(manifest.read_text().replace('"score"', '"score", "extra"'))
    elif breakage == "no fbgemm":
        args += ["--fbgemm-lib-dir", str(tmp_path)]
    elif breakage == "no version":
        shutil.rmtree(ModelDir.of(bad, "rec").version(1))
    elif breakage == "malformed serving":
        # Read only for a max_batch_size 0 config, the `none` form export writes by default.
        _make_unbatched(bad / "rec")
        manifest = ModelDir.of(bad, "rec").manifest
        data = json.loads(manifest.read_text())
        data["serving"] = {"max_batch_size": "lots", "max_queue_delay_us": 500}
        manifest.write_text(json.dumps(data))
    out = run_to_exit(*args, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
    assert out.returncode == 1, out.stderr
    assert expected in out.stderr, out.stderr


def test_sigterm_finishes_in_flight_requests(tmp_path):
    # A 1 s batching window keeps the requests in the queue when SIGTERM arrives.
    write_model(tmp_path, delay_us=1_000_000)
    reference = Reference(ModelDir.of(tmp_path, "rec").model_file(1))
    s = Server(tmp_path, "--batch-window", "fixed")
    batches = [make_batch(1 + i % 3, seed=i) for i in range(8)]

    def one(i):
        with grpcclient.InferenceServerClient(s.grpc) as c:
            return c.infer("rec", infer_inputs(grpcclient, batches[i])).as_numpy("scores")

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        # SIGTERM once the server itself holds all 8 (queued, or answered if the machine was
        # slow enough for the window to close): its gauge, not a client-side sleep.
        deadline = time.monotonic() + 60
        while (
            s.metric("nv_inference_pending_request_count")
            + s.metric("nv_inference_request_success")
            < 8
        ):
            assert time.monotonic() < deadline, s.stderr()
            time.sleep(0.01)
        assert s.stop() == 0
        for f, b in zip(futures, batches, strict=True):
            assert_same_rows(f.result(timeout=10), reference(b))
    assert s.shutdown_counts() == {"succeeded": 8, "failed": 0, "pending": 0}


def _traffic(server: Server, stop: threading.Event, log: list, errors: list, use_grpc: bool):
    module = grpcclient if use_grpc else httpclient
    url = server.grpc if use_grpc else server.http
    i = 0
    with module.InferenceServerClient(url) as c:
        while not stop.is_set():
            batch = make_batch(1 + i % 4, seed=5000 + i)
            i += 1
            try:
                result = c.infer("rec", infer_inputs(module, batch))
            except InferenceServerException as e:
                errors.append(e)
                continue
            response = result.get_response()
            version = response.model_version if use_grpc else response["model_version"]
            log.append((version, batch, result.as_numpy("scores")))


def test_hot_swap_under_traffic_loses_nothing(tmp_path):
    v1 = write_model(tmp_path, version=1, seed=0)
    s = Server(tmp_path, "--poll-repository-s", "1", "--executor-threads", "2")
    stop, log, errors = threading.Event(), [], []
    threads = [
        threading.Thread(target=_traffic, args=(s, stop, log, errors, i % 2 == 1)) for i in range(4)
    ]
    try:
        for t in threads:
            t.start()
        # Version 1 has answered some traffic (by the server's count) before version 2 lands,
        # and version 2 some more after the first answer from it: counts, not sleeps.
        s.wait_for_metric("nv_inference_request_success", 20)
        v2 = write_model(tmp_path, version=2, seed=1)
        deadline = time.monotonic() + 30
        while not any(v == "2" for v, _, _ in log) and time.monotonic() < deadline:
            time.sleep(0.05)
        answered = s.metric("nv_inference_request_success")
        s.wait_for_metric("nv_inference_request_success", answered + 20)
    finally:
        stop.set()
        for t in threads:
            t.join()
        assert s.stop() == 0
    assert errors == []
    versions = [v for v, _, _ in log]
    assert "1" in versions and "2" in versions
    references = {"1": Reference(v1), "2": Reference(v2)}
    for version, batch, scores in log:
        assert_same_rows(scores, references[version](batch))
    assert "swapped model 'rec' version 1 -> 2" in s.stderr()


def test_load_endpoint_needs_model_control(tmp_path):
    """Without --enable-model-control a load is refused as Triton refuses it in that mode:
    HTTP 503 and gRPC UNAVAILABLE."""
    write_model(tmp_path, version=1, seed=0)
    plain = Server(tmp_path)
    try:
        refusals = ((httpclient, plain.http, "503"),
                    (grpcclient, plain.grpc, "StatusCode.UNAVAILABLE"))  # fmt: skip
        for module, url, status in refusals:
            with (
                module.InferenceServerClient(url) as c,
                pytest.raises(InferenceServerException, match="enable-model-control") as e,
            ):
                c.load_model("rec")
            assert e.value.status() == status, e.value
            assert "explicit model load / unload is not allowed" in e.value.message()
    finally:
        assert plain.stop() == 0
    s = Server(tmp_path, "--enable-model-control")
    try:
        v3 = write_model(tmp_path, version=3, seed=3)
        batch = make_batch(3, seed=1)
        with httpclient.InferenceServerClient(s.http) as c:
            c.load_model("rec")
            result = c.infer("rec", infer_inputs(httpclient, batch))
            assert result.get_response()["model_version"] == "3"
            np.testing.assert_array_equal(result.as_numpy("scores"), Reference(v3)(batch))
        v4 = write_model(tmp_path, version=4, seed=4)
        with grpcclient.InferenceServerClient(s.grpc) as c:
            c.load_model("rec")
            result = c.infer("rec", infer_inputs(grpcclient, batch))
            assert result.get_response().model_version == "4"
            np.testing.assert_array_equal(result.as_numpy("scores"), Reference(v4)(batch))
    finally:
        assert s.stop() == 0


def _make_unbatched(model_dir: Path) -> None:
    """Rewrites the tiny model's config in the `none` form: max_batch_size 0, dims carry the
    batch dimension, no dynamic_batching."""
    n = len(DENSE)
    config = ModelDir(model_dir).config
    text = config.read_text()
    text = text.replace("max_batch_size: 512", "max_batch_size: 0")
    text = text.replace(f"dims: [ {n} ]", f"dims: [ -1, {n} ]").replace(
        "dims: [ 3 ]", "dims: [ -1, 3 ]"
    )
    text = text.replace("dims: [ 2 ]", "dims: [ -1, 2 ]").replace("allow_ragged_batch: true", "")
    text = text.split("dynamic_batching")[0]
    config.write_text(text)


def test_unbatched_config_and_pinned_version(tmp_path):
    """max_batch_size 0 (dims carry the batch dimension) with a rec.json that has no "serving"
    (a foreign model): one request per forward, no limit but the body size; and
    --model-version pins an older version."""
    v1 = write_model(tmp_path, version=1, seed=0)
    write_model(tmp_path, version=2, seed=1)
    _make_unbatched(tmp_path / "rec")
    s = Server(tmp_path, "--model-version", "1")
    try:
        batch = make_batch(700, seed=4)
        with httpclient.InferenceServerClient(s.http) as c:
            result = c.infer("rec", infer_inputs(httpclient, batch))
            assert result.get_response()["model_version"] == "1"
            np.testing.assert_array_equal(result.as_numpy("scores"), Reference(v1)(batch))
    finally:
        assert s.stop() == 0


def test_broken_new_version_keeps_the_old_one(tmp_path):
    write_model(tmp_path, version=1, seed=0)
    s = Server(tmp_path, "--poll-repository-s", "1")
    try:
        ModelDir.of(tmp_path, "rec").version(2).mkdir()
        ModelDir.of(tmp_path, "rec").model_file(2).write_bytes(b"not a TorchScript archive")
        # The server's log says when it tried version 2; two more 1 s polls must not retry it.
        deadline = time.monotonic() + 30
        while "load of model 'rec' version 2 failed" not in s.stderr():
            assert time.monotonic() < deadline, s.stderr()
            time.sleep(0.05)
        time.sleep(2.5)
        batch = make_batch(2, seed=3)
        with httpclient.InferenceServerClient(s.http) as c:
            result = c.infer("rec", infer_inputs(httpclient, batch))
            assert result.get_response()["model_version"] == "1"
            assert s.stderr().count("load of model 'rec' version 2 failed") == 1
            v3 = write_model(tmp_path, version=3, seed=3)
            deadline = time.monotonic() + 20
            version = "1"
            while version != "3" and time.monotonic() < deadline:
                time.sleep(0.2)
                result = c.infer("rec", infer_inputs(httpclient, batch))
                version = result.get_response()["model_version"]
            assert version == "3"
            np.testing.assert_array_equal(result.as_numpy("scores"), Reference(v3)(batch))
    finally:
        assert s.stop() == 0


def test_a_batch_variant_model_is_refused_at_load_unless_allowed(tmp_path):
    """The version's rec.json claims batch invariance and carries a probe request; a model that
    scores the probe differently as one batch than sample by sample on this CPU is refused,
    naming the model, the CPU and the difference, or served with a warning and a metric."""
    write_model(tmp_path, batch_probe="variant")
    out = run_to_exit("--model-repository", str(tmp_path), "--http-port", "0",
                      "--grpc-port", "0", "--metrics-port", "0")  # fmt: skip
    assert out.returncode != 0
    assert "model 'rec' version 1 is not batch invariant on this CPU" in out.stderr
    assert "37 samples" in out.stderr and "max diff" in out.stderr
    assert "verified it on a test CPU" in out.stderr and "--allow-batch-variant" in out.stderr
    server = Server(tmp_path, "--allow-batch-variant")
    try:
        assert "serving it anyway" in server.stderr()
        metrics = urllib.request.urlopen(f"http://{server.metrics}/metrics").read().decode()
        assert 'rec_model_batch_variant{model="rec",version="1"} 1' in metrics
    finally:
        server.stop()
