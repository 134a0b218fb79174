"""rec-server reading a partitioned update log (#60) with the real parts: a 2-rank `rec train`
publishing with publish.partitions 2 into our own redis-server (rank r writes partition r), `rec
export` of its middle checkpoint, rec-server applying both partitions; then a silent partition
holding the watermark back, named in the log and the metrics, and released when it speaks; and
the same log laid out over a real 3-master Redis Cluster, read through its slot map.
"""

from __future__ import annotations

import copy
import re
import time

import numpy as np
import pytest
import redis
import torch
import tritonclient.http as httpclient
from clients import infer_inputs
from server import Server

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.contract import read_manifest
from rec.contract.partitions import layout_key, parse_layout
from rec.contract.repository import ModelDir
from rec.contract.requests import random_request
from rec.contract.updates import UpdateRecord, encode, parse_url
from rec.logs.layout import connect, ensure_layout
from rec.logs.route import Router
from rec.quantize import fused_rows
from rec.store.cluster import RedisCluster
from rec.update_log import read_records, write_rows
from tests.helpers import TINY, rec_in_process, run_rec, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)
STEPS, EXPORTED, STREAM = 24, 12, "rec:updates"
T0_ROWS = 300  # TINY's


class Published:
    """One 2-rank run that published into 2 partitions, and its export at step EXPORTED."""

    def __init__(self, tmp) -> None:
        self.broker = RedisBroker(tmp / "redis")
        self.url = self.broker.url(STREAM)
        cfg = copy.deepcopy(TINY)
        cfg["tables"] = cfg["tables"][:4]
        cfg["training"].update(steps=STEPS, eval_every=STEPS)
        cfg["checkpoint"] = {"every_steps": EXPORTED, "keep_last": 3}
        cfg["sharding"] = {"constraints": {"t1": {"sharding_types": ["row_wise"]}}}
        cfg["publish"] = {"url": self.url, "every_steps": 3, "every_seconds": 0, "partitions": 2}
        run = tmp / "run"
        run_rec("train", "--config", str(write_config(tmp / "c.yaml", cfg)), "--run-dir",
                str(run), timeout=600)  # fmt: skip
        self.repo = tmp / "repo"
        rec_in_process("export", str(run), "--checkpoint", run_dir.step_dir_name(EXPORTED),
                       "--repo", str(self.repo), check=True)  # fmt: skip
        self.updates = read_manifest(ModelDir.of(self.repo, "rec").manifest).data["updates"]
        self.records = [r for _, r in read_records(self.url)]

    def scores(self, request) -> np.ndarray:
        """model.pt with the log's rows after the export written into its storage, scoring."""
        module = torch.jit.load(str(ModelDir.of(self.repo, "rec").model_file(1)))
        buffers = dict(module.named_buffers())
        for r in self.records:
            if r.count and r.step > EXPORTED:
                place = self.updates["tables"][r.table]
                write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
        names = ("dense_features", "sparse_lengths", "sparse_values")
        with torch.inference_mode():
            return module(*[torch.from_numpy(request[n]) for n in names]).numpy()

    def applied(self) -> int:
        return sum(r.count for r in self.records if r.step > EXPORTED)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    p = Published(tmp_path_factory.mktemp("published"))
    yield p
    p.broker.stop()


def _publish(url: str, records, partitions: int = 2) -> None:
    """XADDs each record to its rank's partition of the log's layout, as the ranks do."""
    where = parse_url(url)
    router = Router(where.nodes)
    keys = ensure_layout(router, where.stream, partitions).keys
    for rec in records:
        key = keys[rec.rank % len(keys)]
        client = connect(router.node_for(key))
        client.xadd(key, encode(rec))
        client.close()


def _step_record(published, rank: int, step: int) -> UpdateRecord:
    rows = fused_rows(torch.full((1, 8), float(step)), "int8").numpy().tobytes()
    return UpdateRecord(published.updates["run"], 1, rank, 2, step, time.time_ns(), True, "t0",
                        "int8", 8, (rank,), rows)  # fmt: skip


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _check_served(published, server) -> None:
    assert server.wait_for_metric("rec_update_watermark_step", STEPS, timeout=60) == STEPS
    assert server.metric("rec_update_rows_applied_total") == published.applied()
    request = random_request(4, 4, 32, seed=5, ids_per_bag=(1, 6))
    with httpclient.InferenceServerClient(server.http) as c:
        got = c.infer("rec", infer_inputs(httpclient, request)).as_numpy("scores")
    np.testing.assert_array_equal(got, published.scores(request))


