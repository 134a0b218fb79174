"""model.factory (rec/factory.py): a factory that breaks the contract is refused by `rec train`
before any process is launched, naming what is wrong; a model TorchScript cannot compile is
refused by `rec export` naming the module and the construct."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rec import factory
from rec.config import ConfigError, config_from_dict
from rec.contract.repository import ModelDir
from rec.export import torchscript_builder
from rec.model import build_model
from tests.export.conftest import write_seeded_run
from tests.helpers import rec_in_process, write_config

ROOT = Path(__file__).parents[2]
TABLES = [
    {"name": "t0", "rows": 40, "dim": 4, "features": ["a"]},
    {"name": "t1", "rows": 30, "dim": 8, "features": ["b", "c"]},
]


def _config(spec: str, **model):
    return config_from_dict(
        {
            "tables": TABLES,
            "features": {"dense": 3},
            "model": {"factory": f"tests.factories:{spec}", **model},
        }
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("returns_tensor", r"returned a Tensor, not a torch.nn.Module"),
        ("ignores_ebc", r"Pooled does not hold the EmbeddingBagCollection it was given"),
        (
            "wrong_shape",
            r"Flat.forward returned a torch.float32 tensor of shape \(2,\); it must "
            r"return float logits \[B, 1\]",
        ),  # fmt: skip
        ("three_inputs", r"ThreeInputs.forward takes \(dense_features, sparse_features, extra\)"),
        ("raises", r"raised ValueError: this factory wants 3 tables"),
        ("missing", r"module 'tests.factories' has no function 'missing'"),
    ],
)
def test_a_factory_breaking_the_contract_is_refused_by_name(spec, message):
    with pytest.raises(ConfigError, match=message):
        factory.check(_config(spec))


def test_an_unimportable_factory_is_refused():
    cfg = config_from_dict({"tables": TABLES, "model": {"factory": "no_such_pkg.models:build"}})
    with pytest.raises(ConfigError, match=r"importing 'no_such_pkg.models' failed: "
                                          r"ModuleNotFoundError"):  # fmt: skip
        factory.check(cfg)


def test_a_good_factory_passes_and_takes_named_tasks():
    factory.check(_config("good"))
    cfg = _config("good", tasks=["click", "buy"])
    factory.check(cfg)
    assert cfg.model.num_tasks == 2


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"factory": "not a spec"}, r"must be 'package.module:function'"),
        ({"factory_args": {"x": 1}}, r"factory_args is set but model.factory is not"),
    ],
)
def test_bad_factory_keys_are_refused(model, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"tables": TABLES, "model": model})


def test_a_factory_model_exports_to_torchscript_and_aoti_only():
    with pytest.raises(ConfigError, match=r"exports to TorchScript and AOTInductor \(aoti\) only"):
        config_from_dict({"tables": TABLES, "model": {"factory": "tests.factories:good"},
                          "export": {"format": "onnx"}})  # fmt: skip


def test_rec_train_refuses_before_launching_anything(tmp_path):
    cfg = {"tables": TABLES, "features": {"dense": 3},
           "model": {"factory": "tests.factories:wrong_shape"}}  # fmt: skip
    run = tmp_path / "run"
    proc = rec_in_process("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)),
                          "--run-dir", str(run), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert (
        "error: model.factory='tests.factories:wrong_shape': Flat.forward returned" in proc.stdout
    )
    assert "Traceback" not in proc.stdout
    assert not run.exists()  # refused before the run directory was made


def test_an_unscriptable_model_is_refused_naming_module_and_construct():
    cfg = _config("through_numpy")
    module, _ = torchscript_builder.served_module(
        build_model(cfg), cfg, {"t0": "int8", "t1": "int8"}
    )
    with torch.no_grad():
        module(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.int32), torch.arange(6))  # eager
    with pytest.raises(torchscript_builder.NotScriptableError) as e:
        torchscript_builder.script(
            module, "the model of model.factory 'tests.factories:through_numpy'"
        )
    text = str(e.value)
    assert "module ThroughNumpy (the model itself) does not compile" in text
    assert "has no attribute or method 'numpy'" in text and "tests/factories.py" in text


def test_rec_export_refuses_an_unscriptable_model(tmp_path):
    # A committed checkpoint of the model, seeded rather than trained: the refusal is about
    # compiling it, and a factory model training is test_architectures' `custom`.
    cfg = {"tables": TABLES, "features": {"dense": 3},
           "model": {"factory": "tests.factories:through_numpy"}}  # fmt: skip
    run = write_seeded_run(tmp_path / "run", cfg)
    proc = rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"), cwd=ROOT)
    assert proc.returncode == 2, proc.stdout
    assert "ThroughNumpy" in proc.stdout and "cannot be exported to TorchScript" in proc.stdout
    assert "Traceback" not in proc.stdout
    assert not ModelDir.of(tmp_path / "repo", "rec").version(1).exists()
