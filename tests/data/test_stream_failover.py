"""The event reader across a real failover (#60 section 4): a 3-master Redis Cluster with a
replica each; the replica of the stream's master is SIGSTOPped, so it misses the reader's last
XACKs and XREADGROUPs, then the master is SIGKILLed and the replica takes over. The reader acks
again what its committed position covers (the lost XACKs) and does not train again what the
rolled-back group delivers a second time."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from rec.broker import redis_server_path
from rec.contract.events import encode
from rec.data.stream import StreamConfig
from rec.data.stream_redis import RedisEventReader
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature
from rec.store.cluster import RedisCluster

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

SPEC = FeatureSpec("csv", ["clicked"], [DenseFeature("n", "n", "identity")],
                   [SparseFeature("item", "item", "int_or_hash", "|")], dict(HASH))  # fmt: skip
STREAM = "fo"


def _add(client, first: int, count: int) -> None:
    for n in range(first, first + count):  # one event an entry: a read takes one entry
        client.xadd(STREAM, encode([{"clicked": n % 2, "n": n, "item": f"{n}"}]))


def _read(reader: RedisEventReader, want: int, timeout: float = 30.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        b = reader.next_batch(want - len(got), wait_s=0.5)
        got += [int(x) for x in b.batch.dense[:, 0].tolist()]
    return got


def _replica_of(cluster: RedisCluster, master, timeout: float = 20.0):
    """The node replicating `master`, once every node's view names it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = cluster.view()
        ids = [
            n
            for n in cluster.nodes
            if view.get(n.address) and view[n.address].master_id == view[master.address].id
        ]
        if ids:
            return ids[0]
        time.sleep(0.1)
    raise AssertionError(f"no replica of {master.address} after {timeout} s")


def test_a_promoted_replica_trains_nothing_twice_and_its_lost_acks_are_swept(tmp_path):
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=1) as cluster:
        master = cluster.owner(STREAM)
        replica = _replica_of(cluster, master)
        client = redis.Redis(master.host, master.port)
        _add(client, 0, 10)
        cfg = StreamConfig(url=f"{cluster.url()}/{STREAM}", retry_s=0.05, max_retry_s=0.5,
                           dead_letter="{fo}:dead")  # fmt: skip
        reader = RedisEventReader(cfg, SPEC, 0, read_ahead=0)
        try:
            got = _read(reader, 4)
            assert reader.ack(reader.position()) == 4
            got += _read(reader, 4)  # entries 4-7 delivered, pending on both copies
            assert client.wait(1, 5000) == 1, "the replica holds everything so far"
            os.kill(replica.proc.pid, signal.SIGSTOP)
            # Its link closed too: what the master sends from now on never reaches it (a
            # stopped replica would still read its socket's buffer when continued).
            client.client_kill_filter(_type="slave")
            try:
                assert reader.ack(reader.position()) == 4, "XACK of 4-7: lost with the master"
                got += _read(reader, 2)  # entries 8-9: the XREADGROUP is lost too
                assert got == list(range(10))
            finally:
                cluster.kill(master)
                os.kill(replica.proc.pid, signal.SIGCONT)
            replica.cli("CLUSTER", "FAILOVER", "TAKEOVER")
            cluster.wait_ok()
            promoted = redis.Redis(replica.host, replica.port)
            assert promoted.xpending(STREAM, "rec")["pending"] == 4, "the lost XACKs"
            _add(promoted, 10, 3)
            got += _read(reader, 3)
            assert got == list(range(13)), "8 and 9 delivered again are not trained again"
            assert reader.counts["redelivered"] == 2 and reader.counts["swept"] == 4
            assert _read(reader, 1, timeout=1.0) == []
            assert reader.ack(reader.position()) == 5
            assert promoted.xpending(STREAM, "rec")["pending"] == 0, "8, 9 acked once covered"
            promoted.close()
        finally:
            reader.close()
            client.close()
