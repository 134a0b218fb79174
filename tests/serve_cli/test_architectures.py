"""Each architecture end to end: real 2-rank `rec train` (shortened), then two exports of the
run, int8 tables with fp32 dense layers (the default) and with int8 dense layers
(export.dense_dtype: int8), each with its verification; both servers over both protocols score
exactly what each exported model scores in process, batched as one sample at a time (Triton
the int8-dense export, rec-server both).

dlrm is the embedded default config and dlrm_dcn the same with the low-rank cross net;
dcn_v2 (examples/mixed_dims.yaml) is the architecture of tables at different dims; mmoe
(examples/mmoe.yaml) the multi-task one, with two named tasks and a score column each; din
(examples/din.yaml) the one with sequence features, a candidate and a history; custom
(examples/custom_model.yaml) a model of the user's own (DeepFM) built by model.factory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import torch
import yaml

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec import run_dir
from rec.config import config_from_dict
from rec.contract.repository import ModelDir
from rec.serve.client import Rows, ScoreClient, synthetic_rows
from rec.serve.cpp import start_cpp
from rec.serve.triton import start_triton
from tests.artifacts import made
from tests.helpers import rec_in_process, run_rec, write_config

EXAMPLES = Path(__file__).parents[2] / "examples"
PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
# Each architecture's config: an example file, or None for the embedded default, with overrides.
ARCHITECTURES = {"dlrm": (None, {}), "dlrm_dcn": (None, {"model": {"arch": "dlrm_dcn"}}),
                 "dcn_v2": ("mixed_dims.yaml", {}), "mmoe": ("mmoe.yaml", {}),
                 "din": ("din.yaml", {}), "custom": ("custom_model.yaml", {})}  # fmt: skip
ROOT = EXAMPLES.parent  # where rec runs, so that custom_model.yaml's factory is importable
DENSE_DTYPES = ["fp32", "int8"]
# The architectures Triton serves too (test_served_scores_are_the_in_process_scores says why).
TRITON_ARCHITECTURES = ("dlrm", "mmoe", "din")
# scripts/test_sanitized.sh runs this file again against the ASan/UBSan build of rec-server.
# There the server's own C++ path differs by the model's output width, not by its architecture or
# dense layers (those run inside LibTorch, which is not instrumented): dlrm (one task) and mmoe
# (two) with int8 dense layers cover it, and the rest were checked by the main suite. Saves 4
# trainings, 6 exports and 20 server starts of the sanitized stage.
SANITIZED = bool(os.environ.get("REC_SANITIZER_LOGS"))
if SANITIZED:
    ARCHITECTURES = {a: ARCHITECTURES[a] for a in ("dlrm", "mmoe")}
    DENSE_DTYPES = ["int8"]


def _example(arch: str) -> dict:
    example, overrides = ARCHITECTURES[arch]
    cfg = yaml.safe_load((EXAMPLES / example).read_text()) if example else {}
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def _shortened(arch: str) -> dict:
    """The config as it is, on less synthetic data (a test's minute, not the demo's)."""
    cfg = _example(arch)
    cfg.setdefault("data", {})["synthetic"] = {"train_samples": 60_000, "eval_samples": 8192}
    cfg["training"] = {"eval_every": 0, "log_every": 50}
    return cfg


def _train(config: dict) -> Callable[[Path], None]:
    def make(where: Path) -> None:
        path = write_config(where / "c.yaml", config)
        run_rec("train", "--config", str(path), "--run-dir", str(where / "run"), timeout=900,
                cwd=ROOT)  # fmt: skip

    return make


def _export(run: Path, dtype: str) -> Callable[[Path], None]:
    def make(where: Path) -> None:
        overlay = write_config(where / "export.yaml", {"export": {"dense_dtype": dtype}})
        rec_in_process("export", str(run), "--repo", str(where / "repo"), "--format",
                       "torchscript", "--config", str(overlay), check=True, cwd=ROOT)  # fmt: skip

    return make


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def exported(request, tmp_path_factory):
    """(run, {dense dtype: model repository}): one training run, exported both ways. Shared
    artifacts (tests/artifacts.py): the sanitized stage scores the main suite's."""
    config = _shortened(request.param)
    run = made(tmp_path_factory, {"rec train": config}, _train(config)) / "run"
    repos = {}
    for dtype in DENSE_DTYPES:
        recipe = {"rec export": str(run), "dense_dtype": dtype, "format": "torchscript"}
        repos[dtype] = made(tmp_path_factory, recipe, _export(run, dtype)) / "repo"
    return run, repos


