"""features.context (#61): what it accepts, each refusal before any rank starts (naming the
key), and the two ways it reaches a run that trained without it: a resume's `-c` and export's
`-c`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rec.config import ConfigError, config_from_dict
from rec.contract.context import ContextSplit
from rec.train.resume import apply_config_file

DIN = {
    "tables": [
        {"name": "user", "rows": 100, "dim": 8, "features": ["user_id"]},
        {"name": "item", "rows": 100, "dim": 8, "features": ["item_id", "category"]},
        {
            "name": "seq",
            "rows": 100,
            "dim": 8,
            "pooling": "none",
            "features": ["candidate", "history"],
        },
    ],  # fmt: skip
    "model": {"arch": "din", "candidate": "candidate", "history": "history"},
    "features": {"dense": 2},
}


def test_context_names_dense_and_sparse_features_in_any_order():
    cfg = config_from_dict({"features": {"dense": 3, "context": ["cat_5", "dense_2", "cat_1"]}})
    assert cfg.features.context == ["cat_5", "dense_2", "cat_1"]
    split = ContextSplit.from_config(cfg)
    assert split == ContextSplit(dense=(2,), sparse=(1, 5), num_dense=3, num_sparse=8)
    assert split.cand_sparse == (0, 2, 3, 4, 6, 7)
    assert config_from_dict({}).features.context == []


def test_named_dense_features_and_din_history_may_be_context():
    data = {"features": {"dense": 2, "dense_names": ["age", "hour"], "context": ["hour"]}}
    assert ContextSplit.from_config(config_from_dict(data)).dense == (1,)
    din = {**DIN, "features": {"dense": 2, "context": ["user_id", "history", "dense_0"]}}
    assert ContextSplit.from_config(config_from_dict(din)).sparse == (0, 4)


ALL_SPARSE = [f"cat_{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"features": {"context": ["user"]}},
            "features.context names 'user', which is not a feature: the dense features are "
            "['dense_0',",
        ),
        (
            {"features": {"context": ["cat_1", "dense_0", "cat_1"]}},
            "features.context=['cat_1', 'dense_0', 'cat_1'] lists 'cat_1' twice",
        ),
        (
            {"features": {"context": ALL_SPARSE}},
            "features.context names every sparse feature ['cat_0', 'cat_1', 'cat_2', 'cat_3', "
            "'cat_4', 'cat_5', 'cat_6', 'cat_7']: a candidate needs at least one sparse feature "
            "of its own",
        ),
        (
            {"features": {"context": ["cat_0"]}, "model": {"factory": "my.models:build"}},
            "features.context is not yet supported with model.factory='my.models:build'",
        ),
        (
            {"features": {"context": ["cat_0"]}, "export": {"format": "onnx"}},
            "features.context is not yet supported with export.format='onnx': the context form "
            "exports to TorchScript and AOTInductor only",
        ),
        (
            {"features": {"context": ["cat_0"]}, "export": {"format": "both"}},
            "features.context is not yet supported with export.format='both'",
        ),
        (
            {"features": {"context": ["cat_0"]}, "export": {"format": "all"}},
            "features.context is not yet supported with export.format='all'",
        ),
        (
            {"features": {"context": ["cat_0"]}, "export": {"store": {"tables": ["t3"]}}},
            "features.context is not yet supported with export.store.tables=['t3']",
        ),
        (
            {"features": {"context": "cat_0"}},
            "features.context='cat_0' must be a list",
        ),
    ],
)
def test_refusals_name_the_key(data, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert message in str(e.value)


def test_a_name_both_dense_and_sparse_is_refused():
    data = {"features": {"dense": 1, "dense_names": ["cat_0"], "context": ["cat_0"]}}
    with pytest.raises(ConfigError, match="'cat_0', which is both a dense and a sparse feature"):
        config_from_dict(data)


def test_din_candidate_is_never_context():
    din = {**DIN, "features": {"dense": 2, "context": ["user_id", "candidate"]}}
    with pytest.raises(ConfigError) as e:
        config_from_dict(din)
    assert "features.context names 'candidate', din's model.candidate" in str(e.value)


def test_torchscript_and_aoti_take_context():
    for fmt in ("torchscript", "aoti"):
        cfg = config_from_dict({"features": {"context": ["cat_0"]}, "export": {"format": fmt}})
        assert cfg.export.format == fmt


def _run(tmp_path: Path) -> tuple[Path, object]:
    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_dict({"training": {"steps": 10}})
    (run / "config.yaml").write_text(cfg.to_yaml())
    return run, cfg


def test_a_resume_may_set_the_context(tmp_path):
    run, saved = _run(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"features": {"context": ["cat_2", "dense_0"]}}))
    assert apply_config_file(run, saved, path).features.context == ["cat_2", "dense_0"]
    path.write_text(yaml.safe_dump({"features": {"dense": 4, "context": ["cat_2"]}}))
    with pytest.raises(ConfigError, match="features.dense: 13 -> 4"):
        apply_config_file(run, saved, path)


def test_export_takes_the_context_from_its_config_file(tmp_path):
    from rec.export.pipeline import resolve_config

    run, _ = _run(tmp_path)
    path = tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump({"features": {"context": ["cat_3"]},
                                    "export": {"format": "aoti"}}))  # fmt: skip
    cfg = resolve_config(run, None, None, path)
    assert cfg.features.context == ["cat_3"] and cfg.export.format == "aoti"
    assert resolve_config(run, None, None, None).features.context == []
    # Checked like any config: the run's format (torchscript) is kept, onnx refused.
    with pytest.raises(ConfigError, match="export.format='onnx'"):
        resolve_config(run, None, "onnx", path)
