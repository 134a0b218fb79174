"""Real multi-process training: `rec train` through the elastic launcher, gloo, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from rec import run_dir
from rec.config import ConfigError
from tests.helpers import rec_in_process, run_rec, write_config

# Every table gets its own sharding type, so one 2-rank run exercises them all.
SHARDING = {
    "t0": "table_wise",
    "t1": "row_wise",
    "t2": "column_wise",
    "t3": "data_parallel",
    "t4": "table_row_wise",
    "t5": "grid_shard",
    "t6": "table_column_wise",
}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / run_dir.METRICS_FILE).read_text().splitlines()]


def _flat_checkpoint(step_dir: Path, tmp: Path) -> dict:
    """The whole checkpoint as plain tensors, read in one process with no process group."""
    out = tmp / f"{step_dir.parent.parent.name}-{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir), str(out))
    flat: dict = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                flat[prefix + k] = v

    walk(torch.load(out, weights_only=True), "")
    return flat


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    from tests.helpers import TINY

    tmp = tmp_path_factory.mktemp("mixed")
    cfg = json.loads(json.dumps(TINY))
    cfg["sharding"] = {"constraints": {t: {"sharding_types": [s]} for t, s in SHARDING.items()}}
    path = write_config(tmp / "cfg.yaml", cfg)
    run = tmp / "run"
    proc = run_rec("train", "--config", str(path), "--run-dir", str(run), "--nproc", "2")
    return run, proc.stdout


def test_every_sharding_type_trains_and_saves(mixed_run):
    run, out = mixed_run
    plan = json.loads((run / run_dir.PLAN_FILE).read_text())
    assert plan["world_size"] == 2
    got = {row["table"]: row["sharding_type"] for row in plan["tables"]}
    for table, sharding_type in SHARDING.items():
        assert got[table] == sharding_type, out
    for sharding_type in SHARDING.values():
        assert sharding_type in out  # the printed plan table
    committed = run_dir.committed_steps(run)
    assert [p.name for p in committed] == ["step_20", "step_40"]
    assert run_dir.latest_checkpoint(run).name == "step_40"
    assert sorted(p.name for p in committed[-1].glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    meta = run_dir.read_meta(committed[-1])
    assert meta["world_size"] == 2 and meta["step"] == 40
    evals = [m for m in _metrics(run) if m["kind"] == "eval"]
    assert [m["step"] for m in evals] == [20, 40]
    assert 0.0 < evals[-1]["log_loss"] < 1.0


def test_run_records_the_plans_numbers_and_memory_per_rank(mixed_run):
    """plan.json carries rec plan's numbers; the end of the run puts each rank's peak RSS next
    to the plan's estimate for its shards, in metrics.jsonl and the output."""
    run, out = mixed_run
    plan = json.loads((run / run_dir.PLAN_FILE).read_text())
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    assert all(t["traffic"] or t["sharding_type"] == "data_parallel" for t in plan["tables"])
    (memory,) = [m for m in _metrics(run) if m["kind"] == "memory"]
    assert memory["step"] == 40
    assert memory["plan_shard_bytes"] == [r["host_memory"]["used"] for r in plan["ranks"]]
    # a rank's process (torch, torchrec, fbgemm) is far above its few KiB of tables
    assert all(peak > 100 * 2**20 for peak in memory["peak_rss_bytes"])
    assert "rank 1: peak RSS" in out and "the plan's estimate for its shards" in out
    # ...and beside this CPU's calibrated estimate (train.plan_estimate), the run's mean step
    # beside the estimated one
    assert all(e > 100 * 2**20 for e in memory["estimated_bytes"])
    assert memory["estimated_step_ms"] > 0 and memory["measured_step_ms"] > 0
    assert plan["calibrated"]["step_ms"] == memory["estimated_step_ms"]
    assert "step: estimated" in out and "rank 1: peak RSS" in out and "GiB, estimated" in out


