"""rec.contract.repository and rec.json's typed sections: a manifest with every section written
and read back field for field, each refusal naming its field, and the layout's paths and
version listing."""

from __future__ import annotations

import pytest

from rec.contract import (
    FORMATS,
    MANIFEST_FILE,
    ManifestError,
    ModelDir,
    io_manifest,
    parse_manifest,
    versions,
)
from rec.contract.sections import (
    AotiSection,
    BatchProbe,
    DenseSection,
    StoreSection,
    UpdatesSection,
)
from rec.contract.store import StoreError, row_bytes
from rec.contract.updates import FORMAT as UPDATES_FORMAT

SOURCE = f"x/{MANIFEST_FILE}"  # where the refused rec.json was read, as errors name it
DENSE = {"dtype": "int8", "batch_invariant": True, "layers": {"int8": 3, "fp32": 1},
         "verified_on": {"model": "a test CPU", "rec_linear_isa": "avx2"}}  # fmt: skip
PROBE = {"dense_features": [[0.5, 1.0]], "sparse_lengths": [[1]], "sparse_values": [7]}
PLACE = {"buffer": "tbe.weights_host", "offset": 0, "row_stride": 24, "rows": 10, "dim": 16,
         "dtype": "int8", "scale_bias": "first"}  # fmt: skip
UPDATES = {"format": UPDATES_FORMAT, "url": "redis://127.0.0.1:6379/rec", "run": "ab12cd34",
           "step": 40, "gen": 2, "tables": {"t0": PLACE}}  # fmt: skip
STORE = {"format": "rec.store/1", "url": "redis://127.0.0.1:7000", "prefix": "rec:rec:1:ab12cd34",
         "tables": {"t1": {"rows": 100, "dim": 16, "dtype": "int8",
                           "row_bytes": row_bytes(16, "int8"), "partitions": 4}}}  # fmt: skip
AOTI = {"cpu_isa": "avx2", "march": "x86-64-v3", "vector_isa": "avx2",
        "required_cpu_flags": ["avx", "avx2"], "tables_file": "t.bin", "tables": [],
        "max_abs_diff_vs_module": 0.0, "tolerance": 1e-5}  # fmt: skip


def full_manifest() -> dict:
    return {"features": {"dense": ["d0", "d1"], "sparse": ["s0"]}, "num_tasks": 1,
            **io_manifest(2, 1, 1), "dense": DENSE, "batch_probe": PROBE, "updates": UPDATES,
            "store": STORE, "aoti": AOTI}  # fmt: skip


def test_every_section_round_trips_through_a_written_rec_json(tmp_path):
    model = ModelDir.of(tmp_path, "rec")
    model.version(3).mkdir(parents=True)
    model.write_manifest(3, full_manifest())
    for m in (model.read_manifest(), model.read_manifest(3)):
        assert m.data == full_manifest()
        assert m.dense == DenseSection("int8", True, DENSE["layers"], DENSE["verified_on"])
        assert m.dense.verified_cpu == "a test CPU"
        assert m.batch_probe.inputs == PROBE
        assert (m.updates.url, m.updates.run, m.updates.step, m.updates.gen) == (
            UPDATES["url"], "ab12cd34", 40, 2)  # fmt: skip
        assert m.updates.tables == {"t0": PLACE}
        assert m.store.tables["t1"].partitions == 4 and m.store.prefix == STORE["prefix"]
        assert m.aoti.required_cpu_flags == ("avx", "avx2") and m.aoti.extra["tolerance"] == 1e-5
        for name in ("dense", "batch_probe", "updates", "store", "aoti"):
            assert getattr(m, name).to_dict() == full_manifest()[name]


def test_a_manifest_without_sections_has_none_and_defaults_fill_old_updates():
    m = parse_manifest({"features": {"dense": [], "sparse": ["s"]}, "num_tasks": 1})
    assert (m.dense, m.batch_probe, m.updates, m.store, m.aoti) == (None,) * 5
    old = UpdatesSection.from_dict({"format": UPDATES_FORMAT, "url": "", "tables": {}})
    assert (old.url, old.run, old.step, old.gen) == (None, None, 0, 0)
    assert DenseSection.from_dict({"dtype": "fp32", "batch_invariant": False}).to_dict() == {
        "dtype": "fp32", "batch_invariant": False}  # fmt: skip


