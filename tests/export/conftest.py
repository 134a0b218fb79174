"""Fixtures of the export tests: tiny run directories, seeded or really trained.

`seeded_run` writes a checkpoint the way the trainer does (DCP of the TrainModel state dict,
committed by rec.run_dir.commit_checkpoint, and config.yaml) from a seeded model in this
process: fast, for everything that does not need trained weights. `trained_runs` runs the real
`rec train` CLI on 2 ranks, once per sharding layout, for the quality bar and the
sharded-checkpoint tests.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rec import run_dir
from rec.config import config_from_dict
from rec.model import TrainModel, build_model
from tests.artifacts import made
from tests.helpers import run_rec, warning_lines, write_config

# A shared table (b, c), a mean-pooled one and features listed out of table order, so the
# exported model's feature reordering and pooling are exercised.
EXPORT_TINY: dict[str, Any] = {
    "tables": [
        {"name": "t0", "rows": 300, "dim": 8, "features": ["a"]},
        {"name": "t1", "rows": 120, "dim": 8, "features": ["b", "c"]},
        {"name": "t2", "rows": 50, "dim": 8, "features": ["d"], "pooling": "mean"},
        {"name": "t3", "rows": 80, "dim": 8, "features": ["e"]},
    ],
    "features": {"dense": 4, "sparse": ["e", "a", "c", "b", "d"]},
    "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
    "data": {"synthetic": {"train_samples": 8192, "eval_samples": 2048}},
    "training": {"batch_size": 128, "steps": 40, "eval_every": 0, "log_every": 20},
    "checkpoint": {"every_steps": 0},
    "export": {"max_batch_size": 256},
}

# Every sharding type TorchRec offers on CPU, over two 2-rank runs
# (docs/architecture.md#sharding-on-cpu).
SHARDINGS = {
    "tw_rw_cw_dp": ["table_wise", "row_wise", "column_wise", "data_parallel"],
    "gs_twrw_twcw_tw": ["grid_shard", "table_row_wise", "table_column_wise", "table_wise"],
}


def tiny_dict(**export: Any) -> dict[str, Any]:
    data = copy.deepcopy(EXPORT_TINY)
    data["export"].update(export)
    return data


def write_seeded_run(run: Path, data: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A run dir with one committed checkpoint (step_10) of a seeded, untrained model."""
    cfg = config_from_dict(data or tiny_dict())
    torch.manual_seed(seed)
    model = TrainModel(build_model(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # larger than the default init, so quantization error shows
    step = run_dir.checkpoints_dir(run) / "step_10"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step))
    run_dir.commit_checkpoint(run, 10, {"world_size": 1})
    (run / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    return run


@pytest.fixture(scope="session")
def seeded_run(tmp_path_factory) -> Path:
    return write_seeded_run(tmp_path_factory.mktemp("seeded") / "run")


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> dict[str, Path]:
    """Real 2-rank `rec train` runs, one per entry of SHARDINGS, made once for the whole test
    run and shared across its workers (tests/artifacts.py): read them, never write into them."""
    runs = {}
    for name, types in SHARDINGS.items():
        data = tiny_dict()
        # Not a multiple of the global batch (2 x 128): the trainer must score every held-out
        # sample, its last batch short on rank 0 and absent on rank 1 (both padded).
        data["data"]["synthetic"]["eval_samples"] = 1850
        # min_partition 4: the dim-8 tables really split into column shards (TorchRec's
        # default keeps a dim under 32 in one piece).
        data["sharding"] = {
            "constraints": {
                t["name"]: {"sharding_types": [st], "min_partition": 4}
                for t, st in zip(data["tables"], types, strict=True)
            }
        }
        runs[name] = made(tmp_path_factory, {"rec train": data, "nproc": 2}, _train(data)) / "run"
    return runs


def _train(data: dict[str, Any]):
    def make(where: Path) -> None:
        cfg = write_config(where / "c.yaml", data)
        out = run_rec("train", "--config", str(cfg), "--run-dir", str(where / "run"), "--nproc",
                      "2").stdout  # fmt: skip
        # Only rec's own lines: the warnings TorchRec and FBGEMM print for these sharding types
        # (data_parallel's, the host groups of grid and table_row_wise) are known harmless ones.
        assert not warning_lines(out), warning_lines(out)

    return make


@pytest.fixture(scope="session")
def exported(seeded_run, tmp_path_factory):
    """The seeded run exported in both formats (default int8) into a fresh repository."""
    from rec.export.pipeline import export_run

    repo = tmp_path_factory.mktemp("repo") / "models"
    return export_run(seeded_run, repo, fmt="both", log=lambda _: None)


def random_request(num_dense: int, num_sparse: int, batch: int, seed: int):
    """(dense, lengths, values) with empty bags and ids anywhere in int64."""
    from rec.export.module import sample_batch

    return sample_batch(num_dense, num_sparse, batch, seed)


def unsharded_eval(run: Path):
    """The run's LATEST checkpoint loaded unsharded, scoring every held-out sample as the trainer
    does: (quality dict, number of samples scored, the LoadedRun)."""
    from rec.data import make_source
    from rec.export import verify
    from rec.export.build import score
    from rec.export.load import load_run
    from rec.export.module import FloatReference
    from rec.model import table_rows

    loaded = load_run(run)
    module = FloatReference(loaded.model, loaded.cfg.features.sparse, table_rows(loaded.cfg))
    source = make_source(loaded.cfg, "eval")
    batches = list(source.batches(512, rank=0, world_size=1, drop_last=False))
    labels = torch.cat([b.labels.float() for b in batches])
    return verify.quality(score(module, batches), labels), labels.shape[0], loaded
