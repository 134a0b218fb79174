"""`rec train --publish`: the rows training changes reach the update log, bit for bit what a full
export of the same step stores, with a real broker that is killed and restarted mid-run."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
import time

import pytest
import torch
import yaml

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.config import ConfigError, config_from_dict
from rec.contract.updates import parse_url
from rec.export.dcp_reader import CheckpointReader
from rec.export.stream import checkpoint_key
from rec.model import build_model, table_keys
from rec.quantize import fused_rows
from rec.update_log import Applier, ServedTable, read_records
from tests.helpers import (
    REC,
    TINY,
    lose_checkpoint,
    rec_in_process,
    run_rec,
    warning_lines,
    write_config,
)

needs_redis = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)
DTYPES = {"t2": "fp16", "t3": "int4"}  # the rest int8: every rowwise and plain storage
STEPS = 120


def _config(url: str) -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["training"].update(steps=STEPS, eval_every=60)
    cfg["checkpoint"] = {"every_steps": 60, "keep_last": 3}
    cfg["sharding"] = {"constraints": {"t1": {"sharding_types": ["row_wise"]}}}
    cfg["export"] = {"table_dtypes": DTYPES}
    # Every 7 steps: the checkpoints (60, 120) fall between publishes, and still get one (the
    # trainer flushes the log before it commits a checkpoint).
    cfg["publish"] = {"url": url, "every_steps": 7, "every_seconds": 0}
    return cfg


def _exported_rows(step_dir, cfg, table: str) -> torch.Tensor:
    """The table as a full export of `step_dir` stores it: uint8 [rows, row bytes]."""
    model_cfg = config_from_dict(cfg)
    key = checkpoint_key(table_keys(build_model(model_cfg, "meta"))[table])
    rows = CheckpointReader(step_dir).read_rows(key, 0, model_cfg_rows(model_cfg, table))
    return fused_rows(rows, DTYPES.get(table, "int8"))


def _applied(cfg: dict, records) -> Applier:
    """The replica rules (rec.update_log) over `records` in log order, none refused."""
    model_cfg = config_from_dict(cfg)
    state = Applier({t.name: ServedTable(t.rows, t.dim, DTYPES.get(t.name, "int8"))
                     for t in model_cfg.tables})  # fmt: skip
    for rec in records:
        assert state.apply(rec) == ("applied", "")
    return state


def model_cfg_rows(cfg, table: str) -> int:
    return next(t.rows for t in cfg.tables if t.name == table)


@needs_redis
def test_published_rows_equal_the_export_of_the_same_step_across_a_broker_restart(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        cfg = _config(url)
        run = tmp_path / "run"
        config = write_config(tmp_path / "c.yaml", cfg)
        args = [REC, "train", "--config", str(config), "--run-dir", str(run)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        # Kill the broker (SIGKILL: a crash) once publishing is under way.
        import redis

        client = redis.Redis(port=broker.port)
        deadline = time.monotonic() + 300
        while client.xlen("rec:updates") < 6 and proc.poll() is None:
            assert time.monotonic() < deadline, "no records were published"
            time.sleep(0.05)
        client.close()
        broker.stop(kill=True)
        # Down until a publisher has met it down (redis-py's own retries may hide a short
        # outage); training cannot end meanwhile: it flushes the log before each checkpoint.
        while not any("unreachable" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.05)
        broker.start()
        assert proc.wait(timeout=600) == 0, "".join(lines)
        reader.join(timeout=10)
        out = "".join(lines)
        assert "unreachable" in out and "back after" in out, out  # the restart did happen
        records = [r for _, r in read_records(url)]

    state = _applied(cfg, records)
    assert {r.rank for r in records} == {0, 1} and {r.world for r in records} == {2}
    assert len({r.run for r in records}) == 1 and {r.gen for r in records} == {1}
    assert state.watermark()[:2] == (1, STEPS)  # both ranks' last publish is the last step
    for checkpoint in (STEPS // 2, STEPS):  # flushed before each checkpoint was committed
        assert {r.rank for r in records if r.step == checkpoint and r.last} == {0, 1}
    # The step profiler's window (steps 6-15: rec.train.trainer.PROFILE_WARMUP, profile_steps
    # 10) pauses training for seconds as it closes: its rows go out first, off the 7-step grid.
    assert {r.rank for r in records if r.step == 15 and r.last} == {0, 1}

    final = run_dir.latest_checkpoint(run)
    middle = run_dir.checkpoints_dir(run) / run_dir.step_dir_name(STEPS // 2)
    for table in state.tables:
        exported = _exported_rows(final, cfg, table)
        published = state.rows.get(table, {})
        # Every published row is the final export's row, bit for bit...
        for row_id, data in published.items():
            assert data == exported[row_id].numpy().tobytes(), (table, row_id)
        # ...and every row the second half of training changed was published after its middle.
        before = _exported_rows(middle, cfg, table)
        changed = set(torch.nonzero((exported != before).any(dim=1)).flatten().tolist())
        late = {i for r in records if r.table == table and r.step > STEPS // 2 for i in r.ids}
        assert changed, table
        assert changed <= late, (table, sorted(changed - late)[:10])


def test_publishing_keeps_the_planner_to_whole_row_shards():
    from rec.train.sharding import make_constraints

    cfg = copy.deepcopy(TINY)
    cfg["publish"] = {"url": "redis://127.0.0.1:1/s"}
    kept = make_constraints(config_from_dict(cfg), "cpu")
    assert all(set(c.sharding_types) <= {"table_wise", "row_wise", "table_row_wise"}
               for c in kept.values()) and len(kept) == len(cfg["tables"])  # fmt: skip
    cfg["sharding"] = {"constraints": {"t3": {"sharding_types": ["column_wise"]}}}
    with pytest.raises(ConfigError, match="table 't3' may only be sharded \\['column_wise'\\]"):
        make_constraints(config_from_dict(cfg), "cpu")


@pytest.mark.parametrize(
    "url, fault",
    [
        ("redis://h:6379/0", "looks like a Redis database number"),
        ("http://h:6379/s", "must look like redis://HOST:PORT"),
        ("redis://h:99999/s", "not in [1, 65535]"),
        ("redis://h/s", "must look like redis://HOST:PORT"),
    ],
)
def test_a_bad_publish_url_is_refused_before_training(tmp_path, url, fault):
    proc = rec_in_process("train", "--run-dir", str(tmp_path / "run"), "--publish", url)
    assert proc.returncode != 0
    assert fault in proc.stdout
    assert not (tmp_path / "run").exists()


def test_update_url_default_stream():
    assert parse_url("redis://10.0.0.2:7000").stream == "rec:updates"


@needs_redis
def test_a_resumed_publisher_leaves_no_row_the_final_export_lacks(tmp_path):
    """A run that published past its last checkpoint and died (here: its last checkpoint
    removed, as if killed before writing it), resumed on 1 rank: the log, applied in order, ends
    equal to the final export for every row it ever carried."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        cfg = _config(url)
        cfg["tables"][0]["rows"] = 20000  # most rows the dead run touched are not touched again
        cfg["training"]["steps"] = 60
        cfg["checkpoint"] = {"every_steps": 40, "keep_last": 3}
        run = tmp_path / "run"
        run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
                str(run), timeout=600)  # fmt: skip
        # The data stream resumes at the checkpoint's position, so the steps the dead run took
        # are taken again with the same ids; a resumed run that ends sooner (4 steps here, not
        # 20) leaves most of the rows the dead run published untouched.
        lose_checkpoint(run, lost=60, latest=40, steps=44)
        out = run_rec("train", "--resume", str(run), "--nproc", "1", timeout=600).stdout
        assert re.search(r"re-sent [1-9]\d* rows at their step-40 values", out), out
        records = [r for _, r in read_records(url)]

    state = _applied(cfg, records)
    assert {r.gen for r in records} == {1, 2}
    assert state.watermark()[:2] == (2, 44)
    final = run_dir.latest_checkpoint(run)
    for table in state.tables:
        exported = _exported_rows(final, cfg, table)
        for row_id, data in state.rows.get(table, {}).items():
            assert data == exported[row_id].numpy().tobytes(), (table, row_id)


