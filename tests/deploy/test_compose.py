"""docker-compose.yml for real: train -> export -> rec-server -> Prometheus, in containers.

Run by `make test-deploy` (scripts/test_deploy.sh), which builds the images first: rec:latest
(the Dockerfile, from deploy/wheelhouse on a Debian base made by deploy/build_base.sh) and
rec-prometheus:latest (deploy/prometheus.Dockerfile). The tests share one compose project and
run in file order: up, score, scrape, hot swap, stop (drain), up again. The project's containers,
networks and volumes are removed at the end; the images are kept for the next run.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from rec.contract.repository import ModelDir
from rec.serve.cpp import start_cpp
from rec.serve.process import pick_ports
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "recdeploytest"
UP_TIMEOUT = 900  # the first up trains and exports; the images are already built


def compose(*args: str, env: dict[str, str], timeout: float = 300, check: bool = True):
    out = subprocess.run(
        ["docker-compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if check and out.returncode != 0:
        raise AssertionError(f"docker-compose {' '.join(args)}: rc={out.returncode}\n{out.stderr}")
    return out


def docker(*args: str, timeout: float = 120) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"docker {' '.join(args)}: {out.stderr}"
    return out.stdout


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Stack:
    def __init__(self, tmp: Path) -> None:
        http, grpc, metrics, prom, *tier = pick_ports("127.0.0.1", [0] * 8)
        self.http, self.grpc, self.metrics, self.prom = http, grpc, metrics, prom
        self.tier_http, self.tier_metrics = tier[0::2], tier[1::2]  # replicas a and b
        config_dir = tmp / "config"
        config_dir.mkdir()
        (config_dir / "tiny.yaml").write_text(yaml.safe_dump(TINY))
        self.env = {
            **os.environ,
            "REC_IMAGE": os.environ.get("REC_IMAGE", "rec:latest"),
            "PROMETHEUS_IMAGE": os.environ.get("PROMETHEUS_IMAGE", "rec-prometheus:latest"),
            "REC_CONFIG_DIR": str(config_dir),
            "REC_TRAIN_ARGS": "-c /config/tiny.yaml",
            "REC_POLL_S": "2",
            "REC_HTTP_PORT": str(http),
            "REC_GRPC_PORT": str(grpc),
            "REC_METRICS_PORT": str(metrics),
            "PROMETHEUS_PORT": str(prom),
            "REC_TIER_A_HTTP_PORT": str(tier[0]),
            "REC_TIER_A_METRICS_PORT": str(tier[1]),
            "REC_TIER_B_HTTP_PORT": str(tier[2]),
            "REC_TIER_B_METRICS_PORT": str(tier[3]),
        }
        self.tmp = tmp

    def up(self) -> float:
        """`docker-compose up -d`; returns the seconds until rec-server's health check passes."""
        start = time.monotonic()
        compose("up", "-d", "server", "prometheus", env=self.env, timeout=UP_TIMEOUT)
        wait_for("rec-server to be healthy", lambda: self.health() == "healthy", 180)
        return time.monotonic() - start

    def container(self, service: str) -> str:
        return compose("--profile", "tier", "ps", "-q", service, env=self.env).stdout.strip()

    def health(self, service: str = "server") -> str:
        cid = self.container(service)
        return docker("inspect", "-f", "{{.State.Health.Status}}", cid).strip() if cid else ""

    def logs(self, service: str) -> str:
        return compose("--profile", "tier", "logs", "--no-color", service, env=self.env).stdout

    def predict(self, protocol: str, url: str, repo: Path, out: Path) -> list[str]:
        rec = [str(ROOT / ".venv/bin/rec"), "predict", "--url", url, "--protocol", protocol]
        rec += ["--synthetic", "32", "--seed", "7", "--repo", str(repo), "--output", str(out)]
        done = subprocess.run(rec, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return out.read_text().splitlines()

    def copy_repository(self, name: str) -> Path:
        dest = self.tmp / name
        docker("cp", f"{self.container('server')}:/models", str(dest))
        return dest


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("deploy"))
    down = ("--profile", "tier", "down", "-v", "--remove-orphans")
    compose(*down, env=s.env, check=False)  # a killed earlier run
    try:
        s.first_up_s = s.up()
        print(f"first up: healthy after {s.first_up_s:.0f} s (train + export + load)")
        yield s
    finally:
        for service in ("train", "export", "server", "prometheus", "store-init", "server-a"):
            print(f"--- {service} ---\n{s.logs(service)[-3000:]}")
        compose(*down, env=s.env, check=False)


