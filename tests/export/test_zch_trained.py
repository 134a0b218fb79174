"""A ZCH model from training to rec-server: `rec train` (torchrun, a few steps, admission rounds)
-> `rec export` -> rec-server over HTTP, scored against the trained float model on ids its map
admitted and on ids it never saw, which rec-server counts as unknown."""

from __future__ import annotations

import json

import numpy as np
import torch

from rec import zch
from rec.contract import ModelDir
from rec.export import id_maps
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import load_run
from rec.export.module import FloatReference
from rec.export.zch_checks import TOLERANCE, make_probe
from rec.model import table_rows
from rec.serve.client import Rows, ScoreClient
from rec.serve.cpp import start_cpp
from tests.export.conftest import tiny_dict
from tests.helpers import questionable_ids, run_rec, write_config


def test_a_trained_zch_model_serves_the_scores_it_trained(tmp_path):
    data = tiny_dict()
    data["tables"][0]["ids"] = {"zch": {"every_steps": 4, "probes": 4}}  # t0: feature a
    data["data"]["synthetic"].update(live_ids={"t0": 600}, train_samples=2048, eval_samples=512)
    data["training"].update(steps=8, eval_every=0)
    data["checkpoint"] = {"every_steps": 8}
    config = write_config(tmp_path / "cfg.yaml", data)
    run, repo = tmp_path / "run", tmp_path / "repo"
    run_rec("train", "--config", str(config), "--run-dir", str(run), "--nproc", "1")
    run_rec("export", str(run), "--repo", str(repo), "--format", "torchscript")
    manifest = json.loads(ModelDir.of(repo, "rec").manifest.read_text())
    assert manifest["zch"]["tables"]["t0"]["live"] > 0  # the rounds admitted ids

    loaded = load_run(run)
    cfg = loaded.cfg
    maps = id_maps.read_maps(CheckpointReader(loaded.step_dir), cfg)
    trained = FloatReference(loaded.model, cfg.features.sparse, table_rows(cfg),
                             id_maps.reference_maps(cfg, maps)).eval()  # fmt: skip
    probe = make_probe(cfg, maps, seed=3)
    assert probe.admitted_tables == ["t0"]
    torch.set_num_threads(1)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with start_cpp(repo, **ports) as server:
        before = questionable_ids(server.endpoints.metrics, "unknown")
        client = ScoreClient(server.endpoints.http, "http", model="rec")
        try:
            served = [client.score(Rows(b.dense.numpy(), b.lengths.numpy(), b.values.numpy()))
                      for b in probe.batches()]  # fmt: skip
        finally:
            client.close()
        after = questionable_ids(server.endpoints.metrics, "unknown")
    # Feature a's ids that the trained map does not hold, counted by the server as it scored.
    unknown = sum(_unknown_a(cfg, maps, b) for b in probe.batches())
    assert unknown > 0
    assert {f: n - before.get(f, 0) for f, n in after.items()} == {"a": unknown}
    with torch.no_grad():
        want = [trained(b.dense, b.lengths, b.values).numpy() for b in probe.batches()]
    admitted, unknown, unknown_other = served
    assert np.array_equal(unknown, unknown_other)  # the default row, whatever the id
    for got, expected in zip(served[:2], want[:2], strict=True):
        assert np.abs(got - expected).max() <= TOLERANCE["int8"]
    # An admitted id reads its own row, not the default one: its scores are not the unknowns'.
    assert not np.allclose(admitted, unknown, atol=1e-6)


def _unknown_a(cfg, maps, batch) -> int:
    """Feature a's ids of `batch` (batch-major values) that t0's map does not hold."""
    k = list(cfg.features.sparse).index("a")
    lengths = batch.lengths.reshape(-1).to(torch.int64)
    feature = torch.arange(lengths.numel()) % len(cfg.features.sparse)
    mine = torch.repeat_interleave(feature, lengths) == k
    z = id_maps.zch_tables(cfg)["t0"]
    rows = zch.lookup(batch.values[mine], maps["t0"].keys, maps["t0"].used, z.probes)
    return int((rows == z.slots).sum())


