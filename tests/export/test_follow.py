"""`rec export --follow`, in this process on a seeded run: new checkpoints committed while it
runs become versions, superseded ones are skipped, the newest `keep` stay, a restarted
follower goes on from the repository's newest version, and SIGTERM finishes or (twice)
abandons the export in progress, leaving only whole versions.

New checkpoints are copies of the seeded one committed by rec.run_dir.commit_checkpoint (the
trainer's commit protocol); tests/serve_cpp/test_follow.py follows a real `rec train` while
rec-server swaps to the versions under traffic.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from rec import run_dir
from rec.config import ConfigError
from rec.contract import FORMATS, ModelDir
from rec.export.follow import export_one, follow, prune, stop_on_signals
from tests.export.conftest import write_seeded_run
from tests.helpers import rec_in_process


def commit_copy(run: Path, step: int) -> None:
    """A new committed checkpoint at `step`, with the seeded weights."""
    src = run_dir.checkpoints_dir(run) / "step_10"
    dst = run_dir.checkpoints_dir(run) / run_dir.step_dir_name(step)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("COMMITTED", "meta.json"))
    run_dir.commit_checkpoint(run, step, {"world_size": 1})


def staged(repo: Path) -> list[str]:
    return [p.name for p in repo.glob(".staging-*")] if repo.is_dir() else []


class Script:
    """The follower's log: each line kept, and the action for the first line that starts with
    a given prefix run once."""

    def __init__(self, actions: dict) -> None:
        self.lines: list[str] = []
        self.actions = dict(actions)

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        for prefix in list(self.actions):
            if line.startswith(prefix):
                self.actions.pop(prefix)()


def sigterm(times: int = 1):
    def send() -> None:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGTERM)

    return send


def test_follows_new_checkpoints_skips_superseded_and_keeps_k(tmp_path):
    run, repo = write_seeded_run(tmp_path / "run"), tmp_path / "repo"
    script = Script({
        # Two checkpoints commit while no export runs: only the newer one is exported.
        "version torchscript 1: step 10": lambda: (commit_copy(run, 20), commit_copy(run, 30)),
        "version torchscript 2: step 30": lambda: commit_copy(run, 40),
        "version torchscript 3: step 40": sigterm(),
    })  # fmt: skip
    done = follow(run, repo, keep=2, fmt="torchscript", poll_s=0.05, log=script)
    assert [e.step for e in done] == [10, 30, 40], script.lines
    assert [e.previous_step for e in done] == [None, 10, 30]
    assert "version torchscript 2: step 30 (+20) in " in script.lines[1]
    assert done[2].pruned == {"torchscript": [1]} and "pruned 1;" in script.lines[2]
    model = ModelDir.of(repo, "rec")
    assert model.versions() == [2, 3] and staged(repo) == []
    for version, step in ((2, 30), (3, 40)):
        m = json.loads(model.version_manifest(version).read_text())
        # What a server that swaps to it needs to apply the update log after its checkpoint.
        assert m["source"]["step"] == step and m["updates"]["step"] == step
        assert m["source"]["checkpoint"].endswith(f"step_{step}")
    assert json.loads(model.manifest.read_text())["version"] == 3  # the model-level rec.json
    assert "verified: torchscript AUC" in script.lines[0]
    assert script.lines[-1] == "stopped after 3 version(s)"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_a_restarted_follower_goes_on_from_the_newest_version(tmp_path):
    run, repo = write_seeded_run(tmp_path / "run"), tmp_path / "repo"
    follow(run, repo, fmt="torchscript", poll_s=0.05, log=Script({"version": sigterm()}))
    script = Script({
        "the repository's newest version holds step 10": lambda: commit_copy(run, 20),
        "version": sigterm(),
    })  # fmt: skip
    done = follow(run, repo, fmt="torchscript", poll_s=0.05, log=script)
    assert [(e.step, e.versions) for e in done] == [(20, {"torchscript": 2})], script.lines


def test_sigterm_during_an_export_finishes_it(tmp_path):
    run, repo = write_seeded_run(tmp_path / "run"), tmp_path / "repo"
    # After the model is staged and scored, before it is committed.
    detail = Script({"torchscript: built": sigterm()})
    log = Script({})
    done = follow(run, repo, fmt="torchscript", poll_s=0.05, log=log, detail=detail)
    assert [e.step for e in done] == [10], log.lines
    assert log.lines[0].startswith("SIGTERM: stopping once the export in progress")
    assert ModelDir.of(repo, "rec").versions() == [1] and staged(repo) == []


def test_a_second_sigterm_abandons_the_export_and_leaves_nothing(tmp_path):
    run, repo = write_seeded_run(tmp_path / "run"), tmp_path / "repo"
    # export_run's first line: the export's process has a build and checks ahead of it.
    detail = Script({"loaded ": sigterm(times=2)})
    log = Script({})
    done = follow(run, repo, fmt="torchscript", poll_s=0.05, log=log, detail=detail)
    assert done == []
    abandoned = "abandoned the export of step 10; its staging directory was removed"
    assert abandoned in log.lines, log.lines
    # export_run removed its staging directory and the repository it had created.
    assert not repo.exists()


def test_a_checkpoint_deleted_before_its_export_is_skipped(tmp_path):
    """Training's keep_last can delete a checkpoint the follower picked: that export fails in
    its process, and the follower says why and moves on instead of stopping."""
    run, repo = write_seeded_run(tmp_path / "run"), tmp_path / "repo"
    gone = run_dir.checkpoints_dir(run) / "step_20"
    lines: list[str] = []
    with stop_on_signals(lines.append) as stop:
        done = export_one(run, repo, gone, 10, 3, stop, lines.append, None, fmt="torchscript")
    assert done is None
    assert lines == ["step 20: deleted by training while exporting (checkpoint.keep_last); "
                     "taking the newest"]  # fmt: skip
    assert not repo.exists()


def test_prune_keeps_the_newest_and_refuses_fewer_than_two(tmp_path):
    model = ModelDir.of(tmp_path, "rec")
    for v in (1, 2, 3, 5):
        model.version(v).mkdir(parents=True)
        (model.version(v) / FORMATS["torchscript"].file).write_text("x")
    assert prune(tmp_path, "rec", keep=2) == [1, 2]
    assert model.versions() == [3, 5] and staged(tmp_path) == []
    assert prune(tmp_path, "rec", keep=2) == []
    with pytest.raises(ConfigError, match="keep=1 must be at least 2"):
        prune(tmp_path, "rec", keep=1)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--keep", "1"], "'--keep': 1 is not in the range x>=2"),
        (
            ["--version", "3"],
            "--follow exports every new checkpoint as the next version; it does not take --version",
        ),  # fmt: skip
    ],
)
def test_follow_refuses_bad_options(tmp_path, args, expected):
    out = rec_in_process("export", "--follow", str(tmp_path / "run"), *args)
    assert out.returncode == 2 and expected in out.stdout, out.stdout
