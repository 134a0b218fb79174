"""`rec export --format aoti`: torch.export + AOTInductor packages of every architecture, verified
at export, served by rec-server (HTTP and gRPC) and Triton with the scores they have in
process, and refused on a CPU without the ISA they were compiled for.

Each architecture is compiled once (AOTInductor takes ~20 s a model here) and shared by the
tests of this module; seeded (untrained) models, since what is checked is agreement.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.config import ConfigError
from rec.contract import AOTI_TABLES_FILE, AOTI_TABLES_INDEX, FORMATS, MANIFEST_FILE
from rec.contract.repository import ModelDir, aoti_tables_in, manifest_in, model_file_in
from rec.export import aoti_builder, verify
from rec.export.pipeline import export_run
from rec.serve.client import ScoreClient, synthetic_rows
from rec.serve.cpp import start_cpp
from rec.serve.triton import start_triton
from tests.export.conftest import tiny_dict, write_seeded_run

EXAMPLES = Path(__file__).parents[2] / "examples"
PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
SMALL_DATA = {"synthetic": {"train_samples": 2048, "eval_samples": 1024}}


def _config(arch: str) -> dict:
    if arch == "dlrm":
        return tiny_dict()
    if arch == "dlrm_dcn":
        data = tiny_dict()
        data["model"] = {"arch": "dlrm_dcn", "dense_arch": [16, 8], "over_arch": [96, 1],
                         "dcn_num_layers": 2, "dcn_low_rank_dim": 16}  # fmt: skip
        return data
    example = {"dcn_v2": "mixed_dims.yaml", "mmoe": "mmoe.yaml", "din": "din.yaml",
               "custom": "custom_model.yaml"}[arch]  # fmt: skip
    data = yaml.safe_load((EXAMPLES / example).read_text())
    data["data"] = {**data.get("data", {}), **SMALL_DATA}
    return data


ARCHITECTURES = ["dlrm", "dlrm_dcn", "dcn_v2", "mmoe", "din", "custom"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def exported(request, tmp_path_factory, monkeypatch_module):
    """(repo, arch): one seeded run, exported to TorchScript (`rec`) and AOTI (`rec_aoti`)."""
    tmp = tmp_path_factory.mktemp(f"aoti_{request.param}")
    monkeypatch_module.chdir(EXAMPLES.parent)  # custom_model.yaml's factory: examples.custom_model
    monkeypatch_module.syspath_prepend(str(EXAMPLES.parent))
    run = write_seeded_run(tmp / "run", _config(request.param))
    repo = tmp / "repo"
    for fmt in ("torchscript", "aoti"):
        export_run(run, repo, fmt=fmt, log=lambda _: None)
    return repo, request.param


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _rows(repo: Path, batch: int = 37, seed: int = 5):
    manifest = json.loads(ModelDir.of(repo, "rec_aoti").manifest.read_text())
    features = manifest["features"]
    return synthetic_rows(len(features["dense"]), len(features["sparse"]), batch=batch, seed=seed)


def _in_process(model, rows) -> np.ndarray:
    with torch.inference_mode():
        inputs = (rows.dense, rows.lengths, rows.values)
        return model(*(torch.from_numpy(a) for a in inputs)).numpy()


def test_the_package_is_verified_and_recorded(exported):
    repo, arch = exported
    version = ModelDir.of(repo, "rec_aoti").version(1)
    assert sorted(p.name for p in version.iterdir()) == sorted(
        [FORMATS["aoti"].file, MANIFEST_FILE, AOTI_TABLES_FILE, AOTI_TABLES_INDEX])  # fmt: skip
    manifest = json.loads(manifest_in(version).read_text())
    assert manifest["format"] == "aoti" and manifest["file"] == FORMATS["aoti"].file
    section = manifest["aoti"]
    assert (section["cpu_isa"], section["march"]) == ("avx2", "x86-64-v3")
    assert {"avx2", "fma"} <= set(section["required_cpu_flags"])
    assert not any(f.startswith("avx512") for f in section["required_cpu_flags"])
    checks = manifest["verification"]
    assert checks["batched_vs_single_max_diff"]["aoti"] == 0.0
    assert 0 <= checks["aoti_vs_module_max_abs_diff"] <= verify.AOTI_TOLERANCE
    # The tables are not in the package: tables.bin holds them, at the stored (int8) size.
    stored = manifest["embedding_bytes"]["stored"]
    assert sum(t["bytes"] for t in section["tables"]) >= stored
    assert aoti_tables_in(version)[0].stat().st_size >= stored
    assert section["package_bytes"] == model_file_in(version, "aoti").stat().st_size
    assert manifest["dense"]["batch_invariant"] and "batch_probe" in manifest
    config = text_format.Parse(
        ModelDir.of(repo, "rec_aoti").config.read_text(), model_config_pb2.ModelConfig()
    )  # Triton's own schema: raises on an unknown field
    assert config.platform == "torch_aoti" and config.name == "rec_aoti"


def test_rec_server_serves_it_with_the_scores_it_has_in_process(exported):
    """Both protocols, batched and single; the TorchScript model beside it within the bound."""
    repo, arch = exported
    torch.set_num_threads(1)
    model = aoti_builder.AotiModel(ModelDir.of(repo, "rec_aoti").version(1))
    rows = _rows(repo)
    want = _in_process(model, rows)
    singles = np.concatenate([_in_process(model, r) for r in rows.split(1)])
    assert np.array_equal(want, singles)  # batched = one sample at a time
    scripted = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
    assert np.abs(_in_process(scripted, rows) - want).max() <= verify.AOTI_TOLERANCE
    with start_cpp(repo, **PORTS) as server:  # every model: rec and rec_aoti
        for protocol in ("http", "grpc"):
            client = ScoreClient(getattr(server.endpoints, protocol), protocol, model="rec_aoti")
            try:
                assert np.array_equal(client.score(rows), want), protocol
                assert np.array_equal(client.score(rows.split(1)[7]), want[7:8]), protocol
            finally:
                client.close()


def test_triton_serves_it_with_the_same_scores(exported):
    """Triton 2.51 has no torch_aoti backend: rec's Python-backend model loads the package."""
    repo, arch = exported
    if arch not in ("dlrm", "din"):
        pytest.skip("one pooled and one sequence architecture: Triton starts are slow")
    model = aoti_builder.AotiModel(ModelDir.of(repo, "rec_aoti").version(1))
    rows = _rows(repo, seed=9)
    want = _in_process(model, rows)
    with start_triton(repo, model="rec_aoti", **PORTS) as server:
        client = ScoreClient(server.endpoints.grpc, "grpc", model="rec_aoti")
        try:
            assert np.array_equal(client.score(rows), want)
        finally:
            client.close()


