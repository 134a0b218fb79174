"""A partitioned event stream (rec.contract.partitions) read by in-process readers against a real
redis-server of the test's own, P=4: each partition read as consumer partition<k> whatever the
rank, what a stray consumer holds taken over at open and trained once, digests salted by the
partition; ranks reading k mod world; `rec stream replay --partitions --key` making the layout
and sending each event to crc32(key) mod P, or entries round robin."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import redis

from rec.broker import redis_server_path
from rec.config import config_from_dict
from rec.contract.events import encode
from rec.contract.partitions import (
    dead_key,
    event_partition,
    layout_key,
    make_layout,
    parse_layout,
)
from rec.data.replay import synthetic_events
from rec.data.stream import (
    PartitionedReader,
    StreamConfig,
    StreamPosition,
    add_digests,
    event_digest,
    open_reader,
)
from rec.data.stream_redis import Partition, RedisEventReader
from rec.features import feature_spec
from tests.data.conftest import STREAM_SPEC as SPEC
from tests.helpers import rec_in_process, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

P = 4


def _produce(port: int, key: str, entries: int, per_entry: int, first: int) -> list[int]:
    client = redis.Redis(port=port)
    numbers = []
    for e in range(entries):
        n0 = first + e * per_entry
        client.xadd(key, encode([{"clicked": n % 2, "n": n, "item": f"{n}|{n + 1}"}
                                 for n in range(n0, n0 + per_entry)]))  # fmt: skip
        numbers += list(range(n0, n0 + per_entry))
    client.close()
    return numbers


def _digest(port: int, key: str, k: int) -> int:
    """event_digest over what partition k's stream holds, salted by k."""
    digest = 0
    for entry, fields in redis.Redis(port=port).xrange(key):
        size = len(json.loads(fields[b"events"]))
        digest = add_digests(digest, event_digest(entry.decode(), np.arange(size), k))
    return digest


def _part(stream: str, k: int) -> Partition:
    key = make_layout(stream, P).keys[k]
    return Partition(k, key, dead_key(key))


def _reader(broker, stream: str, k: int, start=None, events=None, read_ahead=2):
    cfg = StreamConfig(url=broker.url(stream), retry_s=0.05, max_retry_s=0.2)
    on_event = (lambda kind, msg: events.append((kind, msg))) if events is not None else None
    return RedisEventReader(cfg, SPEC, 0, start, partition=_part(stream, k),
                            on_event=on_event, read_ahead=read_ahead)  # fmt: skip


def _numbers(batch) -> list[int]:
    return [int(x) for x in batch.batch.dense[:, 0].tolist()]


def _drain(reader, batch: int = 32) -> tuple[list[int], int]:
    got, digest = [], 0
    while True:
        b = reader.next_batch(batch, wait_s=0.1)
        if not len(b):
            return got, digest
        got += _numbers(b)
        digest = add_digests(digest, b.digest)


def test_each_partition_is_read_as_its_own_consumer_with_a_salted_digest(broker):
    sent = {k: _produce(broker.port, _part("four", k).key, 6, 5, 1000 * k) for k in range(P)}
    client = redis.Redis(port=broker.port)
    for k in range(P):
        reader = _reader(broker, "four", k)
        got, digest = _drain(reader)
        assert got == sent[k], "in order, once"
        assert digest == _digest(broker.port, _part("four", k).key, k)
        reader.ack(reader.position())
        reader.close()
        names = [c["name"] for c in client.xinfo_consumers(_part("four", k).key, "rec")]
        assert names == [f"partition{k}".encode()], "one consumer per partition, not per rank"
    digests = {_digest(broker.port, _part("four", k).key, k) for k in range(P)}
    assert len(digests) == P
    assert client.exists("four") == 0, "a partitioned reader never touches the stream's own key"