@needs_redis
def test_a_gap_in_publishing_is_closed_when_publishing_resumes(tmp_path):
    """A run published 10 steps; a resume with --no-publish trained 20 more and published
    nothing; a resume goes on publishing as the run does. A replica of the step-10 export that
    applies the log in order ends with every row of every table equal to the final export's,
    and its watermark at the final step: the last resume re-sent every row first."""
    from rec.train.resume import resume_config

    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        cfg = _config(url)
        cfg["training"].update(steps=10, eval_every=0)
        cfg["checkpoint"] = {"every_steps": 0, "keep_last": 3}  # at each start's end
        cfg["publish"]["every_steps"] = 3
        run = tmp_path / "run"
        run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
                str(run), "--nproc", "1")  # fmt: skip
        assert resume_config(run, None, steps=1).publish.url == url  # a resume publishes on
        run_rec("train", "--resume", str(run), "--nproc", "1", "--steps", "20", "--no-publish")
        saved = yaml.safe_load((run / run_dir.CONFIG_FILE).read_text())
        assert saved["publish"]["url"] == ""  # off for later resumes too
        assert max(r.step for _, r in read_records(url)) == 10  # the gap: steps 11-30
        out = run_rec("train", "--resume", str(run), "--nproc", "1", "--steps", "3", "--publish",
                      url).stdout  # fmt: skip
        assert "re-sent all" in out and "at their step-30 values" in out, out
        records = [r for _, r in read_records(url)]

    exported = run_dir.checkpoints_dir(run) / run_dir.step_dir_name(10)
    meta = run_dir.read_meta(exported)
    assert meta["published"] and meta["publish_gen"] == 1
    meta = run_dir.read_meta(run_dir.checkpoints_dir(run) / run_dir.step_dir_name(30))
    assert not meta["published"] and meta["publish_gen"] == 1
    model_cfg = config_from_dict(cfg)
    state = Applier({t.name: ServedTable(t.rows, t.dim, DTYPES.get(t.name, "int8"))
                     for t in model_cfg.tables}, export=(1, 10), run=records[0].run)  # fmt: skip
    for rec in records:
        assert state.apply(rec)[0] in ("applied", "skipped"), rec
    assert state.watermark()[:2] == (2, 33)
    final = run_dir.latest_checkpoint(run)
    assert final.name == "step_33"
    for table in state.tables:
        served = _exported_rows(exported, cfg, table)  # the replica's rows, then the log's
        for row_id, data in state.rows.get(table, {}).items():
            served[row_id] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        want = _exported_rows(final, cfg, table)
        stale = torch.nonzero((served != want).any(dim=1)).flatten().tolist()
        assert not stale, (table, len(stale), stale[:10])


