"""Training with ZCH tables through real torchrun ranks: rounds reset what they admit, and the
id maps go into the checkpoint and come back on a resume at the same and another world size."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch

from rec import run_dir
from rec.config import load_config
from rec.train.zch import fresh_rows
from rec.train.zch_sizing import place
from tests.helpers import TINY, rec_in_process, run_rec, warning_lines, write_config
from tests.train.test_train_distributed import _flat_checkpoint, _metrics

# t1 split by rows over both ranks, t2 by columns: a reset writes the part each rank holds.
ZCH = {
    "t1": ({"every_steps": 10, "eviction": "lru"}, "row_wise"),
    "t2": ({"every_steps": 10, "eviction": "lfu", "admit_after": 2}, "column_wise"),
}


@pytest.fixture(scope="module")
def zch_run(tmp_path_factory):
    """20 steps on 2 ranks; rounds and checkpoints at steps 10 and 20."""
    tmp = tmp_path_factory.mktemp("zch")
    cfg = copy.deepcopy(TINY)
    for table in cfg["tables"]:
        if table["name"] in ZCH:
            table["ids"] = {"zch": ZCH[table["name"]][0]}
    cfg["sharding"] = {"constraints": {t: {"sharding_types": [s]} for t, (_, s) in ZCH.items()}}
    cfg["training"].update(steps=20, eval_every=20)
    cfg["checkpoint"] = {"every_steps": 10, "keep_last": 3}
    run = tmp / "run"
    proc = run_rec("train", "--config", str(write_config(tmp / "cfg.yaml", cfg)), "--run-dir",
                   str(run), "--nproc", "2")  # fmt: skip
    steps = {p.name: _flat_checkpoint(p, tmp) for p in run_dir.committed_steps(run)}
    return run, proc.stdout, steps


def _table(flat: dict, table: str, suffix: str = "") -> torch.Tensor:
    """A table's weight (suffix ""), or its optimizer state (suffix ".<table>.momentum1")."""
    part = "optimizer.state." if suffix else "model."
    (key,) = [k for k in flat if k.startswith(part) and k.endswith(f".{table}.weight{suffix}")]
    return flat[key]


def test_a_newly_admitted_id_starts_with_a_fresh_row_and_no_optimizer_state(zch_run):
    run, out, steps = zch_run
    assert not warning_lines(out), out
    assert "zch: t1 " in out and "default-row reads" in out  # the summary at the evaluation
    (record,) = [m for m in _metrics(run) if m["kind"] == "zch"]
    assert record["step"] == 20 and record["t1_slots"] == 499
    assert record["t1_live"] == int(steps["step_20"]["zch.t1.used"].sum())
    assert record["t2_default_reads"] > 0
    cfg = load_config(run / run_dir.CONFIG_FILE)
    before, after = steps["step_10"], steps["step_20"]
    for name in ZCH:
        table = next(t for t in cfg.tables if t.name == name)
        keys, used = after[f"zch.{name}.keys"], after[f"zch.{name}.used"]
        assert int(used.sum()) > 0 and len(set(keys[used].tolist())) == int(used.sum())
        new = used & (~before[f"zch.{name}.used"] | (keys != before[f"zch.{name}.keys"]))
        slots = torch.nonzero(new).flatten()
        assert len(slots) > 0, f"{name}: the round at step 20 admitted nothing"
        weight = _table(after, name)
        momentum = _table(after, name, f".{name}.momentum1")
        expected = fresh_rows(cfg.training.seed, name, 20, len(slots), table.rows, table.dim)
        torch.testing.assert_close(weight[slots], expected, rtol=0, atol=0)
        assert momentum[slots].abs().max() == 0
        # the ids admitted at step 10 trained since: their rows moved and their state grew
        old = torch.nonzero(before[f"zch.{name}.used"] & ~new).flatten()
        assert momentum[old].abs().max() > 0
        assert not torch.equal(weight[old], _table(before, name)[old])


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_resume_continues_with_the_saved_id_maps(zch_run, tmp_path, nproc):
    """From 2 ranks to 1 and to 2 again: the maps load whole (every rank holds all of it)."""
    run, _, steps = zch_run
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    saved = steps["step_20"]
    live = {t: int(saved[f"zch.{t}.used"].sum()) for t in ZCH}
    out = run_rec("train", "--resume", str(resumed), "--nproc", str(nproc), "--steps",
                  "10").stdout  # fmt: skip
    assert f"resumed id maps: t1 {live['t1']}/499 ids after 2 rounds; " \
           f"t2 {live['t2']}/199 ids after 2 rounds" in out, out  # fmt: skip
    step_30 = _flat_checkpoint(run_dir.latest_checkpoint(resumed), tmp_path)
    for t in ZCH:
        assert int(step_30[f"zch.{t}.meta"][1]) == 3  # the saved map's 2 rounds, then one more


