"""The real tritonserver (nvidia-pytriton) serving the repository's model.pt over HTTP and gRPC.

Scores must equal the TorchScript model's own (same float ops, so within 1e-6), for one and for
many samples per request; bad requests must fail with the client-error class (HTTP 400, gRPC
INVALID_ARGUMENT), as on the C++ server.
"""

from __future__ import annotations

import urllib.request

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import torch
from tritonclient.utils import InferenceServerException

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec.contract.repository import ModelDir
from rec.serve.client import Rows, ScoreClient, synthetic_rows
from rec.serve.process import pick_ports
from rec.serve.repository import ServeError
from rec.serve.triton import start_triton
from tests.serve_triton.tiny_repo import MAX_BATCH_SIZE, NUM_DENSE, NUM_SPARSE, NUM_TASKS

CLIENT_ERROR = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def reference_scores(repo, rows: Rows) -> np.ndarray:
    model = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
    with torch.inference_mode():
        out = model(*(torch.from_numpy(a) for a in (rows.dense, rows.lengths, rows.values)))
    return out.numpy()


def client_for(server, protocol: str) -> ScoreClient:
    return ScoreClient(getattr(server.endpoints, protocol), protocol, "rec")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("batch", [1, 7, 256])
def test_scores_match_torchscript(triton, tiny_repo, protocol, batch):
    rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, batch, seed=batch)
    rows.values[::5] *= -1  # negative ids are valid: the model maps every id into its table
    scores = client_for(triton, protocol).score(rows)
    assert scores.shape == (batch, NUM_TASKS) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, reference_scores(tiny_repo, rows), rtol=0, atol=1e-6)


def test_samples_with_no_ids(triton, tiny_repo):
    rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, 4, seed=1)
    rows.lengths[1:3] = 0
    rows.values = rows.values[: int(rows.lengths.sum())]
    scores = client_for(triton, "grpc").score(rows)
    np.testing.assert_allclose(scores, reference_scores(tiny_repo, rows), rtol=0, atol=1e-6)


def bad_requests() -> dict[str, Rows]:
    ok = synthetic_rows(NUM_DENSE, NUM_SPARSE, 4, seed=2)
    short = Rows(ok.dense, ok.lengths, ok.values[:-1])
    negative = Rows(ok.dense, ok.lengths.copy(), ok.values)
    negative.lengths[0, 0] = -1
    wide = Rows(np.zeros((4, NUM_DENSE + 1), np.float32), ok.lengths, ok.values)
    uneven = Rows(ok.dense[:3], ok.lengths, ok.values)
    too_many = synthetic_rows(NUM_DENSE, NUM_SPARSE, MAX_BATCH_SIZE + 1, seed=3)
    nan = Rows(ok.dense.copy(), ok.lengths, ok.values)
    nan.dense[1, 2] = np.nan
    return {
        "nan_dense": nan,
        "values_vs_lengths": short,
        "negative_length": negative,
        "wrong_dense_width": wide,
        "batch_mismatch": uneven,
        "over_max_batch": too_many,
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(bad_requests()))
def test_bad_request_is_client_error(triton, protocol, case):
    with pytest.raises(InferenceServerException) as err:
        client_for(triton, protocol).score(bad_requests()[case])
    assert str(err.value.status()) == CLIENT_ERROR[protocol], err.value.message()


def test_server_survives_bad_requests(triton, tiny_repo):
    rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, 2, seed=4)
    scores = client_for(triton, "http").score(rows)
    np.testing.assert_allclose(scores, reference_scores(tiny_repo, rows), rtol=0, atol=1e-6)


def test_user_repository_untouched(triton, tiny_repo):
    """Triton serves a staging copy of the config; the user's files stay as export wrote them."""
    config = ModelDir.of(tiny_repo, "rec").config.read_text()
    assert 'platform: "pytorch_libtorch"' in config
    names = sorted(p.relative_to(tiny_repo).as_posix() for p in tiny_repo.rglob("*"))
    rec = ModelDir.of(".", "rec")
    files = (rec.path, rec.version(1), rec.model_file(1), rec.version_manifest(1), rec.config,
             rec.manifest)  # fmt: skip
    assert names == [str(p) for p in files]


def test_published_features(triton):
    features = client_for(triton, "grpc").features()
    assert features.dense == tuple(f"dense_{i}" for i in range(NUM_DENSE))
    assert features.sparse == ("item", "user", "tags", "city")
    assert features.tasks == ("label_0", "label_1")  # rec.json's tasks, for rec predict


def test_port_in_use_is_clear_error(triton, tiny_repo):
    taken = int(triton.endpoints.http.rsplit(":", 1)[1])
    with pytest.raises(ServeError, match=f"port {taken} on 127.0.0.1 is already in use"):
        start_triton(tiny_repo, http_port=taken, grpc_port=0, metrics_port=0)


def test_pick_ports_gives_distinct_free_ports():
    ports = pick_ports("127.0.0.1", [0, 0, 0])
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


def test_cpp_and_triton_agree(triton, cpp):
    """Parity: the same requests through both servers give the same scores and error classes."""
    rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, 64, seed=5)
    for protocol in ("http", "grpc"):
        a = client_for(triton, protocol).score(rows)
        b = client_for(cpp, protocol).score(rows)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        for case, bad in bad_requests().items():
            with pytest.raises(InferenceServerException) as err:
                client_for(cpp, protocol).score(bad)
            assert str(err.value.status()) == CLIENT_ERROR[protocol], (case, err.value.message())