def test_a_gap_in_a_zch_runs_publishing_is_refused(tmp_path):
    """A ZCH run that published, then trained without: replicas hold the map of its last
    published step, and the map changes since are not in the log. Publishing again is refused
    before any rank starts, naming the table; from a checkpoint the log holds, without
    publishing, or in a run that never published (its rows re-sent with their ids, for a
    replica of this checkpoint's export), the resume goes ahead."""
    from rec.train.resume import resume_config

    cfg = _config("redis://127.0.0.1:1/s")
    cfg["tables"][0]["ids"] = {"zch": {"every_steps": 4, "probes": 4}}
    cfg["publish"]["url"] = ""
    (tmp_path / run_dir.CONFIG_FILE).write_text(config_from_dict(cfg).to_yaml())
    (run_dir.checkpoints_dir(tmp_path) / "step_8").mkdir(parents=True)
    run_dir.commit_checkpoint(tmp_path, 8, {"publish_gen": None, "published": False})
    assert resume_config(tmp_path, None, publish="redis://127.0.0.1:1/s").publish.url
    (tmp_path / run_dir.PUBLISH_FILE).write_text('{"run": "r", "gen": 1}\n')
    run_dir.commit_checkpoint(tmp_path, 8, {"publish_gen": 1, "published": False})
    with pytest.raises(ConfigError, match=r"cannot publish from step_8: .* ZCH table\(s\) t0 "):
        resume_config(tmp_path, None, publish="redis://127.0.0.1:1/s")
    assert resume_config(tmp_path, None).publish.url == ""
    run_dir.commit_checkpoint(tmp_path, 8, {"publish_gen": 1, "published": True})
    assert resume_config(tmp_path, None, publish="redis://127.0.0.1:1/s").publish.url