def test_both_partitions_are_applied_and_a_silent_one_holds_the_watermark(published):
    client = redis.Redis.from_url(published.broker.url())
    layout = parse_layout(client.get(layout_key(STREAM)).decode(), layout_key(STREAM))
    assert layout.partitions == 2
    assert {r.rank for r in published.records} == {0, 1}
    for k in (0, 1):
        assert client.xlen(layout.keys[k]) > 0, f"partition {k} is empty"
    assert not client.exists(STREAM)  # no legacy stream: only the partitions hold records

    server = Server(published.repo)  # the log's URL comes from rec.json
    try:
        _check_served(published, server)
        assert "reading update log" in server.stderr() and "partitions 0:" in server.stderr()
        assert server.metric("rec_update_watermark_held_by") == -1

        # Rank 0 publishes step STEPS + 3; rank 1 (partition 1) stays silent.
        _publish(published.url, [_step_record(published, 0, STEPS + 3)])
        held = f"watermark held at gen 1 step {STEPS} by partition 1 (rank 1): silent"
        _wait(lambda: held in server.stderr(), "held line", timeout=20)
        assert server.metric("rec_update_watermark_step") == STEPS
        assert server.metric("rec_update_watermark_held_by") == 1
        silent_1 = server.metric("rec_update_partition_silent_ms", partition="1")
        assert silent_1 >= 5000
        assert server.metric("rec_update_partition_silent_ms", partition="0") < silent_1

        _publish(published.url, [_step_record(published, 1, STEPS + 3)])
        server.wait_for_metric("rec_update_watermark_step", STEPS + 3, timeout=10)
        spoke = f"watermark moved on from gen 1 step {STEPS}: partition 1 (rank 1) spoke again"
        _wait(lambda: spoke in server.stderr(), "spoke-again line", timeout=5)
        assert server.metric("rec_update_watermark_held_by") == -1
        assert server.metric("rec_update_partition_silent_ms", partition="1") < 5000
    finally:
        assert server.stop() == 0, server.stderr()


def test_a_partitioned_log_on_a_cluster_is_read_from_each_partitions_master(published, tmp_path):
    """The run's records laid out over 3 partitions of a 3-master cluster (one each), read by
    rec-server given the cluster's node list: every row applied, the scores as in process. Then
    partition 1's slot moves to another master: the reader follows the MOVED and reads on."""
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        url = cluster.url() + "/" + STREAM
        router = Router(parse_url(url).nodes)
        keys = ensure_layout(router, STREAM, 3).keys
        assert len({router.node_for(k) for k in keys}) == 3  # one partition per master
        _publish(url, published.records, partitions=3)
        server = Server(published.repo, "--updates", url)
        try:
            _check_served(published, server)
            assert "partitions 0:" in server.stderr()
            owner = cluster.owner(keys[1])
            to = next(m for m in cluster.masters() if m is not owner)
            slot = cluster.start_moving(keys[1], to)
            cluster.finish_moving(slot, to)
            assert cluster.owner(keys[1]) is to
            _publish(url, [_step_record(published, r, STEPS + 3) for r in (0, 1)], partitions=3)
            server.wait_for_metric("rec_update_watermark_step", STEPS + 3, timeout=20)
            assert server.metric("rec_update_log_connected") == 1
            # The redirection was met, and followed: MOVED after the move, or, when a read
            # fell inside it, ASK, TRYAGAIN or UNBLOCKED (a blocked XREAD on a moving slot).
            assert re.search(r"(MOVED|ASK|TRYAGAIN|UNBLOCKED)[^\n]*; retrying", server.stderr())
        finally:
            assert server.stop() == 0, server.stderr()


def _all_t0(published, gen: int, rank: int, world: int, step: int, value: float) -> UpdateRecord:
    rows = fused_rows(torch.full((T0_ROWS, 8), value), "int8").numpy().tobytes()
    return UpdateRecord(published.updates["run"], gen, rank, world, step, time.time_ns(), True,
                        "t0", "int8", 8, tuple(range(T0_ROWS)), rows)  # fmt: skip


def test_a_resumed_generation_waits_for_the_longer_partitions_older_records(published):
    """Generation 1: rank 0 one record, rank 1 300 (more than one read of 256); then a resume on
    1 rank (generation 2) re-sends t0 at its checkpoint value into partition 0. Were partition
    0's generation 2 record applied before partition 1's later generation 1 records, those would
    undo it: t0 must end at the re-sent value, as model.pt scores with it."""
    url = published.broker.url("rec:gens")
    _publish(url, [_all_t0(published, 1, 0, 2, EXPORTED + 1, 1.0)])
    _publish(url, [_all_t0(published, 1, 1, 2, s, float(s % 7)) for s in range(13, 313)])
    _publish(url, [_all_t0(published, 2, 0, 1, 100, 5.5)])
    server = Server(published.repo, "--updates", url)
    try:
        server.wait_for_metric("rec_update_watermark_step", 100, timeout=60)
        assert server.metric("rec_update_records_total", outcome="applied") == 302
        module = torch.jit.load(str(ModelDir.of(published.repo, "rec").model_file(1)))
        place = published.updates["tables"]["t0"]
        rows = fused_rows(torch.full((T0_ROWS, 8), 5.5), "int8")
        write_rows(dict(module.named_buffers())[place["buffer"]], place, range(T0_ROWS),
                   rows.numpy().tobytes())  # fmt: skip
        request = random_request(4, 4, 32, seed=9, ids_per_bag=(1, 6))
        with httpclient.InferenceServerClient(server.http) as c:
            got = c.infer("rec", infer_inputs(httpclient, request)).as_numpy("scores")
        names = ("dense_features", "sparse_lengths", "sparse_values")
        with torch.inference_mode():
            want = module(*[torch.from_numpy(request[n]) for n in names]).numpy()
        np.testing.assert_array_equal(got, want)
    finally:
        assert server.stop() == 0, server.stderr()


def test_a_stream_whose_name_cannot_be_partitioned_is_read_as_one_stream(published):
    """A legacy log named with a hash tag ('{' cuts partition keys, so it has no layout) is one
    stream, read as before partitions."""
    url = published.broker.url("{rec}:legacy")
    client = redis.Redis.from_url(published.broker.url())
    for rec in published.records:
        client.xadd("{rec}:legacy", encode(rec))
    server = Server(published.repo, "--updates", url)
    try:
        _check_served(published, server)
        assert "from entry " in server.stderr()
    finally:
        assert server.stop() == 0, server.stderr()
