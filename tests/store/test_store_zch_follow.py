"""Fresh rows into a ZCH table held in the embedding store (rec.updates/3, `rec store follow`).

rec-server and rec's Triton model (when tritonserver is installed) reading the log, and
Python's store reader fed the records, serve them from their caches at once, before the
follower runs; the follower then writes the rows
under the raw ids the records name, deletes the evicted ids and writes the default row, so a
second rec-server with no log and no cache, and the Python reader over the store alone, score
the same. Every one of them scores as the in-model artifact with the same records applied to its
rows and map, bit for bit, on an admitted id whose row changed, a newly admitted id, an evicted
id and never-seen ids. Real redis-server (the log), a real 3-master Redis Cluster (the store)
and real rec-servers."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.request

import numpy as np
import redis
import torch

import rec.ops  # noqa: F401  (model.pt's ops, before torch.jit.load)
from rec import zch
from rec.broker import RedisBroker
from rec.contract import store as contract
from rec.contract.manifest import read_manifest
from rec.contract.repository import ModelDir, manifest_in, model_file_in
from rec.contract.updates import UpdateRecord, encode
from rec.export import id_maps
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import load_run
from rec.export.tiered import TieredScorer
from rec.quantize import fused_rows
from rec.serve.client import Rows, ScoreClient
from rec.serve.cpp import start_cpp
from rec.serve.triton import start_triton
from rec.store.client import connect
from rec.store.cluster import RedisCluster
from rec.store.follow import StoreFollower
from rec.store.reader import StoreReader
from rec.update_log import ServedMap, write_rows
from tests.export.zch_run import write_zch_run, zch_dict
from tests.helpers import rec_in_process
from tests.serve_triton.servers import _triton_missing

FEATURES = ["e", "a", "c", "b", "d"]  # tiny_dict's request columns; t0 is feature a's table


def _rows(place: dict, values: list[float]) -> bytes:
    v = torch.tensor(values, dtype=torch.float32).reshape(-1, 1).expand(-1, place["dim"])
    return fused_rows(v.contiguous(), place["dtype"]).numpy().tobytes()


def _records(m, slots: int, probes: int, place: dict) -> tuple[list[UpdateRecord], dict]:
    """Against the export's t0 map: a row update of an admitted id and of the default row, then
    an eviction and an admission (into a free slot of the new id's window), each with `held`."""
    held = m.used.nonzero().flatten().tolist()
    kept, gone = held[0], held[1]
    window = lambda i: zch.windows(torch.tensor([i]), slots, probes)[0].tolist()  # noqa: E731
    new_id = next(i for i in range(10**6, 10**7) if any(not m.used[s] for s in window(i)))
    free = next(s for s in window(new_id) if not m.used[s])
    ids = {"kept": int(m.keys[kept]), "gone": int(m.keys[gone]), "new": new_id}
    base = dict(run="r", gen=1, rank=0, world=1, wall_ns=time.time_ns(), last=True, table="t0",
                dtype=place["dtype"], dim=place["dim"])  # fmt: skip
    first = UpdateRecord(step=11, ids=(kept, slots), rows=_rows(place, [0.9, -0.7]),
                         held=((kept, ids["kept"]),), **base)  # fmt: skip
    second = UpdateRecord(step=12, ids=(free,), rows=_rows(place, [-1.3]),
                          evicted=((gone, ids["gone"]),), admitted=((free, new_id),),
                          held=((free, new_id),), **base)  # fmt: skip
    return [first, second], ids


def _request(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sample per id of feature a, the other features one fixed small id each."""
    n = len(ids)
    lengths = torch.ones((n, len(FEATURES)), dtype=torch.int32)
    values = [i if f == "a" else 3 for i in ids for f in FEATURES]
    dense = torch.linspace(-1, 1, n * 4).reshape(n, 4)
    return dense, lengths, torch.tensor(values, dtype=torch.int64)


def _served(server, request) -> np.ndarray:
    client = ScoreClient(server.endpoints.grpc, "grpc", model="rec")
    try:
        return np.asarray(client.score(Rows(*(t.numpy() for t in request))))
    finally:
        client.close()


def _refreshed(server) -> float:
    text = urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics", timeout=10).read()
    found = re.findall(rb"^rec_store_cache_refreshed_rows_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def test_fresh_rows_of_a_stored_zch_table_reach_caches_then_the_store(tmp_path):
    run = write_zch_run(tmp_path / "run", zch_dict(store={"tables": ["t0"], "partitions": 3}))
    with RedisBroker(tmp_path / "log") as broker, \
            RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:  # fmt: skip
        rec_in_process("export", str(run), "--repo", str(tmp_path / "tiered"), "--store",
                       cluster.url(), check=True)  # fmt: skip
        rec_in_process("export", str(run), "--repo", str(tmp_path / "plain"), check=True)
        tiered = ModelDir.of(tmp_path / "tiered", "rec").version(1)
        plain = ModelDir.of(tmp_path / "plain", "rec").version(1)
        manifest = json.loads(manifest_in(plain).read_text())
        place, zch_t0 = manifest["updates"]["tables"]["t0"], manifest["zch"]["tables"]["t0"]
        loaded = load_run(run)
        m = id_maps.read_maps(CheckpointReader(loaded.step_dir), loaded.cfg)["t0"]
        records, ids = _records(m, zch_t0["slots"], zch_t0["probes"], place)
        url = broker.url("rec:updates")
        request = _request([ids["kept"], ids["new"], ids["gone"], 424242, -5])
        with contextlib.ExitStack() as servers:
            live = [servers.enter_context(start_cpp(
                tmp_path / "tiered", http_port=0, grpc_port=0, metrics_port=0,
                extra_args=("--updates", url)))]  # fmt: skip
            if _triton_missing() is None:  # rec's Triton model: its store reader's cache
                live.append(servers.enter_context(start_triton(
                    tmp_path / "tiered", http_port=0, grpc_port=0, metrics_port=0, updates=url,
                    store_cache_bytes=1 << 20)))  # fmt: skip
            first = [_served(server, request) for server in live]
            client = redis.Redis(port=broker.port)
            for r in records + [records[1]]:  # the second sent again, as after a broker error
                client.xadd("rec:updates", encode(r))
            client.close()
            deadline = time.monotonic() + 30
            while min(map(_refreshed, live)) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            served_fresh = [_served(server, request) for server in live]  # no follower yet

        # Before the follower: a reader with a cache, fed the records (as Triton's model would
        # be), scores them already; the store still holds the export's rows.
        section = json.loads(manifest_in(tiered).read_text())["store"]
        cached = StoreReader(section, cache_bytes=1 << 20)
        cached_scorer = TieredScorer(torch.jit.load(str(model_file_in(tiered))), cached)
        for r in records:
            cached.refresh_raw("t0", r)
        with torch.no_grad():
            fresh = cached_scorer(*request)
        cached.close()

        for fresh_scores, before_scores in zip(served_fresh, first, strict=True):
            assert not np.array_equal(fresh_scores, before_scores)
        follower = StoreFollower(read_manifest(manifest_in(tiered)), url, log=lambda _: None)
        stats = follower.run(threading.Event(), idle_exit_s=0.5)
        follower.close()
        assert (stats.records, stats.refused) == (3, 0)
        store = connect(cluster.url())
        fields = {}
        for p in range(3):
            fields.update(store.hgetall(contract.partition_key(section["prefix"], "t0", p)))
        store.close()
        assert str(ids["gone"]).encode() not in fields and str(ids["new"]).encode() in fields

        # The reference: the in-model artifact with the same records in its rows and map.
        module = torch.jit.load(str(model_file_in(plain)))
        buffers = dict(module.named_buffers())
        served = ServedMap(zch_t0["probes"], [tuple(buffers[b] for b in zch_t0["buffers"])])
        for r in records:
            write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
            served.write(r)
        reader = StoreReader(section)  # no cache, no log: the store alone
        scorer = TieredScorer(torch.jit.load(str(model_file_in(tiered))), reader)
        before = torch.jit.load(str(model_file_in(plain)))
        with torch.no_grad():
            got, want, old = scorer(*request), module(*request), before(*request)
        reader.close()
        alone = ("--updates", "none", "--store-cache-bytes", "0")  # no log, no cache
        no_log = start_cpp(tmp_path / "tiered", http_port=0, grpc_port=0, metrics_port=0,
                           extra_args=alone)  # fmt: skip
        with no_log:
            served_store = _served(no_log, request)
        for fresh_scores in served_fresh:  # rec-server, then Triton (if installed)
            assert np.array_equal(fresh_scores, want.numpy())
        assert np.array_equal(served_store, want.numpy())
        assert np.array_equal(fresh.numpy(), want.numpy())
        assert np.array_equal(got.numpy(), want.numpy())
        # Every probed id's score moved: a new row, a new id, an evicted id and unknown ones
        # (the default row changed).
        assert (got != old).all(), (got, old)
