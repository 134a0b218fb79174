"""ZCH map changes in order across ranks, end to end (docs/update_log.md, "Id map changes in
order across ranks"): real torchrun ranks publish to a real redis-server, rank 0's sender held
back (train.publish.LAG_SEAM) so its rounds reach the log after rank 1's later ones; the run
then loses its last checkpoint and resumes on another number of ranks (slots move between
ranks), restoring what the dead run changed. A replica that applied the whole log onto the
first export (rec's Triton model's code, serve.python_backend.updates.ServedTables, and
rec-server) refuses nothing and ends with the final export's maps and rows, bit for bit."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request

import numpy as np
import pytest
import torch
import yaml

from rec import run_dir
from rec.broker import RedisBroker, redis_server_path
from rec.contract import ModelDir
from rec.export import id_maps
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import load_run
from rec.export.zch_checks import make_probe
from rec.serve.client import Rows, ScoreClient
from rec.serve.cpp import start_cpp
from rec.serve.python_backend.updates import ServedTables
from rec.train.publish import LAG_SEAM
from rec.update_log import read_records
from tests.export.conftest import tiny_dict
from tests.helpers import run_rec, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _config(url: str) -> dict:
    data = tiny_dict()
    # t0 (feature a): 299 slots split by rows between the ranks, a round every 2 steps; 64-slot
    # windows, so an id evicted from one rank's slot is often admitted again into the other's
    data["tables"][0]["ids"] = {"zch": {"every_steps": 2, "probes": 64}}
    data["sharding"] = {"constraints": {"t0": {"sharding_types": ["row_wise"]}}}
    data["data"]["synthetic"].update(live_ids={"t0": 900}, train_samples=4096, eval_samples=512)
    data["training"].update(steps=16, eval_every=0)
    data["checkpoint"] = {"every_steps": 4, "keep_last": 5}
    data["publish"] = {"url": url, "every_steps": 3, "every_seconds": 0}
    return data


def _moved_ahead(records, gen: int) -> int:
    """Admissions by rank 1 of generation `gen` that reached the log before rank 0's eviction of
    the same id."""
    pending: dict[int, int] = {}  # id -> the step rank 1 admitted it at
    ahead = 0
    for r in records:
        if r.gen != gen:
            continue
        if r.rank == 1:
            pending.update({raw: r.step for _, raw in r.admitted})
        else:
            ahead += sum(1 for _, raw in r.evicted if pending.get(raw, -1) > r.step)
    return ahead


def _served(repo, records) -> tuple[torch.jit.ScriptModule, ServedTables]:
    """The export's model.pt with the log applied by rec's Triton model's code."""
    model_dir = ModelDir.of(repo, "rec")
    manifest = json.loads(model_dir.manifest.read_text())
    module = torch.jit.load(str(model_dir.model_file(1)))
    tables = ServedTables(manifest["updates"], dict(module.named_buffers()),
                          zch=manifest["zch"]["tables"])  # fmt: skip
    for r in records:
        outcome, why = tables.apply(r)
        assert outcome in ("applied", "skipped"), (r.gen, r.rank, r.step, why)
    return module, tables


def _tables_bytes(repo, module) -> dict[str, bytes]:
    """Every table's rows and every ZCH map buffer of `module` (an export's model.pt)."""
    manifest = json.loads(ModelDir.of(repo, "rec").manifest.read_text())
    buffers = dict(module.named_buffers())
    out = {}
    for name, p in manifest["updates"]["tables"].items():
        data = buffers[p["buffer"]]
        out[name] = data[p["offset"] : p["offset"] + p["rows"] * p["row_stride"]].numpy().tobytes()
    for table in manifest["zch"]["tables"].values():
        out.update({b: buffers[b].numpy().tobytes() for b in table["buffers"]})
    return out


