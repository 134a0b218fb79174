"""Bad data: each kind of bad row names file, line/row and column, or is skipped and counted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.batch import RecBatch
from rec.data import DataError, SyntheticSource, make_source, write_criteo_tsv, write_csv

N = 100


def corrupt(path, edits: dict[int, object]) -> None:
    """Rewrites 1-based lines: a callable edits the line's fields, a string replaces the line."""
    with open(path) as f:
        lines = f.read().split("\n")
    sep = "\t" if str(path).endswith(".tsv") else ","
    for number, edit in edits.items():
        if callable(edit):
            fields = lines[number - 1].split(sep)
            edit(fields)
            lines[number - 1] = sep.join(fields)
        else:
            lines[number - 1] = edit
    with open(path, "w") as f:
        f.write("\n".join(lines))


def setter(i: int, value: str):
    def edit(fields: list[str]) -> None:
        fields[i] = value

    return edit


TSV_BAD = {
    "columns": (3, lambda f: f.pop(), r"line 3: 39 fields, expected 40"),
    "dense": (5, setter(2, "abc"), r"line 5, column I2: 'abc' is not a number"),
    "label": (8, setter(0, "2"), r"line 8, column label: '2' is not a label in \[0, 1\]"),
    "hex": (9, setter(16, "zz!"), r"line 9, column C3: 'zz!' is not hex"),
    "empty line": (11, "", r"line 11: 1 fields, expected 40"),
}
CSV_BAD = {  # the header is line 1, so data row i is on line i + 2
    "columns": (4, lambda f: f.append("7"), r"line 4: 9 fields, expected 8"),
    "dense": (6, setter(2, "1.2.3"), r"line 6, column dense_1: '1.2.3' is not a number"),
    "label": (7, setter(0, ""), r"line 7, column label: '' is not a label in \[0, 1\]"),
    "nan": (9, setter(1, "inf"), r"line 9, column dense_0: 'inf' is not a number"),
}


def tsv_file(util, tmp_path, edits, **data):
    path = tmp_path / "bad.tsv"
    write_criteo_tsv(util.criteo_config(), path, N)
    corrupt(path, edits)
    cfg = util.criteo_config({"source": "criteo_tsv", "train_paths": [str(path)], **data})
    cfg.data.eval_every_nth_row = 10**6  # one file, all rows but the first for training
    return path, cfg


def csv_file(util, tmp_path, edits, **data):
    path = tmp_path / "bad.csv"
    write_csv(util.small_config(), path, N)
    corrupt(path, edits)
    cfg = util.small_config({"source": "csv", "train_paths": [str(path)], **data})
    cfg.data.eval_every_nth_row = 10**6
    return path, cfg


def read_all(src, world_size=1, batch_size=16):
    return [
        b
        for r in range(world_size)
        for b in src.batches(batch_size, r, world_size, drop_last=False)
    ]


@pytest.mark.parametrize("kind", list(TSV_BAD))
def test_tsv_bad_row_names_file_line_column(util, tmp_path, kind):
    line, edit, message = TSV_BAD[kind]
    path, cfg = tsv_file(util, tmp_path, {line: edit})
    src = make_source(cfg, "train")
    with pytest.raises(DataError, match=f"^{path}: {message}"):
        read_all(src)


@pytest.mark.parametrize("kind", list(CSV_BAD))
def test_csv_bad_row_names_file_line_column(util, tmp_path, kind):
    line, edit, message = CSV_BAD[kind]
    path, cfg = csv_file(util, tmp_path, {line: edit})
    with pytest.raises(DataError, match=f"^{path}: {message}"):
        read_all(make_source(cfg, "train"))


def test_error_reports_the_first_bad_row(util, tmp_path):
    path, cfg = tsv_file(util, tmp_path, {line: edit for line, edit, _ in TSV_BAD.values()})
    with pytest.raises(DataError, match=r"line 3: "):
        read_all(make_source(cfg, "train"))
    assert issubclass(DataError, ValueError)


@pytest.mark.parametrize("world_size", [1, 3])
def test_tsv_skip_counts_and_keeps_the_good_rows(util, tmp_path, world_size):
    edits = {line: edit for line, edit, _ in TSV_BAD.values()}
    path, cfg = tsv_file(util, tmp_path, edits, on_bad_row="skip")
    sources = [make_source(cfg, "train") for _ in range(world_size)]
    batches = [
        b for r, s in enumerate(sources) for b in s.batches(8, r, world_size, drop_last=False)
    ]
    assert sum(s.skipped_rows for s in sources) == len(edits)
    got = RecBatch.concat(batches)
    assert len(got) == N - 1 - len(edits)
    # The good rows are the synthetic samples at their own positions: holes, no shift.
    bad_rows = [line - 1 for line in edits]
    keep = np.setdiff1d(np.arange(1, N), bad_rows)
    chunk = SyntheticSource(util.criteo_config(), "train").take(0, N)
    mask = np.zeros(N, dtype=bool)
    mask[keep] = True
    want = chunk.rows.select(mask).to_batch()
    if world_size == 1:
        util.assert_same(got, want)
    else:  # ranks interleave by batch; compare as sets of rows via sorted labels/dense
        assert sorted(got.dense[:, 0].tolist()) == sorted(want.dense[:, 0].tolist())


def test_csv_skip_mode_counts(util, tmp_path):
    edits = {line: edit for line, edit, _ in CSV_BAD.values()}
    path, cfg = csv_file(util, tmp_path, edits, on_bad_row="skip")
    src = make_source(cfg, "train")
    assert src.num_samples() == N - 1  # bad rows still hold their positions
    batches = read_all(src, batch_size=10)
    assert src.skipped_rows == len(edits)
    assert sum(len(b) for b in batches) == N - 1 - len(edits)
    # Lines 4, 6, 7, 9 are rows 2, 4, 5, 7, train positions 1, 3, 4, 6 (row 0 is held out).
    assert [len(b) for b in batches][:2] == [6, 10]


