"""`rec train --publish` to a Redis Cluster (#60): real torchrun ranks publish the update log in
partitions, one per rank of the first start (publish.partitions 0 on a cluster), each rank into
its own on its slot's master, each batch confirmed by the master's replica (WAIT,
publish.wait_replicas -1); a resume on 1 rank keeps the layout, reads every partition to undo
what the dead run published past its checkpoint, and writes partition 0 only. Applied in the
order the reader returns it, the log ends equal to the final export for every row it carried."""

from __future__ import annotations

import json
import re

import pytest
import redis

from rec import run_dir
from rec.broker import redis_server_path
from rec.contract.partitions import layout_key, make_layout, parse_layout
from rec.contract.updates import decode
from rec.store.cluster import RedisCluster
from rec.update_log import read_records
from tests.helpers import lose_checkpoint, run_rec, write_config
from tests.train.test_publish import _applied, _config, _exported_rows

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _waits(node) -> int:
    """WAIT commands a node has run."""
    client = redis.Redis(host=node.host, port=node.port)
    stats = client.info("commandstats").get("cmdstat_wait", {})
    client.close()
    return int(stats.get("calls", 0))


def _ranks_by_partition(cluster: RedisCluster, keys) -> dict[int, set[tuple[int, int]]]:
    """Each partition's records as (gen, rank), read from the master that owns its key."""
    out = {}
    for k, key in enumerate(keys):
        node = cluster.owner(key)
        client = redis.Redis(host=node.host, port=node.port)
        out[k] = {(r.gen, r.rank) for r in (decode(f) for _, f in client.xrange(key))}
        client.close()
    return out


def test_ranks_publish_to_their_partitions_and_a_resume_on_one_rank_keeps_them(tmp_path):
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=1) as cluster:
        url = cluster.url() + "/rec:updates"
        cfg = _config(url)
        cfg["tables"][0]["rows"] = 20000
        cfg["training"]["steps"] = 40
        cfg["checkpoint"] = {"every_steps": 20, "keep_last": 3}
        run = tmp_path / "run"
        out = run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)),
                      "--run-dir", str(run), timeout=600).stdout  # fmt: skip
        assert "generation 1, 2 partitions)" in out, out
        assert json.loads((run / run_dir.PUBLISH_FILE).read_text())["partitions"] == 2
        head = cluster.owner(layout_key("rec:updates"))
        client = redis.Redis(host=head.host, port=head.port)
        layout = parse_layout(client.get(layout_key("rec:updates")), "layout")
        client.close()
        assert layout == make_layout("rec:updates", 2)
        assert len({cluster.owner(k).address for k in layout.keys}) == 2, "two masters"
        assert _ranks_by_partition(cluster, layout.keys) == {0: {(1, 0)}, 1: {(1, 1)}}
        assert all(_waits(cluster.owner(k)) > 0 for k in layout.keys), "each master waited"

        # Killed before its last checkpoint: resumed from step 20 on one rank.
        lose_checkpoint(run, lost=40, latest=20, steps=24)
        out = run_rec("train", "--resume", str(run), "--nproc", "1", timeout=600).stdout
        assert "generation 2, 2 partitions)" in out, out
        assert re.search(r"re-sent [1-9]\d* rows at their step-20 values", out), out
        assert _ranks_by_partition(cluster, layout.keys) == {0: {(1, 0), (2, 0)}, 1: {(1, 1)}}
        records = [r for _, r in read_records(url)]

    state = _applied(cfg, records)
    assert state.watermark()[:2] == (2, 24)
    final = run_dir.latest_checkpoint(run)
    for table in state.tables:
        exported = _exported_rows(final, cfg, table)
        for row_id, data in state.rows.get(table, {}).items():
            assert data == exported[row_id].numpy().tobytes(), (table, row_id)
