"""`rec serve` as a user runs it: a foreground process that prints its endpoints, serves, and
stops cleanly on SIGINT/SIGTERM; clear errors for a bad repository, a taken port, no binary."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rec.cli import main
from rec.contract.repository import ModelDir
from rec.serve import cpp as cpp_module
from rec.serve.client import ScoreClient, synthetic_rows
from rec.serve.repository import ServeError
from tests.helpers import warning_lines
from tests.serve_triton.tiny_repo import NUM_DENSE, NUM_SPARSE

REC = str(Path(sys.executable).parent / "rec")
READY = re.compile(r"rec serve: (\w+) ready http=(\S+) grpc=(\S+) metrics=(\S+)")


def start_rec_serve(
    repo: Path, backend: str, *extra: str
) -> tuple[subprocess.Popen, re.Match, str]:
    """The running `rec serve`, its ready line's match and everything it printed up to it."""
    proc = subprocess.Popen(
        [REC, "serve", str(repo), "--backend", backend]
        + ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = READY.match(line)
        if m:
            return proc, m, "".join(lines)
    proc.kill()
    raise AssertionError("rec serve did not get ready:\n" + "".join(lines))


def server_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize(
    "backend, sig, extra",
    [
        ("triton", signal.SIGINT, ()),
        pytest.param("cpp", signal.SIGTERM, (), id="cpp"),
        pytest.param("cpp", signal.SIGTERM, ("--server-arg=--busy-poll-us=0",), id="cpp-arg"),
    ],
)
def test_serve_foreground_then_signal(tiny_repo, backend, sig, extra):
    if backend == "cpp":
        try:
            cpp_module.find_cpp_server()
        except ServeError as e:
            pytest.skip(str(e))
    proc, ready, started = start_rec_serve(tiny_repo, backend, *extra)
    try:
        children = server_pids(proc.pid)
        assert children, "the server runs as a child of rec serve"
        rows = synthetic_rows(NUM_DENSE, NUM_SPARSE, 3)
        assert ScoreClient(ready.group(3), "grpc").score(rows).shape == (3, 2)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"{signal.Signals(sig).name}: stopping" in out and "stopped" in out
    assert not warning_lines(started + out), started + out  # only rec's own lines
    for pid in children:  # stopped and reaped by rec serve
        assert not Path(f"/proc/{pid}").exists()


def invoke(*args: str):
    result = CliRunner().invoke(main, ["serve", *args])
    return result.exit_code, result.output


def test_missing_repository(tmp_path):
    code, out = invoke(str(tmp_path / "nope"), "--backend", "triton")
    assert code == 2 and "does not exist" in out


def test_invalid_repository(tmp_path):
    (tmp_path / "rec").mkdir()
    ModelDir.of(tmp_path, "rec").config.write_text("platform: 'pytorch_libtorch' bogus: 1\n")
    code, out = invoke(str(tmp_path), "--backend", "triton")
    assert code == 2 and "not a valid Triton ModelConfig" in out


def test_port_in_use(triton, tiny_repo):
    taken = triton.endpoints.grpc.rsplit(":", 1)[1]
    code, out = invoke(str(tiny_repo), "--backend", "triton", "--http-port", "0",
                       "--grpc-port", taken, "--metrics-port", "0")  # fmt: skip
    assert code == 2 and f"port {taken} on 127.0.0.1 is already in use" in out


def test_cpp_not_built(tiny_repo, tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_module, "_CHECKOUT", tmp_path)
    monkeypatch.delenv("REC_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out = invoke(str(tiny_repo), "--backend", "cpp")
    assert code == 2 and "the C++ server is not built" in out and "run make setup" in out


def test_server_args_are_checked(tiny_repo):
    """A bad rec-server flag fails `rec serve` with rec-server's own message; Triton takes none."""
    try:
        cpp_module.find_cpp_server()
    except ServeError as e:
        pytest.skip(str(e))
    ports = ("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
    code, out = invoke(str(tiny_repo), "--backend", "cpp", *ports, "--server-arg=--busy-poll-us=-1")
    assert code != 0 and "--busy-poll-us expects an integer" in out, out
    code, out = invoke(str(tiny_repo), "--backend", "triton", *ports, "--server-arg=--x=1")
    assert code == 2 and "--server-arg passes flags to rec-server, not to triton" in out
