"""The repository's config.pbtxt against Triton's real schema, and the staged Triton config."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.contract.repository import ModelDir
from rec.serve.repository import ServeError, load_model
from rec.serve.triton import python_backend_config, stage_repository
from tests.serve_triton.tiny_repo import MAX_BATCH_SIZE, NUM_DENSE, NUM_SPARSE


def test_config_parses_with_tritons_schema(tiny_repo):
    """The default export form (`none`): max_batch_size 0, the batch dimension spelled out."""
    text = ModelDir.of(tiny_repo, "rec").config.read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())  # raises on unknown fields
    assert config.platform == "pytorch_libtorch"
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    types = {i.name: model_config_pb2.DataType.Name(i.data_type) for i in config.input}
    assert types == {
        "dense_features": "TYPE_FP32",
        "sparse_lengths": "TYPE_INT32",
        "sparse_values": "TYPE_INT64",
    }
    assert [list(i.dims) for i in config.input] == [[-1, NUM_DENSE], [-1, NUM_SPARSE], [-1]]
    assert not any(i.allow_ragged_batch for i in config.input)
    assert [(o.name, model_config_pb2.DataType.Name(o.data_type)) for o in config.output] == [
        ("scores", "TYPE_FP32")
    ]


def test_load_model_reads_manifest(tiny_repo):
    model = load_model(tiny_repo)
    manifest = json.loads(ModelDir.of(tiny_repo, "rec").manifest.read_text())
    assert list(model.dense_names) == manifest["features"]["dense"]
    assert list(model.sparse_names) == manifest["features"]["sparse"]
    assert model.model_path == ModelDir.of(tiny_repo, "rec").model_file(1)


def test_staged_config_is_valid_python_backend_config(tiny_repo, tmp_path):
    model = load_model(tiny_repo)
    stage_repository(model, tmp_path)
    staged = text_format.Parse(
        ModelDir.of(tmp_path, "rec").config.read_text(), model_config_pb2.ModelConfig()
    )
    assert staged.backend == "python" and not staged.platform
    assert staged.max_batch_size == 0  # any B per request; see python_backend_config
    assert staged.parameters["model_path"].string_value == str(model.model_path.resolve())
    dims = {i.name: list(i.dims) for i in staged.input}
    assert dims == {
        "dense_features": [-1, NUM_DENSE],
        "sparse_lengths": [-1, NUM_SPARSE],
        "sparse_values": [-1],
        "sparse_strings": [-1],  # the string form: optional, like sparse_values
    }
    optional = {i.name for i in staged.input if i.optional}
    assert optional == {"sparse_values", "sparse_strings"}
    assert (ModelDir.of(tmp_path, "rec").version(1) / "model.py").is_file()
    assert python_backend_config(model).output[0].dims == [-1, model.num_tasks]


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: ModelDir(d).config.write_text("max_batch_size: [oops"), "not a valid Triton"),
        (lambda d: ModelDir(d).manifest.unlink(), "rec.json is missing"),
        (lambda d: shutil.rmtree(ModelDir(d).version(1)), "no version directory"),
        (
            lambda d: _edit_manifest(d, lambda m: m["serving"].update(max_batch_size="512")),
            'rec.json: "serving.max_batch_size" must be an integer in [1, 2^30], got "512"',
        ),
        (
            lambda d: ModelDir(d).manifest.write_text(
                json.dumps({"features": {"dense": ["a"], "sparse": []}, "num_tasks": 2})
            ),
            f"'dense_features' is TYPE_FP32 dims [-1, {NUM_DENSE}], expected TYPE_FP32 [-1, 1]",
        ),
    ],
)
def test_invalid_repository_is_a_clear_error(tiny_repo, tmp_path, breakage, message):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    breakage(repo / "rec")
    with pytest.raises(ServeError, match=re.escape(message)):
        load_model(repo)


def test_missing_repository(tmp_path):
    with pytest.raises(ServeError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_default_model_is_the_torchscript_one(tiny_repo, tmp_path):
    """An ONNX model beside the TorchScript one (as export may write) leaves the choice clear."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    ModelDir.of(repo, "rec_onnx").version(1).mkdir(parents=True)
    ModelDir.of(repo, "rec_onnx").config.write_text('platform: "onnxruntime_onnx"\n')
    assert load_model(repo).name == "rec"
    with pytest.raises(ServeError, match="no version directory with a model.pt"):
        load_model(repo, "rec_onnx")


def _edit_manifest(model_dir, edit) -> None:
    manifest = json.loads(ModelDir(model_dir).manifest.read_text())
    edit(manifest)
    ModelDir(model_dir).manifest.write_text(json.dumps(manifest))


def test_unbatched_form_takes_its_limit_from_the_manifest(tiny_repo, tmp_path):
    """export.triton_batching: none (the default): the limit is rec.json's serving one, as
    rec-server enforces it, and the staged Python-backend model enforces the same."""
    model = load_model(tiny_repo)
    assert model.config.max_batch_size == 0
    assert model.max_batch_size == MAX_BATCH_SIZE
    staged = python_backend_config(model)
    model_inputs = [list(i.dims) for i in model.config.input]
    assert [list(i.dims) for i in staged.input][:3] == model_inputs  # then sparse_strings
    assert staged.parameters["max_rows"].string_value == str(MAX_BATCH_SIZE)
    # A manifest without "serving" (an older export): no limit, as rec-server then serves it.
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    _edit_manifest(repo / "rec", lambda m: m.pop("serving"))
    model = load_model(repo)
    assert model.max_batch_size == 0
    assert python_backend_config(model).parameters["max_rows"].string_value == "0"


def test_ragged_form_is_accepted_and_staged_unbatched(tiny_repo, tmp_path):
    """export.triton_batching: ragged (max_batch_size > 0, no batch dims) loads too; staging
    turns it into the max_batch_size 0 form for Triton."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    none_form = load_model(repo).config
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(none_form)
    config.max_batch_size = 64  # the config's limit wins over rec.json's in this form
    config.dynamic_batching.max_queue_delay_microseconds = 500
    for io in [*config.input, *config.output]:
        if io.name != "sparse_values":
            del io.dims[0]
    config.input[2].allow_ragged_batch = True
    ModelDir.of(repo, "rec").config.write_text(text_format.MessageToString(config))
    model = load_model(repo)
    assert model.max_batch_size == 64
    staged = python_backend_config(model)
    assert staged.max_batch_size == 0 and not staged.HasField("dynamic_batching")
    assert [list(i.dims) for i in staged.input][:3] == [list(i.dims) for i in none_form.input]
    assert staged.parameters["max_rows"].string_value == "64"
