"""rec-server and AOTInductor packages (model.pt2): a live model hot-swapped from a TorchScript
version to an AOTI one, and a package compiled for an ISA this CPU lacks refused at load.

Every architecture served from a package is in tests/export/test_aoti.py; these are the server's
own duties, also run under the sanitizers (scripts/test_sanitized.sh)."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
import torch
from server import Server, run_to_exit

from rec.contract.repository import ModelDir
from rec.export import aoti_builder
from rec.export.pipeline import export_run
from rec.serve.client import ScoreClient, synthetic_rows
from tests.export.conftest import write_seeded_run


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One seeded model exported twice: TorchScript (repo `ts`, model rec) and AOTI (repo
    `pt2`, model rec_aoti)."""
    tmp = tmp_path_factory.mktemp("aoti_server")
    run = write_seeded_run(tmp / "run")
    for fmt, repo in (("torchscript", "ts"), ("aoti", "pt2")):
        export_run(run, tmp / repo, fmt=fmt, log=lambda _: None)
    return tmp / "ts", tmp / "pt2"


def _rows(repo):
    features = json.loads(ModelDir(repo).manifest.read_text())["features"]
    return synthetic_rows(len(features["dense"]), len(features["sparse"]), batch=37, seed=11)


def _in_process(model, rows) -> np.ndarray:
    with torch.inference_mode():
        inputs = (rows.dense, rows.lengths, rows.values)
        return model(*(torch.from_numpy(a) for a in inputs)).numpy()


def test_a_live_model_is_hot_swapped_from_torchscript_to_aoti(exports, tmp_path):
    ts, pt2 = exports
    repo = tmp_path / "repo"
    shutil.copytree(ts, repo)
    rows = _rows(repo / "rec")
    torch.set_num_threads(1)
    before = _in_process(torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1))), rows)
    after = _in_process(aoti_builder.AotiModel(ModelDir.of(pt2, "rec_aoti").version(1)), rows)
    s = Server(repo, "--poll-repository-s", "1")
    client = ScoreClient(s.grpc, "grpc")
    try:
        assert np.array_equal(client.score(rows), before)
        staged = repo / "rec" / ".v2"  # appears whole: the poll never sees half a version
        shutil.copytree(ModelDir.of(pt2, "rec_aoti").version(1), staged)
        os.rename(staged, ModelDir.of(repo, "rec").version(2))
        deadline = time.monotonic() + 30
        while "version 1 -> 2" not in s.stderr() and time.monotonic() < deadline:
            assert client.score(rows).shape == before.shape  # served throughout
            time.sleep(0.2)
        assert "swapped model 'rec' version 1 -> 2" in s.stderr(), s.stderr()
        assert np.array_equal(client.score(rows), after)
        assert np.array_equal(client.score(rows.split(1)[3]), after[3:4])
    finally:
        client.close()
        assert s.stop() == 0


def test_a_package_for_an_isa_this_cpu_lacks_is_refused_at_load(exports, tmp_path):
    _, pt2 = exports
    repo = tmp_path / "repo"
    shutil.copytree(pt2, repo)
    manifest_path = ModelDir.of(repo, "rec_aoti").version_manifest(1)
    manifest = json.loads(manifest_path.read_text())
    lacking = aoti_builder.missing_flags(
        [*aoti_builder.CPU_ISAS["avx512"].flags, "amx_tile", "avx10_2"]
    )
    manifest["aoti"].update(cpu_isa="avx512", march="x86-64-v4")
    manifest["aoti"]["required_cpu_flags"] += lacking[:1]
    manifest_path.write_text(json.dumps(manifest))
    out = run_to_exit("--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
                      "--metrics-port", "0")  # fmt: skip
    assert out.returncode != 0
    assert "was compiled for avx512 (x86-64-v4)" in out.stderr, out.stderr
    assert f"lacks {lacking[0]}" in out.stderr and "this CPU, " in out.stderr, out.stderr
