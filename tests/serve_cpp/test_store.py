"""rec-server serving a model whose large tables are in the embedding store (#35), with the real
parts: our own 3-master, 3-replica Redis Cluster, `rec export --store`, rec-server over HTTP and
gRPC. Its scores must be the in-process model's (the same run exported without the store), bit
for bit; what the store cannot give is an error that names it, never a zero row."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import infer_inputs
from server import Server
from tritonclient.utils import InferenceServerException

import rec.ops  # noqa: F401  (model.pt's dense layers, before torch.jit.load)
from rec import netns
from rec.broker import RedisBroker, _free_port, redis_server_path
from rec.contract import MANIFEST_FILE
from rec.contract import store as contract
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode, row_bytes
from rec.export.tiered import TieredScorer
from rec.serve.cpp import not_ready
from rec.store.client import connect
from rec.store.cluster import RedisCluster
from rec.store.reader import StoreReader
from tests.export.conftest import tiny_dict, write_seeded_run
from tests.helpers import rec_in_process, run_rec
from tests.store.bad_answers import bad_answers

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)
STORE = {"tables": ["t0", "t1", "t2"], "partitions": 4, "table_partitions": {"t0": 7}}


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """(cluster, tiered repository, the in-process model.pt of the same run, hosts). The cluster
    runs on 3 network-namespace hosts (a master and a replica of another on each) where this
    machine can make them (root), else on this host (hosts None)."""
    tmp = tmp_path_factory.mktemp("tier")
    with contextlib.ExitStack() as stack:
        hosts = None if netns.unavailable() else stack.enter_context(netns.Hosts(3))
        where = {} if hosts is None else {
            "hosts": [hosts.address(i) for i in range(3)],
            "prefixes": [hosts.prefix(i) for i in range(3)],
        }  # fmt: skip
        cluster = stack.enter_context(RedisCluster(tmp / "cluster", 3, 1, **where))
        data = tiny_dict(table_dtypes={"t0": "int4", "t1": "fp16"}, store=STORE)
        run = write_seeded_run(tmp / "run", data)
        rec_in_process("export", str(run), "--repo", str(tmp / "tiered"), "--store", cluster.url(),
                       check=True)  # fmt: skip
        rec_in_process("export", str(run), "--repo", str(tmp / "plain"), check=True)
        plain = torch.jit.load(str(ModelDir.of(tmp / "plain", "rec").model_file(1)))
        yield cluster, tmp / "tiered", plain, hosts


def scores(module, server: Server, request: dict) -> np.ndarray:
    url = server.http if module is httpclient else server.grpc
    with module.InferenceServerClient(url) as client:
        return client.infer("rec", infer_inputs(module, request)).as_numpy("scores")


def test_served_scores_are_the_in_process_models_bit_for_bit(tier):
    cluster, repo, plain, _ = tier
    server = Server(repo, "--store-cache-bytes", str(4 << 10))  # small: evictions happen
    try:
        for batch, module in ((1, httpclient), (37, grpcclient), (256, httpclient)):
            for seed in range(3):
                request = random_request(4, 5, batch, seed=seed)
                want = plain(*[torch.from_numpy(a) for a in request.values()]).numpy()
                got = scores(module, server, request)
                assert np.array_equal(got, want), (batch, seed, np.abs(got - want).max())
        # Served through the cache and the store, from more than one node.
        assert server.metric("rec_store_cache_hits_total") > 0
        assert server.metric("rec_store_cache_misses_total") > 0
        assert server.metric("rec_store_cache_bytes") <= 4 << 10
        nodes = server.metric("rec_store_node_requests_total")
        assert nodes >= server.metric("rec_store_lookups_total") > 0
        with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        asked = set(re.findall(r'^rec_store_node_requests_total\{[^}]*node="([^"]+)"', text, re.M))
        assert len(asked) >= 2, asked  # the partitions spread over the masters
    finally:
        server.stop()


def a_stored_row(repo, request: dict) -> tuple[str, int, str]:
    """(table, row, partition hash key) of a store row that `request` reads (the model's keys)."""
    section = json.loads(ModelDir.of(repo, "rec").version_manifest(1).read_text())["store"]
    keys = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1))).store_ids(
        torch.from_numpy(request["sparse_lengths"]), torch.from_numpy(request["sparse_values"])
    )
    key = int(keys[0])
    table, row = contract.store_order(section)[key >> 40], key & ((1 << 40) - 1)
    partition = row % section["tables"][table]["partitions"]
    return table, row, contract.partition_key(section["prefix"], table, partition)


