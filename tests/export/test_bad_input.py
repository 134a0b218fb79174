"""Bad input: a clear error naming the thing, and nothing half-written left behind."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from rec.cli import main
from rec.config import ConfigError
from rec.contract.repository import manifest_in
from rec.export.load import CheckpointMismatchError
from rec.export.pipeline import export_run
from rec.export.repository import RepositoryError
from rec.run_dir import RunDirError
from tests.helpers import write_config


@pytest.fixture
def run(tmp_path, seeded_run):
    copy = tmp_path / "run"
    shutil.copytree(seeded_run, copy)
    return copy


def export(run, repo):
    return export_run(run, repo, log=lambda _: None)


def edit_config(run, edit):
    data = yaml.safe_load((run / "config.yaml").read_text())
    edit(data)
    (run / "config.yaml").write_text(yaml.safe_dump(data))


def test_missing_run_dir(tmp_path):
    with pytest.raises(RunDirError, match="nope.*does not exist"):
        export(tmp_path / "nope", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_no_committed_checkpoint(run, tmp_path):
    (run / "checkpoints" / "step_10" / "COMMITTED").unlink()
    with pytest.raises(RunDirError, match="no committed checkpoint"):
        export(run, tmp_path / "repo")
    with pytest.raises(RunDirError, match="step_10.*no COMMITTED"):
        export_run(run, tmp_path / "repo", checkpoint="step_10")
    with pytest.raises(RunDirError, match="step_99.*does not exist"):
        export_run(run, tmp_path / "repo", checkpoint="step_99")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(
    ("field", "value", "shape"), [("rows", 121, r"\(121, 8\).*\(120, 8\)"), ("dim", 16, "")]
)
def test_config_does_not_match_checkpoint(run, tmp_path, field, value, shape):
    def edit(data):
        for t in data["tables"]:
            if field == "dim" or t["name"] == "t1":
                t[field] = value
        data["model"]["dense_arch"][-1] = data["tables"][0]["dim"]

    edit_config(run, edit)
    with pytest.raises(CheckpointMismatchError, match=rf"table 't\d'.*{shape}"):
        export(run, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_unknown_table_in_override(run, tmp_path):
    overrides = write_config(tmp_path / "x.yaml", {"export": {"table_dtypes": {"big": "int4"}}})
    with pytest.raises(ConfigError, match="unknown table 'big'"):
        export_run(run, tmp_path / "repo", config=overrides)
    bad_dtype = write_config(tmp_path / "y.yaml", {"export": {"table_dtypes": {"t0": "int3"}}})
    with pytest.raises(ConfigError, match="export.table_dtypes.t0='int3'"):
        export_run(run, tmp_path / "repo", config=bad_dtype)


def test_repository_path_is_a_file(run, tmp_path):
    (tmp_path / "repo").write_text("not a directory")
    with pytest.raises(RepositoryError, match="not a directory"):
        export(run, tmp_path / "repo")


def test_cli_prints_one_line(tmp_path):
    result = CliRunner().invoke(main, ["export", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: run directory {str(tmp_path / 'missing')!r} does not exist"
    ]


def test_stale_staging_is_removed_live_one_kept(tmp_path):
    import os
    import subprocess

    from rec.export.repository import staging_dir

    repo = tmp_path / "repo"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (repo / f".staging-{dead.pid}-x").mkdir(parents=True)
    live = repo / f".staging-{os.getppid()}-y"
    live.mkdir()
    mine = staging_dir(repo)
    assert sorted(p.name for p in repo.iterdir()) == sorted([live.name, mine.name])


def test_missing_eval_data_skips_quality_only(run, tmp_path):
    def edit(data):
        data["data"]["source"] = "csv"
        data["data"]["train_paths"] = [str(tmp_path / "gone" / "*.csv")]

    edit_config(run, edit)
    lines = []
    result = export_run(run, tmp_path / "repo", log=lines.append)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    assert "skipped" in manifest["verification"]["eval"]
    assert manifest["verification"]["torchscript_reload_identical"] is True
    assert any(line.startswith("warning: no held-out data") for line in lines)