def test_a_batch_variant_model_is_refused_at_load_unless_allowed(tmp_path):
    """As rec-server (tests/serve_cpp/test_lifecycle.py): Triton's model runs rec.json's batch
    probe when it loads, fails the load naming the model, the CPU and the difference, or with
    allow_batch_variant serves it and reports rec_model_batch_variant 1."""
    from tests.serve_cpp.tiny_model import write_model

    write_model(tmp_path, batch_probe="variant")
    with (
        pytest.raises(ServeError) as failed,
        start_triton(tmp_path, http_port=0, grpc_port=0, metrics_port=0),
    ):
        pass
    message = str(failed.value)
    assert "model 'rec' version 1 is not batch invariant on this CPU" in message
    assert "37 samples" in message and "verified it on a test CPU" in message
    assert "--allow-batch-variant" in message
    with start_triton(
        tmp_path, http_port=0, grpc_port=0, metrics_port=0, allow_batch_variant=True
    ) as server:
        metrics = urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics").read()
        assert b'rec_model_batch_variant{model="rec",version="1"} 1' in metrics
        assert "serving it anyway (--allow-batch-variant)" in server.log_tail(100_000)


def test_log_settings_are_tritons(triton, cpp):
    """The logging extension answers alike: the same settings, names and types from both
    servers over both protocols, and a change of verbosity reads back the same."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    def read(server) -> tuple[dict, dict]:
        with httpclient.InferenceServerClient(server.endpoints.http) as h:
            http = h.get_log_settings()
        with grpcclient.InferenceServerClient(server.endpoints.grpc) as g:
            grpc = g.get_log_settings(as_json=True)["settings"]
        return http, {k: next(iter(v.items()), None) for k, v in grpc.items()}

    theirs, ours = read(triton), read(cpp)
    assert {k: type(v) for k, v in theirs[0].items()} == {k: type(v) for k, v in ours[0].items()}
    assert {k: (v or ("", ""))[0] for k, v in theirs[1].items()} == {
        k: (v or ("", ""))[0] for k, v in ours[1].items()
    }
    for server in (triton, cpp):
        with httpclient.InferenceServerClient(server.endpoints.http) as h:
            assert h.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
            assert h.update_log_settings({"log_verbose_level": 0})["log_verbose_level"] == 0


def test_trace_settings_are_tritons(triton, cpp):
    """The trace extension answers alike: the same default settings over HTTP and gRPC, the
    same refusal of trace_file over the network, the same rate read back."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    answers = []
    for server in (triton, cpp):
        with httpclient.InferenceServerClient(server.endpoints.http) as h:
            http = h.get_trace_settings(model_name="rec")
            with pytest.raises(InferenceServerException) as e:
                h.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
            assert "trace" in e.value.message() and "file" in e.value.message()
            assert h.update_trace_settings(settings={"trace_rate": "7"})["trace_rate"] == "7"
            assert h.update_trace_settings(settings={"trace_rate": "1000"})["trace_rate"] == "1000"
        with grpcclient.InferenceServerClient(server.endpoints.grpc) as g:
            grpc = g.get_trace_settings(as_json=True)["settings"]
        answers.append((http, {k: v.get("value") for k, v in grpc.items()}))
    assert answers[0] == answers[1]


def _scores_through_shared_memory(server, protocol: str, rows: Rows, tag: str) -> np.ndarray:
    """rows' inputs in one system shared memory region, the scores into another, with
    tritonclient's own helpers; the regions are unregistered and destroyed afterwards."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    from rec.serve.client import DENSE, LENGTHS, SCORES, VALUES

    module = httpclient if protocol == "http" else grpcclient
    arrays = {DENSE: rows.dense, LENGTHS: rows.lengths, VALUES: rows.values}
    dtypes = {DENSE: "FP32", LENGTHS: "INT32", VALUES: "INT64"}
    size = sum(a.nbytes for a in arrays.values())
    out_size = len(rows) * NUM_TASKS * 4
    key = f"/rec_triton_test_{tag}_{protocol}"
    handle = shm.create_shared_memory_region("in", key, size)
    out_handle = shm.create_shared_memory_region("out", key + "_out", out_size)
    try:
        shm.set_shared_memory_region(handle, [np.ascontiguousarray(a) for a in arrays.values()])
        with module.InferenceServerClient(getattr(server.endpoints, protocol)) as c:
            c.register_system_shared_memory("in", key, size)
            c.register_system_shared_memory("out", key + "_out", out_size)
            inputs, offset = [], 0
            for name, array in arrays.items():
                tensor = module.InferInput(name, list(array.shape), dtypes[name])
                tensor.set_shared_memory("in", array.nbytes, offset=offset)
                inputs.append(tensor)
                offset += array.nbytes
            output = module.InferRequestedOutput(SCORES)
            output.set_shared_memory("out", out_size)
            c.infer("rec", inputs, outputs=[output])
            bad = module.InferInput(DENSE, list(rows.dense.shape), "FP32")
            bad.set_shared_memory("no_such_region", rows.dense.nbytes)
            with pytest.raises(InferenceServerException) as err:
                c.infer("rec", [bad, *inputs[1:]])
            assert "no_such_region" in err.value.message(), err.value.message()
            c.unregister_system_shared_memory()
        return shm.get_contents_as_numpy(out_handle, np.float32, [len(rows), NUM_TASKS]).copy()
    finally:
        shm.destroy_shared_memory_region(handle)
        shm.destroy_shared_memory_region(out_handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_is_tritons(triton, cpp, tiny_repo, protocol):
    """System shared memory answers alike: inputs read from a region and scores written into
    another give both servers the scores of the socket path, and an unknown region is refused
    by both, naming it."""
    rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, 16, seed=11)
    want = reference_scores(tiny_repo, rows)
    for name, server in (("triton", triton), ("cpp", cpp)):
        got = _scores_through_shared_memory(server, protocol, rows, name)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=name)
