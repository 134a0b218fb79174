"""Each architecture's example config end to end: real 2-rank `rec train` (shortened), int8
export with its verification, then both servers over both protocols score exactly what the
exported model scores in process, batched as one sample at a time.

dcn_v2 (examples/mixed_dims.yaml) is the architecture of tables at different dims; mmoe
(examples/mmoe.yaml) the multi-task one, with two named tasks and a score column each; din
(examples/din.yaml) the one with sequence features, a candidate and a history; custom
(examples/custom_model.yaml) a model of the user's own (DeepFM) built by model.factory.
"""

from __future__ import annotations

import json
from pathlib import Path

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import torch
import yaml

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec import run_dir
from rec.serve.client import Rows, ScoreClient, synthetic_rows
from rec.serve.cpp import start_cpp
from rec.serve.triton import start_triton
from tests.helpers import run_rec, write_config

EXAMPLES = Path(__file__).parents[2] / "examples"
PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
ARCHITECTURES = {"dcn_v2": "mixed_dims.yaml", "mmoe": "mmoe.yaml", "din": "din.yaml",
                 "custom": "custom_model.yaml"}  # fmt: skip
ROOT = EXAMPLES.parent  # where rec runs, so that custom_model.yaml's factory is importable


def _shortened(example: str) -> dict:
    """The example as it is, on less synthetic data (a test's minute, not the demo's)."""
    cfg = yaml.safe_load((EXAMPLES / example).read_text())
    cfg.setdefault("data", {})["synthetic"] = {"train_samples": 60_000, "eval_samples": 8192}
    cfg["training"] = {"eval_every": 0, "log_every": 50}
    return cfg


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def exported(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    cfg = _shortened(ARCHITECTURES[request.param])
    run, repo = tmp / "run", tmp / "repo"
    run_rec("train", "--config", str(write_config(tmp / "c.yaml", cfg)), "--run-dir", str(run),
            timeout=900, cwd=ROOT)  # fmt: skip
    run_rec("export", str(run), "--repo", str(repo), "--format", "torchscript", cwd=ROOT)
    return run, repo


def test_trained_beats_a_constant_and_export_keeps_its_auc(exported, request):
    run, repo = exported
    example = yaml.safe_load((EXAMPLES / ARCHITECTURES[request.node.callspec.id]).read_text())
    tasks = example["model"].get("tasks", ["label"])
    meta = run_dir.read_meta(run_dir.latest_checkpoint(run))
    assert meta["world_size"] == 2
    assert meta["eval"]["auc"] > 0.65, meta["eval"]  # a constant score is 0.5
    manifest = json.loads((repo / "rec" / "1" / "rec.json").read_text())
    assert manifest["tasks"] == tasks and manifest["outputs"][0]["shape"] == [-1, len(tasks)]
    checks = manifest["verification"]
    # The unsharded float model is the trained one: its AUC on the same held-out split is the
    # trainer's (a sharded EBC's columns in plan order would break this).
    assert checks["eval"]["float"]["auc"] == pytest.approx(meta["eval"]["auc"], abs=2e-5)
    ts = checks["eval"]["torchscript"]
    assert ts["auc_ratio"] >= 0.999
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0
    if len(tasks) > 1:  # each task learned, and each kept its AUC through the export
        for task in tasks:
            assert meta["eval"][f"auc_{task}"] > 0.65, meta["eval"]
            assert ts["auc_per_task"][task] == pytest.approx(meta["eval"][f"auc_{task}"], abs=2e-3)
            assert ts["auc_ratio_per_task"][task] >= 0.999
    stored = {t["name"]: (t["dim"], t["stored_dtype"]) for t in manifest["tables"]}
    for table in example["tables"]:
        dtype = example.get("export", {}).get("table_dtypes", {}).get(table["name"], "int8")
        assert stored[table["name"]] == (table["dim"], dtype)


def _in_process(module, rows: Rows) -> np.ndarray:
    with torch.inference_mode():
        inputs = (rows.dense, rows.lengths, rows.values)
        return module(*(torch.from_numpy(a) for a in inputs)).numpy()


def test_served_scores_are_the_in_process_scores(exported):
    _, repo = exported
    manifest = json.loads((repo / "rec" / "1" / "rec.json").read_text())
    num_dense, num_sparse = len(manifest["features"]["dense"]), len(manifest["features"]["sparse"])
    torch.set_num_threads(1)
    module = torch.jit.load(str(repo / "rec" / "1" / "model.pt"))
    rows = synthetic_rows(num_dense, num_sparse, batch=37, seed=5)
    want = _in_process(module, rows)
    singles = [_in_process(module, r) for r in rows.split(1)]
    assert np.array_equal(want, np.concatenate(singles))  # batched = one sample at a time
    with start_cpp(repo, **PORTS) as cpp, start_triton(repo, **PORTS) as triton:
        for server in (cpp, triton):
            for protocol in ("http", "grpc"):
                client = ScoreClient(getattr(server.endpoints, protocol), protocol)
                try:
                    assert np.array_equal(client.score(rows), want), (server.name, protocol)
                    one = rows.split(1)[7]
                    assert np.array_equal(client.score(one), want[7:8]), (server.name, protocol)
                finally:
                    client.close()
