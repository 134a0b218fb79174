"""rec's Triton model serving a version whose large tables are in the embedding store (#35,
docs/store.md), with the real parts: our own 3-master, 3-replica Redis Cluster
(rec.store.cluster), `rec export --store`, and the real tritonserver (nvidia-pytriton) running
serve/triton_python_model.py, which reads the rows of each batch from the cluster.

The reference is the same run exported without the store, its model.pt loaded in this process:
Triton's scores must equal its scores bit for bit, over HTTP and gRPC. A row the store does not
have fails the request with an error naming the row, never a zero row. One Triton for the module.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.request

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, before torch.jit.load)
from rec.broker import RedisBroker, _free_port
from rec.contract import DENSE, LENGTHS, MANIFEST_FILE, VALUES, parse_manifest
from rec.contract import store as contract
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode
from rec.export.tiered import TieredScorer
from rec.serve.client import ScoreClient
from rec.serve.repository import ServeError
from rec.serve.triton import start_triton
from rec.store.client import connect
from rec.store.cluster import RedisCluster
from rec.store.follow import StoreFollower
from rec.store.reader import StoreReader
from tests.export.conftest import tiny_dict, write_seeded_run
from tests.helpers import rec_in_process
from tests.serve_triton.servers import TRITON_AND_REDIS
from tests.store.bad_answers import bad_answers

pytestmark = TRITON_AND_REDIS
STORE = {"tables": ["t0", "t1", "t2"], "partitions": 4}
NUM_DENSE, NUM_SPARSE = 4, 5  # tests.export.conftest's tiny model


class Tier:
    """The cluster, the tiered repository, the plain export's model.pt and Triton serving the
    tiered one."""

    def __init__(self, tmp, cluster: RedisCluster) -> None:
        self.cluster = cluster
        data = tiny_dict(table_dtypes={"t0": "int4", "t1": "fp16"}, store=STORE)
        run = write_seeded_run(tmp / "run", data)
        self.repo = tmp / "tiered"
        rec_in_process("export", str(run), "--repo", str(self.repo), "--store",
                       self.cluster.url(), check=True)  # fmt: skip
        rec_in_process("export", str(run), "--repo", str(tmp / "plain"), check=True)
        self.manifest = json.loads(ModelDir.of(self.repo, "rec").version_manifest(1).read_text())
        self.plain = torch.jit.load(str(ModelDir.of(tmp / "plain", "rec").model_file(1)))
        self.tiered = torch.jit.load(str(ModelDir.of(self.repo, "rec").model_file(1)))
        # No row cache here: every batch reads the store (a row deleted from it is missed).
        self.server = start_triton(self.repo, http_port=0, grpc_port=0, metrics_port=0,
                                   store_cache_bytes=0)  # fmt: skip

    def want(self, request: dict) -> np.ndarray:
        with torch.inference_mode():
            return self.plain(*(torch.from_numpy(request[n]) for n in (DENSE, LENGTHS, VALUES)))


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tier")
    with RedisCluster(tmp / "cluster", masters=3, replicas=1) as cluster:
        t = Tier(tmp, cluster)
        try:
            yield t
        finally:
            code = t.server.stop()  # finalize() closes the store's client: a clean exit
    assert code == 0, t.server.log_tail()


def infer(module, server, request: dict) -> np.ndarray:
    url = server.endpoints.http if module is httpclient else server.endpoints.grpc
    inputs = []
    for name, datatype in ((DENSE, "FP32"), (LENGTHS, "INT32"), (VALUES, "INT64")):
        i = module.InferInput(name, list(request[name].shape), datatype)
        i.set_data_from_numpy(request[name])
        inputs.append(i)
    with module.InferenceServerClient(url) as client:
        return client.infer("rec", inputs).as_numpy("scores")


def test_triton_scores_as_the_in_process_model_bit_for_bit(tier):
    store = tier.manifest["store"]
    assert sorted(store["tables"]) == STORE["tables"] and store["url"] == tier.cluster.url()
    # The update log's layout lists the in-process table only: the log does not write the store.
    assert set(tier.manifest["updates"]["tables"]) == {"t3"}
    buffer = tier.manifest["updates"]["tables"]["t3"]["buffer"]
    assert buffer in dict(tier.tiered.named_buffers())  # where the model's log reader writes
    # model.pt's plain forward refuses: every score below went through the store.
    request = random_request(NUM_DENSE, NUM_SPARSE, 4, seed=0)
    with pytest.raises(torch.jit.Error, match="embedding store"):
        tier.tiered(*(torch.from_numpy(request[n]) for n in (DENSE, LENGTHS, VALUES)))
    for batch, module in ((1, httpclient), (37, grpcclient), (256, httpclient), (5, grpcclient)):
        for seed in range(2):
            request = random_request(NUM_DENSE, NUM_SPARSE, batch, seed=seed)
            want = tier.want(request).numpy()
            got = infer(module, tier.server, request)
            assert got.dtype == np.float32 and got.shape == want.shape
            assert np.array_equal(got, want), (batch, seed, np.abs(got - want).max())
    # The load-time batch probe ran, through the store (forward would have raised).
    assert "batch_probe" in tier.manifest and tier.manifest["dense"]["batch_invariant"]
    with urllib.request.urlopen(f"http://{tier.server.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert re.search(r'^rec_model_batch_variant\{[^}]*model="rec"[^}]*\} 0$', text, re.M), text


def ids(tier, request: dict) -> list[int]:
    """The store keys (table << 40 | row) that `request` reads."""
    lengths, values = (torch.from_numpy(request[n]) for n in (LENGTHS, VALUES))
    return tier.tiered.store_ids(lengths, values).tolist()


def a_stored_row(tier, request: dict) -> tuple[int, str, int, str]:
    """(key, table, row, partition hash key) of a store row that `request` reads."""
    store = tier.manifest["store"]
    keys = ids(tier, request)
    key = keys[len(keys) // 2]
    table, row = contract.store_order(store)[key >> 40], key & ((1 << 40) - 1)
    partition = row % store["tables"][table]["partitions"]
    return key, table, row, contract.partition_key(store["prefix"], table, partition)


def test_bad_store_answers_fail_the_request_naming_them(tier):
    """A row gone, its partition hash gone, a row of the wrong size: each fails its request
    (HTTP 500, gRPC INTERNAL) naming the row, the table and the hash; Triton keeps serving."""
    store = tier.manifest["store"]
    request = random_request(NUM_DENSE, NUM_SPARSE, 8, seed=11)
    key, table, row, hash_key = a_stored_row(tier, request)
    client = connect(store["url"])
    saved = client.hgetall(hash_key)
    assert len(saved[str(row).encode()]) == store["tables"][table]["row_bytes"]
    faults = bad_answers(client, hash_key, table, row)
    try:
        for fault, (break_it, named) in faults.items():
            break_it()
            for module, status in ((httpclient, "500"), (grpcclient, "StatusCode.INTERNAL")):
                with pytest.raises(InferenceServerException) as err:
                    infer(module, tier.server, request)
                message = str(err.value)
                assert named in message, (fault, message)
                assert f"embedding store {store['url']}: row" in message, message
                assert err.value.status() == status, message
            client.hset(hash_key, mapping=saved)
        # Triton kept serving: another request, and this one with its rows back.
        other = next(r for r in (random_request(NUM_DENSE, NUM_SPARSE, 3, seed=s)
                                 for s in range(12, 100)) if key not in ids(tier, r))  # fmt: skip
        assert np.array_equal(infer(grpcclient, tier.server, other), tier.want(other).numpy())
    finally:
        client.hset(hash_key, mapping=saved)
        client.close()
    assert np.array_equal(infer(httpclient, tier.server, request), tier.want(request).numpy())


def test_a_slot_moved_mid_request_is_followed_and_scores_right(tier):
    """One slot resharded under Triton: ASK while it migrates, MOVED after; redis-py's cluster
    pipeline follows both, and every score is the in-process model's."""
    request = random_request(NUM_DENSE, NUM_SPARSE, 8, seed=11)
    want = tier.want(request).numpy()
    hash_key = a_stored_row(tier, request)[3]
    source = tier.cluster.owner(hash_key)
    target = next(m for m in tier.cluster.masters() if m is not source)
    slot = tier.cluster.start_moving(hash_key, target)
    for module in (httpclient, grpcclient):
        assert np.array_equal(infer(module, tier.server, request), want)
    tier.cluster.finish_moving(slot, target)
    assert tier.cluster.owner(hash_key) is target
    for module in (grpcclient, httpclient):
        assert np.array_equal(infer(module, tier.server, request), want)


