"""The embedding tier, export side (#35): `rec export --store URL` writes the chosen tables' rows
into a real Redis Cluster (3 masters, 3 replicas: our own redis-server processes), bit for bit
the rows the exported model holds, and never over an export that is there."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import rec.ops  # noqa: F401  (model.pt's dense layers, before torch.jit.load)
from rec.contract import store as contract
from rec.contract.repository import ModelDir, manifest_in, model_file_in
from rec.serve.client import ScoreClient, synthetic_rows
from rec.serve.cpp import start_cpp
from rec.store.cluster import RedisCluster
from rec.store.plan import table_cost
from rec.store.writer import StoreSink, connect
from tests.export.conftest import tiny_dict, write_seeded_run
from tests.helpers import REC, rec_in_process

EXAMPLES = Path(__file__).parents[2] / "examples"
STORE = {"tables": ["t0", "t1", "t2"], "partitions": 4, "table_partitions": {"t0": 7}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=1) as c:
        yield c


def stored_rows(client, prefix: str, table: str, spec: dict) -> dict[int, bytes]:
    rows: dict[int, bytes] = {}
    for p in range(spec["partitions"]):
        for field, value in client.hgetall(contract.partition_key(prefix, table, p)).items():
            row = int(field)
            assert row % spec["partitions"] == p, f"row {row} of {table} in partition {p}"
            rows[row] = value
    return rows


def model_rows(version_dir, manifest: dict, table: str) -> np.ndarray:
    """The table's rows as model.pt holds them, in the update log's layout (codes, then fp16
    scale and bias), from rec.json's description of its storage."""
    place = manifest["updates"]["tables"][table]
    buffers = dict(torch.jit.load(str(model_file_in(version_dir))).named_buffers())
    raw = buffers[place["buffer"]].numpy()
    stride, off = place["row_stride"], place["offset"]
    rows = raw[off : off + place["rows"] * stride].reshape(place["rows"], stride)
    width = contract.row_bytes(place["dim"], place["dtype"])
    if place["scale_bias"] == "first":
        return np.concatenate([rows[:, 4:width], rows[:, :4]], axis=1)
    return rows[:, :width]


def _config(arch: str, stored: list[str]) -> dict:
    dtypes = {"t0": "int4", "t1": "fp16"}
    if arch != "din":
        data = tiny_dict(table_dtypes=dtypes, store={**STORE, "tables": stored})
        data["model"]["arch"] = arch
        return data
    data = yaml.safe_load((EXAMPLES / "din.yaml").read_text())
    data["data"] = {"synthetic": {"train_samples": 2048, "eval_samples": 1024}}
    data["export"] = {"table_dtypes": dtypes, "store": {**STORE, "tables": stored}}
    return data


# dlrm's pooling is [B, F, D], dcn_v2's flat; with t3 in the model, and every table stored.
# din: its sequence table (candidate and history, unpooled) and one pooled table stored, the
# other pooled tables in the model.
@pytest.mark.parametrize("arch, stored", [("dlrm", ["t0", "t1", "t2"]),
                                          ("dcn_v2", ["t0", "t1", "t2", "t3"]),
                                          ("din", ["item", "t1"])])  # fmt: skip
