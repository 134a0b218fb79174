"""The streamed export (tables read from the checkpoint one row chunk at a time) writes the
model the in-memory path writes (the whole float model loaded, each table quantized in one
piece), byte for byte, for every sharding type, dtype mix and chunk size."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rec.contract.repository import ModelDir, model_file_in
from rec.export import reference
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import load_dense, load_run
from rec.export.module import FloatReference, sample_batch
from rec.export.pipeline import eval_batches, export_run
from rec.export.stream import checkpoint_key, stream_tables
from rec.model import table_keys, table_rows
from rec.quantize import quantize_rows
from tests.export.conftest import tiny_dict, write_seeded_run
from tests.helpers import REC, REPO, run_rec, warning_lines, write_config

# Row counts 300, 120, 50, 80: 7 divides none of them, and 64 is larger than two.
MIXED = {"t0": "int4", "t1": "fp16", "t2": "fp32", "t3": "int8"}


def in_memory_model_pt(run: Path, out: Path, dtypes: dict[str, str]) -> Path:
    """model.pt of the pre-streaming export path, made in a fresh process."""
    subprocess.run([sys.executable, "-m", "tests.export.in_memory_export", str(run), str(out),
                    json.dumps(dtypes)], check=True, cwd=REPO, capture_output=True)  # fmt: skip
    return model_file_in(out)


def archive_entries(path: Path) -> dict[str, bytes]:
    """model.pt's zip entries without the archive's serialization id (random per save)."""
    z = zipfile.ZipFile(path)
    names = [n for n in z.namelist() if n.split("/", 1)[1] != ".data/serialization_id"]
    return {name.split("/", 1)[1]: z.read(name) for name in names}


def export_streamed(run: Path, repo: Path, dtypes: dict[str, str], chunk_rows: int) -> Path:
    """model.pt of `rec export` (a fresh process too) with these dtypes and chunk size."""
    overrides = write_config(
        repo.parent / f"export-{chunk_rows}.yaml",
        {"export": {"table_dtypes": dtypes, "chunk_rows": chunk_rows}},
    )
    # A fresh process: scripting the same classes twice in one process mangles their names.
    out = run_rec("export", str(run), "--repo", str(repo), "--config", str(overrides)).stdout
    assert not warning_lines(out), warning_lines(out)  # only rec's own lines
    return ModelDir.of(repo, "rec").model_file(1)


@pytest.fixture(scope="module")
def in_memory(trained_runs, tmp_path_factory):
    """(layout, dtypes) -> the in-memory path's model.pt, made once: it has no chunk size."""
    made: dict[str, Path] = {}

    def get(layout: str, dtypes: dict[str, str]) -> Path:
        key = f"{layout}-{sorted(dtypes.items())}"
        if key not in made:
            out = tmp_path_factory.mktemp("in_memory") / "out"
            made[key] = in_memory_model_pt(trained_runs[layout], out, dtypes)
        return made[key]

    return get


# Each layout with odd chunks of mixed dtypes; the chunk larger than two tables (64) and the
# whole-table read (0) once each, on one layout apiece: each case is a fresh `rec export`.
@pytest.mark.parametrize(
    ("layout", "dtypes", "chunk_rows"),
    [("tw_rw_cw_dp", MIXED, 7), ("gs_twrw_twcw_tw", MIXED, 7), ("tw_rw_cw_dp", {}, 64),
     ("gs_twrw_twcw_tw", {}, 0)],
)  # fmt: skip
def test_streamed_model_file_is_the_in_memory_one(trained_runs, in_memory, tmp_path, layout,
                                                  dtypes, chunk_rows):  # fmt: skip
    run = trained_runs[layout]
    cfg = load_run(run).cfg
    streamed = export_streamed(run, tmp_path / "repo", dtypes, chunk_rows)
    in_memory = in_memory(layout, dtypes)
    want, got = archive_entries(in_memory), archive_entries(streamed)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    request = sample_batch(cfg.features.dense, len(cfg.features.sparse), 64, seed=3)
    with torch.no_grad():
        want_scores = torch.jit.load(str(in_memory))(*request)
        assert torch.equal(torch.jit.load(str(streamed))(*request), want_scores)


@pytest.mark.parametrize("layout", ["tw_rw_cw_dp", "gs_twrw_twcw_tw"])
def test_reader_rows_are_the_checkpoints(trained_runs, layout):
    """Every sharding type's shards reassemble into DCP's own load of the table."""
    run = trained_runs[layout]
    loaded = load_run(run)
    reader = CheckpointReader(loaded.step_dir)
    bags = loaded.model.sparse_arch.embedding_bag_collection.embedding_bags
    shards = 0
    for name, bag in bags.items():
        key = checkpoint_key(table_keys(loaded.model)[name])
        shards += len(reader.metadata.state_dict_metadata[key].chunks)
        rows = bag.weight.shape[0]
        assert torch.equal(reader.read_rows(key, 0, rows), bag.weight)
        assert torch.equal(reader.read_rows(key, 13, rows - 5), bag.weight[13 : rows - 5])
        assert reader.read_rows(key, 9, 9).shape == (0, bag.weight.shape[1])
    assert shards > len(bags)  # some tables really are split over the two ranks
    with pytest.raises(IndexError, match="outside"):
        reader.read_rows(checkpoint_key(table_keys(loaded.model)["t0"]), 0, 10_000)


