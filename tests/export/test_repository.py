"""The model repository (Contract 2): layout, Triton configs, manifest, versions, ONNX."""

from __future__ import annotations

import json

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.contract import FORMATS, MANIFEST_FILE, TRITON_CONFIG_FILE
from rec.contract.repository import ModelDir, manifest_in, model_file_in
from rec.export.onnx_builder import onnx_session, run_onnx
from rec.export.pipeline import export_run
from rec.export.repository import VersionExistsError
from tests.export.conftest import random_request, write_seeded_run
from tests.helpers import write_config

NUM_DENSE, NUM_SPARSE = 4, 5
quiet = {"log": lambda _: None}


def parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_layout(exported):
    repo = exported.repo
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    ts, onnx = ModelDir.of(".", "rec"), ModelDir.of(".", "rec_onnx")
    assert files == [str(p) for p in (
        ts.model_file(1), ts.version_manifest(1), ts.config, ts.manifest,
        onnx.model_file(1, "onnx"), onnx.version_manifest(1), onnx.config, onnx.manifest,
    )]  # fmt: skip


@pytest.mark.parametrize(("model", "platform"), [("rec", "pytorch_libtorch"),
                                                 ("rec_onnx", "onnxruntime_onnx")])  # fmt: skip
def test_triton_config_follows_the_io_table(exported, model, platform):
    config = parse(ModelDir.of(exported.repo, model).config)  # Triton's own schema
    assert config.name == model and config.platform == platform
    # The default form, `none`: no Triton batching, the batch dimension spelled out; rec-server
    # batches it with rec.json's "serving" settings.
    assert config.max_batch_size == 0
    dtype = model_config_pb2.DataType.Name
    got = [(i.name, dtype(i.data_type), list(i.dims), i.allow_ragged_batch) for i in config.input]
    assert got == [
        ("dense_features", "TYPE_FP32", [-1, NUM_DENSE], False),
        ("sparse_lengths", "TYPE_INT32", [-1, NUM_SPARSE], False),
        ("sparse_values", "TYPE_INT64", [-1], False),
    ]
    out = config.output[0]
    assert (out.name, dtype(out.data_type), list(out.dims)) == ("scores", "TYPE_FP32", [-1, 1])
    assert not config.HasField("dynamic_batching")
    assert config.instance_group[0].count == 1
    serving = json.loads((ModelDir.of(exported.repo, model).manifest).read_text())["serving"]
    assert serving == {
        "max_batch_size": 256,  # export.max_batch_size of the tiny config
        "max_queue_delay_us": 500,
        "preferred_batch_sizes": [],
        "instances": 1,
        "triton_batching": "none",
    }


def test_manifest(exported, seeded_run):
    m = json.loads(ModelDir.of(exported.repo, "rec").manifest.read_text())
    assert m["features"]["sparse"] == ["e", "a", "c", "b", "d"]
    assert m["features"]["dense"] == ["dense_0", "dense_1", "dense_2", "dense_3"]
    assert m["num_tasks"] == 1 and m["version"] == 1 and m["file"] == FORMATS["torchscript"].file
    assert [(t["name"], t["rows"], t["dim"], t["stored_dtype"]) for t in m["tables"]] == [
        ("t0", 300, 8, "int8"), ("t1", 120, 8, "int8"), ("t2", 50, 8, "int8"), ("t3", 80, 8, "int8")
    ]  # fmt: skip
    assert all(t["bytes_stored"] < t["bytes_fp32"] for t in m["tables"])
    assert m["source"]["checkpoint"] == str((seeded_run / "checkpoints" / "step_10").resolve())
    assert {"torch", "torchrec", "fbgemm-gpu-cpu", "onnxruntime"} <= set(m["library_versions"])
    ev = m["verification"]["eval"]
    assert ev["eval_samples"] == 2048 and ev["quality_bar_passed"] in (True, False)
    assert m["verification"]["onnx_vs_torchscript_max_abs_diff"] < 1e-5
    assert m == json.loads(ModelDir.of(exported.repo, "rec").version_manifest(1).read_text())