def test_bad_store_answers_are_errors_that_name_them(tier):
    """A row gone, its whole partition hash gone, a row of the wrong size: each fails the
    request (HTTP 500, gRPC INTERNAL) with a message naming the row, the table and the hash,
    never a zero or truncated row; put back, the same request scores right."""
    cluster, repo, plain, _ = tier
    request = random_request(4, 5, 8, seed=11)
    want = plain(*[torch.from_numpy(a) for a in request.values()]).numpy()
    table, row, hash_key = a_stored_row(repo, request)
    client = connect(cluster.url())
    saved = client.hgetall(hash_key)
    faults = bad_answers(client, hash_key, table, row)
    server = Server(repo, "--store-cache-bytes", "0")  # every request reads the store
    try:
        for fault, (break_it, named) in faults.items():
            break_it()
            for module, status in ((httpclient, "500"), (grpcclient, "StatusCode.INTERNAL")):
                with pytest.raises(InferenceServerException) as err:
                    scores(module, server, request)
                assert named in str(err.value), (fault, str(err.value))
                assert err.value.status() == status, (fault, str(err.value))
            client.hset(hash_key, mapping=saved)
            assert np.array_equal(scores(httpclient, server, request), want), fault
        assert server.metric("rec_store_failed_lookups_total") >= 2 * len(faults)
    finally:
        server.stop()
        client.hset(hash_key, mapping=saved)
        client.close()


def test_a_slot_moved_mid_request_is_followed_and_scores_right(tier):
    """Resharding under the server, one slot: while it migrates, its old owner answers ASK for
    the partition hash (rec-server asks the importing node, ASKING first); once moved, MOVED
    (rec-server reloads the slot map). Every score is the in-process model's, none fails."""
    cluster, repo, plain, _ = tier
    request = random_request(4, 5, 8, seed=11)
    want = plain(*[torch.from_numpy(a) for a in request.values()]).numpy()
    _, _, hash_key = a_stored_row(repo, request)
    source = cluster.owner(hash_key)
    target = next(m for m in cluster.masters() if m is not source)
    server = Server(repo, "--store-cache-bytes", "0")
    try:
        assert np.array_equal(scores(httpclient, server, request), want)
        slot = cluster.start_moving(hash_key, target)
        # The old owner redirects: a client that treats ASK as MOVED finds the slot map
        # unchanged, retries until its deadline and fails.
        with pytest.raises(redis.exceptions.AskError):
            redis.Redis(source.host, source.port).hgetall(hash_key)
        asked = server.metric("rec_store_node_requests_total", node=target.address)
        for module in (httpclient, grpcclient):
            assert np.array_equal(scores(module, server, request), want)
        assert server.metric("rec_store_node_requests_total", node=target.address) > asked
        cluster.finish_moving(slot, target)
        assert cluster.owner(hash_key) is target
        for module in (grpcclient, httpclient):
            assert np.array_equal(scores(module, server, request), want)
        assert server.metric("rec_store_failed_lookups_total") == 0
    finally:
        server.stop()