def test_a_stray_consumers_pending_entries_are_claimed_at_open_and_trained_once(broker):
    key = _part("stray", 1).key
    sent = _produce(broker.port, key, 8, 10, 0)
    client = redis.Redis(port=broker.port)
    client.xgroup_create(key, "rec", id="0")
    # An earlier world's readers: rank0 holds entries 0-2, rank1 entries 3-4, unacknowledged.
    held0 = client.xreadgroup("rec", "rank0", {key: ">"}, count=3)[0][1]
    client.xreadgroup("rec", "rank1", {key: ">"}, count=2)
    # Their checkpoint held entries 0 and 1 whole and 4 events of entry 2.
    start = StreamPosition(held0[2][0].decode(), 4, 10)
    events: list = []
    reader = _reader(broker, "stray", 1, start=start, events=events, read_ahead=0)
    got, _ = _drain(reader)
    assert got == sent[24:], "what the position holds skipped, the rest once, in order"
    claimed = [m for kind, m in events if kind == "claimed"]
    assert len(claimed) == 1 and "rank0 (3 pending)" in claimed[0] and "rank1 (2 pending)" in \
        claimed[0], events  # fmt: skip
    names = [c["name"] for c in client.xinfo_consumers(key, "rec")]
    assert names == [b"partition1"], "the stray consumers are deleted"
    reader.ack(reader.position())
    reader.close()
    assert client.xpending(key, "rec")["pending"] == 0, "the covered entries acked at open"

    again = _reader(broker, "stray", 1, events=events)
    assert _drain(again)[0] == [], "nothing left, nothing claimed twice"
    again.close()
    assert len([m for kind, m in events if kind == "claimed"]) == 1


def _layout(broker, stream: str) -> None:
    layout = make_layout(stream, P)
    redis.Redis(port=broker.port).set(layout_key(stream), layout.to_json(), nx=True)


def test_ranks_read_their_partitions_k_mod_world_and_share_every_event_once(broker):
    _layout(broker, "ranks")
    sent = {k: _produce(broker.port, _part("ranks", k).key, 5, 6, 1000 * k) for k in range(P)}
    cfg = StreamConfig(url=broker.url("ranks"), retry_s=0.05, max_retry_s=0.2)
    readers = [open_reader(cfg, SPEC, r, world=2) for r in (0, 1)]
    assert [sorted(r.parts) for r in readers] == [[0, 2], [1, 3]], "k mod world == rank"
    assert [r.lag() for r in readers] == [10, 10], "entries unread, summed over its partitions"
    got: list[list[int]] = [[], []]
    digest, takes = 0, []
    for rank, reader in enumerate(readers):
        t0 = time.monotonic()
        first = reader.next_batch(8, wait_s=5)
        assert time.monotonic() - t0 < 2.5, "a ready batch does not wait for the deadline"
        batches = [first]
        while len(batches[-1]):
            batches.append(reader.next_batch(8, wait_s=0.2))
        for b in batches:
            got[rank] += _numbers(b)
            digest = add_digests(digest, b.digest)
            takes.append(set(b.parts))
            assert sum(p.events for p in b.parts.values()) == len(b)
        assert set(reader.position()) == set(reader.parts)
        assert reader.ack(reader.position()) == 10
        reader.close()
    assert sorted(got[0]) == sorted(sent[0] + sent[2]) and sorted(got[1]) == sorted(
        sent[1] + sent[3]
    )
    assert any(len(t) > 1 for t in takes), "a batch takes from several partitions"
    want = 0
    for k in range(P):
        want = add_digests(want, _digest(broker.port, _part("ranks", k).key, k))
    assert digest == want


def test_a_rank_without_a_partition_is_warned_and_steps_empty_by_its_deadline(broker):
    _layout(broker, "few")
    said: list = []
    cfg = StreamConfig(url=broker.url("few"), retry_s=0.05, max_retry_s=0.2)
    reader = PartitionedReader(cfg, SPEC, 5, 6, make_layout("few", P),
                               on_event=lambda kind, msg: said.append((kind, msg)))  # fmt: skip
    assert said and said[0][0] == "warning" and "reads no partition" in said[0][1]
    t0 = time.monotonic()
    b = reader.next_batch(8, wait_s=0.3)
    assert len(b) == 0 and b.position == {} and 0.25 < time.monotonic() - t0 < 2
    assert reader.lag() is None
    reader.close()


def test_a_dry_partition_does_not_hold_a_batch_past_its_deadline(broker):
    _layout(broker, "dry")
    sent = _produce(broker.port, _part("dry", 1).key, 1, 5, 0)  # partition 1 only, 5 events
    cfg = StreamConfig(url=broker.url("dry"), retry_s=0.05, max_retry_s=0.2)
    reader = open_reader(cfg, SPEC, 0, world=1)
    t0 = time.monotonic()
    b = reader.next_batch(64, wait_s=0.5)
    took = time.monotonic() - t0
    assert _numbers(b) == sent and 0.4 < took < 2.5, took
    late = _produce(broker.port, _part("dry", 3).key, 1, 4, 100)
    t0 = time.monotonic()
    b = reader.next_batch(4, wait_s=5)
    assert _numbers(b) == late and time.monotonic() - t0 < 2.5, "woken by the partition's thread"
    reader.close()


