"""Will-it-fit checks: a model too big for the machine stops before any work, naming numbers."""

from __future__ import annotations

import pytest

from rec import resources
from rec.config import config_from_dict
from tests.helpers import rec_in_process, write_config

HUGE = {
    "tables": [{"name": "big", "rows": 10_000_000_000, "dim": 64, "features": ["cat_0"]}],
    "model": {"dense_arch": [64]},
}


def test_training_estimate_counts_tables_state_and_ranks(tmp_path):
    cfg = config_from_dict({**HUGE, "tables": [{**HUGE["tables"][0], "rows": 1_000_000}]})
    tables = 1_000_000 * 64 * 4
    state = 1_000_000 * 4  # row-wise Adagrad: one value per row
    want = int(1.3 * (tables + state)) + 2 * resources.PROCESS_BASE
    resources.check_training(cfg, 2, tmp_path, available=want, free=10**12)
    with pytest.raises(resources.ResourceError, match=r"training needs about 2\.49 GB of RAM"):
        resources.check_training(cfg, 2, tmp_path, available=want - 1, free=10**12)
    # keep_last 3 committed checkpoints and the one being written: 4 x 0.26 GB
    with pytest.raises(resources.ResourceError, match=r"needs about 1\.04 GB of disk"):
        resources.check_training(cfg, 2, tmp_path, available=want, free=1000)


def test_adam_state_is_twice_the_tables():
    cfg = config_from_dict({"training": {"embedding_optimizer": "adam"}})
    assert resources.optimizer_state_bytes(cfg) == 2 * resources.table_bytes(cfg)


def test_export_estimate_names_the_numbers(tmp_path):
    cfg = config_from_dict({})
    with pytest.raises(resources.ResourceError, match=r"quantized tables.*available"):
        resources.check_export(cfg, ["onnx"], 10**9, 1000, 1 << 20, tmp_path, available=2 << 30,
                               free=10**12)  # fmt: skip
    resources.check_export(cfg, ["torchscript"], 10**9, 1000, 1 << 20, tmp_path,
                           available=3 << 30, free=10**12)  # fmt: skip


def test_rec_train_refuses_a_model_that_cannot_fit_before_launching(tmp_path):
    run = tmp_path / "run"
    proc = rec_in_process("train", "-c", str(write_config(tmp_path / "huge.yaml", HUGE)),
                          "--run-dir", str(run))  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert "error: training needs about 3382.15 GB of RAM" in proc.stdout
    assert "available" in proc.stdout and "Traceback" not in proc.stdout
    assert not run.exists()  # refused before the run directory or any rank existed
