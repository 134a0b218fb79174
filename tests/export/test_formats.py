"""Export formats as plug-ins (rec.export.formats): the registry, and a fourth format added as
its entry in the contract's table (rec.contract.formats) and one plug-in module, exported end to
end without touching any other file."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.config import ConfigError, config_from_dict
from rec.contract import formats as contract_formats
from rec.contract.formats import FormatSpec
from rec.contract.repository import ModelDir, model_file_in
from rec.export import formats
from rec.export.pipeline import export_run
from tests.export.conftest import tiny_dict

# A whole format, as a user would add one: it reuses TorchScript's builder into its own file
# name, records a check of its own and writes its own config.pbtxt platform.
TOY = """
from rec.contract import FORMATS
from rec.export.formats import Format
from rec.export.formats import torchscript


def build(src, out):
    return torchscript.build(src, out)


def verify(built, checks):
    mine = built["toy"]
    checks["toy_reload_max_abs_diff"] = float((mine.reloaded - mine.scores).abs().max())


FORMAT = Format(
    spec=FORMATS["toy"], load_requires="what TorchScript needs", build=build, verify=verify
)
"""


@pytest.fixture
def toy_format(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "toy.py").write_text(textwrap.dedent(TOY))
    toy = FormatSpec("toy", "Toy", "model.toy", "rec_toy", order=9)
    monkeypatch.setitem(contract_formats.FORMATS, "toy", toy)
    monkeypatch.setattr(formats, "__path__", [*formats.__path__, str(plugins)])
    yield formats.get("toy")
    sys.modules.pop("rec.export.formats.toy", None)


def test_every_format_has_its_own_file_platform_and_model_dir():
    registered = formats.registry().values()
    for field in ("file", "platform", "title"):
        values = [getattr(f, field) for f in registered]
        assert len(set(values)) == len(values), (field, values)
    dirs = [f.model_dir_name("rec") for f in registered]
    assert dirs.count("rec") == 1 and len(set(dirs)) == len(dirs)
    assert formats.resolve("all") == formats.names() == ["torchscript", "onnx", "aoti"]
    assert formats.resolve("both") == ["torchscript", "onnx"]


def test_a_private_helper_module_is_not_a_format(tmp_path, monkeypatch):
    """Formats may share a helper module; a leading underscore keeps it out of the registry."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "_shared.py").write_text("HELPER = 1\n")
    monkeypatch.setattr(formats, "__path__", [*formats.__path__, str(plugins)])
    assert "_shared" not in formats.names()
    assert formats.names() == ["torchscript", "onnx", "aoti"]


def test_an_unknown_format_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"export.format='tflite' is not allowed.*'aoti'"):
        config_from_dict(tiny_dict(format="tflite"))


def test_a_fourth_format_is_one_module(toy_format, seeded_run, tmp_path):
    assert "toy" in formats.choices() and formats.resolve("all")[-1] == "toy"
    assert config_from_dict(tiny_dict(format="toy")).export.format == "toy"
    factory = tiny_dict(format="toy")
    factory["model"]["factory"] = "tests.factories:good"
    with pytest.raises(ConfigError, match="exports to TorchScript and AOTInductor .aoti. only"):
        config_from_dict(factory)

    repo = tmp_path / "models"
    result = export_run(seeded_run, repo, fmt="toy", log=lambda _: None)
    version = ModelDir.of(repo, "rec_toy").version(1)
    assert result.models == {"toy": version}
    assert (version / "model.toy").stat().st_size > 0 and not model_file_in(version).exists()
    manifest = json.loads(ModelDir.of(repo, "rec_toy").manifest.read_text())
    assert (manifest["format"], manifest["file"]) == ("toy", "model.toy")
    assert manifest["load_requires"] == "what TorchScript needs"
    assert manifest["verification"]["toy_reload_max_abs_diff"] == 0.0
    assert manifest["verification"]["batched_vs_single_max_diff"] == {"toy": 0.0}
    config = text_format.Parse(
        ModelDir.of(repo, "rec_toy").config.read_text(), model_config_pb2.ModelConfig()
    )
    assert (config.name, config.platform) == ("rec_toy", "rec_toy")


def test_a_plugin_without_its_entry_in_the_contract_is_refused(tmp_path, monkeypatch):
    """The contract's table is the one list of formats: a plug-in for a format it does not
    have would be built by export but unknown to every reader, so the registry refuses it."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    spec = 'from rec.contract.formats import FormatSpec\nSPEC = FormatSpec("toy", "T", "m", "p", 9)'
    spec += "\n"
    (plugins / "toy.py").write_text(spec + textwrap.dedent(TOY).replace('FORMATS["toy"]', "SPEC"))
    monkeypatch.setattr(formats, "__path__", [*formats.__path__, str(plugins)])
    try:
        with pytest.raises(TypeError, match=r"do not match the contract's table"):
            formats.registry()
    finally:
        sys.modules.pop("rec.export.formats.toy", None)
