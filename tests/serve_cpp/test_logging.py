"""Triton's logging extension on rec-server: the stock tritonclient reads and changes the log
settings over HTTP and gRPC on a running server, and the change shows in what it logs."""

from __future__ import annotations

import json
import time

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import http_post, infer_inputs
from server import Server
from tiny_model import make_batch
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def _grpc_settings(c: grpcclient.InferenceServerClient) -> dict:
    settings = c.get_log_settings(as_json=True)["settings"]
    return {k: next(iter(v.values())) if v else None for k, v in settings.items()}


def _infer(s: Server, rows: int) -> None:
    with httpclient.InferenceServerClient(s.http) as c:
        c.infer("rec", infer_inputs(httpclient, make_batch(rows, seed=rows)))


def _wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _verbose_lines(s: Server) -> list[str]:
    return [line for line in s.log if "VERBOSE" in line or " V rec-server]" in line]


@pytest.fixture()
def fresh(repo):
    s = Server(repo)
    yield s
    assert s.stop() == 0, s.stderr()


def test_verbosity_changes_at_run_time_over_http_and_grpc(fresh, tmp_path):
    s = fresh
    with (
        httpclient.InferenceServerClient(s.http) as h,
        grpcclient.InferenceServerClient(s.grpc) as g,
    ):
        assert "logging" in h.get_server_metadata()["extensions"]
        assert "logging" in g.get_server_metadata(as_json=True)["extensions"]
        assert h.get_log_settings() == DEFAULTS
        assert _grpc_settings(g) == DEFAULTS

        _infer(s, 3)
        assert _verbose_lines(s) == []  # level 0: nothing per batch

        assert h.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
        _infer(s, 5)
        _wait_for(lambda: any("batch of 5 rows" in line for line in _verbose_lines(s)), "a line")
        assert "VERBOSE rec-server: model 'rec' version 1: batch of 5 rows" in s.stderr()

        g.update_log_settings({"log_format": "ISO8601"})
        _infer(s, 6)
        _wait_for(lambda: any(" V rec-server] model 'rec'" in x for x in s.log), "an ISO8601 line")

        g.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
        assert _grpc_settings(g)["log_verbose_level"] == 0
        count = len(_verbose_lines(s))
        _infer(s, 7)
        assert h.get_log_settings()["log_verbose_level"] == 0
        time.sleep(0.2)
        assert len(_verbose_lines(s)) == count

        # Like Triton, no network client may point the log at a file: it would pick a path
        # the server appends to.
        for update in (h.update_log_settings, g.update_log_settings):
            with pytest.raises(InferenceServerException) as e:
                update({"log_file": str(tmp_path / "x.log")})
            assert "log_file cannot be changed over the network" in e.value.message()
        assert not (tmp_path / "x.log").exists()


def test_log_file_from_the_command_line(repo, tmp_path):
    path = tmp_path / "rec-server.log"
    s = Server(repo, "--log-file", str(path), "--log-verbose", "1")
    try:
        _infer(s, 9)
        _wait_for(lambda: "batch of 9 rows" in path.read_text(), "the batch line in the file")
        assert "loaded model 'rec' version 1" in path.read_text()
        with httpclient.InferenceServerClient(s.http) as c:
            assert c.get_log_settings()["log_file"] == str(path)
            assert c.get_log_settings()["log_verbose_level"] == 1
    finally:
        assert s.stop() == 0, s.stderr()
    assert "shutdown complete" in path.read_text()
    assert "batch of 9 rows" not in s.stderr()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"{not json", "must be a JSON object"),
        (
            b'{"log_verbose_level": -1}',
            "log setting 'log_verbose_level' must be a bool, an unsigned",
        ),
        (b'{"log_verbose_level": 4294967296}', "'log_verbose_level' must be a bool, an unsigned"),
        (b'{"log_verbose_level": 1.5}', "'log_verbose_level' must be a bool, an unsigned"),
        (b'{"log_verbose_level": "2"}', "'log_verbose_level' must be an unsigned integer, got a s"),
        (b'{"log_info": 1}', "log setting 'log_info' must be a bool, got an unsigned integer"),
        (b'{"log_file": null}', "log setting 'log_file' must be a bool, an unsigned"),
        (b'{"log_format": "json"}', 'log_format must be "default" or "ISO8601", got "json"'),
        (b'{"log_file": "/tmp/x.log"}', "log_file cannot be changed over the network"),
        (b'{"log_verbose_level": 3, "nope": true}', "unknown log setting 'nope'"),
    ],
)
def test_bad_log_settings_are_400_and_change_nothing(server, body, expected):
    status, text = http_post(server.http, "/v2/logging", body)
    assert status == 400, text
    assert expected in json.loads(text)["error"]
    with httpclient.InferenceServerClient(server.http) as c:
        assert c.get_log_settings() == DEFAULTS  # the valid half of a bad update is not applied


def test_bad_log_settings_over_grpc_are_invalid_argument(server):
    """Hand-built requests (the stock client types each setting by its name), and the stock
    client's own None, which sends a setting without a value."""
    cases = [
        ({"log_info": "string_param"}, "log setting 'log_info' must be a bool, got a string"),
        ({"log_verbose_level": "bool_param"}, "'log_verbose_level' must be an unsigned integer"),
        ({"log_error": "bool_param", "verbose": "uint32_param"}, "unknown log setting 'verbose'"),
    ]
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for settings, expected in cases:
            request = service_pb2.LogSettingsRequest()
            for name, kind in settings.items():
                setattr(request.settings[name], kind, {"string_param": "yes",
                                                       "bool_param": True,
                                                       "uint32_param": 2}[kind])  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                stub.LogSettings(request, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert expected in e.value.details()
    with grpcclient.InferenceServerClient(server.grpc) as c:
        with pytest.raises(InferenceServerException) as e:
            c.update_log_settings({"log_info": None})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "log setting 'log_info' has no value" in e.value.message()
        assert _grpc_settings(c) == DEFAULTS
