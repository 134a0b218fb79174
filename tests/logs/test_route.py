"""rec.logs.route.Router against real redis-server processes: one plain node (every key on it),
a 3-master Redis Cluster (each key on its slot's master, partitions spread evenly), a slot moved
to another master (the router follows once told, and the event reader follows its stream there
with nothing lost), and nodes that do not answer (an outage, not a crash)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis

from rec.broker import RedisBroker, _free_port, redis_server_path
from rec.contract.events import encode
from rec.contract.partitions import make_layout
from rec.data.stream import StreamConfig
from rec.data.stream_redis import RedisEventReader
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature
from rec.logs.route import RouteConfigError, RouteError, Router, describe, redirected, reroutes
from rec.store.cluster import RedisCluster

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)

SPEC = FeatureSpec("csv", ["clicked"], [DenseFeature("n", "n", "identity")],
                   [SparseFeature("item", "item", "int_or_hash", "|")], dict(HASH))  # fmt: skip
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("plain")) as b:
        yield b


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=0) as c:
        yield c


def _address(node: tuple[str, int]) -> str:
    return f"{node[0]}:{node[1]}"


def _other_master(cluster: RedisCluster, key: str):
    owner = cluster.owner(key)
    return owner, next(m for m in cluster.masters() if m is not owner)


def _move(cluster: RedisCluster, key: str, to) -> None:
    slot = cluster.start_moving(key, to)
    cluster.finish_moving(slot, to)


def test_one_plain_node_serves_every_key(broker):
    router = Router([(HOST, broker.port)])
    assert router.cluster is None, "nothing asked before the first key"
    keys = ("a", "{rec:events:0:10}", b"\xff")
    assert {router.node_for(k) for k in keys} == {(HOST, broker.port)}
    assert router.cluster is False and router.refreshes == 1
    assert router.masters() == [(HOST, broker.port)]


def test_several_plain_nodes_are_refused(broker):
    router = Router([(HOST, broker.port), (HOST, _free_port(HOST))])
    with pytest.raises(RouteConfigError, match="is a plain Redis"):
        router.node_for("a")


def test_no_node_answering_is_an_outage_naming_each_node():
    dead = [(HOST, _free_port(HOST)), (HOST, _free_port(HOST))]
    router = Router(dead)
    with pytest.raises(RouteError) as e:
        router.node_for("a")
    assert all(_address(n) in str(e.value) for n in dead)
    assert reroutes(e.value) and isinstance(e.value, OSError), "retried like a lost connection"


def test_each_key_goes_to_its_slots_master_and_partitions_spread_evenly(cluster):
    # The first seed is no node at all: the router asks the next one.
    seeds = [(HOST, _free_port(HOST)), *((n.host, n.port) for n in cluster.nodes)]
    router = Router(seeds)
    keys = make_layout("rec:events", 6).keys
    nodes = [router.node_for(k) for k in keys]
    assert router.cluster is True and router.refreshes == 1
    assert [_address(n) for n in nodes] == [cluster.owner(k).address for k in keys]
    assert sorted(Counter(nodes).values()) == [2, 2, 2], "P = 2 x masters: two partitions each"
    assert sorted(router.masters()) == sorted((m.host, m.port) for m in cluster.masters())
    for key, node in zip(keys, nodes, strict=True):  # a plain client there is never redirected
        client = redis.Redis(*node)
        assert client.xadd(key, {"k": key})
        client.close()


def test_a_moved_slot_is_followed_after_the_redirection(cluster):
    key = make_layout("route-moved", 3).keys[1]
    router = Router([(n.host, n.port) for n in cluster.nodes])
    before, after = _other_master(cluster, key)
    assert _address(router.node_for(key)) == before.address
    client = redis.Redis(*router.node_for(key))
    client.xadd(key, {"k": "v"})  # MIGRATE moves keys: the slot needs one
    client.close()
    _move(cluster, key, after)

    client = redis.Redis(*router.node_for(key))  # the map is stale: still the old master
    with pytest.raises(redis.ResponseError) as e:
        client.xadd(key, {"k": "v"})
    client.close()
    assert redirected(e.value) and reroutes(e.value)
    assert describe(e.value).startswith("MOVED "), describe(e.value)
    assert after.address in describe(e.value)

    router.invalidate()
    assert _address(router.node_for(key)) == after.address
    assert router.refreshes == 2
    assert not redirected(redis.ResponseError("WRONGTYPE Operation against a key"))


def _produce(cluster: RedisCluster, stream: str, first: int, count: int) -> list[int]:
    """`count` entries of one event each, XADDed through redis-py's cluster client."""
    from rec.store.client import connect

    client = connect(cluster.url())
    for n in range(first, first + count):
        client.xadd(stream, encode([{"clicked": n % 2, "n": n, "item": f"{n}"}]))
    client.close()
    return list(range(first, first + count))


