"""This CPU's calibration (train.calibration) and the estimate made from it (train.plan_estimate):
the cache's key and round trip, micro-benchmarks that measure something, an estimate that moves
with its inputs, and the end of a run printing the estimate beside what was measured. No timed
asserts: how close the estimate comes is benchmarks/plan_accuracy.py's business."""

from __future__ import annotations

import copy
import json
import time

import pytest
import torch

from rec.config import config_from_dict
from rec.cpu import cpu_info
from rec.model import TrainModel, build_model
from rec.train import calibration, plan_estimate
from rec.train.distributed import set_rank_threads
from rec.train.plan_stats import plan_or_refuse
from rec.train.progress import Progress

TINY = {
    "tables": [
        {"name": "a", "rows": 1000, "dim": 16, "features": ["f_a"]},
        {"name": "b", "rows": 500, "dim": 16, "features": ["f_b"]},
    ],
    "features": {"dense": 4},
    "model": {"dense_arch": [16, 16], "over_arch": [16, 1]},
    "training": {"batch_size": 8},
    "sharding": {"constraints": {"a": {"sharding_types": ["table_wise"]},
                                 "b": {"sharding_types": ["table_wise"]}}},
}  # fmt: skip


def _by_hand(key: dict) -> dict:
    """A calibration with round numbers, as load() caches one."""
    return {
        "key": key,
        "tbe": {"rowwise_adagrad": {"call_us": 100.0, "table_us": 10.0,
                                    "ns_per_elem_cached": 1.0, "ns_per_elem_dram": 4.0}},
        "dense_optimizer_ns": {"adam": 2.0},
        "loop": {"sparse_dist/2": 0.010, "sparse_dist/8": 0.016, "base/2": 0.008,
                 "base/8": 0.014, "a2a_bytes_per_s": 1e9},
        "baseline_rss": 400 << 20,
        "dense": {"gflops": 50.0, "layer_us": 20.0},
        "data": {"us_per_sample": 1.0, "us_per_id": 0.1, "ids_per_feature": 1.5},
        "measured_s": 1.0,
        "measured_at": "2026-11-29T00:00:00Z",
    }  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cache_key_names_the_cpu_and_libraries_and_round_trips(cache):
    key = calibration.cache_key()
    assert key["cpu"] == cpu_info()["model"]
    assert key["torch"] == torch.__version__ and key["cores"] >= 1 and key["threads"] >= 1
    path = calibration.cache_path(key)
    assert path.parent == cache and path.name.startswith("calibration-")
    assert calibration.load(measure=False) is None  # nothing cached: no number made up
    cal = _by_hand(key)
    path.write_text(json.dumps(cal))
    assert calibration.load(measure=False) == cal
    assert calibration.load("adam", measure=False) is None  # a fused Adam not measured yet
    # Another torch (or CPU, or thread count) is another file, and an entry of another key in
    # this file is not taken for this one.
    assert calibration.cache_path({**key, "torch": "0.0"}) != path
    path.write_text(json.dumps({**cal, "key": {**key, "threads": key["threads"] + 1}}))
    assert calibration.load(measure=False) is None