def test_rec_plan_lists_the_zch_tables_and_their_map_memory(tmp_path):
    cfg = copy.deepcopy(TINY)
    cfg["tables"][1]["ids"] = {"zch": {"probes": 8, "every_steps": 40}}  # t1: 499 slots
    path = write_config(tmp_path / "cfg.yaml", cfg)
    out = rec_in_process("plan", "--config", str(path), "--world-size", "2", check=True).stdout
    assert "ZCH tables (each rank holds every id map, 57 bytes per slot):" in out
    (line,) = [x for x in out.splitlines() if x.startswith("t1 ") and "KiB" in x]
    fields = line.split()
    assert fields[:6] == ["t1", "499", f"{499 * 57 / 1024:.1f}", "KiB", "8", "40"]
    # Synthetic ids without live_ids: the table's 500 ids 0..499, placed over 499 slots
    # through rec's hash: some windows fill before every slot does.
    placed = place(np.arange(500), 499, 8)
    assert fields[6:9] == ["500", f"{placed.load:.0%}", f"{placed.full_share:.1%}"], line
    assert 0.8 < placed.load < 1.0 and placed.full > 0


def test_rec_plan_counts_a_files_live_ids(tmp_path):
    """For files, rec plan counts each ZCH table's distinct ids in the data itself."""
    rows = [f"{i % 2},{i},user-{i % 13},item-{i % 5}" for i in range(200)]
    (tmp_path / "clicks.csv").write_text("\n".join(["clicked,price,user_id,item", *rows]) + "\n")
    cfg = {
        "tables": [
            {
                "name": "users",
                "rows": 64,
                "dim": 8,
                "features": ["user"],
                "ids": {"zch": {}},
            },
            {"name": "item_ids", "rows": 32, "dim": 8, "features": ["item"]},
        ],  # fmt: skip
        "features": {"dense": 1, "dense_names": ["price"]},
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": {
            "source": "csv",
            "train_paths": [str(tmp_path / "clicks.csv")],
            "columns": {"label": "clicked", "sparse": {"user": "user_id"}},
        },  # fmt: skip
    }
    path = write_config(tmp_path / "cfg.yaml", cfg)
    out = rec_in_process("plan", "--config", str(path), "--world-size", "2", check=True).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("users ") and "KiB" in x]
    assert line.split()[6:8] == ["13", f"{13 / 63:.0%}"], line  # 63 slots: rows - 1
    # 200 rows, of which every 10th is held out for evaluation.
    assert "in the first 180 training samples (all of them)" in out


def test_a_zch_table_is_never_planned_data_parallel():
    from rec.config import config_from_dict
    from rec.train.sharding import make_constraints

    cfg = copy.deepcopy(TINY)
    cfg["tables"][0]["ids"] = {"zch": {}}
    cfg["sharding"] = {"constraints": {"t0": {"sharding_types": ["data_parallel", "row_wise"]}}}
    constraints = make_constraints(config_from_dict(cfg), "cpu")
    assert constraints["t0"].sharding_types == ["row_wise"]
    assert "data_parallel" in constraints["t1"].sharding_types  # a modulo table keeps it