def test_volumes_hold_the_run_and_the_repository(stack):
    runs = docker("run", "--rm", "-v", f"{PROJECT}_runs:/runs:ro", stack.env["REC_IMAGE"],
                  "ls", "/runs/main/checkpoints")  # fmt: skip
    assert "LATEST" in runs.split() and "step_40" in runs.split()
    repo = stack.copy_repository("served")
    assert ModelDir.of(repo, "rec").model_file(1).is_file()
    manifest = json.loads(ModelDir.of(repo, "rec").manifest.read_text())
    assert manifest["source"]["checkpoint"] == "/runs/main/checkpoints/step_40"
    assert manifest["tables"][0]["stored_dtype"] == "int8"


def test_runs_as_non_root(stack):
    assert docker("exec", stack.container("server"), "id", "-un").strip() == "rec"


def test_published_ports_are_loopback_only(stack):
    ports = docker("port", stack.container("server"))
    assert ports.strip() and all("127.0.0.1:" in line for line in ports.splitlines()), ports


def test_scores_match_the_same_model_served_outside_docker(stack):
    repo = stack.copy_repository("outside")
    inside_http = stack.predict("http", f"127.0.0.1:{stack.http}", repo, stack.tmp / "in_h.csv")
    inside_grpc = stack.predict("grpc", f"127.0.0.1:{stack.grpc}", repo, stack.tmp / "in_g.csv")
    with start_cpp(repo, http_port=0, grpc_port=0, metrics_port=0) as host:
        outside = stack.predict("http", host.endpoints.http, repo, stack.tmp / "out.csv")
    assert len(outside) > 32  # a header line and 32 scores
    assert inside_http == outside
    assert inside_grpc == outside


def test_prometheus_scrapes_rec_server(stack):
    base = f"http://127.0.0.1:{stack.prom}/api/v1/query?query="

    def query(q: str):
        status, body = get(base + urllib.parse.quote(q))
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return result[0]["value"][1] if result else None

    assert wait_for("up{job=rec} == 1", lambda: query('up{job="rec"}') == "1", 90, 3)

    def scored() -> bool:
        # A scrape from before the test above reads 0; the next one (15 s later) has its scores.
        value = query('sum(nv_inference_request_success{job="rec"})')
        return value is not None and float(value) > 0

    assert wait_for("a scraped nv_inference_request_success above 0", scored, 90, 3)


def test_two_replicas_serve_the_tables_from_one_redis_cluster(stack):
    """Profile "tier": a 3-node Redis Cluster holding every table of the same checkpoint, and two
    rec-server replicas reading it through their own caches. Both score as the in-process
    server does, bit for bit, and both read rows from the cluster's three nodes."""
    repo = stack.copy_repository("tier_reference")
    reference = stack.predict("http", f"127.0.0.1:{stack.http}", repo, stack.tmp / "ref.csv")
    compose("--profile", "tier", "up", "-d", "server-a", "server-b", env=stack.env,
            timeout=UP_TIMEOUT)  # fmt: skip
    for replica in ("server-a", "server-b"):
        wait_for(f"{replica} to be healthy", lambda r=replica: stack.health(r) == "healthy", 180)
    init = stack.logs("store-init")
    assert "/models-tier/rec/1" in init, init[-2000:]  # its export, into the cluster
    for name, port, metrics in zip("ab", stack.tier_http, stack.tier_metrics, strict=True):
        scored = stack.predict("http", f"127.0.0.1:{port}", repo, stack.tmp / f"tier_{name}.csv")
        assert scored == reference, f"replica {name}"
        status, body = get(f"http://127.0.0.1:{metrics}/metrics")
        nodes = {line.split('node="')[1].split('"')[0] for line in body.decode().splitlines()
                 if line.startswith("rec_store_node_requests_total{")}  # fmt: skip
        assert status == 200 and len(nodes) == 3, (name, nodes)