def _numbers(batch) -> list[int]:
    return [int(x) for x in batch.batch.dense[:, 0].tolist()]


def _read_until(reader: RedisEventReader, want: int, timeout: float = 30.0) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += _numbers(reader.next_batch(want - len(got), wait_s=0.3))
    return got


def test_the_event_reader_follows_its_stream_to_another_master(cluster):
    stream = "route-reader"
    sent = _produce(cluster, stream, 0, 20)
    messages: list[tuple[str, str]] = []
    cfg = StreamConfig(url=f"{cluster.url()}/{stream}", retry_s=0.05, max_retry_s=0.2,
                       dead_letter="{route-reader}:dead")  # fmt: skip
    reader = RedisEventReader(cfg, SPEC, 0, on_event=lambda k, m: messages.append((k, m)))
    try:
        got = _read_until(reader, 20)
        assert got == sent
        assert reader.ack(reader.position()) == 20
        before, after = _other_master(cluster, stream)
        assert _address(reader.router.node_for(stream)) == before.address

        # The read-ahead thread is blocked in XREADGROUP on the old master when the slot moves.
        _move(cluster, stream, after)
        sent += _produce(cluster, stream, 20, 15)
        got += _read_until(reader, 15)
        assert got == sent, "in order, nothing lost, nothing twice"
        assert _address(reader.router.node_for(stream)) == after.address
        assert reader.counts["outages"] >= 1
        down = [m for k, m in messages if k == "down"]
        assert down and all("not served where it was" in m for m in down), messages
        assert any(f"on {after.address} as rec/rank0" in m for k, m in messages if k == "up")
        assert reader.ack(reader.position()) == 15, "the acknowledgements go to the new master"
        client = redis.Redis(after.host, after.port)
        assert client.xpending(stream, "rec")["pending"] == 0
        client.close()
    finally:
        reader.close()


def test_on_a_cluster_the_dead_letters_share_the_streams_slot(cluster):
    """The reader parks a refused event in the pipeline that acknowledges its entry, on the
    stream's node: `<stream>:dead` hashes elsewhere and is refused, naming a key that does not."""
    from rec.store.client import connect

    stream, refused = "route-dead", {"clicked": 3, "n": 1, "item": ""}  # a label of 3
    client = connect(cluster.url())
    client.xadd(stream, encode([refused, {"clicked": 1, "n": 2, "item": "2"}]))
    url = f"{cluster.url()}/{stream}"
    reader = RedisEventReader(StreamConfig(url=url, retry_s=0.05), SPEC, 0)
    with pytest.raises(ValueError, match=r"set data.stream.dead_letter to '\{route-dead\}:dead'"):
        reader.next_batch(2, wait_s=5.0)
    reader.close()

    cfg = StreamConfig(url=url, retry_s=0.05, dead_letter="{route-dead}:dead")
    reader = RedisEventReader(cfg, SPEC, 0)
    try:
        assert _read_until(reader, 1) == [2]
        assert dict(reader.refused) == {"label_not_binary": 1}
        dead = client.xrange("{route-dead}:dead")
        assert [fields[b"reason"] for _, fields in dead] == [b"label_not_binary"]
    finally:
        reader.close()
        client.close()