@needs_redis
def test_publish_turns_on_when_resuming_a_run_trained_without_it(tmp_path):
    """The planner makes small tables data_parallel (trained by the dense optimizer), and
    publishing keeps every table to whole-row shards (the fused embedding optimizer): `--resume
    --publish` loads the rows under the new plan, re-sends every row (the log has none of
    the 20 steps trained without it), trains on and publishes. The rows no step after the
    resume looked up are the checkpoint's: loaded, not initialised afresh."""
    cfg = copy.deepcopy(TINY)
    cfg["tables"] = cfg["tables"][:4]
    cfg["tables"][2]["rows"], cfg["tables"][3]["rows"] = 50, 25  # data_parallel on 2 ranks
    # Steep Zipf ids, one per sample: every table keeps rows the 2 steps after the resume never
    # look up, which must be the checkpoint's.
    cfg["data"]["synthetic"].update(zipf_alpha=2.0, max_hotness=1)
    cfg["training"].update(steps=20, eval_every=0)
    cfg["checkpoint"] = {"every_steps": 0, "keep_last": 3}
    cfg["export"] = {"table_dtypes": DTYPES}
    run = tmp_path / "run"
    run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
            str(run))  # fmt: skip
    plan = json.loads((run / run_dir.PLAN_FILE).read_text())["tables"]
    replicated = sorted(r["table"] for r in plan if r["sharding_type"] == "data_parallel")
    assert replicated, plan
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        out = run_rec("train", "--resume", str(run), "--steps", "2", "--publish", url).stdout
        records = [r for _, r in read_records(url)]
    assert "at step 20" in out and f"table(s) {', '.join(replicated)}: rows as saved" in out, out
    resent = sum(len(r.ids) for r in records if r.step == 20)
    assert resent == sum(t["rows"] for t in cfg["tables"]), resent  # every row, once
    assert f"re-sent all {resent} rows at their step-20 values" in out, out
    records = [r for r in records if r.step > 20]  # what the 2 steps trained
    rows = sum(len(r.ids) for r in records)  # every rank's, as the summary counts them
    assert f"published to {url}: {rows} rows from 2 ranks (rank 0: " in out, out
    assert not warning_lines(out), warning_lines(out)  # loading under another plan: quiet
    plan = json.loads((run / run_dir.PLAN_FILE).read_text())["tables"]
    assert {r["sharding_type"] for r in plan} <= {"table_wise", "row_wise", "table_row_wise"}
    state = _applied(cfg, records)
    assert state.watermark()[:2] == (1, 22)
    assert yaml.safe_load((run / run_dir.CONFIG_FILE).read_text())["publish"]["url"] == url
    start, final = run_dir.checkpoints_dir(run) / "step_20", run_dir.latest_checkpoint(run)
    assert final.name == "step_22"
    for table in state.tables:
        exported = _exported_rows(final, cfg, table)
        for row_id, data in state.rows.get(table, {}).items():
            assert data == exported[row_id].numpy().tobytes(), (table, row_id)
        looked_up = {i for r in records if r.table == table for i in r.ids}
        kept = [i for i in range(len(exported)) if i not in looked_up]
        assert kept and looked_up, (table, len(kept), len(looked_up))
        assert torch.equal(exported[kept], _exported_rows(start, cfg, table)[kept]), table
    # And back: with --no-publish the small tables are data_parallel again, from whole-row
    # shards (no broker: a resume that still published would fail).
    out = run_rec("train", "--resume", str(run), "--steps", "1", "--no-publish").stdout
    assert f"table(s) {', '.join(replicated)}: rows as saved" in out, out
    assert run_dir.latest_checkpoint(run).name == "step_23"
    plan = json.loads((run / run_dir.PLAN_FILE).read_text())["tables"]
    assert sorted(r["table"] for r in plan if r["sharding_type"] == "data_parallel") == replicated


