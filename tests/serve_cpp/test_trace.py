"""Triton's trace extension on rec-server: settings over HTTP and gRPC with the stock client,
sampled requests' timestamps in Triton's JSON trace format, in order, in the trace file."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import http_post, infer_inputs
from server import Server
from tiny_model import make_batch
from tritonclient.utils import InferenceServerException

DEFAULTS = {  # Triton 2.51's answer on a server started without trace settings
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
              "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
              "HTTP_SEND_START", "HTTP_SEND_END"]  # fmt: skip
GRPC_ORDER = ["GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
              "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
              "GRPC_SEND_START", "GRPC_SEND_END"]  # fmt: skip


def _grpc_settings(c: grpcclient.InferenceServerClient, model: str = "") -> dict:
    settings = c.get_trace_settings(model_name=model, as_json=True)["settings"]
    return {k: v.get("value", []) for k, v in settings.items()}


def _http_infer(s: Server, rows: int) -> None:
    with httpclient.InferenceServerClient(s.http) as c:
        c.infer("rec", infer_inputs(httpclient, make_batch(rows, seed=rows)))


def _grpc_infer(s: Server, rows: int) -> None:
    with grpcclient.InferenceServerClient(s.grpc) as c:
        c.infer("rec", infer_inputs(grpcclient, make_batch(rows, seed=rows)))


def _traces(path) -> dict[int, dict]:
    """Triton's format: per trace one {id, model_name, model_version} object and one
    {id, timestamps: [{name, ns}]} object per timestamp. Sorted by id, which is taken when the
    request is sampled: the file is in the order traces finish, and a trace finishes after its
    response is sent, so the client's next request can finish first."""
    traces: dict[int, dict] = defaultdict(lambda: {"stamps": []})
    for item in json.loads(path.read_text()):
        t = traces[item["id"]]
        if "model_name" in item:
            t["model"] = (item["model_name"], item["model_version"])
        for stamp in item.get("timestamps", []):
            t["stamps"].append((stamp["name"], stamp["ns"]))
    return dict(sorted(traces.items()))


def _wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _assert_ordered(trace: dict, order: list[str]) -> None:
    names = [n for n, _ in trace["stamps"]]
    assert sorted(names) == sorted(order), names
    ns = dict(trace["stamps"])
    times = [ns[n] for n in order]
    assert times == sorted(times), list(zip(order, times, strict=True))


def test_defaults_are_tritons_and_tracing_needs_a_file(server):
    with httpclient.InferenceServerClient(server.http) as h:
        assert "trace" in h.get_server_metadata()["extensions"]
        assert h.get_trace_settings() == DEFAULTS
        assert h.get_trace_settings(model_name="rec") == DEFAULTS
        for settings, expected in [
            ({"trace_level": ["TIMESTAMPS"]}, "tracing needs a trace file: start rec-server with"),
            ({"trace_file": "/tmp/t.json"}, "trace_file cannot be changed over the network"),
        ]:
            with pytest.raises(InferenceServerException) as e:
                h.update_trace_settings(settings=settings)
            assert e.value.status() == "400" and expected in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            h.get_trace_settings(model_name="nope")
        assert e.value.status() == "404"
    with grpcclient.InferenceServerClient(server.grpc) as g:
        assert _grpc_settings(g) == {k: v if isinstance(v, list) else [v]
                                     for k, v in DEFAULTS.items()}  # fmt: skip
        with pytest.raises(InferenceServerException) as e:
            g.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException) as e:
            g.get_trace_settings(model_name="nope")
        assert e.value.status() == "StatusCode.NOT_FOUND"


@pytest.fixture()
def traced(repo, tmp_path):
    path = tmp_path / "trace.json"
    s = Server(repo, "--trace-file", str(path))
    yield s, path
    assert s.stop() == 0, s.stderr()