def test_one_pass_remap_reads_what_each_tables_lookup_reads():
    """ZchTables.remap serves every ZCH table in one pass; it must give rec.zch.lookup's rows,
    table by table (different slots and probes), and leave the modulo table's ids alone."""
    import numpy as np

    from rec.batch import RecBatch, feature_major
    from rec.config import config_from_dict
    from rec.tables import table_rows
    from rec.train.zch import ZchTables
    from rec.zch import lookup

    cfg = copy.deepcopy(TINY)
    cfg["tables"][0]["ids"] = {"zch": {"probes": 3}}
    cfg["tables"][2]["ids"] = {"zch": {"probes": 16}}
    cfg = config_from_dict(cfg)
    keys = list(cfg.features.sparse)
    zch = ZchTables(cfg, keys)
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(-(2**40), 2**40, (4000,), generator=gen)
    for m in zch.maps.values():  # admit half of the ids the batch holds
        ids = np.unique(raw[:150].numpy())
        none = np.zeros(0, np.int64)
        m.admit(ids, np.ones(len(ids), np.int64), none, none, none, 1, 0.0)
        assert 0 < m.live() < m.slots
    lengths = torch.randint(0, 4, (64, len(keys)), generator=gen, dtype=torch.int32)
    values = raw[torch.randint(0, 300, (int(lengths.sum()),), generator=gen)]
    batch = RecBatch(torch.zeros(64, 4), lengths, values, torch.zeros(64, 1))
    rows = table_rows(cfg)
    got = batch.to_torchrec(keys, rows, zch.remap_train).sparse_features.to_dict()
    plain = batch.to_torchrec(keys, rows).sparse_features.to_dict()
    lengths_fm, raw_fm = feature_major(lengths, values)
    ends = torch.cumsum(lengths_fm.reshape(len(keys), -1).sum(1), 0).tolist()
    for i, f in enumerate(keys):
        table = cfg.feature_to_table()[f]
        if table in zch.maps:
            m = zch.maps[table]
            want = lookup(raw_fm[(ends[i - 1] if i else 0) : ends[i]], m.keys, m.used, m.cfg.probes)
            assert torch.equal(got[f].values(), want), f
            assert (want < m.slots).any() and (want == m.slots).any()
        else:
            assert torch.equal(got[f].values(), plain[f].values()), f


def test_a_rounds_sparse_hits_sum_as_the_dense_counts_did():
    """A round gathers each rank's hits as (slot, count, last step) of the slots it saw, not a
    dense vector over every slot (33.8M at Kaggle size); summed, they must give each table the
    dense hits and last steps a sum and a max over the ranks would, and leave the tables not
    due their sightings."""
    import numpy as np

    from rec.config import config_from_dict
    from rec.train.zch import ZchTables, _sum_hits, _table_hits

    cfg = copy.deepcopy(TINY)
    cfg["tables"][0]["ids"] = {"zch": {"probes": 3, "every_steps": 5}}
    cfg["tables"][2]["ids"] = {"zch": {"every_steps": 10}}
    cfg = config_from_dict(cfg)
    keys = list(cfg.features.sparse)
    gen = torch.Generator().manual_seed(1)
    pool = torch.randint(-(2**40), 2**40, (200,), generator=gen)
    ranks = [ZchTables(cfg, keys) for _ in range(2)]
    for z in ranks:
        for m in z.maps.values():  # a third of the pool admitted, so that slots are hit
            ids = np.unique(pool[:70].numpy())
            none = np.zeros(0, np.int64)
            m.admit(ids, np.ones(len(ids), np.int64), none, none, none, 1, 0.0)
    for _ in range(3):
        for z in ranks:
            lengths = torch.randint(0, 3, (len(keys) * 16,), generator=gen, dtype=torch.int32)
            raw = pool[torch.randint(0, 200, (int(lengths.sum()),), generator=gen)]
            z.remap_train(lengths, raw, torch.zeros_like(raw))
    total = int(ranks[0].flat_keys.numel())
    dense_hits = torch.zeros(total, dtype=torch.float64)
    dense_last = torch.zeros(total, dtype=torch.int64)
    for z in ranks:
        hits, steps = torch.cat(z.seen.hits), torch.cat(z.seen.hit_steps)
        dense_hits += torch.bincount(hits, minlength=total)
        dense_last = torch.maximum(
            dense_last, torch.zeros(total, dtype=torch.int64).scatter_reduce(0, hits, steps, "amax")
        )
    due = [next(iter(ranks[0].maps))]  # the first table's round only
    parts = [z._local_counts(due)[1] for z in ranks]
    slots, counts, last = _sum_hits(parts)
    part = ranks[0]._part(due[0])
    at, table_counts, table_last = _table_hits(slots, counts, last, part)
    got_hits = torch.zeros(part.stop - part.start, dtype=torch.float64)
    got_last = torch.zeros(part.stop - part.start, dtype=torch.int64)
    got_hits[torch.from_numpy(at)] = torch.from_numpy(table_counts)
    got_last[torch.from_numpy(at)] = torch.from_numpy(table_last)
    assert got_hits.sum() > 0
    assert torch.equal(got_hits, dense_hits[part]) and torch.equal(got_last, dense_last[part])
    other = ranks[0]._part(list(ranks[0].maps)[1])  # not due: its hits wait for its round
    kept = torch.cat(ranks[0].seen.hits)
    assert kept.numel() > 0 and bool(((kept >= other.start) & (kept < other.stop)).all())