def test_onnx_round_trip_dynamic_shapes(exported):
    session = onnx_session(model_file_in(exported.models["onnx"], "onnx"))
    scripted = torch.jit.load(str(model_file_in(exported.models["torchscript"])))
    for batch, seed in ((1, 11), (3, 12), (300, 13)):
        request = random_request(NUM_DENSE, NUM_SPARSE, batch, seed)
        got = run_onnx(session, *request)
        assert got.shape == (batch, 1)
        assert (got - scripted(*request)).abs().max().item() < 1e-5
    dense, lengths, _ = random_request(NUM_DENSE, NUM_SPARSE, 4, 14)
    no_ids = (dense, torch.zeros_like(lengths), torch.zeros(0, dtype=torch.int64))
    assert (run_onnx(session, *no_ids) - scripted(*no_ids)).abs().max().item() < 1e-5


def test_versions_force_and_overrides(tmp_path):
    run = write_seeded_run(tmp_path / "run", seed=1)
    repo = tmp_path / "repo"
    export_run(run, repo, **quiet)
    overrides = write_config(
        tmp_path / "export.yaml",
        {"export": {"table_dtypes": {"t0": "int4", "t1": "fp16", "t2": "fp32"},
                    "triton_batching": "ragged", "instances": 2,
                    "preferred_batch_sizes": [64, 128]}},
    )  # fmt: skip
    second = export_run(run, repo, config=overrides, **quiet)
    assert second.models["torchscript"] == ModelDir.of(repo, "rec").version(2)
    m = json.loads(ModelDir.of(repo, "rec").manifest.read_text())
    assert m["version"] == 2
    stored = {t["name"]: t["stored_dtype"] for t in m["tables"]}
    assert stored == {"t0": "int4", "t1": "fp16", "t2": "fp32", "t3": "int8"}
    config = parse(ModelDir.of(repo, "rec").config)
    assert config.max_batch_size == 256 and list(config.input[0].dims) == [NUM_DENSE]
    assert [i.name for i in config.input if i.allow_ragged_batch] == ["sparse_values"]
    assert list(config.output[0].dims) == [1]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [64, 128]
    assert config.instance_group[0].count == 2
    with pytest.raises(VersionExistsError, match="rec/1"):
        export_run(run, repo, version=1, **quiet)
    before = ModelDir.of(repo, "rec").model_file(1).read_bytes()
    export_run(run, repo, version=1, force=True, quantize="int4", **quiet)
    assert ModelDir.of(repo, "rec").model_file(1).read_bytes() != before
    assert (
        json.loads(ModelDir.of(repo, "rec").version_manifest(1).read_text())["tables"][0][
            "stored_dtype"
        ]
        == "int4"
    )
    assert json.loads(ModelDir.of(repo, "rec").manifest.read_text())["version"] == 2  # still newest
    assert sorted(p.name for p in repo.iterdir()) == ["rec"]  # no staging left behind
    assert sorted(p.name for p in (repo / "rec").iterdir()) == [
        "1",
        "2",
        TRITON_CONFIG_FILE,
        MANIFEST_FILE,
    ]


def test_skip_exported_exports_each_checkpoint_once(tmp_path):
    run = write_seeded_run(tmp_path / "run", seed=1)
    repo = tmp_path / "repo"
    first = export_run(run, repo, fmt="torchscript", skip_exported=True, **quiet)
    model = model_file_in(first.models["torchscript"])
    stamp = model.stat().st_mtime_ns
    again = export_run(run, repo, fmt="torchscript", skip_exported=True, **quiet)
    assert again.models == first.models and model.stat().st_mtime_ns == stamp
    assert repo_versions(repo / "rec") == ["1"]
    # rec_onnx does not hold it yet: both formats are written, the TorchScript one as version 2.
    both = export_run(run, repo, fmt="both", skip_exported=True, **quiet)
    assert both.models == {
        "torchscript": ModelDir.of(repo, "rec").version(2),
        "onnx": ModelDir.of(repo, "rec_onnx").version(1),
    }


def repo_versions(model_dir):
    return sorted(p.name for p in model_dir.iterdir() if p.name.isdigit())


def test_onnx_only(tmp_path, seeded_run):
    result = export_run(seeded_run, tmp_path / "repo", fmt="onnx", quantize="int4", **quiet)
    assert sorted(result.models) == ["onnx"]
    m = json.loads(manifest_in(result.models["onnx"]).read_text())
    assert m["verification"]["onnx_runtime_vs_source_max_abs_diff"] < 1e-5
    assert {t["stored_dtype"] for t in m["tables"]} == {"int4"}
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["rec_onnx"]