RAW = {
    "tables": [
        {"name": f"t{i}", "rows": r, "dim": 8, "features": [f"cat_{i}"]}
        for i, r in enumerate([300, 50])
    ],  # fmt: skip
    "features": {"dense": 2},
    "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
    "data": {"synthetic": {"train_samples": 2_000, "eval_samples": 100, "max_hotness": 1}},
}


def _entries(client, key: str) -> list[list[dict]]:
    return [json.loads(f[b"events"]) for _, f in client.xrange(key)]


def test_replay_partitions_by_the_key_columns_crc32_creates_and_keeps_the_layout(broker, tmp_path):
    config = str(write_config(tmp_path / "c.yaml", RAW))
    url = broker.url("keyed")
    out = rec_in_process("stream", "replay", "--synthetic", "600", "--partitions", "4", "--key",
                         "cat_0", "--per-entry", "50", "--to", url, "-c", config,
                         check=True)  # fmt: skip
    assert "sent 600 events" in out.stdout, out.stdout
    client = redis.Redis(port=broker.port)
    layout = parse_layout(client.get(layout_key("keyed")), "keyed")
    assert (layout.partitions, layout.key) == (4, "cat_0") and layout == make_layout(
        "keyed", 4, "cat_0"
    )
    _, chunks = synthetic_events(config_from_dict(RAW), 600)
    sent = [json.loads(json.dumps(e)) for chunk, _ in chunks for e in chunk]
    for k, key in enumerate(layout.keys):
        got = [e for entry in _entries(client, key) for e in entry]
        assert got, f"partition {k} is empty"
        assert all(event_partition(e["cat_0"], 4) == k for e in got)
        assert got == [e for e in sent if event_partition(e["cat_0"], 4) == k], "in order"
    assert not client.exists("keyed"), "nothing goes to the unpartitioned stream"

    other = rec_in_process("stream", "replay", "--synthetic", "10", "--partitions", "2",
                           "--to", url, "-c", config)  # fmt: skip
    assert other.returncode == 1 and "already 4 partitions keyed by 'cat_0'" in other.stdout
    # Without --partitions, the layout there is followed.
    rec_in_process("stream", "replay", "--synthetic", "40", "--start", "600", "--to", url,
                   "-c", config, check=True)  # fmt: skip
    total = sum(len(e) for key in layout.keys for e in _entries(client, key))
    assert total == 640 and not client.exists("keyed")
    cfg = StreamConfig(url=url, retry_s=0.05, max_retry_s=0.2)
    reader = open_reader(cfg, feature_spec(config_from_dict(RAW)), 0, world=1)
    read = 0
    while len(b := reader.next_batch(256, wait_s=0.2)):
        read += len(b)
    reader.close()
    assert read == 640, "the partitioned reader reads what the replay sent"


def test_replay_without_a_key_deals_entries_round_robin(broker, tmp_path):
    config = str(write_config(tmp_path / "c.yaml", RAW))
    url = broker.url("dealt")
    rec_in_process("stream", "replay", "--synthetic", "300", "--partitions", "3", "--per-entry",
                   "20", "--to", url, "-c", config, check=True)  # fmt: skip
    client = redis.Redis(port=broker.port)
    layout = parse_layout(client.get(layout_key("dealt")), "dealt")
    assert (layout.partitions, layout.key) == (3, "")
    counts = [len(_entries(client, key)) for key in layout.keys]
    assert counts == [5, 5, 5], "15 entries of 20 dealt in turn"
    first = [_entries(client, key)[0][0]["cat_0"] for key in layout.keys]
    _, chunks = synthetic_events(config_from_dict(RAW), 60)
    sent = [e for chunk, _ in chunks for e in chunk]
    assert first == [sent[0]["cat_0"], sent[20]["cat_0"], sent[40]["cat_0"]]
    key = rec_in_process("stream", "replay", "--synthetic", "5", "--key", "cat_0", "--to", url,
                         "-c", config)  # fmt: skip
    assert key.returncode == 2 and "give --partitions P" in key.stdout
