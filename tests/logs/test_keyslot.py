"""rec.contract.partitions' slot function against a real Redis Cluster node's CLUSTER KEYSLOT:
every golden key, every partition key of a few layouts, and random keys with and without hash
tags (braces anywhere, empty tags, UTF-8 and arbitrary bytes). One redis-server started with
--cluster-enabled yes on a free port: it answers KEYSLOT before it joins any cluster."""

import json
import random
from pathlib import Path

import pytest

from rec.broker import RedisBroker, _free_port
from rec.contract import partitions as pt

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "partition_key_golden.json").read_text())


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    import redis

    # The cluster bus port is not port + 10000 (the default), which may be over 65535.
    extra = ["--cluster-enabled", "yes", "--cluster-port", str(_free_port("127.0.0.1"))]
    broker = RedisBroker(tmp_path_factory.mktemp("keyslot"), extra=extra)
    client = redis.Redis(port=broker.port)
    try:
        yield client
    finally:
        client.close()
        broker.stop()


def _random_keys(n: int, seed: int = 0) -> list[bytes]:
    rnd = random.Random(seed)
    alphabet = b"ab{}:01\xd0\xba"
    out = []
    for _ in range(n):
        if rnd.random() < 0.5:
            out.append(bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12))))
        else:
            out.append(rnd.randbytes(rnd.randint(1, 24)))
    return out


def _keyslots(client, keys: list[bytes]) -> list[int]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("CLUSTER", "KEYSLOT", key)
    return [int(v) for v in pipe.execute()]


def test_the_slot_of_every_key_is_the_nodes(node):
    assert node.info("cluster")["cluster_enabled"] == 1
    keys = [c["key"].encode() for c in GOLDEN["key_slot"]]
    for case in GOLDEN["partitions"]:
        keys += [p["key"].encode() for p in case["parts"]]
        keys += [p["dead"].encode() for p in case["parts"]]
    for stream, count in (("rec:events", 64), ("rec:updates", 100), ("événements", 12)):
        layout = pt.make_layout(stream, count)
        keys += [k.encode() for k in layout.keys] + [pt.layout_key(stream).encode()]
    keys += _random_keys(3000)
    assert [pt.key_slot(k) for k in keys] == _keyslots(node, keys)
