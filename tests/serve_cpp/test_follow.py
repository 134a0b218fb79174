"""`rec train` -> `rec export --follow` -> rec-server, all real processes at once: the follower
exports the checkpoints a running training commits, rec-server swaps to each new version while
two clients (HTTP and gRPC) send requests back to back, and not one request fails. The
repository keeps the newest `--keep` versions, and SIGTERM stops the follower cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from clients import http_scores, infer_inputs
from server import Server
from tritonclient.utils import InferenceServerException

from rec.contract import random_request
from rec.contract.repository import ModelDir
from tests.helpers import warning_lines

REC = str(Path(sys.executable).parent / "rec")
STEPS, EVERY = 1800, 300
# One rank trains a step in about 3.5 ms: a checkpoint every second or so, more often than the
# follower (about 0.3 s an export, after its start) and the server (1 s polls) take them, so
# both skip some; training's keep_last 2 also deletes checkpoints under the follower.
CONFIG = {
    "tables": [
        {"name": "t0", "rows": 300, "dim": 8, "features": ["cat_0"]},
        {"name": "t1", "rows": 500, "dim": 8, "features": ["cat_1"]},
    ],
    "features": {"dense": 5},
    "model": {"arch": "dlrm", "dense_arch": [16, 8], "over_arch": [16, 1]},
    "data": {"synthetic": {"train_samples": 50_000, "eval_samples": 512}},
    "training": {"batch_size": 64, "steps": STEPS, "eval_every": 0, "log_every": 600},
    "checkpoint": {"every_steps": EVERY, "keep_last": 2},
}


class Lines(threading.Thread):
    """A process's merged output, line by line, as it comes."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []
        self.start()

    def run(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            assert self.proc.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r} in {timeout} s:\n" + "\n".join(self.lines))


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([REC, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip


def traffic(server: Server, stop: threading.Event, served: list, errors: list, use_grpc: bool):
    """Requests back to back until `stop`; the version that answered each one, in order."""
    module = grpcclient if use_grpc else httpclient
    i = 0
    with module.InferenceServerClient(server.grpc if use_grpc else server.http) as c:
        while not stop.is_set():
            i += 1
            batch = random_request(5, 2, 1 + i % 8, seed=i)
            try:
                result = c.infer("rec", infer_inputs(module, batch))
            except InferenceServerException as e:
                errors.append(e)
                continue
            response = result.get_response()
            served.append(int(response.model_version if use_grpc else response["model_version"]))


def test_follow_a_training_run_while_rec_server_swaps_under_traffic(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    run, repo = tmp_path / "run", tmp_path / "repo"
    train = start("train", "-c", str(tmp_path / "config.yaml"), "--run-dir", str(run),
                  "--nproc", "1")  # fmt: skip
    follower = start("export", "--follow", str(run), "--repo", str(repo), "--keep", "2",
                     "--format", "torchscript")  # fmt: skip
    out = Lines(follower)
    server, stop, threads = None, threading.Event(), []
    served: list[list[int]] = [[], []]
    errors: list = []
    try:
        out.wait_for("version torchscript 1: step ")
        server = Server(repo, "--poll-repository-s", "1", "--executor-threads", "2")
        threads = [threading.Thread(target=traffic, args=(server, stop, served[k], errors, k == 1))
                   for k in (0, 1)]  # fmt: skip
        for t in threads:
            t.start()
        assert train.wait(timeout=300) == 0
        newest = _wait_for_step(out, STEPS)
        # The server answers from the final version: its own poll picked it up.
        deadline = time.monotonic() + 30
        while not (served[0] and served[0][-1] == newest) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert served[0][-1] == newest, (served[0][-5:], server.stderr()[-2000:])
        stop.set()
        for t in threads:
            t.join()
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=60) == 0, "\n".join(out.lines)
        out.join(timeout=10)
        _check_final_version(server, repo, newest)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for proc in (train, follower):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if server is not None:
            assert server.stop() == 0
    assert errors == [] and server.shutdown_counts()["failed"] == 0
    for versions in served:
        assert versions and versions == sorted(versions)  # each client only ever moved forward
    swaps = server.stderr().count("swapped model 'rec' version")
    assert swaps >= 2 and len(set(served[0] + served[1])) >= 3, (swaps, out.lines)
    assert out.lines[-1].startswith("stopped after "), out.lines
    assert warning_lines("\n".join(out.lines)) == []
    model = ModelDir.of(repo, "rec")
    assert model.versions() == [newest - 1, newest]  # --keep 2
    assert not list(repo.glob(".staging-*"))


def _wait_for_step(out: Lines, step: int) -> int:
    """The version the follower wrote from checkpoint `step`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in out.lines:
            if line.startswith("version torchscript ") and f": step {step} " in line:
                return int(line.split()[2].rstrip(":"))
        time.sleep(0.05)
    raise AssertionError(f"no version of step {step}:\n" + "\n".join(out.lines))


def _check_final_version(server: Server, repo: Path, version: int) -> None:
    """The final version's rec.json holds the run's last step (where a server applying the update
    log goes on from), and the server's scores are that version's, number for number."""
    model = ModelDir.of(repo, "rec")
    manifest = json.loads(model.version_manifest(version).read_text())
    assert manifest["source"]["step"] == STEPS and manifest["updates"]["step"] == STEPS
    torch.set_num_threads(1)
    module = torch.jit.load(str(model.model_file(version)))
    batch = random_request(5, 2, 16, seed=99)
    with torch.inference_mode():
        want = module(*(torch.from_numpy(batch[k]) for k in
                        ("dense_features", "sparse_lengths", "sparse_values"))).numpy()  # fmt: skip
    np.testing.assert_array_equal(http_scores(server.http, batch), want)