BAD = [  # (section, its value, the field named, what it must be and what it was)
    ("dense", [], "dense", "an object, got []"),
    ("dense", {"batch_invariant": True}, "dense.dtype", "a string, got none"),
    ("dense", {**DENSE, "batch_invariant": 1}, "dense.batch_invariant", "true or false, got 1"),
    ("dense", {**DENSE, "layers": {"int8": -1}}, "dense.layers",
     'an object of layer counts, got {"int8":-1}'),
    ("dense", {**DENSE, "verified_on": "x"}, "dense.verified_on", 'an object, got "x"'),
    ("batch_probe", {**PROBE, "sparse_values": 7}, "batch_probe.sparse_values", "a list, got 7"),
    ("batch_probe", {}, "batch_probe.dense_features", "a list, got none"),
    ("updates", "redis://x:1", "updates", 'an object, got "redis://x:1"'),
    ("updates", {**UPDATES, "format": None}, "updates.format", "a string, got null"),
    ("updates", {**UPDATES, "url": 5}, "updates.url", "a string or null, got 5"),
    ("updates", {**UPDATES, "run": []}, "updates.run", "a string or null, got []"),
    ("updates", {**UPDATES, "step": -1}, "updates.step", "an integer >= 0, got -1"),
    ("updates", {**UPDATES, "gen": "2"}, "updates.gen", 'an integer >= 0, got "2"'),
    ("updates", {**UPDATES, "tables": {"t0": 1}}, "updates.tables",
     'an object of table places, got {"t0":1}'),
    ("aoti", {**AOTI, "cpu_isa": None}, "aoti.cpu_isa", "a string, got null"),
    ("aoti", {**AOTI, "march": 3}, "aoti.march", "a string, got 3"),
    ("aoti", {**AOTI, "required_cpu_flags": "avx"}, "aoti.required_cpu_flags",
     'a list of strings, got "avx"'),
]  # fmt: skip


@pytest.mark.parametrize("section, value, field, message", BAD)
def test_a_bad_section_is_refused_naming_its_field(tmp_path, section, value, field, message):
    data = {**full_manifest(), section: value}
    m = parse_manifest(data, SOURCE)  # the fields a server needs are fine: read lazily
    with pytest.raises(ManifestError) as e:
        getattr(m, section)
    assert str(e.value) == f'{SOURCE}: "{field}" must be {message}'
    assert e.value.field == field
    model = ModelDir.of(tmp_path, "rec")
    model.version(1).mkdir(parents=True)
    with pytest.raises(ManifestError):  # and export never writes one
        model.write_manifest(1, data)
    assert not model.manifest.exists() and not model.version_manifest(1).exists()


def test_a_bad_store_section_is_refused_by_the_store_contract():
    bad = {**STORE, "tables": {"t1": {**STORE["tables"]["t1"], "partitions": 0}}}
    m = parse_manifest({**full_manifest(), "store": bad}, SOURCE)
    with pytest.raises(StoreError, match=rf"{SOURCE}: store.tables.t1.partitions must be"):
        m.store  # noqa: B018
    with pytest.raises(StoreError, match="store must be an object"):
        StoreSection.from_dict([], SOURCE)


def test_sections_build_from_fields_as_export_writes_them():
    assert BatchProbe(PROBE).to_dict() == PROBE
    assert AotiSection("avx2", "x86-64-v3", ("avx",)).to_dict()["required_cpu_flags"] == ["avx"]


def test_versions_are_numeric_directories_optionally_holding_a_file(tmp_path):
    model = ModelDir.of(tmp_path, "rec")
    assert model.versions() == [] and versions(tmp_path / "nothing") == []
    for v in (10, 2, 1):
        model.version(v).mkdir(parents=True)
    (model.path / "latest").mkdir()
    (model.path / "7").write_text("a file, not a version")
    model.model_file(2).write_bytes(b"")
    model.model_file(10, "aoti").write_bytes(b"")
    assert model.versions() == [1, 2, 10]
    assert model.versions(holding=[FORMATS["torchscript"].file]) == [2]
    assert model.versions(holding=[model.model_file(1, "aoti").name]) == [10]
    assert model.config.parent == model.path == model.manifest.parent
    assert model.version_manifest(2) == model.version(2) / model.manifest.name
    assert str(model.model_file(2)) == f"{tmp_path}/rec/2/{FORMATS['torchscript'].file}"
