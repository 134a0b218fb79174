"""`rec stream replay`'s WAIT (#60 section 4) against a real master and a real replica
(redis-server --replicaof): with the replica live every round trip is replicated (auto waits
for 1, as the master has a replica); with it SIGSTOPped each WAIT times out, its entries are
counted unreplicated and warned about, and the replay goes on; without a replica auto waits for
none."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.data.replay import replay
from tests.helpers import rec_in_process

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("master")) as master:
        extra = ["--replicaof", master.host, str(master.port)]
        with RedisBroker(tmp_path_factory.mktemp("replica"), extra=extra) as replica:
            client = redis.Redis(port=replica.port)
            deadline = time.monotonic() + 20
            while client.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not sync"
                time.sleep(0.05)
            client.close()
            yield master, replica


def _chunks(n: int, first: int = 0):
    return iter([([{"clicked": 1, "n": i} for i in range(first, first + n)], None)])


def test_auto_waits_for_the_live_replica_and_counts_nothing_unreplicated(pair):
    master, replica = pair
    said: list[str] = []
    stats = replay(_chunks(100), master.url("live"), per_entry=10, log=said.append)
    assert stats.entries == 10 and stats.unreplicated == 0, said
    assert not [s for s in said if "WAIT" in s]
    # WAIT answered before replay returned: the replica holds every entry already.
    assert redis.Redis(port=replica.port).xlen("live") == 10


def test_a_stopped_replica_times_each_wait_out_and_the_replay_goes_on(pair):
    master, replica = pair
    said: list[str] = []
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        stats = replay(_chunks(30), master.url("stopped"), per_entry=10, log=said.append,
                       wait_replicas=1, wait_timeout_s=0.3)  # fmt: skip
        took = time.monotonic() - t0
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert stats.entries == 3 and stats.unreplicated == 3, said
    assert 0.25 < took < 5, "one round trip, one WAIT timing out"
    warned = [s for s in said if "WAIT 1 answered 0" in s]
    assert len(warned) == 1 and "3 entries unreplicated" in warned[0], said
    assert redis.Redis(port=master.port).xlen("stopped") == 3, "sent all the same"


def test_the_command_says_what_was_unreplicated_and_auto_without_a_replica_waits_for_none(
    pair, tmp_path
):
    master, replica = pair
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        args = ["--synthetic", "20", "--per-entry", "10", "--wait-replicas", "1"]
        out = rec_in_process("stream", "replay", *args, "--to", master.url("cli"), check=True)
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert "sent 20 events in 2 entries" in out.stdout and "2 entries unreplicated" in out.stdout
    bad = rec_in_process("stream", "replay", "--synthetic", "1", "--to", master.url("cli"),
                         "--wait-replicas", "some")  # fmt: skip
    assert bad.returncode == 2 and "give a replica count" in bad.stdout
    with RedisBroker(tmp_path / "alone") as alone:
        said: list[str] = []
        t0 = time.monotonic()
        stats = replay(_chunks(50), alone.url("alone"), per_entry=10, log=said.append)
        assert stats.unreplicated == 0 and not said and time.monotonic() - t0 < 3
