"""The update log's partitions as a publishing run chooses them (train.publish.next_identity)
against real redis-server processes: created once with the layout record, recorded in the run's
publish.json and kept by every later start whatever its world or config; the first start's world
on a Redis Cluster; a legacy run refused where a layout would hide its stream."""

from __future__ import annotations

import json

import pytest
import redis

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import ConfigError, PublishConfig
from rec.contract.partitions import key_slot, layout_key, make_layout, parse_layout
from rec.store.cluster import RedisCluster
from train.publish import PublishError, next_identity

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("plain")) as b:
        yield b


def _run(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def _saved(run) -> dict:
    return json.loads((run / run_dir.PUBLISH_FILE).read_text())


def test_partitions_are_chosen_at_the_first_start_and_kept(broker, tmp_path):
    url = broker.url("u:kept")
    first = next_identity(tmp_path, PublishConfig(url=url, partitions=3), world=2)
    assert first.keys == make_layout("u:kept", 3).keys and first.gen == 1
    assert _saved(tmp_path) == {"run": first.run, "gen": 1, "partitions": 3}
    record = redis.Redis(port=broker.port).get(layout_key("u:kept"))
    assert parse_layout(record, "layout") == make_layout("u:kept", 3)
    # A resume on another world, its config silent about partitions: the same keys.
    again = next_identity(tmp_path, PublishConfig(url=url), world=5)
    assert (again.run, again.gen, again.keys) == (first.run, 2, first.keys)
    with pytest.raises(PublishError, match="publish.partitions=2, but this run publishes to 3"):
        next_identity(tmp_path, PublishConfig(url=url, partitions=2), world=2)


def test_a_layout_of_another_count_is_refused(broker, tmp_path):
    url = broker.url("u:other")
    next_identity(_run(tmp_path / "a"), PublishConfig(url=url, partitions=2), world=2)
    with pytest.raises(PublishError, match="has 2 partitions, not 4"):
        next_identity(_run(tmp_path / "b"), PublishConfig(url=url, partitions=4), world=2)
    assert not (tmp_path / "b" / run_dir.PUBLISH_FILE).exists(), "nothing recorded"


def test_one_plain_node_keeps_the_legacy_layout_unless_asked(broker, tmp_path):
    url = broker.url("u:legacy")
    ident = next_identity(_run(tmp_path / "a"), PublishConfig(url=url), world=4)
    assert ident.keys == () and _saved(tmp_path / "a")["partitions"] == 0
    assert redis.Redis(port=broker.port).get(layout_key("u:legacy")) is None
    # A run that published before partitions existed (no count saved) stays legacy too.
    old = tmp_path / "old"
    old.mkdir()
    (old / run_dir.PUBLISH_FILE).write_text(json.dumps({"run": "r", "gen": 3}))
    assert next_identity(old, PublishConfig(url=url), world=2).keys == ()
    # Another run made the log partitioned: the legacy run's stream would go unread.
    next_identity(_run(tmp_path / "b"), PublishConfig(url=url, partitions=2), world=2)
    with pytest.raises(PublishError, match=r"\{u:legacy\}:layout exists"):
        next_identity(_run(tmp_path / "a"), PublishConfig(url=url), world=4)


def test_the_partition_count_is_checked_by_the_config():
    with pytest.raises(ConfigError, match="publish.partitions=-1"):
        PublishConfig(partitions=-1)


def test_a_cluster_gets_the_first_starts_world_spread_over_its_masters(tmp_path):
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        url = cluster.url() + "/u:c"
        ident = next_identity(_run(tmp_path / "run"), PublishConfig(url=url), world=3)
        assert len(ident.keys) == 3 and _saved(tmp_path / "run")["partitions"] == 3
        owners = {cluster.owner(k).address for k in ident.keys}
        assert len(owners) == 3, f"one partition per master: {owners}"
        assert [key_slot(k) * 3 // 16384 for k in ident.keys] == [0, 1, 2]