def test_an_unreachable_store_leaves_the_model_not_ready_naming_it(tier, tmp_path):
    """The server comes up, the model is not ready and says why (readiness, inference, the
    repository index), and the load is retried: rec.json pointed back at the live cluster makes
    it ready without a restart, scoring as the in-process model does."""
    cluster, repo, plain, _ = tier
    moved = tmp_path / "repo"
    shutil.copytree(repo, moved)
    dead = f"redis://127.0.0.1:{_free_port('127.0.0.1')}"
    manifests = list(moved.glob(f"rec/**/{MANIFEST_FILE}"))
    for manifest in manifests:
        data = json.loads(manifest.read_text())
        data["store"]["url"] = dead
        manifest.write_text(json.dumps(data))
    server = Server(moved)
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{server.http}/v2/models/rec/ready", timeout=10)
        body = err.value.read().decode()
        assert err.value.code == 503 and f"embedding store {dead}" in body, body
        assert "unreachable" in body and body.count("embedding store") == 1, body  # named once
        reason = not_ready(server.http)  # what `rec serve` prints instead of "ready"
        assert reason.startswith("model 'rec': embedding store") and dead in reason, reason
        request = random_request(4, 5, 3, seed=2)
        c = httpclient.InferenceServerClient(server.http)
        with pytest.raises(InferenceServerException) as failed:
            c.infer("rec", infer_inputs(httpclient, request))
        assert "not ready" in str(failed.value) and dead in str(failed.value), str(failed.value)
        with grpcclient.InferenceServerClient(server.grpc) as c:
            index = c.get_model_repository_index(as_json=True)["models"]
            assert index[0]["state"] == "UNAVAILABLE" and dead in index[0]["reason"], index
            with pytest.raises(InferenceServerException) as failed:
                c.infer("rec", infer_inputs(grpcclient, request))
        assert failed.value.status() == "StatusCode.UNAVAILABLE", failed.value.status()
        for manifest in manifests:  # the store is back (here: rec.json names the live one)
            data = json.loads(manifest.read_text())
            data["store"]["url"] = cluster.url()
            manifest.write_text(json.dumps(data))
        deadline = time.monotonic() + 30
        while not httpclient.InferenceServerClient(server.http).is_model_ready("rec"):
            assert time.monotonic() < deadline, server.stderr()[-2000:]
            time.sleep(0.2)
        want = plain(*[torch.from_numpy(a) for a in request.values()]).numpy()
        assert np.array_equal(scores(httpclient, server, request), want)
        assert not_ready(server.http) is None
    finally:
        server.stop()


def _shifted_rows(client, section: dict, table: str, ids: list[int]) -> bytes:
    """Valid rows for `ids` that differ from theirs: each id gets the next stored row."""
    spec = section["tables"][table]

    def row(i: int) -> bytes:
        key = contract.partition_key(section["prefix"], table, i % spec["partitions"])
        return client.hget(key, str(i))

    return b"".join(row((i + 1) % spec["rows"]) for i in ids)


def test_fresh_rows_reach_the_cache_at_once_and_the_store_through_the_follower(tier, tmp_path):
    """A record of a stored table in the update log: rec-server writes its rows into its row
    cache as it applies it (scores change at once, with the follower not running yet), then
    `rec store follow` writes them into the store, where a server that does not read the log
    finds them. Both score as the tiered model does over the updated store, bit for bit; a
    record of the wrong row format is refused by both."""
    cluster, repo, _, _ = tier
    manifest = json.loads(ModelDir.of(repo, "rec").version_manifest(1).read_text())
    section, updates = manifest["store"], manifest["updates"]
    table = "t0"
    spec = section["tables"][table]
    width = spec["row_bytes"]
    broker = RedisBroker(tmp_path / "broker")
    client = connect(cluster.url())
    url = broker.url("rec:updates")
    ids = list(range(0, spec["rows"], 2))

    def key(i: int) -> str:
        return contract.partition_key(section["prefix"], table, i % spec["partitions"])

    old = [client.hget(key(i), str(i)) for i in ids]
    step = int(updates["step"]) + 1
    rows = _shifted_rows(client, section, table, ids)
    record = UpdateRecord("r1", 1, 0, 1, step, time.time_ns(), True, table, spec["dtype"],
                          spec["dim"], tuple(ids), rows)  # fmt: skip
    wide = spec["dim"] * 2
    bad = UpdateRecord("r1", 1, 0, 1, step, time.time_ns(), False, table, spec["dtype"], wide,
                       (1,), bytes(row_bytes(wide, spec["dtype"])))  # fmt: skip
    server = Server(repo, "--updates", url)
    try:
        request = random_request(4, 5, 64, seed=11)
        before = scores(httpclient, server, request)
        with redis.Redis(port=broker.port) as log:
            log.xadd("rec:updates", encode(bad))
            log.xadd("rec:updates", encode(record))
        server.wait_for_metric("rec_store_cache_refreshed_rows_total", len(ids), timeout=30)
        cached = scores(httpclient, server, request)
        assert not np.array_equal(cached, before)
        assert client.hget(key(ids[1]), str(ids[1])) == old[1]  # not in the store yet
        out = run_rec("store", "follow", str(repo), "--updates", url, "--idle-exit-s", "1").stdout
        assert f"{len(ids)} rows into {cluster.url()}" in out and "1 refused" in out, out
        assert "refused: row format" in out, out
        assert client.hget(key(ids[1]), str(ids[1])) == rows[width : 2 * width]
        model = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
        reader = StoreReader(section)
        try:
            want = TieredScorer(model, reader)(*[torch.from_numpy(a) for a in request.values()])
        finally:
            reader.close()
        assert np.array_equal(cached, want.numpy())
        no_log = Server(repo, "--updates", "none", "--store-cache-bytes", "0")
        try:
            assert np.array_equal(scores(grpcclient, no_log, request), want.numpy())
        finally:
            no_log.stop()
        text = urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10).read()
        assert b'outcome="row_format"' in text, text
    finally:
        server.stop()
        for i, value in zip(ids, old, strict=True):  # the export's rows, for the tests after
            client.hset(key(i), str(i), value)
        client.close()
        broker.stop()