@pytest.mark.parametrize("dense_dtype", DENSE_DTYPES)
def test_trained_beats_a_constant_and_export_keeps_its_auc(exported, request, dense_dtype):
    run, repos = exported
    repo = repos[dense_dtype]
    cfg = config_from_dict(_example(request.node.callspec.params["exported"]))
    tasks = cfg.model.task_names
    meta = run_dir.read_meta(run_dir.latest_checkpoint(run))
    assert meta["world_size"] == 2
    assert meta["eval"]["auc"] > 0.65, meta["eval"]  # a constant score is 0.5
    manifest = json.loads(ModelDir.of(repo, "rec").version_manifest(1).read_text())
    assert manifest["tasks"] == tasks and manifest["outputs"][0]["shape"] == [-1, len(tasks)]
    checks = manifest["verification"]
    # The unsharded float model is the trained one: its AUC on the same held-out split is the
    # trainer's (a sharded EBC's columns in plan order would break this).
    assert checks["eval"]["float"]["auc"] == pytest.approx(meta["eval"]["auc"], abs=2e-5)
    ts = checks["eval"]["torchscript"]
    assert ts["auc_ratio"] >= 0.999
    assert manifest["dense"]["dtype"] == dense_dtype and manifest["dense"]["batch_invariant"]
    assert manifest["dense"]["layers"].get(dense_dtype, 0) >= 1, manifest["dense"]
    assert "accepted_quality_loss" not in checks["eval"]
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0
    if len(tasks) > 1:  # each task learned, and each kept its AUC through the export
        for task in tasks:
            assert meta["eval"][f"auc_{task}"] > 0.65, meta["eval"]
            assert ts["auc_per_task"][task] == pytest.approx(meta["eval"][f"auc_{task}"], abs=2e-3)
            assert ts["auc_ratio_per_task"][task] >= 0.999
    stored = {t["name"]: (t["dim"], t["stored_dtype"]) for t in manifest["tables"]}
    for table in cfg.tables:
        dtype = cfg.export.table_dtypes.get(table.name, cfg.export.quantize)
        assert stored[table.name] == (table.dim, dtype)


def _in_process(module, rows: Rows) -> np.ndarray:
    with torch.inference_mode():
        inputs = (rows.dense, rows.lengths, rows.values)
        return module(*(torch.from_numpy(a) for a in inputs)).numpy()


@pytest.mark.parametrize("dense_dtype", DENSE_DTYPES)
def test_served_scores_are_the_in_process_scores(exported, request, dense_dtype):
    arch = request.node.callspec.params["exported"]
    repo = exported[1][dense_dtype]
    manifest = json.loads(ModelDir.of(repo, "rec").version_manifest(1).read_text())
    num_dense, num_sparse = len(manifest["features"]["dense"]), len(manifest["features"]["sparse"])
    torch.set_num_threads(1)
    module = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
    rows = synthetic_rows(num_dense, num_sparse, batch=37, seed=5)
    want = _in_process(module, rows)
    singles = [_in_process(module, r) for r in rows.split(1)]
    assert np.array_equal(want, np.concatenate(singles))  # batched = one sample at a time
    # Triton scores the int8-dense export only: its Python backend runs model.pt whatever the
    # dense layers hold, and the int8 one is the variant that needs rec's ops registered there
    # (fp32 dense layers on Triton: tests/serve_triton). rec-server scores both. Triton's
    # Python backend hands model.pt its three inputs and reads one output whatever the
    # architecture inside, so it serves the shapes that differ at its edge: one task (dlrm),
    # two (mmoe) and sequence features (din); three Triton starts fewer. Under the sanitizers
    # (which Triton is not built with) it is left out.
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(start_cpp(repo, **PORTS))]
        if dense_dtype == "int8" and arch in TRITON_ARCHITECTURES and not SANITIZED:
            servers.append(stack.enter_context(start_triton(repo, **PORTS)))
        for server in servers:
            for protocol in ("http", "grpc"):
                client = ScoreClient(getattr(server.endpoints, protocol), protocol)
                try:
                    assert np.array_equal(client.score(rows), want), (server.name, protocol)
                    one = rows.split(1)[7]
                    assert np.array_equal(client.score(one), want[7:8]), (server.name, protocol)
                finally:
                    client.close()