def test_tensorboard_reads_the_runs_numbers(mixed_run):
    """The run's TensorBoard event files, read by TensorBoard's own reader, hold metrics.jsonl's
    numbers under `<kind>/<name>` (per rank: `/rank_<r>`), at the same steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = mixed_run
    board = EventAccumulator(str(run / run_dir.TENSORBOARD_DIR))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    for tag in ("train/loss", "train/samples_per_s", "train/lr", "eval/auc", "eval/log_loss",
                "memory/peak_rss_bytes/rank_0", "memory/peak_rss_bytes/rank_1",
                "memory/plan_shard_bytes/rank_1"):  # fmt: skip
        assert tag in tags, sorted(tags)
    records = _metrics(run)
    train = [m for m in records if m["kind"] == "train"]
    assert [e.step for e in board.Scalars("train/loss")] == [m["step"] for m in train]
    assert [e.value for e in board.Scalars("train/loss")] == pytest.approx(
        [m["loss"] for m in train], rel=1e-6
    )
    evals = [m for m in records if m["kind"] == "eval"]
    assert [e.value for e in board.Scalars("eval/auc")] == pytest.approx(
        [m["auc"] for m in evals], rel=1e-6
    )
    (memory,) = [m for m in records if m["kind"] == "memory"]
    (peak,) = board.Scalars("memory/peak_rss_bytes/rank_1")
    assert peak.step == memory["step"] and peak.value == pytest.approx(
        memory["peak_rss_bytes"][1], rel=1e-6
    )


def test_run_splits_its_step_time_and_counts_the_bytes_it_sends(mixed_run):
    """The profiled steps' split adds up to the step, and the reduce-scatter and all-gather of
    the tables row-sharded over both ranks (row_wise, table_row_wise, grid_shard) send exactly
    their pooled embeddings: batch x ranks x dims x 4 bytes forward, batch x dims x 4 back."""
    from rec.train.step_profile import PHASES
    from tests.helpers import TINY

    run, out = mixed_run
    (split,) = [m for m in _metrics(run) if m["kind"] == "step_time"]
    assert split["profiled_steps"] == 10
    # Kineto's start and stop marks stay out of the terminal (step_profile._without_usdt_lines).
    assert "USDT" not in out, [line for line in out.splitlines() if "USDT" in line]
    for rank in range(2):
        parts = {p: split[f"{p}_ms"][rank] for p in PHASES}
        assert all(v >= 0 for v in parts.values()), parts
        assert sum(parts.values()) == pytest.approx(split["step_ms"][rank], abs=0.01), parts
        assert all(parts[p] > 0 for p in ("forward", "backward", "optimizer", "communication"))
    batch, dims = TINY["training"]["batch_size"], 3 * 8  # t1, t4, t5: dim 8 each
    assert split["reduce_scatter_bytes"] == [batch * 2 * dims * 4] * 2
    assert split["all_gather_bytes"] == [batch * dims * 4] * 2
    assert all(b > 0 for b in split["all_to_all_bytes"] + split["all_reduce_bytes"])
    # Next to the plan's send buffers: embeddings' sizes are exact; the ids' all-to-all also
    # carries lengths and split sizes, which the plan leaves out.
    for kind in ("all_to_all", "reduce_scatter", "all_gather"):
        assert split[f"{kind}_bytes"] == split[f"plan_{kind}_bytes"], (kind, split)
    ids = zip(split["ids_all_to_all_bytes"], split["plan_ids_all_to_all_bytes"], strict=True)
    assert all(measured > planned > 0 for measured, planned in ids), split
    assert "rank 1: step" in out and "sends per step: ids_all_to_all" in out and "(plan " in out


@pytest.mark.parametrize("nproc", [1, 2])
def test_load_then_save_at_another_world_size_is_exact(mixed_run, tmp_path, nproc):
    run, _ = mixed_run
    dest = tmp_path / f"resaved{nproc}"
    worker = Path(__file__).with_name("reshard_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
         "--standalone", str(worker), str(run), str(dest)],
        env=env, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    before = _flat_checkpoint(run_dir.latest_checkpoint(run), tmp_path)
    after = _flat_checkpoint(run_dir.latest_checkpoint(dest), tmp_path)
    tensors = [k for k, v in before.items() if isinstance(v, torch.Tensor)]
    assert any("embedding_bags.t1.weight" in k for k in tensors)
    assert any(k.endswith("momentum1") for k in tensors)  # fused row-wise Adagrad state
    assert any(k.endswith("exp_avg_sq") for k in tensors)  # dense Adam state
    assert set(before) == set(after)
    for key in tensors:
        assert torch.equal(before[key], after[key]), key


def test_resume_at_one_rank_continues_the_loss(mixed_run, tmp_path):
    """A finished run trains on: `--steps 20` past its last checkpoint, with `-c` changing what
    a resume may change (here how many checkpoints are kept), written to its config.yaml."""
    run, _ = mixed_run
    resumed = tmp_path / "resumed"
    import shutil

    from rec.config import load_config

    shutil.copytree(run, resumed)
    more = write_config(tmp_path / "more.yaml", {"checkpoint": {"keep_last": 1}})
    out = run_rec("train", "--resume", str(resumed), "--nproc", "1", "--steps", "20", "-c",
                  str(more)).stdout  # fmt: skip
    assert "resumed from" in out and "at step 40" in out
    saved = load_config(resumed / run_dir.CONFIG_FILE)
    assert (saved.training.steps, saved.checkpoint.keep_last) == (60, 1)
    assert [p.name for p in run_dir.committed_steps(resumed)] == ["step_60"]  # keep_last: 1
    train = [m for m in _metrics(resumed) if m["kind"] == "train"]
    steps = [m["step"] for m in train]
    assert steps == [10, 20, 30, 40, 50, 60]
    first_loss = train[0]["loss"]
    # A restart from scratch would start near the untrained loss again; a resume carries on.
    assert train[4]["loss"] < first_loss
    assert run_dir.latest_checkpoint(resumed).name == "step_60"
    assert run_dir.read_meta(run_dir.latest_checkpoint(resumed))["world_size"] == 1


def test_a_resume_refuses_a_config_that_changes_the_model(mixed_run, tmp_path):
    """`-c` on a resume names each field the checkpoint depends on that it would change, and
    touches nothing; so does --publish on a run whose constraints keep a table column-wise."""
    run, _ = mixed_run
    saved = (run / run_dir.CONFIG_FILE).read_text()
    other = write_config(tmp_path / "other.yaml",
                         {"model": {"dense_arch": [32, 8]}, "training": {"steps": 80}})  # fmt: skip
    proc = rec_in_process("train", "--resume", str(run), "-c", str(other))
    assert proc.returncode == 2, proc.stdout
    assert "(model.dense_arch: [16, 8] -> [32, 8])" in proc.stdout, proc.stdout
    proc = rec_in_process("train", "--resume", str(run), "--publish", "redis://127.0.0.1:1/s")
    assert proc.returncode == 2, proc.stdout
    assert "cannot publish: table 't2' may only be sharded ['column_wise']" in proc.stdout
    assert (run / run_dir.CONFIG_FILE).read_text() == saved
    assert run_dir.latest_checkpoint(run).name == "step_40"


def test_steps_and_epochs_more_count_from_the_last_checkpoint(tmp_path):
    """--steps N: N past the checkpoint's step. --epochs N: N past a run of whole epochs that
    finished; from within an epoch, the unfinished one is the first of the N."""
    from rec.config import config_from_dict
    from rec.train.resume import extend
    from tests.helpers import TINY

    cfg = config_from_dict({**TINY, "training": {**TINY["training"], "steps": 0, "epochs": 2}})
    (run_dir.checkpoints_dir(tmp_path) / "step_9").mkdir(parents=True)
    length = {"steps": 0, "epochs": 2}
    run_dir.commit_checkpoint(tmp_path, 9, {"epoch": 1, "complete": True, "length": length})
    assert (extend(tmp_path, cfg, None, 3).training.epochs, cfg.training.epochs) == (5, 2)
    assert extend(tmp_path, cfg, 7, None).training.steps == 16
    run_dir.commit_checkpoint(tmp_path, 9, {"epoch": 1, "complete": False, "length": length})
    more = extend(tmp_path, cfg, None, 3).training
    assert (more.epochs, more.steps) == (4, 0)


def test_a_resume_takes_the_runs_own_config_file_with_a_new_length(tmp_path):
    """The file the run was made from, its length changed, is applied (its tables written
    short, as the defaults fill them); the same file with a table's dim changed is refused
    naming that field."""
    from rec.config import config_from_dict
    from rec.train.resume import resume_config
    from tests.helpers import TINY

    (tmp_path / run_dir.CONFIG_FILE).write_text(config_from_dict(TINY).to_yaml())
    longer = json.loads(json.dumps(TINY))
    longer["training"].update(steps=0, epochs=3)
    cfg = resume_config(tmp_path, write_config(tmp_path / "longer.yaml", longer))
    assert (cfg.training.steps, cfg.training.epochs) == (0, 3)
    with pytest.raises(ConfigError, match="sets training.epochs, but training.steps=40 decides"):
        resume_config(tmp_path, write_config(tmp_path / "epochs.yaml", {"training": {"epochs": 3}}))
    longer["tables"][1]["dim"] = 4
    with pytest.raises(ConfigError, match=r"\(tables\.t1\.dim: 8 -> 4\)"):
        resume_config(tmp_path, write_config(tmp_path / "other.yaml", longer))


def test_new_run_refuses_a_directory_with_checkpoints(mixed_run):
    run, _ = mixed_run
    proc = rec_in_process("train", "--run-dir", str(run))
    assert proc.returncode == 2
    assert "already has checkpoints" in proc.stdout


def test_plan_command_prints_a_table(tmp_path):
    out = rec_in_process("plan", "--world-size", "4", check=True).stdout
    assert "sharding type" in out
    assert "t0" in out and "t7" in out


def test_table_row_wise_and_grid_on_a_simulated_two_host_topology(tmp_path, tiny_config):
    """4 ranks as 2 hosts x 2: TWRW keeps a table inside one host, GS splits rows per host."""
    tiny_config["sharding"] = {
        "constraints": {
            "t0": {"sharding_types": ["table_row_wise"]},
            "t1": {"sharding_types": ["grid_shard"]},
        },
        "topology": {"local_world_size": 2},
    }
    tiny_config["training"].update(steps=10, eval_every=0, log_every=10)
    tiny_config["checkpoint"]["every_steps"] = 0
    run = tmp_path / "run"
    path = write_config(tmp_path / "cfg.yaml", tiny_config)
    run_rec("train", "--config", str(path), "--run-dir", str(run), "--nproc", "4")
    plan = {r["table"]: r for r in json.loads((run / run_dir.PLAN_FILE).read_text())["tables"]}
    assert plan["t0"]["sharding_type"] == "table_row_wise"
    twrw_ranks = {s["rank"] for s in plan["t0"]["shards"]}
    assert twrw_ranks in ({0, 1}, {2, 3})  # one host's ranks
    assert plan["t1"]["sharding_type"] == "grid_shard"
    assert len(list(run_dir.latest_checkpoint(run).glob("*.distcp"))) == 4