def test_stored_tables_score_as_in_process_bit_for_bit(cluster, tmp_path, arch, stored):
    data = _config(arch, stored)
    run = write_seeded_run(tmp_path / "run", data)
    out = rec_in_process("export", str(run), "--repo", str(tmp_path / "tiered"), "--store",
                         cluster.url(), check=True)  # fmt: skip
    assert re.search(r"[0-9.]+ [kMG]?B of Redis memory per copy", out.stdout), out.stdout
    rec_in_process("export", str(run), "--repo", str(tmp_path / "plain"), check=True)  # every table
    tiered_dir, plain_dir = (
        ModelDir.of(tmp_path / "tiered", "rec").version(1),
        ModelDir.of(tmp_path / "plain", "rec").version(1),
    )
    tiered = json.loads(manifest_in(tiered_dir).read_text())
    plain = json.loads(manifest_in(plain_dir).read_text())
    section = tiered["store"]
    contract.check_section(section)
    assert set(section["tables"]) == set(stored)
    if "t0" in stored:
        assert section["tables"]["t0"]["partitions"] == 7
        assert section["tables"]["t0"]["dtype"] == "int4"
    assert set(tiered["updates"]["tables"]) == {t["name"] for t in data["tables"]} - set(stored)
    client = connect(cluster.url())
    prefix = section["prefix"]
    for table, spec in section["tables"].items():
        rows = stored_rows(client, prefix, table, spec)
        assert sorted(rows) == list(range(spec["rows"])), table
        got = np.stack([np.frombuffer(rows[r], dtype=np.uint8) for r in range(spec["rows"])])
        want = model_rows(plain_dir, plain, table)
        assert got.shape == want.shape and (got == want).all(), f"{table}: rows differ"
    meta = client.hgetall(contract.meta_key(prefix))
    assert meta[b"step"] == b"10" and meta[b"format"] == contract.FORMAT.encode()

    # The tiered model, rows read from the store, scores as the in-process one, bit for bit.
    from rec.contract.requests import random_request
    from rec.export.tiered import TieredScorer
    from rec.store.reader import StoreReader

    reader = StoreReader(section)
    scorer = TieredScorer(torch.jit.load(str(model_file_in(tiered_dir))), reader)
    in_process = torch.jit.load(str(model_file_in(plain_dir)))
    features = tiered["features"]
    for batch in (1, 37, 256):
        request = random_request(len(features["dense"]), len(features["sparse"]), batch, batch)
        args = [torch.from_numpy(a) for a in request.values()]
        want, got = in_process(*args), scorer(*args)
        assert torch.equal(got, want), (batch, (got - want).abs().max())
    # And so does rec-server, over its cache and its own cluster client.
    rows = synthetic_rows(len(features["dense"]), len(features["sparse"]), batch=37, seed=3)
    with torch.inference_mode():
        want = in_process(*(torch.from_numpy(a) for a in (rows.dense, rows.lengths, rows.values)))
    with start_cpp(tmp_path / "tiered", http_port=0, grpc_port=0, metrics_port=0) as server:
        served = ScoreClient(server.endpoints.grpc, "grpc")
        try:
            assert np.array_equal(served.score(rows), want.numpy())
        finally:
            served.close()

    # Exporting over the served version (--force on version 1) must not touch its rows.
    before = client.hgetall(contract.partition_key(prefix, "t1", 0))
    again = rec_in_process("export", str(run), "--repo", str(tmp_path / "tiered"), "--store",
                           cluster.url(), "--version", "1", "--force")  # fmt: skip
    assert again.returncode == 2, again.stdout
    assert "exist already" in again.stdout and prefix in again.stdout
    assert client.hgetall(contract.partition_key(prefix, "t1", 0)) == before
    reader.close()
    client.close()


def test_a_failed_export_leaves_no_keys_behind(cluster, tmp_path):
    # The export stops after its tables were streamed (into the store too), before it commits:
    # no repository will name those keys, so they must go again.
    from rec.export.pipeline import export_run
    from rec.export.store import run_tag

    run = write_seeded_run(tmp_path / "run", tiny_dict(store=STORE))
    seen: list[str] = []

    def log(line: str) -> None:
        seen.append(line)
        if "built, scored and reloaded" in line:
            raise RuntimeError("stopped between streaming and commit")

    with pytest.raises(RuntimeError, match="stopped between"):
        export_run(run, tmp_path / "repo", store=cluster.url(), log=log)
    assert any(line.startswith("store: 3 tables") for line in seen), seen
    prefix = contract.prefix("rec", 1, run_tag(run))
    client = connect(cluster.url())
    assert not client.exists(contract.meta_key(prefix))
    for table, parts in (("t0", 7), ("t1", 4), ("t2", 4)):
        for p in range(parts):
            assert not client.exists(contract.partition_key(prefix, table, p)), (table, p)
    client.close()


def test_the_memory_plan_is_what_redis_uses(cluster):
    rows, dim = 120_000, 64
    masters = cluster.masters()

    def used() -> int:  # one copy: the masters' (replicas copy them at their own pace)
        memory = cluster.used_memory()
        return sum(memory[m.address] for m in masters)

    before = used()
    for dtype, parts in (("int8", 8), ("int4", 3)):
        spec = {"t": {"dim": dim, "dtype": dtype, "partitions": parts}}
        sink = StoreSink(cluster.url(), f"plan:{dtype}", spec)
        for start in range(0, rows, 50_000):
            sink.write("t", start, torch.randn(min(50_000, rows - start), dim))
        sink.close()
    planned = sum(table_cost(rows, dim, d, p).bytes for d, p in (("int8", 8), ("int4", 3)))
    assert 0.85 < planned / (used() - before) < 1.15, (planned, used() - before)


