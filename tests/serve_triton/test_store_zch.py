"""rec's Triton model serving ZCH tables from the embedding store (issue #50 item 5,
rec.store/2): the real tritonserver running serve/triton_python_model.py over our own Redis
Cluster scores the probe's admitted and unknown ids as the in-model ZCH artifact of the same run,
bit for bit, with and without its row caches; a missing partition fails the request naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rec.ops  # noqa: F401  (model.pt's ops, before torch.jit.load)
from rec.contract import store as contract
from rec.contract.repository import model_file_in
from rec.serve.client import Rows, ScoreClient
from rec.serve.triton import start_triton
from rec.store.client import connect
from rec.store.cluster import RedisCluster
from tests.helpers import questionable_ids
from tests.serve_triton.servers import TRITON_AND_REDIS
from tests.store.test_store_zch import Exported, unknown_ids

pytestmark = TRITON_AND_REDIS


def _rows(batch) -> Rows:
    return Rows(batch.dense.numpy(), batch.lengths.numpy(), batch.values.numpy())


def test_triton_serves_stored_zch_tables_as_the_in_model_artifact(tmp_path):
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        exported = Exported(tmp_path, cluster.url())
        plain = torch.jit.load(str(model_file_in(exported.plain_dir)))
        with torch.no_grad():
            want = [plain(b.dense, b.lengths, b.values).numpy() for b in exported.probe.batches()]
        assert np.array_equal(want[1], want[2])  # unknown ids: the default row, whatever the id
        for cache in (1 << 20, 0):  # with row caches, then without (every batch from the store)
            server = start_triton(exported.repo, http_port=0, grpc_port=0, metrics_port=0,
                                  store_cache_bytes=cache)  # fmt: skip
            try:
                before = questionable_ids(server.endpoints.metrics, "unknown")
                client = ScoreClient(server.endpoints.grpc, "grpc", model="rec")
                try:
                    for _ in range(2):  # the second pass from the caches, if any
                        for batch, w in zip(exported.probe.batches(), want, strict=True):
                            assert np.array_equal(client.score(_rows(batch)), w)
                    # The raw ids the store lacked, counted per feature on both passes.
                    after = questionable_ids(server.endpoints.metrics, "unknown")
                    got = {f: n - before.get(f, 0) for f, n in after.items()}
                    assert got == {f: 2 * n for f, n in unknown_ids(exported).items()}
                    if cache:
                        continue
                    # A missing partition: the request fails naming it (no default row).
                    section = exported.section
                    redis = connect(cluster.url())
                    redis.delete(contract.partition_key(section["prefix"], "t0", 1))
                    redis.close()
                    batch = next(iter(exported.probe.batches()))
                    values = batch.values.reshape(batch.lengths.shape).clone()
                    k = list(exported.cfg.features.sparse).index("a")
                    values[:, k] = next(i for i in range(1, 99) if i % 4 == 1)  # partition 1
                    bad = Rows(batch.dense.numpy(), batch.lengths.numpy(),
                               values.reshape(-1).numpy())  # fmt: skip
                    with pytest.raises(Exception, match=r"t0:1\}' of table 't0' does not exist"):
                        client.score(bad)
                finally:
                    client.close()
            finally:
                server.stop()
