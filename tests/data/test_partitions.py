"""A partitioned event stream (rec.contract.partitions) read by in-process readers against a real
redis-server of the test's own, P=4: each partition read as consumer partition<k> whatever the
rank, what a stray consumer holds taken over at open and trained once, digests salted by the
partition."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.contract.events import encode
from rec.contract.partitions import dead_key, make_layout
from rec.data.stream import StreamConfig, StreamPosition, add_digests, event_digest
from rec.data.stream_redis import Partition, RedisEventReader
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

SPEC = FeatureSpec(
    "csv",
    ["clicked"],
    [DenseFeature("n", "n", "identity")],
    [SparseFeature("item", "item", "int_or_hash", "|")],
    dict(HASH),
)
P = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("redis")) as b:
        yield b


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
