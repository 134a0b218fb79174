"""docs/config.md and `rec config --example` come from rec/config.py's docstrings and agree
with the code: the committed reference is the generated one, the example config loads to the
defaults, and every key has a docstring and, where its form is not plain, an example."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rec import config_doc
from rec.cli import main as rec_cli
from rec.config import RecConfig, _convert, default_config, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"
FIELDS = [f for s in config_doc.sections()[1:] for f in s.fields]


def test_docs_config_md_is_the_generated_reference():
    assert DOC.read_text(encoding="utf-8") == config_doc.markdown(), (
        f"docs/config.md differs from rec/config.py's docstrings; regenerate it with "
        f"`{config_doc.REGENERATE}`"
    )


def test_rec_config_prints_the_reference_and_the_example():
    runner = CliRunner()
    assert runner.invoke(rec_cli, ["config", "--doc"]).output == config_doc.markdown()
    assert runner.invoke(rec_cli, ["config", "--example"]).output == config_doc.example_yaml()
    bare = runner.invoke(rec_cli, ["config"])
    assert bare.exit_code == 2 and "--example" in bare.output and "--doc" in bare.output


def test_example_config_loads_to_the_defaults(tmp_path):
    path = tmp_path / "example.yaml"
    path.write_text(config_doc.example_yaml())
    assert load_config(path) == default_config()  # what `rec train -c` reads


def _keys(value: typing.Any) -> typing.Any:
    """The tree of mapping keys in `value` (a list's items each)."""
    if isinstance(value, dict):
        return {k: _keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_keys(v) for v in value if isinstance(v, dict)]
    return None


def test_example_config_has_every_key():
    written = yaml.safe_load(config_doc.example_yaml())
    assert _keys(written) == _keys(default_config().to_dict())


def test_every_key_is_in_the_reference_once():
    paths = [f.path for f in FIELDS]
    assert len(paths) == len(set(paths))

    def walk(cls: type, path: str) -> list[str]:
        out = []
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            where = f"{path}.{f.name}" if path else f.name
            inner = config_doc._nested(tp)
            if inner is None or inner[1] != "":
                out.append(where)
            if inner is not None:
                out += walk(inner[0], where + inner[1])
        return out

    assert sorted(paths) == sorted(p for p in walk(RecConfig, "") if p != "tables")


@pytest.mark.parametrize("field", FIELDS, ids=[f.path for f in FIELDS])
def test_every_key_has_a_docstring_and_a_valid_example(field):
    assert field.text, f"{field.path} has no docstring in rec/config.py"
    empty = field.default is dataclasses.MISSING or field.default in ("", [], {})
    if empty or typing.get_origin(field.type) is dict:
        assert field.example is not None, (
            f"{field.path}: a required, empty or mapping key needs an `Example:` paragraph in "
            "its docstring (the reference shows it)"
        )
    value = yaml.safe_load(config_doc.example_snippet(field))
    for part in field.path.split("<name>.")[-1].split("."):
        value = value[part[:-2]][0] if part.endswith("[]") else value[part]
    _convert(field.type, value, field.path)  # raises ConfigError on an example of a bad form


def test_docstring_example_paragraph_is_split_off():
    text, example = config_doc.split_example("Says what.\n\nExample:\n    a: 1\n    b: [2]")
    assert (text, example) == ("Says what.", "a: 1\nb: [2]")
    assert config_doc.split_example("Says what.\n\nExample: [x, y]") == ("Says what.", "[x, y]")
    assert config_doc.split_example("No example.") == ("No example.", None)