def test_a_published_zch_run_carries_its_maps_to_rec_server(tmp_path):
    """`rec train --publish` with a ZCH table: the rounds after the exported checkpoint reach
    rec-server through the update log (map changes with their rows), and rec-server scores as
    the exported model.pt with the log's rows and the last checkpoint's map written into it.
    The same table exported into the embedding store (keyed by raw id) gets there too: a
    rec-server reading the log scores so before `rec store follow` runs, and one with no log
    and no cache after it (tests/store/test_store_zch_follow.py has the cases by hand)."""
    import re
    import time
    import urllib.request

    from rec import run_dir
    from rec.broker import RedisBroker, redis_server_path
    from rec.update_log import read_records, write_rows

    if redis_server_path() is None:
        import pytest

        pytest.skip("redis-server is not installed (make setup installs it)")
    broker = RedisBroker(tmp_path / "redis")
    try:
        url = broker.url("rec:updates")
        data = tiny_dict()
        data["tables"][0]["ids"] = {"zch": {"every_steps": 4, "probes": 4}}  # t0: feature a
        data["data"]["synthetic"].update(live_ids={"t0": 600}, train_samples=4096,
                                         eval_samples=512)  # fmt: skip
        data["training"].update(steps=12, eval_every=0)
        data["checkpoint"] = {"every_steps": 4, "keep_last": 3}
        data["publish"] = {"url": url, "every_steps": 3, "every_seconds": 0}
        # With --store only: every table, so a server that reads no log is as fresh as the store.
        data["export"]["store"] = {"tables": ["t0", "t1", "t2", "t3"], "partitions": 3}
        config = write_config(tmp_path / "cfg.yaml", data)
        run, repo = tmp_path / "run", tmp_path / "repo"
        run_rec("train", "--config", str(config), "--run-dir", str(run), "--nproc", "1")
        run_rec("export", str(run), "--repo", str(repo), "--checkpoint",
                run_dir.step_dir_name(4), "--format", "torchscript")  # fmt: skip
        later = [r for _, r in read_records(url) if r.step > 4]
        assert sum(len(r.admitted) for r in later) > 0  # the rounds at 8 and 12 admitted ids
        assert all(set(s for s, _ in r.admitted) <= set(r.ids) for r in later)

        loaded = load_run(run)
        cfg = loaded.cfg
        maps = id_maps.read_maps(CheckpointReader(loaded.step_dir), cfg)  # step 12's
        model_dir = ModelDir.of(repo, "rec")
        manifest = json.loads(model_dir.manifest.read_text())
        exported = torch.jit.load(str(model_dir.model_file(1)))
        reference = torch.jit.load(str(model_dir.model_file(1)))
        buffers = dict(reference.named_buffers())
        for r in later:
            if r.count:
                place = manifest["updates"]["tables"][r.table]
                write_rows(buffers[place["buffer"]], place, r.ids, r.rows)
        keys, used = (buffers[b] for b in manifest["zch"]["tables"]["t0"]["buffers"])
        assert not torch.equal(keys[used], maps["t0"].keys[maps["t0"].used])  # rounds 8, 12
        keys.copy_(maps["t0"].keys)
        used.copy_(maps["t0"].used)
        probe = make_probe(cfg, maps, seed=5)
        torch.set_num_threads(1)
        with start_cpp(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
            deadline = time.monotonic() + 60
            pattern = re.compile(r'^rec_update_watermark_step\{model="rec"[^}]*\} (\S+)$', re.M)
            while True:
                with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics") as r:
                    m = pattern.search(r.read().decode())
                if m and float(m.group(1)) >= 12:
                    break
                assert time.monotonic() < deadline, "rec-server did not reach step 12"
                time.sleep(0.1)
            client = ScoreClient(server.endpoints.http, "http", model="rec")
            try:
                served = [client.score(Rows(b.dense.numpy(), b.lengths.numpy(), b.values.numpy()))
                          for b in probe.batches()]  # fmt: skip
            finally:
                client.close()
        with torch.inference_mode():
            args = [(b.dense, b.lengths, b.values) for b in probe.batches()]
            want = [reference(*a).numpy() for a in args]
            old = [exported(*a).numpy() for a in args]
        for got, expected in zip(served, want, strict=True):
            np.testing.assert_array_equal(got, expected)
        assert not np.allclose(served[0], old[0], atol=1e-6)  # the log changed ids and rows
        _stored_gets_there_too(tmp_path, run, url, probe, want)
    finally:
        broker.stop()


def _stored_gets_there_too(tmp_path, run, url, probe, want) -> None:
    """Every table exported at step 4 into a Redis Cluster (t0 keyed by raw id): rec-server
    with the log, then (after `rec store follow`) rec-server alone, score `want`, bit for
    bit."""
    from rec import run_dir
    from rec.store.cluster import RedisCluster

    rows = [Rows(b.dense.numpy(), b.lengths.numpy(), b.values.numpy()) for b in probe.batches()]

    def scores(extra: tuple[str, ...]) -> list[np.ndarray]:
        with start_cpp(stored, http_port=0, grpc_port=0, metrics_port=0,
                       extra_args=extra) as server:  # fmt: skip
            _wait_for_step(server, 12 if "none" not in extra else 0)
            client = ScoreClient(server.endpoints.grpc, "grpc", model="rec")
            try:
                return [client.score(r) for r in rows]
            finally:
                client.close()

    stored = tmp_path / "stored"
    with RedisCluster(tmp_path / "cluster", masters=3, replicas=0) as cluster:
        run_rec("export", str(run), "--repo", str(stored), "--checkpoint",
                run_dir.step_dir_name(4), "--store", cluster.url())  # fmt: skip
        for got, expected in zip(scores(("--updates", url)), want, strict=True):
            np.testing.assert_array_equal(got, expected)  # the follower has not run
        out = run_rec("store", "follow", str(stored), "--idle-exit-s", "1").stdout
        assert " 0 refused" in out, out
        alone = scores(("--updates", "none", "--store-cache-bytes", "0"))
        for got, expected in zip(alone, want, strict=True):
            np.testing.assert_array_equal(got, expected)


def _wait_for_step(server, step: int) -> None:
    import re
    import time
    import urllib.request

    deadline = time.monotonic() + 60
    pattern = re.compile(r'^rec_update_watermark_step\{model="rec"[^}]*\} (\S+)$', re.M)
    while step:
        with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics") as r:
            m = pattern.search(r.read().decode())
        if m and float(m.group(1)) >= step:
            return
        assert time.monotonic() < deadline, f"rec-server did not reach step {step}"
        time.sleep(0.1)
