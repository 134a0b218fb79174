"""Which partition holds a replica's watermark back (rec.update_log.WatermarkWatch, #60): the
rules on a clock of the test's own, then Triton's update reader (serve/python_backend/updates.py,
in process) and the store's follower, both following one partitioned log on a real 3-master
Redis Cluster while rank 1 falls silent: each names partition 1 once it has been silent 5 s,
and says it spoke again when the watermark moves on; Triton's metrics say so too."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from rec.broker import redis_server_path
from rec.contract.sections import StoredTable, StoreSection, UpdatesSection
from rec.contract.store import meta_key, row_bytes
from rec.contract.updates import UpdateRecord
from rec.store.cluster import RedisCluster
from rec.update_log import Applier, ServedTable, WatermarkWatch
from tests.logs.test_update_reader import DIM, ROWS, _publish, _record

TABLES = {"t0": ServedTable(ROWS, DIM, "int8")}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fed(watch: WatermarkWatch, applier: Applier, records: list[UpdateRecord]) -> None:
    for rec in records:
        assert applier.apply(rec)[0] == "applied"
        watch.heard(rec)


def test_the_silent_rank_is_named_by_its_partition_then_heard_again():
    applier, clock = Applier(TABLES), Clock()
    watch = WatermarkWatch(applier, lambda: 2, every_seconds=2.0, clock=clock)
    assert watch.after_s == 8.0, "4 x every_seconds when that is above 5 s"
    _fed(watch, applier, [_record(r, 3, 1) for r in range(3)])
    assert applier.held_by() is None and watch.check() is None, "every rank at step 1"
    assert watch.held_partition() == -1
    _fed(watch, applier, [_record(0, 3, 2), _record(2, 3, 2)])
    assert applier.held_by() == 1 and applier.mark[:2] == (1, 1)
    clock.now += 7.9
    assert watch.check() is None, "not silent long enough"
    clock.now += 0.2
    assert watch.check() == "watermark held at gen 1 step 1 by partition 1 (rank 1): silent 8 s"
    assert watch.check() is None, "said once"
    clock.now += 1.0
    _fed(watch, applier, [_record(0, 3, 3)])
    assert watch.check() is None and watch.held_partition() == 1
    assert watch.silent_ms() == {0: 0.0, 1: pytest.approx(9100)}, "rank 0 speaks for 0 and 2"
    _fed(watch, applier, [_record(1, 3, 2)])
    assert watch.check() == "watermark moved on from gen 1 step 1: partition 1 (rank 1) spoke again"
    assert applier.mark[:2] == (1, 2) and watch.check() is None, "rank 1 just spoke"
    # A rank of a newer generation with no complete publish yet holds it; one stream: its rank.
    fresh, clock.now = Applier(TABLES), 0.0
    one = WatermarkWatch(fresh, lambda: 0, clock=clock)
    _fed(one, fresh, [_record(0, 2, 1)])
    clock.now = 5.0
    assert fresh.held_by() == 1 and one.check() == (
        "watermark held at gen 0 step 0 by rank 1: silent 5 s")  # fmt: skip


@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_triton_and_the_follower_name_the_silent_partition(tmp_path):
    from rec.serve.python_backend.metrics import MemoryMetrics, UpdateMetrics
    from rec.serve.python_backend.updates import UpdateReader
    from rec.store.follow import StoreFollower

    with RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        url = cluster.url() + "/u:w"
        triton_lines: list[str] = []
        metrics = MemoryMetrics()
        reader = UpdateReader("m", url, Applier(TABLES), UpdateMetrics(metrics, "m", "1"),
                              lambda level, line: triton_lines.append(line))  # fmt: skip
        table = StoredTable(ROWS, DIM, "int8", row_bytes(DIM, "int8"), 2)
        manifest = SimpleNamespace(
            store=StoreSection("rec.store/2", cluster.url(), "w", {"t0": table}),
            updates=UpdatesSection("rec.updates/1", url, "r", step=0, gen=1),
        )
        import redis

        store = redis.RedisCluster.from_url(cluster.url().split(",")[0])
        store.hset(meta_key("w"), mapping={"format": "rec.store/2"})
        store.close()
        follower_lines: list[str] = []
        follower = StoreFollower(manifest, log=follower_lines.append)
        stop = threading.Event()
        thread = threading.Thread(target=follower.run, args=(stop,))
        thread.start()
        try:
            _publish(url, "u:w", 2, [_record(r, 2, 1) for r in range(2)])
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:  # rank 0 goes on, rank 1 says nothing
                _publish(url, "u:w", 2, [_record(0, 2, int(time.monotonic() * 10))])
                time.sleep(0.2)
            assert metrics.value("rec_update_watermark_held_by", model="m", version="1") == 1
            silent = metrics.value("rec_update_partition_silent_ms", model="m", version="1",
                                   partition="1")  # fmt: skip
            assert 7000 < silent < 9500, silent
            _publish(url, "u:w", 2, [_record(1, 2, 2)])
            time.sleep(1.0)
            silent = metrics.value("rec_update_partition_silent_ms", model="m", version="1",
                                   partition="1")  # fmt: skip
            assert silent < 2000, "partition 1 spoke"
        finally:
            stop.set()
            reader.stop()
            thread.join(10)
            follower.close()
    held = "watermark held at gen 1 step 1 by partition 1 (rank 1): silent"
    spoke = "watermark moved on from gen 1 step 1: partition 1 (rank 1) spoke again"
    triton_lines = [line.removeprefix("model 'm': ") for line in triton_lines]
    for lines in (triton_lines, [line.removeprefix("store follow: ") for line in follower_lines]):
        named = [line for line in lines if line.startswith(("watermark held", "watermark moved"))]
        assert len(named) == 2 and named[0].startswith(held) and named[1] == spoke, lines
    assert reader.tables.mark[:2] == (1, 2) and follower.applier.mark[:2] == (1, 2)
