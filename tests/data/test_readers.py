"""File readers on files written from the synthetic stream: they must give the same batches."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rec.batch import RecBatch
from rec.config import ConfigError
from rec.data import (
    SyntheticSource,
    make_source,
    write_criteo_tsv,
    write_csv,
    write_parquet,
)
from rec.data import text as text_mod
from rec.data.tabular import ParquetSource
from rec.features import string_id

WRITERS = {"criteo_tsv": write_criteo_tsv, "csv": write_csv, "parquet": write_parquet}
EXT = {"criteo_tsv": "tsv", "csv": "csv", "parquet": "parquet"}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Tiny read blocks, so that even small files span many blocks and record batches."""
    monkeypatch.setattr(text_mod, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(ParquetSource, "read_rows", 700)


def config_for(util, kind, **data):
    make = util.criteo_config if kind == "criteo_tsv" else util.small_config
    return make(data)


def write(util, tmp_path, source, n, name="train", **kw):
    path = tmp_path / f"{name}.{EXT[source]}"
    WRITERS[source](config_for(util, source), path, n, **kw)
    return str(path)


def synthetic_rows(cfg, split, positions) -> RecBatch:
    """The synthetic samples at `positions` (sorted), as one batch."""
    chunk = SyntheticSource(cfg, split).take(0, int(positions[-1]) + 1)
    keep = np.zeros(len(chunk.rows), dtype=bool)
    keep[positions] = True
    return chunk.rows.select(keep).to_batch()


@pytest.mark.parametrize("source", ["criteo_tsv", "csv", "parquet"])
def test_round_trip_equals_synthetic(util, tmp_path, source):
    train = write(util, tmp_path, source, 2000)
    evals = write(util, tmp_path, source, 600, name="eval", split="eval")
    cfg = config_for(util, source)
    cfg.data.synthetic.train_samples, cfg.data.synthetic.eval_samples = 2000, 600
    files = config_for(util, source, source=source, train_paths=[train], eval_paths=[evals])
    for split, n in (("train", 2000), ("eval", 600)):
        src = make_source(files, split)
        assert src.num_samples() == n
        want = list(make_source(cfg, split).batches(128, 0, 1, drop_last=False))
        got = list(src.batches(128, 0, 1, drop_last=False))
        assert len(got) == len(want) == -(-n // 128)
        for a, b in zip(got, want, strict=True):
            util.assert_same(a, b)
        assert src.skipped_rows == 0


@pytest.mark.parametrize("source", ["criteo_tsv", "csv", "parquet"])
def test_world_size_independent_with_start(util, tmp_path, source):
    path = write(util, tmp_path, source, 1500)
    src = make_source(config_for(util, source, source=source, train_paths=[path]), "train")
    for start, drop_last in ((0, True), (1000, True), (1000, False)):
        one = util.collect(src, 60, 1, start=start, drop_last=drop_last)[0]
        for world in (2, 3):
            ranks = util.collect(src, 60 // world, world, start=start, drop_last=drop_last)
            assert len(ranks[0]) == len(one)
            for k, single in enumerate(one):
                parts = [r[k] for r in ranks if k < len(r)]
                util.assert_same(RecBatch.concat(parts), single)


def test_eval_every_nth_row_splits_one_file(util, tmp_path):
    path = write(util, tmp_path, "csv", 1005)
    cfg = util.small_config()
    files = util.small_config({"source": "csv", "train_paths": [path], "eval_every_nth_row": 10})
    train, evals = make_source(files, "train"), make_source(files, "eval")
    assert evals.num_samples() == 101 and train.num_samples() == 904
    held_out = np.arange(0, 1005, 10)
    rest = np.setdiff1d(np.arange(1005), held_out)
    got_eval = RecBatch.concat(list(evals.batches(50, 0, 1, drop_last=False)))
    util.assert_same(got_eval, synthetic_rows(cfg, "train", held_out))
    got_train = RecBatch.concat(list(train.batches(113, 0, 1)))
    util.assert_same(got_train, synthetic_rows(cfg, "train", rest[: 113 * 8]))
    # Resuming training at a position maps to the right rows of the file.
    resumed = next(train.batches(10, 0, 1, start=500))
    util.assert_same(resumed, synthetic_rows(cfg, "train", rest[500:510]))


def test_glob_reads_files_in_sorted_order(util, tmp_path):
    for i in (1, 0):  # written out of order on purpose
        write(util, tmp_path, "criteo_tsv", 700, name=f"day_{i}", start=700 * i)
    cfg = util.criteo_config()
    glob_cfg = util.criteo_config(
        {"source": "criteo_tsv", "train_paths": [str(tmp_path / "day_*.tsv")]}
    )
    cfg.data.eval_every_nth_row = glob_cfg.data.eval_every_nth_row = 1_000_000
    src = make_source(glob_cfg, "train")
    assert src.num_samples() == 1399  # global row 0 is the (only) eval row
    got = next(src.batches(1399, 0, 1))
    util.assert_same(got, synthetic_rows(cfg, "train", np.arange(1, 1400)))


def test_criteo_empty_fields(util, tmp_path):
    path = write(util, tmp_path, "criteo_tsv", 300)
    with open(path) as f:
        text = f.read()
    assert "\t\t" in text  # empty integer and categorical fields are in the file
    b = next(
        make_source(
            util.criteo_config({"source": "criteo_tsv", "train_paths": [path]}), "train"
        ).batches(200, 0, 1)
    )
    assert (b.lengths == 0).any() and (b.dense == 0).any()


def test_text_files_crlf_and_no_final_newline(util, tmp_path):
    path = write(util, tmp_path, "criteo_tsv", 50)
    with open(path, "rb") as f:
        lf = f.read()
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(lf.replace(b"\n", b"\r\n")[:-2])  # CRLF, and no newline at the end
    cfg = util.criteo_config({"source": "criteo_tsv", "train_paths": [str(crlf)]})
    cfg.data.eval_every_nth_row = 1000
    src = make_source(cfg, "train")
    assert src.num_samples() == 49
    util.assert_same(
        next(src.batches(49, 0, 1)), synthetic_rows(util.criteo_config(), "train", np.arange(1, 50))
    )


def test_string_ids_are_hashed_stably(util, tmp_path):
    path = tmp_path / "s.csv"
    path.write_text(
        "label,dense_0,dense_1,dense_2,cat_0,cat_1,cat_2,cat_3\n"
        "1,0.5,,2,apple|7,42,,x y\n"
        "0,1,2,3,7,banana|apple,1|2|3,-5\n"
    )
    src = make_source(
        util.small_config({"source": "csv", "train_paths": [str(path)], "eval_paths": [str(path)]}),
        "train",
    )
    b = next(src.batches(2, 0, 1))
    apple = int.from_bytes(hashlib.blake2b(b"apple", digest_size=8).digest(), "little", signed=True)
    assert b.lengths.tolist() == [[2, 1, 0, 1], [1, 2, 3, 1]]
    assert b.values.tolist() == [
        apple,
        7,
        42,
        string_id("x y"),
        7,
        string_id("banana"),
        apple,
        1,
        2,
        3,
        -5,
    ]
    assert torch.equal(b.dense, torch.tensor([[0.5, 0.0, 2.0], [1.0, 2.0, 3.0]]))
    assert string_id("apple") == apple != string_id("Apple")


def test_parquet_string_and_list_columns(util, tmp_path):
    path = tmp_path / "p.parquet"
    table = pa.table(
        {
            "label": pa.array([1, 0, 1], pa.int8()),
            "dense_0": pa.array([1.5, None, 2.0]),
            "dense_1": pa.array(["3", "", "4.25"]),
            "dense_2": pa.array([1, 2, 3]),
            "cat_0": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
            "cat_1": pa.array(["a|5", None, "6"]),
            "cat_2": pa.array([["x"], ["y", "7"], None], pa.list_(pa.string())),
            "cat_3": pa.array([None, 9, 10], pa.int32()),
        }
    )
    pq.write_table(table, path)
    src = make_source(
        util.small_config(
            {"source": "parquet", "train_paths": [str(path)], "eval_paths": [str(path)]}
        ),
        "eval",
    )
    b = next(src.batches(3, 0, 1))
    assert b.lengths.tolist() == [[2, 2, 1, 0], [0, 0, 2, 1], [0, 1, 0, 1]]
    x, y, a = string_id("x"), string_id("y"), string_id("a")
    assert b.values.tolist() == [1, 2, a, 5, x, y, 7, 9, 6, 10]
    assert b.dense.tolist() == [[1.5, 3.0, 1.0], [0.0, 0.0, 2.0], [2.0, 4.25, 3.0]]
    assert b.labels.tolist() == [[1.0], [0.0], [1.0]]


def test_multi_task_label_columns(util, tmp_path):
    two = {"dense_arch": [16, 8], "over_arch": [16, 2]}
    cfg = util.small_config(model=two)
    cfg.data.columns.labels = ["click", "buy"]
    path = tmp_path / "two.parquet"
    write_parquet(cfg, path, 500)
    assert pq.read_schema(path).names[:2] == ["click", "buy"]
    cfg.data.source, cfg.data.train_paths = "parquet", [str(path)]
    got = next(make_source(cfg, "train").batches(400, 0, 1))
    assert got.labels.shape == (400, 2)
    assert not torch.equal(got.labels[:, 0], got.labels[:, 1])
    with pytest.raises(ConfigError, match="2 tasks"):
        make_source(
            util.small_config({"source": "parquet", "train_paths": [str(path)]}, model=two), "train"
        )


def test_criteo_needs_criteo_shape(util, tmp_path):
    path = write(util, tmp_path, "csv", 10)
    with pytest.raises(ConfigError, match="features.dense=13 and 26 sparse"):
        make_source(util.small_config({"source": "criteo_tsv", "train_paths": [path]}), "train")
    with pytest.raises(ValueError, match="max_hotness: 1"):
        write_criteo_tsv(
            util.criteo_config({"synthetic": {"max_hotness": 2}}), tmp_path / "x.tsv", 100
        )


def test_criteo_hand_written_lines(util, tmp_path):
    """Exact values: log1p(max(x, 0)) of integers and decimals, hex of any case and width."""
    dense = ["-2", "3", "1.5", "", "0"] + ["7"] * 8
    cats = ["68fd1e64", "", "ABCDEF", "ffffffffffffffff"] + ["1"] * 22
    path = tmp_path / "day.tsv"
    path.write_text("\t".join(["1", *dense, *cats]) + "\n" + "\t".join(["0.0", *dense, *cats]))
    cfg = util.criteo_config({"source": "criteo_tsv", "train_paths": [str(path)]})
    cfg.data.eval_paths = [str(path)]
    b = next(make_source(cfg, "eval").batches(2, 0, 1))
    want = np.log1p(np.array([0, 3, 1.5, 0, 0] + [7] * 8)).astype(np.float32)
    assert np.array_equal(b.dense[0].numpy(), want) and torch.equal(b.dense[0], b.dense[1])
    assert b.labels.tolist() == [[1.0], [0.0]]
    assert b.lengths[0].tolist() == [1, 0] + [1] * 24
    assert b.values[:4].tolist() == [0x68FD1E64, 0xABCDEF, -1, 1]
    assert b.values.numel() == 50


def test_criteo_multi_task_reads_leading_label_columns(util, tmp_path):
    two = {"dense_arch": [8, 4], "over_arch": [8, 2]}
    cfg = util.criteo_config(model=two)
    path = tmp_path / "two.tsv"
    write_criteo_tsv(cfg, path, 300)
    with open(path) as f:
        assert len(f.readline().split("\t")) == 41
    cfg.data.source, cfg.data.train_paths, cfg.data.eval_paths = (
        "criteo_tsv",
        [str(path)],
        [str(path)],
    )
    cfg.data.synthetic.train_samples = 300
    got = list(make_source(cfg, "train").batches(100, 0, 1))
    cfg.data.source = "synthetic"
    want = list(make_source(cfg, "train").batches(100, 0, 1))
    for a, b in zip(got, want, strict=True):
        util.assert_same(a, b)
    assert got[0].labels.shape == (100, 2)


def test_csv_quoted_cells_and_other_delimiter(util, tmp_path):
    path = tmp_path / "q.csv"
    path.write_text(
        'label;dense_0;dense_1;dense_2;cat_0;cat_1;cat_2;cat_3\n1;1;2;3;"a;b|c";5;"";7\n'
    )
    cfg = util.small_config({"source": "csv", "train_paths": [str(path)], "delimiter": ";"})
    cfg.data.eval_paths = [str(path)]
    b = next(make_source(cfg, "train").batches(1, 0, 1))
    assert b.lengths.tolist() == [[2, 1, 0, 1]]
    assert b.values.tolist() == [string_id("a;b"), string_id("c"), 5, 7]
