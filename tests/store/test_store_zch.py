"""ZCH tables in the embedding store (issue #50 item 5, rec.store/2): keyed by raw id, the
default row stored once per table, an id the store lacks read as the default row, a missing
partition still an error. A real 3-master Redis Cluster, real `rec export`, and the scores of
the tiered model (Python reader, rec-server; Triton in tests/serve_triton/test_store_zch.py)
against the in-model ZCH artifact of the same run, on admitted and on unknown ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rec.ops  # noqa: F401  (model.pt's ops, before torch.jit.load)
from rec import zch
from rec.contract import store as contract
from rec.contract.repository import ModelDir, manifest_in, model_file_in
from rec.export import id_maps
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import load_run
from rec.export.zch_checks import make_probe
from rec.serve.client import Rows, ScoreClient
from rec.serve.cpp import start_cpp
from rec.store.client import connect
from rec.store.cluster import RedisCluster
from rec.store.reader import StoreReader
from tests.export.zch_run import write_zch_run, zch_dict
from tests.helpers import questionable_ids, rec_in_process

# t0 (feature a) and t1 (b, c) are ZCH tables, t2 a modulo one: all three stored, t3 in model.
STORE = {"tables": ["t0", "t1", "t2"], "partitions": 4, "table_partitions": {"t1": 3}}


class Exported:
    """One ZCH run exported twice: its stored tables in the cluster, and every table in the
    model (the in-model ZCH artifact, the reference)."""

    def __init__(self, root: Path, url: str) -> None:
        run = write_zch_run(root / "run", zch_dict(store=STORE))
        rec_in_process("export", str(run), "--repo", str(root / "tiered"), "--store", url,
                       check=True)  # fmt: skip
        rec_in_process("export", str(run), "--repo", str(root / "plain"), check=True)
        self.repo = root / "tiered"
        self.tiered_dir = ModelDir.of(root / "tiered", "rec").version(1)
        self.plain_dir = ModelDir.of(root / "plain", "rec").version(1)
        self.manifest = json.loads(manifest_in(self.tiered_dir).read_text())
        self.section = self.manifest["store"]
        loaded = load_run(run)
        self.cfg = loaded.cfg
        self.maps = id_maps.read_maps(CheckpointReader(loaded.step_dir), self.cfg)
        # Requests whose ZCH ids are admitted, unknown, and unknown with other remainders.
        self.probe = make_probe(self.cfg, self.maps, seed=3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=0) as c:
        yield c


@pytest.fixture(scope="module")
def exported(cluster, tmp_path_factory) -> Exported:
    return Exported(tmp_path_factory.mktemp("zch"), cluster.url())


def unknown_ids(exported: Exported) -> dict[str, int]:
    """Per ZCH feature, the probe's ids (every batch) that its table's map does not hold: what a
    server counts as unknown."""
    features = list(exported.cfg.features.sparse)
    owner = exported.cfg.feature_to_table()
    out: dict[str, int] = {}
    for b in exported.probe.batches():
        values = b.values.reshape(b.lengths.shape)  # one id per feature per sample
        for name, m in exported.maps.items():
            z = id_maps.zch_tables(exported.cfg)[name]
            for k, f in enumerate(features):
                if owner[f] == name:
                    rows = zch.lookup(values[:, k], m.keys, m.used, z.probes)
                    out[f] = out.get(f, 0) + int((rows == z.slots).sum())
    return out


def _fields(client, prefix: str, table: str, parts: int) -> dict[int, dict[bytes, bytes]]:
    return {p: client.hgetall(contract.partition_key(prefix, table, p)) for p in range(parts)}


def test_a_zch_table_is_stored_by_raw_id_with_its_default_row_once(exported, cluster):
    section = exported.section
    contract.check_section(section)
    assert section["format"] == contract.FORMAT_RAW_IDS
    assert [t for t, s in section["tables"].items() if contract.is_raw_keyed(s)] == ["t0", "t1"]
    client = connect(cluster.url())
    for table in ("t0", "t1"):
        spec, m = section["tables"][table], exported.maps[table]
        fields = _fields(client, section["prefix"], table, spec["partitions"])
        ids = {}
        for p, held in fields.items():
            assert held.pop(contract.MARKER_FIELD.encode()) == b"", (table, p)
            default = held.pop(contract.DEFAULT_FIELD.encode(), None)
            assert (default is not None) == (p == 0), (table, p)  # once, in partition 0
            for field in held:
                raw = int(field)
                assert contract.raw_id_partition(raw, spec["partitions"]) == p, (table, raw)
                ids[raw] = held[field]
        admitted = m.keys[m.used].tolist()
        assert sorted(ids) == sorted(admitted)  # every admitted id, nothing else
    # The modulo table keeps rec.store/1's layout: every row, by row index, no marker.
    t2 = section["tables"]["t2"]
    rows = [int(f) for held in _fields(client, section["prefix"], "t2", 4).values() for f in held]
    assert sorted(rows) == list(range(t2["rows"]))
    client.close()
    # model.pt holds no id map of a stored ZCH table: the store is its map.
    buffers = dict(torch.jit.load(str(model_file_in(exported.tiered_dir))).named_buffers())
    assert not [b for b in buffers if ".maps.t0." in b or ".maps.t1." in b]


def _scores(exported: Exported, score) -> list[np.ndarray]:
    return [np.asarray(score(b.dense, b.lengths, b.values)) for b in exported.probe.batches()]


def test_stored_zch_scores_are_the_in_model_artifact_s(exported, cluster):
    from rec.export.tiered import TieredScorer

    plain = torch.jit.load(str(model_file_in(exported.plain_dir)))
    with torch.no_grad():
        want = _scores(exported, lambda *a: plain(*a).numpy())
    for cache in (0, 1 << 20):  # straight from the store, then through the caches (twice)
        reader = StoreReader(exported.section, cache_bytes=cache)
        scorer = TieredScorer(torch.jit.load(str(model_file_in(exported.tiered_dir))), reader)
        for _ in range(2 if cache else 1):
            with torch.no_grad():
                got = _scores(exported, lambda *a, s=scorer: s(*a).numpy())
            for g, w in zip(got, want, strict=True):  # admitted, unknown, unknown elsewhere
                assert np.array_equal(g, w)
        reader.close()
    admitted, unknown, other = want
    assert np.array_equal(unknown, other) and not np.allclose(admitted, unknown, atol=1e-6)
    # A batch without a stored id (every bag empty): no pair, the same scores.
    batch = next(iter(exported.probe.batches()))
    empty = (batch.dense[:3], torch.zeros_like(batch.lengths[:3]), batch.values[:0])
    reader = StoreReader(exported.section)
    scorer = TieredScorer(torch.jit.load(str(model_file_in(exported.tiered_dir))), reader)
    with torch.no_grad():
        assert scorer.model.store_ids(*empty[1:]).shape == (0, 2)
        assert torch.equal(scorer(*empty), plain(*empty))
    reader.close()

    # And rec-server, through its own cluster client and caches: the same scores.
    with start_cpp(exported.repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        before = questionable_ids(server.endpoints.metrics, "unknown")
        client = ScoreClient(server.endpoints.grpc, "grpc")
        try:
            for _ in range(2):  # the second pass from the caches
                got = [client.score(Rows(b.dense.numpy(), b.lengths.numpy(), b.values.numpy()))
                       for b in exported.probe.batches()]  # fmt: skip
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(g, w)
        finally:
            client.close()
        after = questionable_ids(server.endpoints.metrics, "unknown")
    # The raw ids the store lacked, counted per feature on both passes (never cached).
    expected = unknown_ids(exported)
    assert set(expected) == {"a", "b", "c"} and all(n > 0 for n in expected.values())
    assert {f: n - before.get(f, 0) for f, n in after.items()} == {
        f: 2 * n for f, n in expected.items()
    }


def test_a_missing_partition_of_a_zch_table_is_still_an_error(exported, cluster):
    # Last in this module: it deletes one of the export's partitions, once rec-server has
    # loaded (its load-time batch probe would fail on it, as any request does).
    section = exported.section
    parts = section["tables"]["t0"]["partitions"]
    gone = next(i for i in range(1, 1000) if contract.raw_id_partition(i, parts) == 1)
    kept = next(i for i in range(1, 1000) if contract.raw_id_partition(i, parts) == 2)
    client = connect(cluster.url())
    held = client.hgetall(contract.partition_key(section["prefix"], "t0", 2))
    assert str(kept).encode() not in held  # an id the store lacks, in a partition that exists
    reader = StoreReader(section)
    assert reader.rows(torch.tensor([[0, kept]])).numpy().tobytes() == reader._default_row(0)
    k = list(exported.cfg.features.sparse).index("a")
    batch = next(iter(exported.probe.batches()))
    values = batch.values.reshape(batch.lengths.shape).clone()
    values[:, k] = gone
    rows = Rows(batch.dense.numpy(), batch.lengths.numpy(), values.reshape(-1).numpy())
    want = r"partition hash '\{.*:t0:1\}' of table 't0' does not exist"
    with start_cpp(exported.repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        assert client.delete(contract.partition_key(section["prefix"], "t0", 1)) == 1
        with pytest.raises(contract.StoreError, match=want):
            reader.rows(torch.tensor([[0, gone]]))
        # rec-server: the request fails naming the partition, never scored with the default row.
        scores = ScoreClient(server.endpoints.http, "http")
        try:
            with pytest.raises(Exception, match=want):
                scores.score(rows)
        finally:
            scores.close()
    reader.close()
    client.close()


def test_the_config_takes_a_stored_zch_table_with_publishing():
    from rec.config import config_from_dict

    data = zch_dict(store={"tables": ["t0"]})
    config_from_dict(data)
    data["publish"] = {"url": "redis://127.0.0.1:1/rec:updates"}
    # Fresh rows reach it by raw id (tests/store/test_store_zch_follow.py).
    assert config_from_dict(data).publish.url
