"""Trimming the event stream (rec.data.stream_trim) against a real redis-server: nothing at or
after the oldest kept checkpoint's position, nor another group's pending or undelivered entry,
is trimmed; a key some kept checkpoint has no position in is not trimmed; dead letters are
capped; a reader resumed from the oldest kept checkpoint's position reads exactly the rest; a
real `rec train` trims below its oldest kept checkpoint after each one, every event trained
once."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import redis

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.contract.events import encode
from rec.data.replay import synthetic_events
from rec.data.stream import StreamConfig, add_digests, event_digest
from rec.data.stream_reader import StreamPosition, entry_key
from rec.data.stream_redis import RedisEventReader
from rec.data.stream_trim import kept_bounds, trim_stream
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature
from rec.train.stream_tally import lineage
from tests.helpers import TINY, run_rec, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

SPEC = FeatureSpec("csv", ["clicked"], [DenseFeature("n", "n", "identity")],
                   [SparseFeature("item", "item", "int_or_hash", "|")], dict(HASH))  # fmt: skip
PER_ENTRY = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("redis")) as b:
        # Small macro nodes, so that an approximate trim has whole nodes to drop in a short test.
        redis.Redis(port=b.port).config_set("stream-node-max-entries", 10)
        yield b


def _produce(client, key: str, entries: int) -> list[bytes]:
    ids = []
    for e in range(entries):
        n0 = e * PER_ENTRY
        ids.append(client.xadd(key, encode([{"clicked": n % 2, "n": n, "item": f"{n}"}
                                            for n in range(n0, n0 + PER_ENTRY)])))  # fmt: skip
    return ids


def _numbers(batch) -> list[int]:
    return [int(x) for x in batch.batch.dense[:, 0].tolist()]


def _meta(position: dict | None, *more: dict | None) -> dict:
    """A one-stream checkpoint's meta.json `stream` section with these ranks' positions."""
    return {"positions": [position, *more]}


def test_the_oldest_kept_position_and_another_groups_needs_bound_the_trim(broker):
    client = redis.Redis(port=broker.port)
    ids = _produce(client, "ev", 200)
    client.xadd("ev:dead", {"reason": "x"})
    cfg = StreamConfig(url=broker.url("ev"), retry_s=0.05, max_retry_s=0.2)
    reader = RedisEventReader(cfg, SPEC, 0, read_ahead=0)
    got, checkpoints = [], []
    for _ in range(3):  # three checkpoints, the middle of an entry each time
        got += _numbers(reader.next_batch(151, wait_s=2))
        checkpoints.append(reader.position())
    reader.ack(checkpoints[0])  # the newest ones committed, their acks not yet sent (a crash)
    reader.close()
    assert got == list(range(453))
    # Another job's group: 20 entries read, 5 acknowledged, 15 pending from entry 65 on.
    client.xgroup_create("ev", "other", id=ids[59])
    held = client.xreadgroup("other", "c", {"ev": ">"}, count=20)[0][1]
    client.xack("ev", "other", *[i for i, _ in held[:5]])

    kept = [_meta(c) for c in checkpoints[1:]]  # keep_last 2: the first one was pruned
    oldest = checkpoints[1]["entry"]
    assert entry_key(ids[64]) < entry_key(oldest), "the other group's need is the lower bound"
    done = trim_stream(cfg, kept)
    assert done == {"ev": ids[65].decode()}
    left = [i for i, _ in client.xrange("ev")]
    assert left[-1] == ids[-1] and set(ids[65:]) <= set(left), "nothing it needs is trimmed"
    assert len(left) < 200 - 40, "whole nodes below the bound are gone"

    client.xgroup_destroy("ev", "other")
    assert trim_stream(cfg, kept) == {"ev": oldest}
    left = [i.decode() for i, _ in client.xrange("ev")]
    assert oldest in left and entry_key(left[0]) > entry_key(ids[65]), left[:3]
    assert client.xlen("ev:dead") == 1, "dead letters capped at DEAD_KEEP only"

    # The oldest kept checkpoint resumes exactly: what its position holds skipped, the rest once.
    again = RedisEventReader(cfg, SPEC, 0, StreamPosition.from_dict(checkpoints[1]), read_ahead=0)
    rest: list[int] = []
    while len(b := again.next_batch(256, wait_s=0.3)):
        rest += _numbers(b)
    again.close()
    assert rest == list(range(302, 800)), "from the checkpoint's position on, each once"
    assert again.counts["acked"] == 0 and again.refused == {}, "trimmed pending entries: covered"
    client.close()


def test_a_key_some_kept_checkpoint_has_no_position_in_is_not_trimmed(broker):
    client = redis.Redis(port=broker.port)
    _produce(client, "{pt:0:0}", 50)
    _produce(client, "{pt:1:0}", 50)
    late = client.xrange("{pt:0:0}")[40][0].decode()
    parts = [{"partition": 0, "key": "{pt:0:0}", "position": {"entry": late, "events": 4,
                                                               "size": 4}},
             {"partition": 1, "key": "{pt:1:0}", "position": None}]  # fmt: skip
    bounds = kept_bounds([{"format": 2, "parts": parts}], "pt")
    assert bounds == {"{pt:0:0}": entry_key(late), "{pt:1:0}": None}
    cfg = StreamConfig(url=broker.url("pt"))
    assert trim_stream(cfg, [{"format": 2, "parts": parts}]) == {"{pt:0:0}": late}
    assert client.xlen("{pt:1:0}") == 50 and 10 <= client.xlen("{pt:0:0}") < 50
    # One stream: a rank with no position keeps the stream whole.
    assert kept_bounds([_meta({"entry": late, "events": 0, "size": 4}, None)], "s") == {"s": None}
    client.close()


def test_a_training_run_trims_below_its_oldest_kept_checkpoint(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url, client = broker.url("run"), redis.Redis(port=broker.port)
        client.config_set("stream-node-max-entries", 2)
        cfg = copy.deepcopy(TINY)
        cfg["tables"] = cfg["tables"][:4]
        cfg["training"] = {"batch_size": 32, "steps": 0, "log_every": 5, "profile_steps": 0}
        cfg["checkpoint"] = {"every_steps": 3, "keep_last": 2}
        cfg["data"]["stream"] = {"url": url, "wait_s": 0.2, "idle_exit_s": 3}
        _, chunks = synthetic_events(config_from_dict(cfg), 800)
        events = [e for chunk, _ in chunks for e in chunk]
        ids, digest = [], 0
        for i in range(0, 800, 16):
            ids.append(client.xadd("run", encode(events[i : i + 16])).decode())
            digest = add_digests(digest, event_digest(ids[-1], np.arange(16)))
        config, run = write_config(tmp_path / "c.yaml", cfg), tmp_path / "run"
        out = run_rec("train", "-c", str(config), "--run-dir", str(run), timeout=300).stdout
        kept = [run_dir.read_meta(d)["stream"] for d in run_dir.committed_steps(run)]
        assert len(kept) == 2 and lineage(kept[-1]) == (800, digest), out
        oldest = min((p for m in kept for p in m["positions"]), key=lambda p: entry_key(p["entry"]))
        left = [i.decode() for i, _ in client.xrange("run")]
        assert len(left) < len(ids) - 4, "trimmed"
        assert [i for i in ids if entry_key(i) >= entry_key(oldest["entry"])] == [
            i for i in left if entry_key(i) >= entry_key(oldest["entry"])
        ], "nothing at or after the oldest kept checkpoint's position"
        assert client.xpending("run", "rec")["pending"] == 0
        client.close()