@needs_redis
def test_a_broker_that_refuses_writes_fails_the_run_loudly(tmp_path):
    """The broker answers with an error (out of memory), not silence: the sender cannot deliver,
    and training stops with that error instead of training on with rows the log will never
    have, or hanging."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        import redis

        client = redis.Redis(port=broker.port)
        client.config_set("maxmemory", 1)  # every write: OOM command not allowed
        cfg = _config(url)
        proc = run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)),
                       "--run-dir", str(tmp_path / "run"), check=False, timeout=600)  # fmt: skip
        client.close()
    assert proc.returncode != 0
    assert "publishing to redis://" in proc.stdout and "maxmemory" in proc.stdout, proc.stdout[
        -3000:
    ]


@needs_redis
def test_a_zch_run_publishes_its_rounds_and_a_resume_restores_the_maps_a_dead_run_changed(
    tmp_path,
):
    """A ZCH table's rounds reach the log as map changes with their rows; the run dies after a
    round its last checkpoint lacks (the checkpoint removed) and resumes on 1 rank. The log,
    applied in order to an empty map by the replica rules, refuses nothing and ends holding the
    final checkpoint's map, and every row it carried equals the final export's."""
    from rec.export import id_maps
    from rec.update_log import ServedMap

    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        cfg = _config(url)
        cfg["tables"][0].update(rows=300, ids={"zch": {"every_steps": 4, "probes": 4}})
        cfg["data"] = {"synthetic": {"train_samples": 4096, "eval_samples": 512,
                                     "live_ids": {"t0": 900}}}  # fmt: skip
        cfg["training"].update(steps=12, eval_every=0)
        cfg["checkpoint"] = {"every_steps": 8, "keep_last": 3}
        cfg["publish"]["every_steps"] = 3
        run = tmp_path / "run"
        run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", cfg)), "--run-dir",
                str(run), "--nproc", "1", timeout=600)  # fmt: skip
        # 10 steps: no round after the resume, the step-8 map is final.
        lose_checkpoint(run, lost=12, latest=8, steps=10)
        out = run_rec("train", "--resume", str(run), "--nproc", "1", timeout=600).stdout
        assert re.search(r"re-sent [1-9]\d* rows at their step-8 values", out), out
        records = [r for _, r in read_records(url)]

    # Every t0 record says which raw id each row's slot holds (rec.updates/3); the Applier
    # below refuses one whose ids disagree with the map it keeps (map_mismatch).
    zch_records = [r for r in records if r.table == "t0"]
    assert all(r.held is not None for r in zch_records) and any(r.held for r in zch_records)
    assert all(r.held is None for r in records if r.table and r.table != "t0")
    dead = [r for r in records if r.gen == 1 and r.step == 12]
    assert any(r.admitted for r in dead) and any(r.evicted for r in dead)  # round 12: lfu
    restore = [r for r in records if r.gen == 2 and r.step == 8]
    assert any(r.admitted or r.evicted for r in restore)
    model_cfg = config_from_dict(cfg)
    state = Applier({t.name: ServedTable(t.rows, t.dim, DTYPES.get(t.name, "int8"))
                     for t in model_cfg.tables},
                    maps={"t0": ServedMap.empty(299, 4)})  # fmt: skip
    for rec in records:
        assert state.apply(rec) == ("applied", ""), rec.step
    final = run_dir.latest_checkpoint(run)
    want = id_maps.read_maps(CheckpointReader(final), model_cfg)["t0"]
    keys, used = state.maps["t0"].copies[0]
    assert torch.equal(used, want.used) and torch.equal(keys[used], want.keys[want.used])
    for table in state.tables:
        exported = _exported_rows(final, cfg, table)
        for row_id, data in state.rows.get(table, {}).items():
            assert data == exported[row_id].numpy().tobytes(), (table, row_id)