def test_a_bad_store_url_is_refused_by_name(tmp_path):
    cases = {
        "redis://h:6379/0": "not HOST:PORT",
        "http://h:6379": "want redis://",
        "redis://h:99999": "not HOST:PORT",
        "redis://h:1,:2": "not HOST:PORT",
    }
    for url, message in cases.items():
        with pytest.raises(contract.StoreError, match=message):
            contract.parse_store_url(url)
    # And from the command line: exit 2 and the reason, no traceback.
    run = write_seeded_run(tmp_path / "run", tiny_dict(store=STORE))
    out = rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"), "--store",
                         "redis://h:6379/0")  # fmt: skip
    assert out.returncode == 2 and "not HOST:PORT" in out.stdout, out.stdout
    assert "Traceback" not in out.stdout
    # A format the store does not serve yet is refused by name, before any store is asked.
    out = rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"), "--format",
                         "onnx", "--store", "redis://127.0.0.1:1")  # fmt: skip
    assert out.returncode == 2 and "export.format is 'onnx'" in out.stdout, out.stdout
    assert (
        "Traceback" not in out.stdout
        and not ModelDir.of(tmp_path / "repo", "rec").version(1).exists()
    )


def test_an_unreachable_store_is_an_error_before_any_work(tmp_path):
    from rec.broker import _free_port

    run = write_seeded_run(tmp_path / "run", tiny_dict(store=STORE))
    url = f"redis://127.0.0.1:{_free_port('127.0.0.1')}"
    out = rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"), "--store", url)
    assert out.returncode == 2 and "cannot reach the cluster" in out.stdout, out.stdout
    assert not ModelDir.of(tmp_path / "repo", "rec").version(1).exists()


def test_the_plan_sizes_the_store_and_the_cache(tmp_path):
    from click.testing import CliRunner

    from rec.cli import main
    from rec.store.plan import rows_for_hit_rate
    from tests.helpers import write_config

    # The cache's rows for a hit rate: the exact Zipf sums agree with the approximation.
    for alpha in (1.05, 1.2):
        weights = np.arange(1, 200_001, dtype=np.float64) ** -alpha
        share = np.cumsum(weights) / weights.sum()
        for rate in (0.5, 0.9):
            exact = int(np.searchsorted(share, rate)) + 1
            assert abs(rows_for_hit_rate(200_000, alpha, rate) - exact) <= 0.01 * exact + 1
    config = write_config(tmp_path / "c.yaml", tiny_dict(store={**STORE, "min_bytes": 0}))
    out = CliRunner().invoke(main, ["plan", "-c", str(config), "--store-masters", "3",
                                    "--store-replicas", "2", "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)["store"]
    assert set(plan["tables"]) == {"t0", "t1", "t2"} and plan["nodes"] == 9
    per_copy = sum(
        table_cost(t["rows"], t["dim"], t["dtype"], t["partitions"]).bytes
        for t in plan["tables"].values()
    )
    assert plan["store_bytes_per_copy"] == per_copy
    assert plan["store_bytes_all_copies"] == 3 * per_copy
    assert plan["bytes_per_node"] == -(-per_copy // 3)


def test_rec_store_cluster_runs_one_until_interrupted(tmp_path):
    """`rec store cluster`, the local cluster to try the store with: its URL on stdout, a
    cluster that takes writes, and every node gone after Ctrl-C (SIGINT)."""
    proc = subprocess.Popen([REC, "store", "cluster", str(tmp_path / "c"), "--replicas", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = proc.stdout.readline().strip()  # "" if it exited first
        assert url.startswith("redis://"), proc.stderr.read() if proc.poll() is not None else url
        client = connect(url)
        client.hset("{t}:0", "1", b"row")
        assert client.hget("{t}:0", "1") == b"row"
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()
    for host, port in contract.parse_store_url(url).nodes:
        with pytest.raises(OSError), socket.create_connection((host, port), timeout=2):
            pass