def metric(server, name: str) -> float:
    with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(rf'^{name}\{{[^}}]*model="rec"[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(v) for v in found) if found else -1.0


def test_the_cache_serves_repeats_and_takes_fresh_rows_from_the_log(tier, tmp_path):
    """A second Triton with a row cache and the update log: a repeated request is answered from
    the cache (rec_store_* metrics), a record of a stored table changes the scores before the
    store has its rows, and they equal the tiered model's over the store once the follower has
    written them."""
    store, updates = tier.manifest["store"], tier.manifest["updates"]
    spec = store["tables"]["t0"]
    client = connect(store["url"])

    def key(i: int) -> str:
        return contract.partition_key(store["prefix"], "t0", i % spec["partitions"])

    ids = list(range(spec["rows"]))
    old = [client.hget(key(i), str(i)) for i in ids]
    shifted = b"".join(old[(i + 1) % len(ids)] for i in ids)  # valid rows, each another's
    record = UpdateRecord("r1", 1, 0, 1, int(updates["step"]) + 1, time.time_ns(), True, "t0",
                          spec["dtype"], spec["dim"], tuple(ids), shifted)  # fmt: skip
    broker = RedisBroker(tmp_path / "broker")
    url = broker.url("rec:updates")
    server = start_triton(tier.repo, http_port=0, grpc_port=0, metrics_port=0, updates=url,
                          store_cache_bytes=1 << 20)  # fmt: skip
    try:
        request = random_request(NUM_DENSE, NUM_SPARSE, 16, seed=21)
        first = infer(httpclient, server, request)
        assert np.array_equal(first, tier.want(request).numpy())
        misses = metric(server, "rec_store_cache_misses_total")
        assert np.array_equal(infer(grpcclient, server, request), first)
        assert metric(server, "rec_store_cache_misses_total") == misses > 0
        assert metric(server, "rec_store_cache_hits_total") >= misses
        with redis.Redis(port=broker.port) as log:
            log.xadd("rec:updates", encode(record))
        deadline = time.monotonic() + 30
        while metric(server, "rec_store_cache_refreshed_rows_total") < len(ids):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        fresh = infer(httpclient, server, request)
        assert not np.array_equal(fresh, first)
        follower = StoreFollower(parse_manifest(tier.manifest), url, log=lambda line: None)
        assert follower.run(threading.Event(), idle_exit_s=1.0).rows == len(ids)
        follower.close()
        reader = StoreReader(store)
        try:
            args = [torch.from_numpy(request[n]) for n in (DENSE, LENGTHS, VALUES)]
            want = TieredScorer(tier.tiered, reader)(*args).numpy()
        finally:
            reader.close()
        assert np.array_equal(fresh, want)
    finally:
        assert server.stop() == 0, server.log_tail()
        for i, value in zip(ids, old, strict=True):
            client.hset(key(i), str(i), value)
        client.close()
        broker.stop()


def test_an_unreachable_store_leaves_the_model_not_ready_naming_it(tier, tmp_path):
    """Triton comes up with the model not ready, and the reason is in its repository index and in
    `not_ready` (which `rec serve` prints). The load is retried every 2 s: rec.json pointed back
    at the live cluster makes the model ready without a restart, scoring as in process."""
    moved = tmp_path / "repo"
    shutil.copytree(tier.repo, moved)
    dead = f"redis://127.0.0.1:{_free_port('127.0.0.1')}"
    manifests = list(moved.glob(f"rec/**/{MANIFEST_FILE}"))
    for manifest in manifests:
        data = json.loads(manifest.read_text())
        data["store"]["url"] = dead
        manifest.write_text(json.dumps(data))
    server = start_triton(moved, http_port=0, grpc_port=0, metrics_port=0, store_cache_bytes=0)
    try:
        assert server.not_ready and f"embedding store {dead} unreachable" in server.not_ready
        with grpcclient.InferenceServerClient(server.endpoints.grpc) as c:
            (entry,) = c.get_model_repository_index(as_json=True)["models"]
            assert entry["state"] == "UNAVAILABLE" and dead in entry["reason"], entry
            assert not c.is_model_ready("rec")
        request = random_request(NUM_DENSE, NUM_SPARSE, 3, seed=2)
        with pytest.raises(InferenceServerException):  # Triton: no version of 'rec' available
            infer(httpclient, server, request)
        for protocol in ("http", "grpc"):  # rec predict's client adds the index's reason
            client = ScoreClient(getattr(server.endpoints, protocol), protocol)
            with pytest.raises(ServeError, match=f"UNAVAILABLE: .*embedding store {dead}"):
                client.model_config()
            client.close()
        for manifest in manifests:  # the store is back (here: rec.json names the live one)
            data = json.loads(manifest.read_text())
            data["store"]["url"] = tier.cluster.url()
            manifest.write_text(json.dumps(data))
        deadline = time.monotonic() + 60
        with httpclient.InferenceServerClient(server.endpoints.http) as c:
            while server.not_ready is not None or not c.is_model_ready("rec"):
                assert time.monotonic() < deadline, (server.not_ready, server.log_tail())
                time.sleep(0.2)
        assert np.array_equal(infer(grpcclient, server, request), tier.want(request).numpy())
    finally:
        assert server.stop() == 0, server.log_tail()


def test_a_store_that_is_gone_fails_the_request_naming_it(tier):
    """Last in the module: the whole cluster killed. The request fails with UNAVAILABLE naming
    the store, and Triton still answers (its model is not lost)."""
    for node in tier.cluster.nodes:
        tier.cluster.kill(node)
    request = random_request(NUM_DENSE, NUM_SPARSE, 2, seed=3)
    for module, status in ((httpclient, "503"), (grpcclient, "StatusCode.UNAVAILABLE")):
        with pytest.raises(InferenceServerException) as err:
            infer(module, tier.server, request)
        message = str(err.value)
        assert f"embedding store {tier.manifest['store']['url']} unavailable" in message, message
        assert err.value.status() == status, message
    with urllib.request.urlopen(
        f"http://{tier.server.endpoints.http}/v2/models/rec/ready", timeout=10
    ) as r:
        assert r.status == 200