def test_new_export_version_is_hot_swapped(stack):
    repo = stack.copy_repository("before_swap")
    before = stack.predict("http", f"127.0.0.1:{stack.http}", repo, stack.tmp / "v1.csv")
    # A different export of the same checkpoint (int4 tables), as version 2 of the same model.
    run = compose("run", "--rm", "export", "rec", "export", "/runs/main", "--repo", "/models",
                  "--quantize", "int4", env=stack.env, timeout=600)  # fmt: skip
    assert "/models/rec/2" in run.stdout

    def serving_version_2() -> bool:
        status, body = get(f"http://127.0.0.1:{stack.http}/v2/models/rec/versions/2/ready")
        return status == 200

    wait_for("rec-server to load version 2", serving_version_2, 60)
    after = stack.predict("http", f"127.0.0.1:{stack.http}", repo, stack.tmp / "v2.csv")
    assert after != before  # int4 tables score differently from int8
    assert stack.health() == "healthy"


def test_stop_drains_every_answered_request(stack):
    url = f"http://127.0.0.1:{stack.http}/v2/models/rec/infer"
    body = json.dumps(infer_request(stack.copy_repository("drain"))).encode()
    answered, refused, broken = [], [], []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    answered.append((r.status, json.loads(r.read())))
            except urllib.error.HTTPError as e:
                (refused if e.code == 503 else broken).append(repr(e))  # 503: shutting down
            except (http.client.IncompleteRead, json.JSONDecodeError) as e:
                broken.append(repr(e))  # an answer cut short: a lost request
            except (urllib.error.URLError, ConnectionError) as e:
                # Not accepted. Through docker-proxy a closed port shows as a reset, not a refusal.
                refused.append(repr(e))
                time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for("requests answered before the stop", lambda: len(answered) >= 20, 30, 0.1)
    cid = stack.container("server")
    compose("stop", "server", env=stack.env, timeout=120)
    stop.set()
    for t in threads:
        t.join(30)
    print(f"stop under load: {len(answered)} answered, {len(refused)} refused, {len(broken)} lost")
    assert not broken, broken[:3]
    assert refused, "the clients never saw the server go away"
    first = answered[0][1]["outputs"][0]["data"]
    assert all(status == 200 and r["outputs"][0]["data"] == first for status, r in answered)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).strip() == "0"
    logs = docker("logs", cid, timeout=30) + stack.logs("server")
    assert "shutting down on SIGTERM" in logs and "shutdown complete" in logs


def test_second_up_finds_the_volumes(stack):
    seconds = stack.up()
    print(f"second up: healthy after {seconds:.0f} s")
    assert "nothing to train" in compose("logs", "--no-color", "train", env=stack.env).stdout
    assert "already exported, kept" in compose("logs", "--no-color", "export", env=stack.env).stdout
    status, body = get(f"http://127.0.0.1:{stack.http}/v2/models/rec")
    assert status == 200 and json.loads(body)["versions"] == ["2"]
    repo = stack.copy_repository("after_restart")
    assert sorted(p.name for p in (repo / "rec").iterdir() if p.name.isdigit()) == ["1", "2"]
    stack.predict("grpc", f"127.0.0.1:{stack.grpc}", repo, stack.tmp / "again.csv")


def infer_request(repo: Path) -> dict:
    """One KServe v2 JSON request of 2 rows, shaped from rec.json's I/O."""
    shapes = {
        i["name"]: i["shape"]
        for i in json.loads(ModelDir.of(repo, "rec").manifest.read_text())["inputs"]
    }
    num_dense, num_sparse = shapes["dense_features"][-1], shapes["sparse_lengths"][-1]
    return {
        "inputs": [
            {"name": "dense_features", "shape": [2, num_dense], "datatype": "FP32",
             "data": [0.5] * (2 * num_dense)},
            {"name": "sparse_lengths", "shape": [2, num_sparse], "datatype": "INT32",
             "data": [1] * (2 * num_sparse)},
            {"name": "sparse_values", "shape": [2 * num_sparse], "datatype": "INT64",
             "data": list(range(2 * num_sparse))},
        ]
    }  # fmt: skip