def test_a_training_rank_finds_the_calibration_its_launcher_made(cache, monkeypatch):
    """`rec train` calibrates before it launches; each rank then lowers its threads to its
    share of the cores (set_rank_threads) and must still read that calibration's entry for
    the end-of-run estimate."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    key = calibration.cache_key()
    assert key["threads"] == calibration.cores()
    calibration.cache_path(key).write_text(json.dumps(_by_hand(key)))
    try:
        set_rank_threads(2 * calibration.cores())  # a rank of many: one thread
        assert torch.get_num_threads() == 1
        assert calibration.cache_key() == key
        assert calibration.load(measure=False) == _by_hand(key)
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what the launcher and its ranks share
    assert calibration.cache_key()["threads"] == 3


def test_tbe_costs_from_the_timings():
    """measure_tbe's arithmetic on timings chosen here: a call's and a table's cost from 1 and 8
    tables, the cost per id x dim from the large lookups; noisy timings clamp, never invert."""
    us, elems = 1e-6, 8192 * 64
    costs = calibration.tbe_costs(10 * us, 17 * us, 10 * us + elems * 2e-9, 10 * us + elems * 8e-9)
    assert costs == pytest.approx({"call_us": 9.0, "table_us": 1.0, "ns_per_elem_cached": 2.0,
                                   "ns_per_elem_dram": 8.0})  # fmt: skip
    # Eight tables timed faster than one, the big table faster than the small: no table cost,
    # and the big table costs what the small one does.
    noisy = calibration.tbe_costs(10 * us, 9 * us, 10 * us + elems * 2e-9, 10 * us)
    assert noisy == pytest.approx({"call_us": 10.0, "table_us": 0.0, "ns_per_elem_cached": 2.0,
                                   "ns_per_elem_dram": 2.0})  # fmt: skip


def test_micro_benchmarks_measure_this_cpu():
    """FBGEMM's TBE with a fused optimizer and a Linear: each cost is positive and finite, and
    no single call took longer than the whole measurement did."""
    t0 = time.perf_counter()
    tbe = calibration.measure_tbe("sgd", lambda _: None)
    elapsed_us = (time.perf_counter() - t0) * 1e6
    assert 0 < tbe["call_us"] + tbe["table_us"] < elapsed_us  # the one-table call, at least
    assert 0 < tbe["ns_per_elem_cached"] * 8192 * 64 / 1e3 < elapsed_us
    assert 0 < tbe["ns_per_elem_dram"] * 8192 * 64 / 1e3 < elapsed_us
    t0 = time.perf_counter()
    dense = calibration.measure_dense(lambda _: None)["dense"]
    elapsed_us = (time.perf_counter() - t0) * 1e6
    assert 0 < dense["layer_us"] < elapsed_us
    # 6 x 512^3 FLOP in at most the whole measurement's time; below 100 TFLOP/s on one thread.
    assert 6 * 512**3 / elapsed_us / 1e3 < dense["gflops"] < 1e5


def _estimate(config: dict, probe: dict | None = None, world: int = 2):
    cfg = config_from_dict(config)
    _, capture = plan_or_refuse(cfg, TrainModel(build_model(cfg, "meta")), world)
    cal = _by_hand(calibration.cache_key())
    batch = cfg.training.batch_size
    probe = probe or {}
    steps = plan_estimate.step_ms(cfg, capture.best_plan, cal, world, world, batch, probe,
                                  [0] * world)  # fmt: skip
    memory = plan_estimate.memory_bytes(cfg, capture.best_plan, cal, world, batch, probe)
    return steps, memory, {so.name: so.shards[0].rank for so in capture.best_plan}


def test_estimate_grows_with_rows_batch_and_ids():
    steps, memory, owner = _estimate(TINY)
    for rank in (0, 1):
        assert memory[rank]["total"] == sum(v for k, v in memory[rank].items() if k != "total")
        assert memory[rank]["process"] == 400 << 20
        assert steps[rank]["total"] == pytest.approx(
            sum(v for k, v in steps[rank].items() if k != "total"), abs=1e-2)  # fmt: skip
    # Rows: table a x 10 adds its 9,000 rows of 16 floats and their row-wise Adagrad float.
    bigger = copy.deepcopy(TINY)
    bigger["tables"][0]["rows"] = 10_000
    _, more, owner2 = _estimate(bigger)
    a = owner["a"]
    assert owner2["a"] == a
    grown = more[a]["tables_and_optimizer"] - memory[a]["tables_and_optimizer"]
    assert grown == 9_000 * (16 + 1) * 4
    # A ZCH table's id map is on every rank, 57 bytes a slot, beside its rows.
    zch = copy.deepcopy(TINY)
    zch["tables"][0]["ids"] = {"zch": {}}
    _, with_maps, _ = _estimate(zch)
    assert [m.get("id_maps") for m in with_maps] == [(1_000 - 1) * 57] * 2
    assert "id_maps" not in memory[0]
    # Batch: every rank's data, lookups and dense layers take longer; so do more ids per sample.
    wider = copy.deepcopy(TINY)
    wider["training"]["batch_size"] = 64
    slower, _, _ = _estimate(wider)
    multi_hot, _, _ = _estimate(TINY, {"ids_per_feature": 3.0})
    for part in ("data", "embeddings", "dense"):
        assert slower[0][part] > steps[0][part], part
    assert multi_hot[a]["embeddings"] > steps[a]["embeddings"]
    assert multi_hot[a]["data"] > steps[a]["data"]


def test_end_of_run_prints_the_estimate_beside_the_measured(tmp_path, capsys):
    progress = Progress(tmp_path / "metrics.jsonl", total_steps=4, samples_per_step=16)
    progress.start(0)
    for step in (2, 4):
        progress.train(step, loss=0.5, lr=0.1)
    measured = progress.mean_step_ms()
    assert measured is not None and measured > 0
    gib = 1024**3
    est = {"process": gib // 4, "tables_and_optimizer": gib // 4, "dense": 0, "activations": 0,
           "data": 0, "total": gib // 2}  # fmt: skip
    report = {"calibrated": {"step_ms": 2 * measured, "profile_steps": 10,
                             "ranks": [{"memory_bytes": est}, {"memory_bytes": est}]}}  # fmt: skip
    progress.memory(4, [gib, gib // 2], [1000, 1000], report)
    out = capsys.readouterr().out
    assert "step: estimated" in out and "2.00x" in out
    assert "rank 0: peak RSS 1.000 GiB, estimated 0.500 GiB (0.50x: process 0.250 + " in out
    assert "rank 1: peak RSS 0.500 GiB, estimated 0.500 GiB (1.00x" in out
    assert "the plan's estimate for its shards" in out  # TorchRec's, named as such
    assert "leaves out what torch.profiler holds over the 10 profiled steps" in out
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["kind"] == "memory" and record["estimated_bytes"] == [gib // 2, gib // 2]
    assert record["measured_step_ms"] == pytest.approx(measured)
