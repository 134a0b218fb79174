"""examples/dlrm_v2.yaml, MLPerf DLRM-v2's shape: the config is MLPerf's (cardinalities with
the 40M tables capped, per-feature hotness, DCN sizes, the context split), `rec plan` fits it
on a 24 GB machine, and a variant with 1000-row tables trains on 2 ranks and exports int8
tables and dense layers with the context form, its verification passed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from rec.config import load_config
from rec.contract.repository import ModelDir
from rec.data import synthetic
from tests.helpers import rec_in_process, run_rec, write_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "dlrm_v2.yaml"
# MLPerf Inference's dlrm_v2 reference, Criteo 1TB multi-hot, features 0..25.
CARDINALITIES = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
                 405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152,
                 12973, 108, 36]  # fmt: skip
HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
ROWS = [2_500_000 if c == 40_000_000 else c for c in CARDINALITIES]  # the 40M tables capped
GIB = 1 << 30


def test_the_example_is_mlperf_dlrm_v2_shaped():
    cfg = load_config(EXAMPLE)
    sparse = [f"cat_{i}" for i in range(26)]
    assert cfg.features.sparse == sparse and cfg.features.dense == 13
    assert [t.rows for t in cfg.tables] == ROWS
    assert {t.dim for t in cfg.tables} == {128}
    assert cfg.data.synthetic.hotness == dict(zip(sparse, HOTNESS, strict=True))
    m = cfg.model
    assert (m.arch, m.dense_arch, m.over_arch) == ("dlrm_dcn", [512, 256, 128],
                                                   [1024, 1024, 512, 256, 1])  # fmt: skip
    assert (m.dcn_num_layers, m.dcn_low_rank_dim) == (3, 512)
    multi = [f for f, h in zip(sparse, HOTNESS, strict=True) if h > 1]
    assert len(multi) == 15
    assert cfg.features.context == multi + cfg.features.dense_names
    e = cfg.export
    assert (e.quantize, e.table_dtypes, e.dense_dtype, e.max_batch_size) == ("int8", {}, "int8",
                                                                            1024)  # fmt: skip
    # The planner is told each multi-hot table's ids per sample.
    for f, h in zip(sparse, HOTNESS, strict=True):
        c = cfg.sharding.constraints.get(f"t_{f}")
        assert (c.pooling_factor if c else 1) == h


def test_its_synthetic_samples_hold_mlperf_hotness():
    synthetic._TEACHERS.clear()  # the calibration below is this config's own
    rows = synthetic.SyntheticSource(load_config(EXAMPLE), "eval").take(0, 512).rows
    lengths = np.asarray(rows.lengths)
    assert (lengths == np.array(HOTNESS)).all()
    assert len(rows.values) == 512 * sum(HOTNESS)
    synthetic._TEACHERS.clear()  # its tables' teacher is large; free it for other tests


def test_rec_plan_fits_it_on_24_gb():
    proc = rec_in_process("plan", "-c", str(EXAMPLE), "--json", check=True)
    plan = json.loads(proc.stdout[proc.stdout.index("{") :])
    ranks = plan["calibrated"]["ranks"]
    tables = sum(r["memory_bytes"]["tables_and_optimizer"] for r in ranks)
    fp32 = sum(ROWS) * 128 * 4  # 8.54 GB
    assert fp32 < tables < 1.05 * fp32  # plus row-wise Adagrad's one float a row
    total = sum(r["memory_bytes"]["total"] for r in ranks)
    assert total < 16 * GIB, f"{total / GIB:.2f} GiB"  # room left on a 24 GB machine


def test_a_small_variant_trains_and_exports_int8_with_the_context_form(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    for t in data["tables"]:
        t["rows"] = min(t["rows"], 1000)
    data["data"]["synthetic"].update(train_samples=1024, eval_samples=512)
    data["training"].update(batch_size=64, steps=4, warmup_steps=0, eval_batches=2)
    # Four steps learn nothing that int8 dense layers must keep: the AUC bar is not the point.
    data["export"].update(eval_batches=2, accept_quality_loss=True)
    config = write_config(tmp_path / "tiny.yaml", data)
    run = tmp_path / "run"
    run_rec("train", "-c", str(config), "--run-dir", str(run), timeout=300)
    rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"), check=True)
    m = json.loads(ModelDir.of(tmp_path / "repo", "rec").version_manifest(1).read_text())
    assert [i["name"] for i in m["inputs"]] == ["context_dense", "context_lengths",
        "context_values", "candidate_lengths", "candidate_values", "candidate_offsets"]  # fmt: skip
    multi = [i for i, h in enumerate(HOTNESS) if h > 1]
    assert m["context"]["sparse"] == multi and m["context"]["dense"] == list(range(13))
    assert m["dense"]["dtype"] == "int8" and m["serving"]["max_batch_size"] == 1024
    assert {t["stored_dtype"] for t in m["tables"]} == {"int8"}
    checks = m["verification"]
    assert checks["context_vs_flat_max_diff"] == {"torchscript": 0.0}
    assert checks["batched_vs_single_max_diff"] == {"torchscript": 0.0}