def _wait_for_records(server, n: int) -> dict[str, float]:
    pattern = re.compile(r'^rec_update_records_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)$', re.M)
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(f"http://{server.endpoints.metrics}/metrics") as r:
            counts = {o: float(v) for o, v in pattern.findall(r.read().decode())}
        if sum(counts.values()) >= n:
            return counts
        assert time.monotonic() < deadline, f"rec-server took {counts} of {n} records"
        time.sleep(0.1)


@pytest.mark.parametrize("first, resumed", [(2, 1), (1, 2)])
def test_a_lagging_rank_and_a_resume_on_other_ranks_reach_the_final_maps(
    tmp_path, monkeypatch, first, resumed
):
    """On 2 ranks, then 1 (rank 0 lagging in the first run), and on 1 rank, then 2 (lagging in
    the resumed run, whose ranks restore the slots the dead run changed from both shards)."""
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("rec:updates")
        data = _config(url)
        data["training"]["steps"] = 12
        run, start, final = tmp_path / "run", tmp_path / "first", tmp_path / "final"
        lagging = 1 if first == 2 else 2  # the generation whose rank 0 lags
        if lagging == 1:
            monkeypatch.setenv(LAG_SEAM, "0:1.0")  # rank 0's sender a round or more behind
        run_rec("train", "--config", str(write_config(tmp_path / "c.yaml", data)), "--run-dir",
                str(run), "--nproc", str(first), timeout=900)  # fmt: skip
        run_rec("export", str(run), "--repo", str(start), "--checkpoint",
                run_dir.step_dir_name(4), "--format", "torchscript")  # fmt: skip
        # The run dies after step 12's round, its checkpoint lost: resume from step 8.
        shutil.rmtree(run_dir.checkpoints_dir(run) / run_dir.step_dir_name(12))
        (run_dir.checkpoints_dir(run) / run_dir.LATEST_FILE).write_text("step_8\n")
        saved = yaml.safe_load((run / run_dir.CONFIG_FILE).read_text())
        saved["training"]["steps"] = 16
        (run / run_dir.CONFIG_FILE).write_text(yaml.safe_dump(saved))
        if lagging == 2:
            monkeypatch.setenv(LAG_SEAM, "0:1.0")
        else:
            monkeypatch.delenv(LAG_SEAM)
        out = run_rec("train", "--resume", str(run), "--nproc", str(resumed), timeout=900).stdout
        assert re.search(r"re-sent [1-9]\d* rows at their step-8 values", out), out
        run_rec("export", str(run), "--repo", str(final), "--format", "torchscript")
        records = [r for _, r in read_records(url)]
        # the case: an admission ahead of its id's eviction
        assert _moved_ahead(records, lagging) > 0

        module, applied = _served(start, records)
        assert sum(applied.refused.values()) == 0
        final_module = torch.jit.load(str(ModelDir.of(final, "rec").model_file(1)))
        got, want = _tables_bytes(start, module), _tables_bytes(final, final_module)
        assert got.keys() == want.keys()
        assert [k for k in want if got[k] != want[k]] == []

        cfg = load_run(run).cfg
        maps = id_maps.read_maps(CheckpointReader(run_dir.latest_checkpoint(run)), cfg)
        probe = make_probe(cfg, maps, seed=5)
        batches = list(probe.batches())
        torch.set_num_threads(1)
        with start_cpp(start, http_port=0, grpc_port=0, metrics_port=0,
                       extra_args=("--updates", url)) as server:  # fmt: skip
            counts = _wait_for_records(server, len(records))
            client = ScoreClient(server.endpoints.http, "http", model="rec")
            try:
                served = [client.score(Rows(b.dense.numpy(), b.lengths.numpy(),
                                            b.values.numpy())) for b in batches]  # fmt: skip
            finally:
                client.close()
        assert {o: n for o, n in counts.items() if n and o not in ("applied", "skipped")} == {}
        with torch.inference_mode():
            reference = [module(b.dense, b.lengths, b.values).numpy() for b in batches]
        for got_scores, expected in zip(served, reference, strict=True):
            np.testing.assert_array_equal(got_scores, expected)