def test_reader_fallback_loads_whole_chunks_with_the_same_rows(trained_runs, monkeypatch):
    """Where a chunk's header is not understood, the reader loads the chunk as DCP does."""
    from rec.export import dcp_reader

    monkeypatch.setattr(dcp_reader, "_parse_chunk", lambda *_: None)
    loaded = load_run(trained_runs["gs_twrw_twcw_tw"])
    reader = CheckpointReader(loaded.step_dir)
    for name, bag in loaded.model.sparse_arch.embedding_bag_collection.embedding_bags.items():
        key = checkpoint_key(table_keys(loaded.model)[name])
        rows = bag.weight.shape[0]
        parts = [reader.read_rows(key, r, min(rows, r + 7)) for r in range(0, rows, 7)]
        assert torch.equal(torch.cat(parts), bag.weight)


def test_onnx_streamed_in_odd_chunks_agrees_with_torchscript(trained_runs, tmp_path):
    overrides = write_config(tmp_path / "both.yaml", {
        "export": {"format": "both", "table_dtypes": MIXED, "chunk_rows": 7}})  # fmt: skip
    result = export_run(trained_runs["tw_rw_cw_dp"], tmp_path / "repo", config=overrides,
                        log=lambda _: None)  # fmt: skip
    checks = result.manifests["onnx"]["verification"]
    assert checks["onnx_vs_torchscript_max_abs_diff"] <= 1e-4
    assert checks["eval"]["onnx"]["auc_ratio"] > 0.99


@pytest.mark.parametrize("dtype", ["int8", "int4", "fp16", "fp32"])
def test_quantizing_in_chunks_is_quantizing_whole(dtype):
    table = torch.randn(103, 16) * 3
    whole = quantize_rows(table, dtype)
    parts = [quantize_rows(c, dtype) for c in torch.split(table, 10)]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
    if whole[1] is not None:
        assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])


def test_reference_scores_are_the_float_models(trained_runs):
    """Verification's float scores come from the gathered rows only, and are bit for bit the
    whole float model's."""
    run = trained_runs["tw_rw_cw_dp"]
    loaded = load_run(run)
    cfg = loaded.cfg
    batches = list(eval_batches(cfg, lambda _: None))
    touched = reference.touched_rows(cfg, batches)
    assert sum(r.numel() for r in touched.values()) < sum(t.rows for t in cfg.tables)
    dense = load_dense(run)
    sink = reference.ReferenceSink(cfg, touched)
    stream_tables(
        CheckpointReader(dense.step_dir), cfg, [sink], chunk_rows=11, keys=table_keys(dense.model)
    )
    ref = reference.ReferenceModule(dense.model, cfg, sink)
    full = FloatReference(loaded.model, cfg.features.sparse, table_rows(cfg)).eval()
    with torch.no_grad():
        for b in batches:
            assert torch.equal(
                ref(b.dense, b.lengths, b.values), full(b.dense, b.lengths, b.values)
            )
        other = sample_batch(cfg.features.dense, len(cfg.features.sparse), 64, seed=99)
        with pytest.raises(RuntimeError, match="did not gather"):
            ref(*other)


def test_kill_during_streaming_leaves_no_version(tmp_path):
    """SIGKILL while the tables stream: no version appears; the next export cleans up."""
    data = tiny_dict(chunk_rows=1)
    data["tables"][0]["rows"] = 300_000  # ~300k one-row chunks: seconds of streaming
    run = write_seeded_run(tmp_path / "run", data)
    repo = tmp_path / "repo"
    proc = subprocess.Popen([REC, "export", str(run), "--repo", str(repo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(repo.glob(".staging-*/rec/1")) and time.monotonic() < deadline:
        assert proc.poll() is None, "export finished before it could be killed"
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "export finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (repo / "rec").exists()
    assert list(repo.glob(".staging-*"))  # the torn work is only ever in staging
    cfg = write_config(tmp_path / "fast.yaml", {"export": {"chunk_rows": 0}})
    result = export_run(run, repo, config=cfg, log=lambda _: None)
    assert result.models["torchscript"] == ModelDir.of(repo, "rec").version(1)
    assert not list(repo.glob(".staging-*"))


def test_exporting_every_format_prints_only_recs_lines(trained_runs, tmp_path):
    """`rec export --format all` (TorchScript; ONNX through torch's dynamo exporter, which warns
    the most; AOTInductor, loaded back on a CPU wider than its ISA): the warnings the exporters
    print are known harmless ones."""
    run = trained_runs["tw_rw_cw_dp"]
    out = run_rec("export", str(run), "--repo", str(tmp_path / "repo"), "--format", "all").stdout
    assert all(f"{fmt}: AUC" in out for fmt in ("torchscript", "onnx", "aoti")), out
    assert not warning_lines(out), warning_lines(out)
