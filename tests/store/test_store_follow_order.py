"""The store's follower (rec.store.follow.StoreApplier) applying a ZCH table kept by raw id when
the ranks' records reach the log out of order (rec.served_map's rule, per id: IdPlaces). A real
redis-server holds the table's partition hashes; the reference is the same records applied in
training order. A restarted follower's replay (dry, then on) ends where one that never stopped
does."""

from __future__ import annotations

import time

import pytest
import redis
import torch

from rec.broker import RedisBroker, redis_server_path
from rec.contract.sections import StoredTable, StoreSection, UpdatesSection
from rec.contract.store import partition_key, row_bytes
from rec.contract.updates import UpdateRecord
from rec.store.follow import StoreApplier
from rec.zch import home

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

SLOTS, PARTS, DIM = 16, 2, 4
_HOMES = home(torch.arange(1, 5000), SLOTS)


def _id_at(slot: int, nth: int = 0) -> int:
    return int(torch.nonzero(slot == _HOMES)[nth]) + 1


def _applier(client, prefix: str) -> StoreApplier:
    table = StoredTable(SLOTS + 1, DIM, "int8", row_bytes(DIM, "int8"), PARTS, "raw_id", SLOTS)
    store = StoreSection("rec.store/2", "redis://unused", prefix, {"t0": table})
    updates = UpdatesSection("rec.updates/1", None, "r", step=10, gen=1)
    return StoreApplier(store, updates, client)


def _of(rank: int, step: int, ids=(), evicted=(), admitted=(), held=(), row: int = 0):
    return UpdateRecord("r", 1, rank, 2, step, time.time_ns(), True, "t0", "int8", DIM,
                        tuple(ids), bytes([row] * 8) * len(ids), tuple(evicted),
                        tuple(admitted), tuple(held))  # fmt: skip


def _stored(client, prefix: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for p in range(PARTS):
        out.update(client.hgetall(partition_key(prefix, "t0", p)))
    return out


def _apply(applier: StoreApplier, records) -> None:
    for r in records:
        assert applier.apply(r) == ("applied", ""), (r.rank, r.step)
    applier.flush()


# Round 12: rank 0 evicts x from slot 5 and gives the slot to y. Round 14: rank 1 admits x into
# slot 8 with a fresh row; its rows at step 15 follow. Rank 0's sender a round behind also sends
# its step-11 row of x (slot 5) after all of rank 1's.
X, Y = _id_at(5), _id_at(5, 1)
RANK0 = [_of(0, 11, [5], held=[(5, X)], row=1),
         _of(0, 12, [5], [(5, X)], [(5, Y)], [(5, Y)], row=2)]  # fmt: skip
RANK1 = [_of(1, 14, [8], [], [(8, X)], [(8, X)], row=3), _of(1, 15, [8], held=[(8, X)], row=4)]


def test_a_lagging_ranks_eviction_and_old_rows_keep_the_moved_ids_new_row(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        client = redis.Redis(port=broker.port)
        _apply(_applier(client, "ref"), RANK0 + RANK1)
        want = _stored(client, "ref")
        assert want == {str(X).encode(): bytes([4] * 8), str(Y).encode(): bytes([2] * 8)}
        _apply(_applier(client, "lag"), RANK1 + RANK0)
        assert _stored(client, "lag") == want
        # A follower restarted after rank 1's records: its replay (dry) rebuilds the order
        # state, so rank 0's late eviction still leaves x's row.
        client.delete(*(partition_key("restart", "t0", p) for p in range(PARTS)))
        _apply(_applier(client, "restart"), RANK1)
        again = _applier(client, "restart")
        again.dry = True
        _apply(again, RANK1)
        again.dry = False
        _apply(again, RANK0)
        assert _stored(client, "restart") == want
        # Without the replay the late eviction would delete it: what the replay is for.
        fresh = _applier(client, "forgot")
        _apply(fresh, RANK1)
        _apply(_applier(client, "forgot"), RANK0)
        assert str(X).encode() not in _stored(client, "forgot")
        client.close()


def test_a_restarted_follower_still_keeps_a_moved_ids_row(tmp_path):
    """`rec store follow`'s StoreFollower stopped after rank 1's records and started again
    before rank 0's late ones reach the log: it replays the log up to its saved entry (writing
    nothing) and then leaves x's new row, as one that never stopped does. A real 3-master Redis
    Cluster holds the store, a real redis-server the log."""
    import threading
    from types import SimpleNamespace

    from rec.contract.store import meta_key
    from rec.contract.updates import encode
    from rec.store.client import connect
    from rec.store.cluster import RedisCluster
    from rec.store.follow import StoreFollower

    table = StoredTable(SLOTS + 1, DIM, "int8", row_bytes(DIM, "int8"), PARTS, "raw_id", SLOTS)
    with RedisBroker(tmp_path / "redis") as broker, \
            RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:  # fmt: skip
        url = broker.url("rec:updates")
        store = StoreSection("rec.store/2", cluster.url(), "p", {"t0": table})
        updates = UpdatesSection("rec.updates/1", url, "r", step=10, gen=1)
        manifest = SimpleNamespace(store=store, updates=updates)
        client, log = connect(cluster.url()), redis.Redis(port=broker.port)
        client.hset(meta_key("p"), mapping={"format": "rec.store/2"})  # a finished export's
        for records in (RANK1, RANK0):  # rank 0's sender behind: its records come last
            for r in records:
                log.xadd("rec:updates", encode(r))
            follower = StoreFollower(manifest, log=lambda line: None)
            stats = follower.run(threading.Event(), idle_exit_s=0.5)
            follower.close()
            assert stats.refused == 0
        assert follower.cursor != "0" and _stored(client, "p") == {
            str(X).encode(): bytes([4] * 8),
            str(Y).encode(): bytes([2] * 8),
        }
        client.close()
        log.close()
