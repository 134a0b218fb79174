"""The update log read in either layout (rec.logs.update_reader.PartitionedLogReader) against real
redis-server processes: ranks publishing over P partitions as train.publish does (rank r into
partition r mod P) are read whole, each rank's records in its order, on one node and on a
3-master Redis Cluster; a reader resumes from its saved cursors; a reader started before the
layout exists finds it; the store's follower saves a cursor per partition and goes on from
them, its replay of a raw-keyed table stopping at each."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.contract.partitions import make_layout
from rec.contract.sections import StoredTable, StoreSection, UpdatesSection
from rec.contract.store import meta_key, row_bytes
from rec.contract.updates import UpdateRecord, encode, parse_url
from rec.logs.layout import connect, ensure_layout
from rec.logs.route import Router
from rec.logs.update_reader import PartitionedLogReader
from rec.store.cluster import RedisCluster
from rec.update_log import Applier, ServedTable, read_records

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

DIM, ROWS = 4, 64


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("plain")) as b:
        yield b


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=0) as c:
        yield c


def _record(rank: int, world: int, step: int, last: bool = True, gen: int = 1,
            of: int | None = None) -> UpdateRecord:  # fmt: skip
    """Rank `rank`'s record of rows `of` and ROWS-1-`of` (default: its own), each byte `step`."""
    of = rank if of is None else of
    rows = bytes([step % 256]) * (row_bytes(DIM, "int8") * 2)
    return UpdateRecord("r", gen, rank, world, step, time.time_ns(), last, "t0", "int8", DIM,
                        (of, ROWS - 1 - of), rows)  # fmt: skip


def _publish(url: str, stream: str, partitions: int, records) -> None:
    """XADDs each record to its rank's partition, as the ranks' senders do."""
    router = Router(parse_url(url).nodes)
    keys = ensure_layout(router, stream, partitions).keys if partitions else (stream,)
    clients: dict = {}
    for rec in records:
        key = keys[rec.rank % len(keys)]
        node = router.node_for(key)
        clients.setdefault(node, connect(node)).xadd(key, encode(rec))
    for client in clients.values():
        client.close()


def _ranks_interleaved(world: int, steps: range) -> list[UpdateRecord]:
    return [_record(r, world, s) for s in steps for r in range(world)]


def _check_order(records: list[UpdateRecord], world: int, steps: range) -> None:
    for rank in range(world):
        assert [r.step for r in records if r.rank == rank] == list(steps), f"rank {rank}"
    state = Applier({"t0": ServedTable(ROWS, DIM, "int8")})
    assert all(state.apply(r) == ("applied", "") for r in records)
    assert state.mark[:2] == (1, steps[-1]) and state.held_by() is None


@pytest.mark.parametrize("partitions, world", [(2, 2), (3, 2), (4, 2), (2, 4)])
def test_every_ranks_records_are_read_in_its_order(broker, partitions, world):
    url = broker.url(f"u:{partitions}:{world}")
    steps = range(1, 31)
    _publish(url, f"u:{partitions}:{world}", partitions, _ranks_interleaved(world, steps))
    records = [r for _, r in read_records(url, count=7)]  # several reads of each partition
    assert len(records) == world * len(steps)
    _check_order(records, world, steps)


def test_a_newer_generation_waits_for_every_partitions_older_records(broker):
    """Generation 1 on 2 ranks (rank 1 sends two records a publish, so its partition is the
    longer), then a resume on 1 rank re-sends rank 1's rows (at step 5, its checkpoint): read a
    few entries at a time, rank 1's step 6-12 records of the dead generation must all come
    before them, or they would undo the re-sent rows."""
    url, stream = broker.url("u:gens"), "u:gens"
    rank1 = [_record(1, 2, s, last) for s in range(1, 13) for last in (False, True)]
    _publish(url, stream, 2, [_record(0, 2, s) for s in range(1, 13)] + rank1)
    _publish(url, stream, 2, [_record(0, 1, 5, gen=2, of=1), _record(0, 1, 6, gen=2)])
    for count in (1, 3, 100):
        entries = read_records(url, count=count)
        records = [r for _, r in entries]
        assert [r.gen for r in records] == [1] * 36 + [2, 2], count
        assert [r.step for r in records if r.rank == 1] == [s for s in range(1, 13) for _ in "ab"]
        state = Applier({"t0": ServedTable(ROWS, DIM, "int8")})
        assert all(state.apply(r)[0] == "applied" for r in records)
        assert state.rows["t0"][1] == bytes([5]) * row_bytes(DIM, "int8"), "the re-sent row"
        assert state.mark[:2] == (2, 6)
    reader = PartitionedLogReader(url, count=2, block_ms=50)
    stop, got = threading.Event(), []
    for batch in reader.follow(stop):
        got += [r.gen for _, r in batch]
        if len(got) == 38 or not batch:
            stop.set()
    assert got == [1] * 36 + [2, 2]