def test_sampled_requests_are_traced_in_order_until_the_count_is_used(traced):
    s, path = traced
    with httpclient.InferenceServerClient(s.http) as h:
        _http_infer(s, 2)  # tracing is off: nothing is kept
        settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "4"}
        assert h.update_trace_settings(settings=settings) == {**DEFAULTS, **settings,
                                                              "trace_file": str(path)}  # fmt: skip
        _http_infer(s, 3)
        _grpc_infer(s, 4)
        _http_infer(s, 5)
        _grpc_infer(s, 6)
        # The count is used up: the file is written, and later requests are not traced.
        _wait_for(path.exists, "the trace file")
        _http_infer(s, 7)
        assert h.get_trace_settings()["trace_count"] == "0"
    traces = _traces(path)
    assert len(traces) == 4
    assert all(t["model"] == ("rec", 1) for t in traces.values())
    kinds = [("HTTP" if t["stamps"][0][0].startswith("HTTP") else "GRPC") for t in traces.values()]
    assert kinds == ["HTTP", "GRPC", "HTTP", "GRPC"]
    for t in traces.values():
        _assert_ordered(t, HTTP_ORDER if t["stamps"][0][0].startswith("HTTP") else GRPC_ORDER)


def test_rate_log_frequency_and_model_settings(traced):
    s, path = traced
    with (
        httpclient.InferenceServerClient(s.http) as h,
        grpcclient.InferenceServerClient(s.grpc) as g,
    ):
        g.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "log_frequency": "2"})
        # The model's own rate: every 2nd request to it; the global one stays.
        assert (
            h.update_trace_settings(model_name="rec", settings={"trace_rate": "2"})["trace_rate"]
            == "2"
        )
        assert h.get_trace_settings()["trace_rate"] == "1000"
        assert _grpc_settings(g, "rec")["trace_rate"] == ["2"]
        for rows in range(1, 7):
            _http_infer(s, rows)  # 2, 4 and 6 are traced
        _wait_for(lambda: (path.parent / "trace.json.0").exists(), "the first 2 traces")
        assert len(_traces(path.parent / "trace.json.0")) == 2
        # null clears the model's own setting: it follows the global rate again.
        cleared = h.update_trace_settings(model_name="rec", settings={"trace_rate": None})
        assert cleared["trace_rate"] == "1000"
    s.stop()
    assert len(_traces(path.parent / "trace.json.1")) == 1  # the rest, written at shutdown
    assert not path.exists()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"[1]", "trace settings must be a JSON object"),
        (b'{"trace_level": ["TENSORS"]}', "trace_level TENSORS is not supported by rec-server"),
        (b'{"trace_level": ["BOGUS"]}', 'trace_level must be OFF or TIMESTAMPS, got "BOGUS"'),
        (b'{"trace_level": 5}', "trace setting 'trace_level' must be a string, an array of str"),
        (b'{"trace_level": [5]}', "trace setting 'trace_level' must be a string, an array of s"),
        (b'{"trace_rate": "0"}', 'trace_rate must be one integer >= 1 (as a string), got "0"'),
        (b'{"trace_rate": "x"}', 'trace_rate must be one integer >= 1 (as a string), got "x"'),
        (b'{"trace_rate": ["1", "2"]}', "trace_rate must be one integer >= 1 (as a string), got 2"),
        (b'{"trace_count": "-5"}', 'trace_count must be one integer >= -1 (as a string), got "-5"'),
        (b'{"log_frequency": "99999999999999999999"}', "log_frequency must be one integer >= 0"),
        (b'{"trace_mode": "opentelemetry"}', 'trace_mode must be "triton"'),
        (b'{"trace_rate": "5", "nope": "1"}', "unknown trace setting 'nope'"),
    ],
)
def test_bad_trace_settings_are_400_and_change_nothing(server, body, expected):
    for route in ("/v2/trace/setting", "/v2/models/rec/trace/setting"):
        status, text = http_post(server.http, route, body)
        assert status == 400, text
        assert expected in json.loads(text)["error"]
    with httpclient.InferenceServerClient(server.http) as c:
        assert c.get_trace_settings() == DEFAULTS
        assert c.get_trace_settings(model_name="rec") == DEFAULTS