def test_a_cpu_without_the_packages_isa_is_refused(exported, tmp_path):
    """rec.json names the flags the package's code needs; loading checks them before the
    compiled library runs (it would die with SIGILL), naming the ISA and this CPU."""
    repo, arch = exported
    if arch != "dlrm":
        pytest.skip("the check does not depend on the architecture")
    version = tmp_path / "1"
    shutil.copytree(ModelDir.of(repo, "rec_aoti").version(1), version)
    manifest = json.loads(manifest_in(version).read_text())
    lacking = aoti_builder.missing_flags(
        [*aoti_builder.CPU_ISAS["avx512"].flags, "amx_tile", "avx10_2"]
    )
    manifest["aoti"]["cpu_isa"] = "avx512"
    manifest["aoti"]["required_cpu_flags"] += lacking[:1]
    manifest_in(version).write_text(json.dumps(manifest))
    with pytest.raises(aoti_builder.IsaError, match=rf"compiled for avx512 .*lacks {lacking[0]}"):
        aoti_builder.AotiModel(version)


def test_onednn_packed_layers_are_refused_before_any_work(tmp_path):
    """The fp32 cross net without batch invariance runs oneDNN-packed layers, which an
    exported graph cannot hold: a clear refusal, no repository written."""
    data = tiny_dict(batch_invariant=False)
    data["model"] = {"arch": "dlrm_dcn", "dense_arch": [16, 8], "over_arch": [96, 1],
                     "dcn_num_layers": 1, "dcn_low_rank_dim": 96}  # fmt: skip
    run = write_seeded_run(tmp_path / "run", data)
    with pytest.raises(ConfigError, match="cannot hold oneDNN-packed dense layers"):
        export_run(run, tmp_path / "repo", fmt="aoti", log=lambda _: None)
    assert not (tmp_path / "repo" / "rec_aoti").exists()


def test_an_isa_this_cpu_lacks_cannot_be_the_target(tmp_path, monkeypatch):
    """On a CPU without AVX-512 (any CPU, held to avx2 by the REC_MAX_CPU_ISA seam) the avx512
    target is refused before any work: it could not be verified here."""
    monkeypatch.setenv("REC_MAX_CPU_ISA", "avx2")
    assert aoti_builder.missing_flags(aoti_builder.CPU_ISAS["avx512"].flags)
    run = write_seeded_run(tmp_path / "run", copy.deepcopy(tiny_dict(cpu_isa="avx512")))
    with pytest.raises(ConfigError, match=r"export.cpu_isa: avx512 needs a CPU with"):
        export_run(run, tmp_path / "repo", fmt="aoti", log=lambda _: None)