def test_consecutive_ids_that_fit_their_slots_are_held_without_eviction(tmp_path):
    """A log's users numbered 1..600, born through the run, in 799 slots (load 75 %): the run
    ends holding at least 90 % of them and evicted none (issue #59: ids shaped like real ones)."""
    users, steps, batch = 600, 40, 64
    rng = np.random.default_rng(0)
    events = steps * 2 * batch
    # user k signs up at event k * events / users; an event picks a user signed up by then
    born = np.arange(users) * events // users
    picks = [min(int(rng.integers(0, np.searchsorted(born, t, "right"))), users - 1)
             for t in range(events)]  # fmt: skip
    for k, t in enumerate(born):
        picks[t] = k  # each user's first sighting at its sign-up
    rows = [f"{rng.integers(0, 2)},{rng.random():.3f},{k + 1}" for k in picks]
    for name, part in (("train", rows), ("eval", rows[-256:])):
        (tmp_path / f"{name}.csv").write_text("\n".join(["clicked,price,user", *part]) + "\n")
    cfg = {
        "tables": [
            {"name": "users", "rows": 800, "dim": 8, "features": ["user"], "ids": {"zch": {}}}
        ],  # fmt: skip
        "features": {"dense": 1, "dense_names": ["price"]},
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": {
            "source": "csv",
            "train_paths": [str(tmp_path / "train.csv")],
            "eval_paths": [str(tmp_path / "eval.csv")],
            "columns": {"label": "clicked"},
        },
        "training": {"batch_size": batch, "steps": steps, "eval_every": 0, "log_every": 10},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
    }
    run = tmp_path / "run"
    run_rec("train", "--config", str(write_config(tmp_path / "cfg.yaml", cfg)), "--run-dir",
            str(run), "--nproc", "2")  # fmt: skip
    records = [m for m in _metrics(run) if m["kind"] == "zch"]
    assert records and records[-1]["step"] == steps
    held, slots = records[-1]["users_live"], records[-1]["users_slots"]
    assert slots == 799 and held >= 0.9 * min(users, slots), records[-1]
    assert sum(r["users_evicted"] for r in records) == 0, records
    flat = _flat_checkpoint(run_dir.latest_checkpoint(run), tmp_path)
    keys = flat["zch.users.keys"][flat["zch.users.used"]]
    assert len(keys) == held and int(keys.min()) >= 1 and int(keys.max()) <= users
