"""rec.json read the same way by both sides of Contract 2: rec.contract's reader (what `rec
serve`, rec's Triton model and the batch probe use) and rec-server. Each malformed field is
refused by both, and both name the field; the repository's file names agree too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from server import run_to_exit
from tiny_model import tiny_manifest, write_model

from rec.contract import (
    FORMATS,
    MANIFEST_FILE,
    TRITON_CONFIG_FILE,
    ManifestError,
    ModelDir,
    parse_manifest,
)
from rec.contract.sections import ZCH_MAP_LAYOUT

LAYOUT_H = Path(__file__).resolve().parents[2] / "cpp" / "src" / "contract" / "repository_layout.h"


def _serving(m: dict, **kv) -> None:
    m["serving"] = {"max_batch_size": 512, "max_queue_delay_us": 500, **kv}


# (field the refusal must name, how the tiny model's rec.json is broken)
MALFORMED = [
    ("features.dense", lambda m: m["features"].update(dense="age")),
    ("features.sparse", lambda m: m["features"].update(sparse=["user", 2, "tags"])),
    ("num_tasks", lambda m: m.update(num_tasks=0)),
    ("num_tasks", lambda m: m.update(num_tasks="2")),
    ("inputs", lambda m: m.update(inputs={"name": "dense_features"})),
    ("inputs[1].name", lambda m: m["inputs"][1].update(name=7)),
    ("inputs[2].role", lambda m: m["inputs"][2].update(role="ids")),
    ("inputs[2].role", lambda m: m["inputs"][2].update(role="lengths")),  # lengths twice
    ("inputs", lambda m: m["inputs"][2].pop("role")),  # lengths without values
    ("serving", lambda m: m.update(serving=[512])),
    ("serving.max_batch_size", lambda m: _serving(m, max_batch_size="lots")),
    ("serving.max_batch_size", lambda m: _serving(m, max_batch_size=1 << 31)),
    ("serving.max_queue_delay_us", lambda m: _serving(m, max_queue_delay_us=-1)),
    ("serving.preferred_batch_sizes", lambda m: _serving(m, preferred_batch_sizes=[0, 64])),
    ("feature_spec", lambda m: m.update(feature_spec=["user"])),
]


def _ids(case) -> str:
    return case[0]


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("manifest")
    write_model(repo)
    return repo


def test_the_tiny_models_manifest_is_well_formed():
    m = parse_manifest(tiny_manifest())
    assert m.roles == {
        "dense": "dense_features",
        "lengths": "sparse_lengths",
        "values": "sparse_values",
    }
    assert m.num_tasks == 2 and m.serving_max_batch_size == 0


@pytest.mark.parametrize("case", MALFORMED, ids=_ids)
def test_python_reader_names_the_malformed_field(case):
    field, breakage = case
    manifest = tiny_manifest()
    breakage(manifest)
    with pytest.raises(ManifestError) as e:
        parse_manifest(manifest, MANIFEST_FILE)
    assert e.value.field == field
    assert f'rec.json: "{field}" must be ' in str(e.value)


def test_rec_server_names_each_malformed_field_as_python_does(tiny_repo, tmp_path):
    """One rec-server start per case (about a second each): the server refuses to start, exit 1,
    with the Python reader's own sentence for the same file."""
    for field, breakage in MALFORMED:
        manifest = tiny_manifest()
        breakage(manifest)
        path = ModelDir.of(tiny_repo, "rec").manifest
        path.write_text(json.dumps(manifest))
        with pytest.raises(ManifestError) as e:
            parse_manifest(manifest, str(path))
        out = run_to_exit("--model-repository", str(tiny_repo), "--http-port", "0",
                          "--grpc-port", "0", "--metrics-port", "0")  # fmt: skip
        assert out.returncode == 1, (field, out.stderr)
        assert str(e.value) in out.stderr, (field, str(e.value), out.stderr[-600:])


def test_cpp_file_names_are_the_contracts():
    names = dict(re.findall(r'constexpr char (\w+)\[\] = "([^"]+)"', LAYOUT_H.read_text()))
    assert names == {
        "kTritonConfigFile": TRITON_CONFIG_FILE,
        "kManifestFile": MANIFEST_FILE,
        "kTorchScriptFile": FORMATS["torchscript"].file,
        "kAotiFile": FORMATS["aoti"].file,
    }


def _zch(m: dict, layout: str = ZCH_MAP_LAYOUT, **table) -> None:
    t0 = {"slots": 99, "default_row": 99, "eviction": "lfu", "probes": 16, "admit_after": 1,
          **table}  # fmt: skip
    m["zch"] = {"layout": layout, "tables": {"t0": t0}}


# The `zch` section (a typed section: Python checks it when read, rec-server at load).
ZCH_MALFORMED = [
    ("zch.layout", lambda m: _zch(m, layout="rec.zch.map/3")),
    # layout 1 (the old home()): refused with the advice to re-export, in the same words
    ("zch.layout", lambda m: _zch(m, layout="rec.zch.map/1")),
    ("zch.tables", lambda m: m.update(zch={"layout": ZCH_MAP_LAYOUT, "tables": {}})),
    ("zch.tables.t0.default_row", lambda m: _zch(m, default_row=0)),
    ("zch.tables.t0.probes", lambda m: _zch(m, probes=100)),
]


def test_both_readers_refuse_a_bad_zch_section_in_the_same_words(tiny_repo):
    path = ModelDir.of(tiny_repo, "rec").manifest
    good = tiny_manifest()
    _zch(good)
    assert parse_manifest(good).zch.tables["t0"].default_row == 99
    for field, breakage in ZCH_MALFORMED:
        manifest = tiny_manifest()
        breakage(manifest)
        path.write_text(json.dumps(manifest))
        with pytest.raises(ManifestError) as e:
            parse_manifest(manifest, str(path)).zch  # noqa: B018  (read: checked)
        assert e.value.field == field
        out = run_to_exit("--model-repository", str(tiny_repo), "--http-port", "0",
                          "--grpc-port", "0", "--metrics-port", "0")  # fmt: skip
        assert out.returncode == 1, (field, out.stderr)
        assert str(e.value) in out.stderr, (field, str(e.value), out.stderr[-600:])
