"""Security defaults of rec-server: loopback bind, model control off unless enabled, model names
that cannot leave the repository, and request size and batch limits."""

import gzip
import http.client
import json
import shutil
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from live_server import Server, batch, infer_inputs
from tritonclient.utils import InferenceServerException

from rec.contract.repository import ModelDir

LISTEN = "0A"


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.append(addr)
    return found


def _post(hostport: str, path: str, body: bytes = b"", headers: dict | None = None):
    host, port = hostport.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", path, body=body, headers=headers or {})
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


@pytest.fixture(scope="module")
def default_server(exported_repo):
    s = Server(exported_repo, "--max-body-bytes", "65536")
    yield s
    assert s.stop() == 0, s.stderr()


def test_binds_loopback_only_by_default(default_server):
    # 127.0.0.1, ::1, ::ffff:127.0.0.1 (gRPC binds an IPv6 socket with the mapped address)
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    for hostport in (default_server.http, default_server.grpc, default_server.metrics):
        addrs = _listening(int(hostport.rsplit(":", 1)[1]))
        assert addrs and set(addrs) <= loopback, (hostport, addrs)


def test_model_control_is_off_by_default(default_server):
    status, body = _post(default_server.http, "/v2/repository/models/rec/load")
    # 503 and UNAVAILABLE: Triton's answer to a load with model control off.
    assert status == 503 and b"--enable-model-control" in body, (status, body)
    with (
        grpcclient.InferenceServerClient(default_server.grpc) as c,
        pytest.raises(InferenceServerException, match="enable-model-control") as e,
    ):
        c.load_model("rec")
    assert e.value.status() == "StatusCode.UNAVAILABLE", e.value


@pytest.fixture(scope="module")
def control_server(exported_repo, tmp_path_factory):
    # A servable model outside the repository: nothing may load it.
    outside = tmp_path_factory.mktemp("outside")
    shutil.copytree(exported_repo / "rec", outside / "evil")
    s = Server(exported_repo, "--enable-model-control")
    yield s, outside
    assert s.stop() == 0, s.stderr()


@pytest.mark.parametrize(
    "name",
    [
        "..",
        "../outside/evil",
        "..%2F..%2Fetc",
        "%2Fetc%2Fpasswd",
        "%2e%2e",
        "rec%2F..%2F..",
        "evil",
    ],
)
def test_model_names_cannot_escape_the_repository(control_server, name):
    s, outside = control_server
    status, body = _post(s.http, f"/v2/repository/models/{name}/load")
    assert status in (400, 404), (name, status, body)
    host, port = s.http.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    for path in (f"/v2/models/{name}/config", f"/v2/models/{name}", f"/v2/models/{name}/ready"):
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        assert r.status in (400, 404), (path, r.status)
    c.close()
    with grpcclient.InferenceServerClient(s.grpc) as g, pytest.raises(InferenceServerException):
        g.load_model(name.replace("%2F", "/").replace("%2e", "."))
    assert str(outside) not in s.stderr()
    assert "evil" not in s.stderr()


def test_reload_of_a_served_model_is_allowed_with_model_control(control_server):
    s, _ = control_server
    assert _post(s.http, "/v2/repository/models/rec/load")[0] == 200


def test_body_size_limit(default_server, manifest):
    status, _ = _post(
        default_server.http, "/v2/models/rec/infer", b"x" * 70000, {"Content-Type": "x"}
    )
    assert status == 413
    # A gzip bomb: 16 KiB on the wire (under the limit), 16 MiB inflated (far over it).
    bomb = gzip.compress(b"\0" * (16 << 20))
    assert len(bomb) < 65536
    status, body = _post(
        default_server.http, "/v2/models/rec/infer", bomb, {"Content-Encoding": "gzip"}
    )
    assert status in (400, 413) and b"65536" in body, (status, body)
    assert default_server.proc.poll() is None


def test_batch_limit(default_server, manifest, exported_repo):
    # The exported config is the `none` form (max_batch_size 0): rec-server takes the limit
    # from rec.json's "serving".
    max_batch = json.loads(ModelDir.of(exported_repo, "rec").manifest.read_text())["serving"][
        "max_batch_size"
    ]
    with httpclient.InferenceServerClient(default_server.http) as c:
        ok = c.infer("rec", infer_inputs(httpclient, batch(manifest, 4, seed=1)))
        assert ok.as_numpy("scores").shape[0] == 4
        big = batch(manifest, max_batch + 1, seed=2)
        with pytest.raises(InferenceServerException, match="batch"):
            c.infer("rec", infer_inputs(httpclient, big))
    with (
        grpcclient.InferenceServerClient(default_server.grpc) as g,
        pytest.raises(InferenceServerException, match="batch"),
    ):
        g.infer("rec", infer_inputs(grpcclient, big))


def test_statistics_json_is_well_formed(default_server):
    host, port = default_server.http.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/v2/models/rec/stats")
    r = c.getresponse()
    assert r.status == 200 and "model_stats" in json.loads(r.read())