def test_a_reader_resumes_from_its_cursors(broker):
    url, stream = broker.url("u:resume"), "u:resume"
    _publish(url, stream, 3, _ranks_interleaved(3, range(1, 11)))
    first = PartitionedLogReader(url, block_ms=None, count=4)
    seen = []
    while entries := first.read():
        seen += entries
    first.close()
    assert len(seen) == 30 and first.partitions == 3
    saved = first.places()
    assert set(saved) == {0, 1, 2} and "0" not in saved.values()
    _publish(url, stream, 3, _ranks_interleaved(3, range(11, 16)))
    again = PartitionedLogReader(url, cursors=saved, block_ms=None)
    later = [r for _, r in again.read()]
    again.close()
    assert sorted((r.rank, r.step) for r in later) == [(k, s) for k in range(3)
                                                       for s in range(11, 16)]  # fmt: skip


def test_a_reader_started_before_the_layout_finds_it(broker):
    url, stream = broker.url("u:late"), "u:late"
    stop, got = threading.Event(), []
    reader = PartitionedLogReader(url, block_ms=100)

    def follow():
        for entries in reader.follow(stop):
            got.extend(r for _, r in entries)
            if len(got) >= 20:
                stop.set()

    thread = threading.Thread(target=follow)
    thread.start()
    time.sleep(0.3)  # reading the plain stream, which stays empty
    _publish(url, stream, 2, _ranks_interleaved(2, range(1, 11)))
    thread.join(10)
    stop.set()
    assert not thread.is_alive() and reader.partitions == 2
    _check_order(got, 2, range(1, 11))


def test_the_legacy_stream_reads_as_before(broker):
    url, stream = broker.url("u:legacy"), "u:legacy"
    _publish(url, stream, 0, _ranks_interleaved(2, range(1, 6)))
    entries = read_records(url)
    _check_order([r for _, r in entries], 2, range(1, 6))
    after = read_records(url, start=entries[3][0])
    assert after == entries[4:]
    reader = PartitionedLogReader(url, block_ms=None)
    reader.read()
    assert reader.layout is None and reader.places() == {0: entries[-1][0]}
    reader.close()


def test_partitions_on_a_cluster_are_read_from_their_masters(cluster):
    url = cluster.url() + "/u:c"
    _publish(url, "u:c", 6, _ranks_interleaved(2, range(1, 21)))
    owners = {cluster.owner(k).address for k in make_layout("u:c", 6).keys}
    assert len(owners) == 3
    records = [r for _, r in read_records(url, count=5)]
    _check_order(records, 2, range(1, 21))


def test_the_follower_keeps_a_cursor_per_partition(cluster):
    """`rec store follow` on a partitioned log, its store and log on one 3-master cluster: the
    first run stores every rank's rows and saves follow_id:<k>; a restarted one takes only the
    records after them. A raw-keyed ZCH table's replay stops at each saved cursor: stopped
    after rank 1's records, restarted before rank 0's late ones, it keeps the moved id's new
    row (tests/store/test_store_follow_order.py's case, ranks in partitions of their own)."""
    from rec.store.follow import StoreFollower
    from tests.store import test_store_follow_order as order

    url = cluster.url() + "/u:follow"
    table = StoredTable(ROWS, DIM, "int8", row_bytes(DIM, "int8"), 2)
    store = StoreSection("rec.store/2", cluster.url(), "f", {"t0": table})
    updates = UpdatesSection("rec.updates/1", url, "r", step=0, gen=1)
    client = redis.RedisCluster.from_url(cluster.url().split(",")[0])
    client.hset(meta_key("f"), mapping={"format": "rec.store/2"})  # a finished export's
    manifest = SimpleNamespace(store=store, updates=updates)

    def follow(prefix_manifest) -> StoreFollower:
        follower = StoreFollower(prefix_manifest, log=lambda line: None)
        follower.stats = follower.run(threading.Event(), idle_exit_s=0.5)
        follower.close()
        return follower

    _publish(url, "u:follow", 2, _ranks_interleaved(2, range(1, 6)))
    first = follow(manifest)
    assert first.stats.records == 10 and first.stats.refused == 0
    saved = client.hgetall(meta_key("f"))
    assert {b"follow_id:0", b"follow_id:1"} <= set(saved) and b"follow_id" not in saved
    _publish(url, "u:follow", 2, _ranks_interleaved(2, range(6, 9)))
    second = follow(manifest)
    assert second.stats.records == 6 and second.applier.mark[:2] == (1, 8)

    zurl = cluster.url() + "/u:zch"
    ztable = StoredTable(order.SLOTS + 1, order.DIM, "int8", row_bytes(order.DIM, "int8"),
                         order.PARTS, "raw_id", order.SLOTS)  # fmt: skip
    zmanifest = SimpleNamespace(
        store=StoreSection("rec.store/2", cluster.url(), "z", {"t0": ztable}),
        updates=UpdatesSection("rec.updates/1", zurl, "r", step=10, gen=1),
    )
    client.hset(meta_key("z"), mapping={"format": "rec.store/2"})
    for records in (order.RANK1, order.RANK0):  # rank 0's sender behind: its records come last
        _publish(zurl, "u:zch", 2, records)
        assert follow(zmanifest).stats.refused == 0
    assert order._stored(client, "z") == {str(order.X).encode(): bytes([4] * 8),
                                          str(order.Y).encode(): bytes([2] * 8)}  # fmt: skip
    client.close()