def test_skipped_batch_still_yielded_for_training(util, tmp_path):
    """With drop_last, a batch whose rows were all bad is yielded empty: ranks stay in step."""
    path, cfg = csv_file(util, tmp_path, {5: "x", 6: "y"}, on_bad_row="skip")
    batches = list(make_source(cfg, "train").batches(2, 0, 1))  # lines 5, 6: positions 2, 3
    assert [len(b) for b in batches[:3]] == [2, 0, 2]
    assert batches[1].lengths.shape == (0, 4) and batches[1].dense.shape == (0, 3)


def parquet_file(tmp_path, util, **columns):
    cfg = util.small_config()
    n = 6
    data = {
        "label": pa.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),
        "dense_0": pa.array(["1", "2", "3", "x", "5", "6"]),
        "dense_1": pa.array([1.0] * n),
        "dense_2": pa.array([1.0] * n),
        "cat_0": pa.array(range(n)),
        "cat_1": pa.array(range(n)),
        "cat_2": pa.array(range(n)),
        "cat_3": pa.array(range(n)),
    }
    data.update(columns)
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(data), path, row_group_size=4)
    cfg.data.source, cfg.data.train_paths, cfg.data.eval_paths = "parquet", [str(path)], [str(path)]
    return path, cfg


def test_parquet_bad_rows(util, tmp_path):
    path, cfg = parquet_file(tmp_path, util)
    with pytest.raises(DataError, match=rf"^{path}: row 4, column dense_0: 'x' is not a number"):
        read_all(make_source(cfg, "train"))
    labels = pa.array([0.0, None, 0.0, 1.0, 3.0, 1.0])
    path, cfg = parquet_file(tmp_path, util, label=labels, dense_0=pa.array([1.0] * 6))
    with pytest.raises(DataError, match=rf"^{path}: row 2, column label: None is not a label"):
        read_all(make_source(cfg, "train"))
    cfg.data.on_bad_row = "skip"
    src = make_source(cfg, "train")
    assert sum(len(b) for b in read_all(src)) == 4 and src.skipped_rows == 2


def test_missing_file_and_pattern(util, tmp_path):
    missing = tmp_path / "nope.tsv"
    cfg = util.criteo_config({"source": "criteo_tsv", "train_paths": [str(missing)]})
    with pytest.raises(DataError, match=f"^{missing}: file not found"):
        make_source(cfg, "train")
    pattern = str(tmp_path / "day_*.csv")
    cfg = util.small_config({"source": "csv", "train_paths": [pattern], "on_bad_row": "skip"})
    with pytest.raises(DataError, match="no file matches"):
        make_source(cfg, "train")


def test_unknown_column(util, tmp_path):
    path = tmp_path / "x.csv"
    write_csv(util.small_config(), path, 10)
    cfg = util.small_config({"source": "csv", "train_paths": [str(path)], "on_bad_row": "skip"})
    cfg.data.columns.sparse = {"cat_3": "category"}
    with pytest.raises(DataError, match=rf"^{path}: no column 'category' in the CSV header"):
        make_source(cfg, "train")
    ppath, pcfg = parquet_file(tmp_path, util)
    pcfg.data.columns.dense = ["dense_0", "dense_1", "price"]
    with pytest.raises(DataError, match=rf"^{ppath}: no column 'price' in the Parquet schema"):
        make_source(pcfg, "eval")


def test_negative_ids_follow_features_negative(util, tmp_path):
    """modulo (the default) takes "-3" as id -3; error refuses its row, naming line and column;
    a string whose hash is negative is no negative value under either policy."""
    path, cfg = csv_file(util, tmp_path, {5: setter(4, "-3"), 7: setter(5, "-1|word|-0")})
    rows = read_all(make_source(cfg, "train"), batch_size=N)
    assert -3 in torch_values(rows) and -1 in torch_values(rows)
    cfg.features.negative = "error"
    with pytest.raises(DataError, match=rf"^{path}: line 5, column cat_0: -3 is a negative id; "
                       r"features.negative: error refuses them \(modulo maps them into the "
                       r"table\)$"):  # fmt: skip
        read_all(make_source(cfg, "train"))
    cfg.data.on_bad_row = "skip"
    src = make_source(cfg, "train")
    assert sum(len(b) for b in read_all(src, batch_size=N)) == N - 1 - 2
    assert src.skipped_rows == 2
    path, cfg = csv_file(util, tmp_path, {5: setter(4, "word|-0")})  # "word" hashes negative
    cfg.features.negative = "error"
    assert sum(len(b) for b in read_all(make_source(cfg, "train"), batch_size=N)) == N - 1


def test_negative_parquet_ids_follow_features_negative(util, tmp_path):
    ids = pa.array([[1], [2, -4], [], [3], None, [5]])
    path, cfg = parquet_file(tmp_path, util, dense_0=pa.array([1.0] * 6), cat_2=ids,
                             cat_3=pa.array(["a", "b", "c", "-7", "e", "f"]))  # fmt: skip
    assert sum(len(b) for b in read_all(make_source(cfg, "train"))) == 6
    cfg.features.negative = "error"
    with pytest.raises(DataError, match=rf"^{path}: row 2, column cat_2: -4 is a negative id"):
        read_all(make_source(cfg, "train"))
    cfg.data.on_bad_row = "skip"
    src = make_source(cfg, "train")
    assert sum(len(b) for b in read_all(src)) == 4 and src.skipped_rows == 2  # rows 2 and 4


def torch_values(batches) -> list[int]:
    return [v for b in batches for v in b.values.tolist()]