def test_a_master_killed_under_load_fails_over_and_no_score_is_wrong(tier):
    """Last in this file: it leaves the cluster failed over. Every row comes from the store (no
    cache); two clients score the same 20 requests again and again while one master is
    SIGKILLed. Redis Cluster promotes its replica (node timeout 2 s) and rec-server follows the
    new slot map: requests meanwhile either wait out the failover or fail with 503 naming the
    store, and not one score differs from the in-process model's."""
    cluster, repo, plain, hosts = tier
    if hosts is None:
        pytest.skip(f"the cluster is not on namespace hosts: {netns.unavailable()}")
    requests = [random_request(4, 5, 16, seed=100 + i) for i in range(20)]
    expected = [plain(*[torch.from_numpy(a) for a in r.values()]).numpy() for r in requests]
    server = Server(repo, "--store-cache-bytes", "0")
    results: list[tuple[float, str]] = []  # (time, "ok" | "wrong" | the error)
    stop = threading.Event()

    def client(offset: int) -> None:
        with httpclient.InferenceServerClient(server.http, connection_timeout=30.0,
                                              network_timeout=30.0) as c:  # fmt: skip
            k = offset
            while not stop.is_set():
                i = k % len(requests)
                k += 1
                try:
                    got = c.infer("rec", infer_inputs(httpclient, requests[i])).as_numpy("scores")
                    results.append((time.monotonic(), "ok" if np.array_equal(got, expected[i])
                                    else "wrong"))  # fmt: skip
                except Exception as e:  # the server's error response
                    results.append((time.monotonic(), str(e)))

    threads = [threading.Thread(target=client, args=(o,)) for o in (0, 7)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        victim = cluster.masters()[0]
        killed = time.monotonic()
        cluster.kill(victim)
        # Failed over once 3 masters are alive again (the others call the cluster ok until
        # they notice the loss, after the node timeout).
        deadline = time.monotonic() + 30
        while len(cluster.masters()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.wait_ok(timeout=30)
        recovered = time.monotonic()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        server.stop()
    outcomes = [r for _, r in results]
    failed = [r for r in outcomes if r not in ("ok", "wrong")]
    assert outcomes.count("wrong") == 0
    assert sum(1 for t, r in results if t < killed and r == "ok") > 0
    assert sum(1 for t, r in results if t > recovered and r == "ok") > 0, failed[-3:]
    for message in failed:
        assert message.count("embedding store") == 1 and "503" in message, message
    print(
        f"failover of {victim.address}: {len(outcomes)} requests, {len(failed)} failed with 503, "
        f"{recovered - killed:.1f} s to cluster_state ok"
    )
