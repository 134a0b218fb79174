"""Trimming the update log (rec.logs.update_trim, #60) on a real redis-server, 2 partitions: live
registrations hold the trim back (nothing a reader needs goes), publish.keep_s keeps its history,
no registration keeps everything; a reader silent past publish.reader_ttl_s is trimmed past, and
Triton's update reader and the store follower, following from before the trim, say so and name
the recovery rather than skip rows."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import PublishConfig
from rec.contract.partitions import partition_key
from rec.contract.sections import StoredTable, StoreSection, UpdatesSection
from rec.contract.store import StoreError, meta_key, row_bytes
from rec.logs.update_reader import PartitionedLogReader
from rec.logs.update_trim import live_needs, readers_key, register, tails, trim_log
from rec.store.cluster import RedisCluster
from rec.update_log import Applier, ServedTable
from tests.logs.test_update_reader import DIM, ROWS, _publish, _record

pytestmark = pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")

TABLES = {"t0": ServedTable(ROWS, DIM, "int8")}
STEPS = 30


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("redis")) as b:
        # Small macro nodes, so that an approximate trim has whole nodes to drop.
        redis.Redis(port=b.port).config_set("stream-node-max-entries", 10)
        yield b


def _log(broker, stream: str) -> tuple[str, redis.Redis, dict[int, list[str]]]:
    """A 2-partition log of ranks 0 and 1 publishing STEPS steps; its entry ids per partition."""
    url = f"redis://127.0.0.1:{broker.port}/{stream}"
    _publish(url, stream, 2, [_record(r, 2, s) for s in range(1, STEPS + 1) for r in range(2)])
    client = redis.Redis(port=broker.port)
    ids = {k: [e[0].decode() for e in client.xrange(_key(stream, k))] for k in range(2)}
    assert [len(v) for v in ids.values()] == [STEPS, STEPS]
    return url, client, ids


def _key(stream: str, k: int) -> str:
    return partition_key(stream, k, 2)


def test_registrations_and_keep_s_hold_the_trim_back(broker):
    url, client, ids = _log(broker, "held")
    cfg = PublishConfig(url=url, partitions=2, keep_s=0)
    before = tails(url)
    assert trim_log(cfg, before, gen=1, step=STEPS) == {}, "no registration: nothing known"
    assert client.xlen(_key("held", 0)) == STEPS
    register(url, "a", {0: ids[0][15], 1: ids[1][22]})
    register(url, "b", {0: ids[0][25], 1: ids[1][12]})
    register(url, "gone", {0: "0-0", 1: "0-0"}, now=time.time() - 61)  # past reader_ttl_s
    done = trim_log(cfg, before, gen=1, step=STEPS)
    assert done == {0: ids[0][15], 1: ids[1][12]}, "the oldest live need per partition"
    for k, need in ((0, 15), (1, 12)):
        left = [e[0].decode() for e in client.xrange(_key("held", k))]
        assert left == ids[k][10:], "whole nodes below the need went, nothing from it on"
        assert ids[k][need] in left
    trimmed = json.loads(client.get("{held}:trimmed"))
    assert trimmed["0"] == {"minid": ids[0][15], "gen": 1, "step": STEPS}
    # The checkpoint's tails bound it too: a reader needing more than was written before the
    # flush does not let records of a later step go.
    register(url, "a", {0: "9999999999999-0", 1: "9999999999999-0"})
    register(url, "b", {0: "9999999999999-0", 1: "9999999999999-0"})
    ms, seq = ids[0][21].split("-")
    assert trim_log(cfg, {0: ids[0][21], 1: ids[1][21]}, 1, 22)[0] == f"{ms}-{int(seq) + 1}"
    left = [e[0].decode() for e in client.xrange(_key("held", 0))]
    assert left == ids[0][20:], "the macro node holding the tail stays"
    # publish.keep_s: the last hour stays whatever the readers need.
    url2, client2, ids2 = _log(broker, "kept")
    register(url2, "a", {0: ids2[0][-1], 1: ids2[1][-1]})
    trim_log(PublishConfig(url=url2, partitions=2, keep_s=3600), tails(url2), 1, STEPS)
    assert client2.xlen(_key("kept", 0)) == client2.xlen(_key("kept", 1)) == STEPS


def test_a_reader_past_its_ttl_is_trimmed_past_and_says_so(broker, tmp_path):
    from rec.serve.python_backend.metrics import MemoryMetrics, UpdateMetrics
    from rec.serve.python_backend.updates import UpdateReader
    from rec.store.follow import StoreFollower

    url, client, ids = _log(broker, "past")
    register(url, "stuck", {0: ids[0][0], 1: ids[1][0]}, now=time.time() - 120)
    register(url, "live", {0: ids[0][-1], 1: ids[1][-1]})
    assert live_needs(client.hgetall(readers_key("past")), 60, time.time()) == {
        0: tuple(map(int, ids[0][-1].split("-"))),
        1: tuple(map(int, ids[1][-1].split("-"))),
    }
    done = trim_log(PublishConfig(url=url, partitions=2, keep_s=0), tails(url), 1, STEPS)
    assert done == {0: ids[0][-1], 1: ids[1][-1]} and client.xlen(_key("past", 0)) < STEPS
    # Triton's reader with an export older than the trim, reading from the log's start.
    lines: list[str] = []
    reader = UpdateReader("m", url, Applier(TABLES), UpdateMetrics(MemoryMetrics(), "m", "1"),
                          lambda level, line: lines.append(f"{level} {line}"))  # fmt: skip
    deadline = time.monotonic() + 10
    while not any("trimmed" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    names = client.hkeys(readers_key("past"))
    reader.stop()
    said = [line for line in lines if "trimmed" in line]
    assert said and said[0].startswith("error model 'm': the update log's partition 0 was "
                                       f"trimmed below {ids[0][-1]}"), lines  # fmt: skip
    assert "rec export" in said[0] and "gen 1 step 30" in said[0]
    assert any(n.startswith(b"triton:m@") for n in names), "it registers"
    # The store follower (its store a 3-master cluster), saved cursors near the start: it
    # stops naming the trim.
    table = StoredTable(ROWS, DIM, "int8", row_bytes(DIM, "int8"), 2)
    with RedisCluster(tmp_path / "store", masters=3, replicas=0) as cluster:
        manifest = SimpleNamespace(
            store=StoreSection("rec.store/2", cluster.url(), "w", {"t0": table}),
            updates=UpdatesSection("rec.updates/1", url, "r", step=0, gen=1),
        )
        store = redis.RedisCluster.from_url(cluster.url().split(",")[0])
        store.hset(meta_key("w"), mapping={"format": "rec.store/2", "follow_id:0": ids[0][2],
                                           "follow_id:1": ids[1][2]})  # fmt: skip
        store.close()
        follower = StoreFollower(manifest, log=lambda line: None)
        need = follower._need(PartitionedLogReader(url))
        assert need == {0: ids[0][2], 1: ids[1][2]}, "it registers its saved cursors"
        with pytest.raises(StoreError, match=r"follow stopped: .*partition 0 was trimmed.*--store"):
            follower.run(threading.Event(), idle_exit_s=5)
        follower.close()


def test_rec_train_trims_at_each_checkpoint(broker, tmp_path):
    """A real `rec train` (1 rank, the one-stream layout) trims after its checkpoints below a
    live registration: the entries before the need go, the need and every record stay."""
    import copy

    from tests.helpers import TINY, run_rec, write_config

    stream = "trained"
    client = redis.Redis(port=broker.port)
    ids = [client.xadd(stream, {"old": str(i)}).decode() for i in range(30)]  # older history
    url = f"redis://127.0.0.1:{broker.port}/{stream}"
    register(url, "replica", {0: ids[20]})
    cfg = copy.deepcopy(TINY)
    cfg["training"].update(steps=20, eval_every=0)
    cfg["checkpoint"] = {"every_steps": 10, "keep_last": 2}
    cfg["publish"] = {"url": url, "every_steps": 5, "every_seconds": 0, "keep_s": 0, "trim": True,
                      "reader_ttl_s": 600}  # fmt: skip
    config = write_config(tmp_path / "c.yaml", cfg)
    run_rec("train", "--config", str(config), "--run-dir", str(tmp_path / "run"), "--nproc", "1")
    left = [e[0].decode() for e in client.xrange(stream)]
    assert left[:10] == ids[20:], "below the need gone (whole nodes), the need on kept"
    records = client.xrange(stream, "(" + ids[29])
    assert len(left) == 10 + len(records) and records, "every record the run published stays"
    assert all(b"old" not in fields for _, fields in records)
    assert json.loads(client.get("{trained}:trimmed")) == {
        "0": {"minid": ids[20], "gen": 1, "step": 20}}  # fmt: skip
    # `rec export --follow` registers the oldest kept version's place: its checkpoint's tails.
    from rec.export.follow import _ServedPlaces

    steps = run_dir.committed_steps(tmp_path / "run")
    tails = [run_dir.read_meta(d)["publish_tails"] for d in steps]
    assert [len(t) for t in tails] == [1, 1] and tails[0]["0"] < tails[1]["0"]
    served = _ServedPlaces(url, keep=2)
    for d in steps:
        served.add(d)
    assert served.need() == {0: tails[0]["0"]}
    served.add(steps[1])
    assert served.need() == {0: tails[1]["0"]}, "only the newest `keep` versions"
    deadline = time.monotonic() + 10
    while not (names := [n for n in client.hkeys(readers_key(stream)) if b"export" in n]):
        assert time.monotonic() < deadline, "registered within a round"
        time.sleep(0.1)
    served.stop()
    assert json.loads(client.hget(readers_key(stream), names[0]))["need"] == {"0": tails[1]["0"]}
