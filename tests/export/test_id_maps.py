"""ZCH tables in the export (rec.export.id_maps): the served module reads an admitted id's own
row and the default row for any other id, the same in eager, TorchScript, AOTInductor and ONNX,
verified at export; a checkpoint whose map does not fit its table is refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from rec import zch
from rec.cli import main
from rec.config import config_from_dict
from rec.contract import ManifestError, ModelDir, parse_manifest
from rec.contract.store import StoreError
from rec.export import id_maps, served, torchscript_builder
from rec.export.id_maps import _plain_lookup
from rec.export.module import FloatReference
from rec.export.pipeline import export_run
from rec.model import build_model, table_keys, table_rows
from tests.export.zch_run import I64, admitted_ids, hand_made_map, write_zch_run, zch_dict
from tests.helpers import questionable_ids

MIX = zch.HOME_CONSTANTS
EXTREME = [I64.min, I64.min + 1, -(2**31) - 1, -1, 0, 1, 2**31 - 1, 2**31, 2**62, I64.max - 1,
           I64.max]  # fmt: skip


@pytest.mark.parametrize("slots,probes", [(1, 1), (2, 2), (7, 3), (299, 4), (4099, 16)])
def test_the_served_lookups_are_rec_zch_lookup(slots, probes):
    """The served module runs rec::zch_lookup (TorchScript, AOTInductor) and ONNX a copy of
    rec.zch.lookup in plain ops: the same rows for every id."""
    g = torch.Generator().manual_seed(slots)
    held = torch.randint(-(2**63), 2**63 - 1, (slots // 2,), generator=g).tolist()
    keys, used = hand_made_map(slots, probes, EXTREME[: slots // 2] + held, strict=False)
    ids = torch.cat([torch.tensor(EXTREME), torch.tensor(held, dtype=torch.int64),
                     torch.randint(-(2**63), 2**63 - 1, (2000,), generator=g)])  # fmt: skip
    want = zch.lookup(ids, keys, used, probes)
    scripted = torch.jit.script(_plain_lookup)
    assert torch.equal(_plain_lookup(ids, keys, used, probes, MIX), want)
    assert torch.equal(scripted(ids, keys, used, probes, MIX), want)
    assert torch.equal(torch.ops.rec.zch_lookup(ids, keys, used, probes), want)  # cpp/ops/zch.cpp
    assert torch.equal(torch.ops.rec.zch_lookup(ids, keys, used.view(torch.uint8), probes), want)
    assert set(want[torch.isin(ids, keys[used])].tolist()) <= set(range(slots))


_SCAN_SCRIPT = """
import json, sys
import torch
import rec.ops
from rec import zch
from rec.cli import main
from tests.export.test_id_maps import EXTREME
from tests.export.zch_run import hand_made_map
ok = []
for slots, probes in [(1, 1), (7, 3), (20, 16), (33, 9), (4099, 16)]:
    g = torch.Generator().manual_seed(slots)
    held = torch.randint(-(2**63), 2**63 - 1, (slots // 2,), generator=g).tolist()
    keys, used = hand_made_map(slots, probes, EXTREME[: slots // 2] + held, strict=False)
    ids = torch.cat([torch.tensor(EXTREME), torch.tensor(held, dtype=torch.int64),
                     torch.randint(-(2**63), 2**63 - 1, (500,), generator=g)])
    ok.append(torch.equal(torch.ops.rec.zch_lookup(ids, keys, used, probes),
                          zch.lookup(ids, keys, used, probes)))
json.dump(ok, sys.stdout)
"""


@pytest.mark.parametrize("cap", ["scalar"])
def test_the_ops_scalar_scan_is_rec_zch_lookup(cap):
    """rec::zch_lookup's one-key-at-a-time scan (CPUs without AVX-512, REC_MAX_CPU_ISA) gives
    the rows the AVX-512 one does (the test above, on this CPU): rec.zch.lookup's."""
    env = {**os.environ, "REC_MAX_CPU_ISA": cap}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _SCAN_SCRIPT], env=env, cwd=root,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [True] * 5


def _module_and_reference(maps):
    """The served module (fp32 tables) of zch_dict's seeded model, and its float reference."""
    cfg = config_from_dict(zch_dict())
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    module, tbe = torchscript_builder.served_module(
        model, cfg, {t.name: "fp32" for t in cfg.tables}
    )
    sink = served.TbeSink(tbe)
    for name, key in table_keys(model).items():
        sink.write(name, 0, model.state_dict()[key])
    id_maps.fill(module, maps)
    ref = FloatReference(model, cfg.features.sparse, table_rows(cfg),
                         id_maps.reference_maps(cfg, maps)).eval()  # fmt: skip
    return cfg, module, ref


def test_admitted_ids_read_their_own_rows_and_other_ids_the_default_row():
    """Feature a (table t0, 300 rows: 299 slots and the default row): 5, 305 and 605 share a
    remainder but read three rows, each the slot holding it; never-admitted ids read row 299."""
    ids = admitted_ids(300)
    maps = {"t0": id_maps.TableMap(*hand_made_map(299, 4, ids)),
            "t1": id_maps.TableMap(*hand_made_map(119, 4, admitted_ids(120, 1)))}  # fmt: skip
    cfg, module, ref = _module_and_reference(maps)
    unknown = [6, 306, -8, 2**40 + 1]
    column = list(cfg.features.sparse).index("a")
    lengths = torch.zeros(1, len(cfg.features.sparse), dtype=torch.int32)
    lengths[0, column] = len(ids) + len(unknown)
    values = torch.tensor(ids + unknown)
    torch.ops.rec.zch_take_unknowns()  # this thread's counts start here
    rows, _ = module.lookup.indices(lengths, values)  # only feature a has ids
    # The op counts the unknown ids per request column for the server; -1: no map read it.
    counts = torch.ops.rec.zch_take_unknowns().tolist()
    counted = dict(zip(cfg.features.sparse[: len(counts)], counts, strict=True))
    assert counted == {"e": -1, "a": len(unknown), "c": 0, "b": 0}  # d's column is after b's
    assert torch.ops.rec.zch_take_unknowns().numel() == 0  # taken: reset
    # rec::zch_remap, what artifacts exported before the counts call, is kept as it was: the
    # same rows, nothing counted.
    holder = module.lookup.id_maps
    lookup = module.lookup
    column_of = None if lookup.columns_in_order else lookup.column_of
    raw, indices, offsets = served.feature_major_ids(lengths, values, lookup.rows, column_of)
    maps_args = ([m.keys for m in holder.maps.values()], [m.used for m in holder.maps.values()])
    old = torch.ops.rec.zch_remap(raw, indices, offsets, *maps_args, holder.probes,
                                  holder.table_of)  # fmt: skip
    assert torch.equal(old, rows) and torch.ops.rec.zch_take_unknowns().numel() == 0
    keys = maps["t0"].keys
    assert torch.equal(keys[rows[: len(ids)]], values[: len(ids)])  # each its own slot
    assert len(set(rows[:3].tolist())) == 3  # one remainder, three rows
    assert rows[len(ids):].tolist() == [299] * len(unknown)  # fmt: skip
    # Scores: eager and scripted equal, and the float model's with the same map.
    dense = torch.randn(1, 4).repeat(len(values), 1)  # one dense row: only the ids differ
    request = (dense, *_one_id_per_sample(cfg, values, column))
    eager = module(*request)
    scripted = torchscript_builder.to_torchscript(module, request)
    torch.ops.rec.zch_take_unknowns()
    assert torch.equal(scripted(*request), eager)
    assert torch.ops.rec.zch_take_unknowns()[column] == len(unknown)
    assert (eager - ref(*request)).abs().max() < 1e-5
    # An unknown id scores as every other unknown id: the default row, whatever its remainder.
    unknown_scores = eager[len(ids) :]
    assert torch.equal(unknown_scores, unknown_scores[:1].expand_as(unknown_scores))


def _one_id_per_sample(cfg, values, column):
    """Samples of one id each in feature `column` (the others empty)."""
    lengths = torch.zeros(len(values), len(cfg.features.sparse), dtype=torch.int32)
    lengths[:, column] = 1
    return lengths, values


@pytest.fixture(scope="module")
def zch_exported(tmp_path_factory):
    """A seeded ZCH run (t0, and t1 shared by b and c) exported in every format."""
    tmp = tmp_path_factory.mktemp("zch")
    run = write_zch_run(tmp / "run")
    repo = tmp / "repo"
    export_run(run, repo, fmt="all", log=lambda _: None)
    return run, repo


@pytest.mark.parametrize("model", ["rec", "rec_onnx", "rec_aoti"])
def test_export_verifies_admitted_and_unknown_ids_in_every_format(zch_exported, model):
    _, repo = zch_exported
    manifest = json.loads(ModelDir.of(repo, model).manifest.read_text())
    fmt = manifest["format"]
    checks = manifest["verification"]["zch"]
    assert checks["tables_with_admitted_ids"] == ["t0", "t1"]
    assert checks[fmt]["admitted_max_abs_diff_vs_float"] <= checks["tolerance"]
    assert checks[fmt]["unknown_max_abs_diff_vs_float"] <= checks["tolerance"]
    section = parse_manifest(manifest).zch
    assert sorted(section.tables) == ["t0", "t1"]
    t0 = section.tables["t0"]
    assert (t0.slots, t0.default_row, t0.probes, t0.admit_after, t0.eviction) == (
        299, 299, 4, 2, "lru")  # fmt: skip
    assert t0.live == len(admitted_ids(300))
    if fmt == "aoti":  # the maps ride in tables.bin after the tables, as raw bytes
        names = [t["name"] for t in manifest["aoti"]["tables"]]
        maps = [
            f"lookup.id_maps.maps.{t}.{part}" for t in ("t0", "t1") for part in ("keys", "used")
        ]
        assert names[-4:] == maps


def test_an_unknown_map_layout_is_refused_by_name():
    manifest = {"features": {"dense": [], "sparse": ["a"]}, "num_tasks": 1,
                "zch": {"layout": "rec.zch.map/3", "tables": {}}}  # fmt: skip
    with pytest.raises(ManifestError, match=r'"zch.layout" must be rec.zch.map/2 \(the id map'):
        parse_manifest(manifest).zch  # noqa: B018  (read: checked)


def test_a_layout_1_artifact_is_refused_with_a_re_export_hint():
    """Layout 1 placed ids by the old home(): its maps would read other rows under this one."""
    manifest = {"features": {"dense": [], "sparse": ["a"]}, "num_tasks": 1,
                "zch": {"layout": "rec.zch.map/1", "tables": {}}}  # fmt: skip
    hint = "exported with ZCH map layout 1 and must be re-exported with this rec (`rec export`)"
    with pytest.raises(ManifestError, match=re.escape(hint)):
        parse_manifest(manifest).zch  # noqa: B018  (read: checked)


def test_a_map_of_the_wrong_size_is_refused_at_export(tmp_path):
    """A checkpoint whose t0 map has 200 slots, for a table of 300 rows (299 slots)."""
    keys, used = hand_made_map(200, 4, [5, 7])
    maps = {"t0": (keys, used), "t1": hand_made_map(119, 4, [1])}
    run = write_zch_run(tmp_path / "run", maps=maps)
    with pytest.raises(id_maps.IdMapError, match=r"'zch.t0.keys' is torch.int64 \[200\], but ZCH "
                       r"table 't0' has 299 slots"):  # fmt: skip
        export_run(run, tmp_path / "repo", fmt="torchscript", log=lambda _: None)
    assert not (tmp_path / "repo").exists()


def test_a_checkpoint_without_the_map_is_refused_at_export(tmp_path):
    run = write_zch_run(tmp_path / "run", maps={"t0": hand_made_map(299, 4, [5])})
    with pytest.raises(id_maps.IdMapError, match=r"holds no id map for ZCH table 't1'"):
        export_run(run, tmp_path / "repo", fmt="torchscript", log=lambda _: None)


def test_a_zch_table_the_store_would_take_by_size_goes_there_when_the_run_publishes(tmp_path):
    """export.store.min_bytes 0 picks every table, t0 and t1 with them, of a run that publishes:
    no longer refused (rec store follow and the servers' caches place the update log's rows of
    a stored ZCH table by raw id, rec.updates/3), so the export goes on to the store, which is
    not there (tests/store/test_store_zch_follow.py stores and follows one)."""
    data = zch_dict()
    data["publish"] = {"url": "redis://127.0.0.1:1/rec:updates"}
    run = write_zch_run(tmp_path / "run", data)
    config = tmp_path / "export.yaml"
    config.write_text("export:\n  store:\n    url: redis://127.0.0.1:1\n    min_bytes: 0\n")
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:1") as e:
        export_run(run, tmp_path / "repo", fmt="torchscript", config=config, log=lambda _: None)
    assert "ZCH" not in str(e.value)


def _probe_rows(run):
    """zch_checks' probe of the run's maps as wire rows: (admitted, unknown, unknown_other)."""
    from rec.export.dcp_reader import CheckpointReader
    from rec.export.load import load_run
    from rec.export.zch_checks import make_probe
    from rec.serve.client import Rows

    loaded = load_run(run)
    maps = id_maps.read_maps(CheckpointReader(loaded.step_dir), loaded.cfg)
    probe = make_probe(loaded.cfg, maps, seed=5)
    return [Rows(b.dense.numpy(), b.lengths.numpy(), b.values.numpy()) for b in probe.batches()]


def _unknowns(run, probes) -> dict[str, int]:
    """The ids of `probes` (wire rows) that no map holds, per ZCH feature: what a server counts
    as rec_questionable_ids_total{reason="unknown"} for them (rec.zch.lookup's default row)."""
    from rec.export.dcp_reader import CheckpointReader
    from rec.export.load import load_run

    loaded = load_run(run)
    cfg, maps = loaded.cfg, id_maps.read_maps(CheckpointReader(loaded.step_dir), loaded.cfg)
    owner, zch_of = cfg.feature_to_table(), id_maps.zch_tables(cfg)
    counts = {f: 0 for f in cfg.features.sparse if owner[f] in zch_of}
    for rows in probes:
        lengths = rows.lengths.reshape(-1).tolist()  # sample-major: sample i's features in order
        ends = np.cumsum([0, *lengths])
        for k, n in enumerate(lengths):
            feature = cfg.features.sparse[k % len(cfg.features.sparse)]
            if feature in counts and n:
                z, m = zch_of[owner[feature]], maps[owner[feature]]
                got = zch.lookup(torch.from_numpy(rows.values[ends[k] : ends[k + 1]]), m.keys,
                                 m.used, z.probes)  # fmt: skip
                counts[feature] += int((got == z.slots).sum())
    return counts


def _write_jsonl(path: Path, probes) -> Path:
    """The wire rows as a JSON lines file `rec predict` reads (zch_dict's columns)."""
    cfg = config_from_dict(zch_dict())
    lines = []
    for rows in probes:
        ends = np.cumsum([0, *rows.lengths.reshape(-1).tolist()])
        for i, dense in enumerate(rows.dense.tolist()):
            record = {f"dense_{j}": x for j, x in enumerate(dense)}
            for k, feature in enumerate(cfg.features.sparse):
                at = i * len(cfg.features.sparse) + k
                record[feature] = rows.values[ends[at] : ends[at + 1]].tolist()
            lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines))
    return path


def _in_process(model, rows) -> np.ndarray:
    with torch.inference_mode():
        return model(*(torch.from_numpy(a) for a in (rows.dense, rows.lengths, rows.values)))


def test_rec_server_and_triton_score_admitted_and_unknown_ids_as_the_artifact(zch_exported):
    """rec-server (TorchScript and AOTInductor, HTTP) and Triton (TorchScript) return the
    scores the artifacts have in process, bit for bit; an unknown id scores as any other. Each
    server counts the unknown ids per feature (rec_questionable_ids_total{reason="unknown"}),
    and `rec predict --repo` names them in its summary."""
    from rec.export.aoti_builder import AotiModel
    from rec.serve.client import ScoreClient
    from rec.serve.cpp import start_cpp
    from rec.serve.triton import start_triton

    run, repo = zch_exported
    torch.set_num_threads(1)
    probes = _probe_rows(run)
    models = {"rec": torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1))),
              "rec_aoti": AotiModel(ModelDir.of(repo, "rec_aoti").version(1))}  # fmt: skip
    want = {name: [_in_process(m, rows).numpy() for rows in probes] for name, m in models.items()}
    for name in models:  # the default row, whatever the unknown id
        assert np.array_equal(want[name][1], want[name][2]), name
    unknown = _unknowns(run, probes)
    assert unknown["a"] > 0 and unknown["b"] > 0  # both tables' features have unknown ids
    rows_file = _write_jsonl(run.parent / "probe.jsonl", probes)
    summary = "unknown ids (not in the exported ZCH maps of --repo's version, read as the default "
    summary += "row), by feature: "
    summary += ", ".join(f"{f} {n}" for f, n in unknown.items() if n)
    ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
    with start_cpp(repo, **ports) as server:
        for name in models:
            before = questionable_ids(server.endpoints.metrics, "unknown", name)
            client = ScoreClient(server.endpoints.http, "http", model=name)
            try:
                for rows, expected in zip(probes, want[name], strict=True):
                    assert np.array_equal(client.score(rows), expected), name
            finally:
                client.close()
            # Counted per feature, by exactly the ids no map holds (the warm-up adds nothing).
            after = questionable_ids(server.endpoints.metrics, "unknown", name)
            assert {f: n - before.get(f, 0) for f, n in after.items()} == unknown, name
            # rec predict names them, counted on the artifact's maps; the server counts again.
            result = CliRunner().invoke(main, [
                "predict", "--url", server.endpoints.http, "--input", str(rows_file),
                "--repo", str(repo), "--model", name,
            ])  # fmt: skip
            assert result.exit_code == 0, result.output
            assert summary in result.stderr, result.stderr
            again = questionable_ids(server.endpoints.metrics, "unknown", name)
            assert {f: n - after[f] for f, n in again.items()} == unknown, name
    with start_triton(repo, model="rec", **ports) as server:
        before = questionable_ids(server.endpoints.metrics, "unknown")
        client = ScoreClient(server.endpoints.grpc, "grpc", model="rec")
        try:
            for rows, expected in zip(probes, want["rec"], strict=True):
                assert np.array_equal(client.score(rows), expected)
        finally:
            client.close()
        after = questionable_ids(server.endpoints.metrics, "unknown")
        assert {f: n - before.get(f, 0) for f, n in after.items()} == unknown
