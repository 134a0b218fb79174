"""Data checked before anything starts: `rec train` refuses bad data files in one line, exit 2,
before the run directory is made and before any rank starts; `rec predict`'s reader names an
empty file as empty.

Every `rec train` here is refused in the launching process (rec_in_process): no rank starts,
so a test that passes has proved that nothing got as far as launching.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.config import config_from_dict
from rec.data import DataError, make_source
from rec.data.preflight import check_training_data, empty_reason
from rec.data.raw import read_raw
from rec.data.text import count_lines
from rec.features import feature_spec
from tests.helpers import rec_in_process, write_config

HEADER = "clicked,price,views,user_id,item"


def clicks(path, rows: int, header: str = HEADER) -> str:
    """A CSV of `rows` clicks with string ids: columns clicked, price, views, user_id, item."""
    lines = [header] + [
        f"{i % 2},{1.5 + i},{i * 7},user-{i % 13},item-{i % 5}" for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def config(path: str, **data) -> dict:
    """A two-table model reading `path`, with batches of 16 (one global batch on 2 ranks: 32)."""
    return {
        "tables": [
            {"name": "users", "rows": 64, "dim": 8, "features": ["user"]},
            {"name": "item_ids", "rows": 32, "dim": 8, "features": ["item"]},
        ],
        "features": {"dense": 2, "dense_names": ["price", "views"]},
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": {
            "source": "csv",
            "train_paths": [path],
            "columns": {"label": "clicked", "sparse": {"user": "user_id"}},
            **data,
        },
        "training": {"batch_size": 16, "steps": 4},
    }


def refused(tmp_path, data: dict) -> str:
    """Runs `rec train` on `data`: asserts exit 2, one error line, no traceback, no run
    directory; returns the line."""
    cfg, run = write_config(tmp_path / "cfg.yaml", data), tmp_path / "run"
    proc = rec_in_process("train", "-c", str(cfg), "--run-dir", str(run), "--nproc", "2")
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stdout
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stdout
    assert not run.exists()  # refused before the run directory is made
    return errors[0]


def test_a_mapped_column_the_csv_lacks(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 100)
    data = config(path)
    data["data"]["columns"]["sparse"]["item"] = "category"
    line = refused(tmp_path, data)
    assert line == (
        f"error: {path}: no column 'category' in the CSV header (it has ['clicked', 'price', "
        "'views', 'user_id', 'item']); map the features to columns with data.columns"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [("", "0 bytes"), (HEADER + "\n", "a header and no rows"), ("\n\n", "only blank lines")],
)
def test_an_empty_training_file(tmp_path, text, why):
    path = tmp_path / "clicks.csv"
    path.write_text(text)
    line = refused(tmp_path, config(str(path)))
    assert line == (
        f"error: {path}: empty ({why}); every file of data.train_paths needs rows: remove it "
        "from the list or fill it"
    )


def test_an_empty_eval_file_among_good_ones(tmp_path):
    good = clicks(tmp_path / "train.csv", 100)
    empty = tmp_path / "eval.csv"
    empty.write_text(HEADER + "\n")
    line = refused(tmp_path, config(good, eval_paths=[good, str(empty)]))
    assert line.startswith(f"error: {empty}: empty (a header and no rows); every file of "
                           "data.eval_paths needs rows")  # fmt: skip


def test_fewer_rows_than_one_global_batch(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 30)  # 27 train rows (3 of 30 held out) < 16 x 2
    line = refused(tmp_path, config(path))
    assert line == (
        f"error: {path}: 27 training samples (1 row in 10 is held out for evaluation), fewer "
        "than one global batch (16 x 2 ranks); lower training.batch_size (or --nproc), or add rows"
    )


def test_every_row_held_out(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 100)
    line = refused(tmp_path, config(path, eval_every_nth_row=1))
    assert "data.eval_every_nth_row=1 holds out every row, so none is left to train on" in line


def test_a_text_column_mapped_as_a_number(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 100)
    data = config(path)
    data["data"]["columns"]["dense"] = ["price", "item"]  # item holds ids, not numbers
    data["data"]["columns"]["sparse"]["item"] = "views"
    line = refused(tmp_path, data)
    assert line == (
        f"error: {path}: column 'item' holds text, not numbers ('item-0' on line 2); it is "
        "mapped to dense feature 'views'; a categorical column belongs in data.columns.sparse"
    )


def test_a_text_label(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 100)
    data = config(path)
    data["data"]["columns"]["label"] = "user_id"
    line = refused(tmp_path, data)
    assert line == (
        f"error: {path}: column 'user_id' holds text, not numbers ('user-0' on line 2); "
        "data.columns.label must name a column of 0/1 (or [0, 1]) labels"
    )


def test_one_bad_cell_among_numbers_is_left_to_on_bad_row(tmp_path):
    """A column of numbers with one bad cell is a bad row (data.on_bad_row), not a mapping
    error: the check passes it."""
    path = tmp_path / "clicks.csv"
    clicks(path, 100)
    lines = path.read_text().split("\n")
    lines[3] = lines[3].replace(",3.5,", ",n/a,")
    path.write_text("\n".join(lines))
    check_training_data(config_from_dict(config(str(path))), nproc=2)


def test_a_parquet_column_of_the_wrong_type(tmp_path):
    path = tmp_path / "clicks.parquet"
    table = pa.table({"clicked": [0, 1] * 50, "price": ["cheap"] * 100, "views": [1.0] * 100,
                      "user_id": ["u"] * 100, "item": [3] * 100})  # fmt: skip
    pq.write_table(table, path)
    data = config(str(path))
    data["data"]["source"] = "parquet"
    line = refused(tmp_path, data)
    assert line == (
        f"error: {path}: column 'price' holds text, not numbers ('cheap' on row 1); it is "
        "mapped to dense feature 'price'; a categorical column belongs in data.columns.sparse"
    )
    table = table.set_column(1, "price", pa.array(["1.5", "", "7"] * 33 + ["x"]))
    pq.write_table(table, path)
    check_training_data(config_from_dict(data), nproc=2)  # numbers as text: read as numbers
    table = table.set_column(1, "price", pa.array([[1.0]] * 100))
    pq.write_table(table, path)
    line = refused(tmp_path, data)
    assert line == f"error: {path}: column 'price' has type list<element: double>; expected numbers"


def test_an_empty_parquet_file(tmp_path):
    path = tmp_path / "clicks.parquet"
    pq.write_table(pa.table({"clicked": pa.array([], pa.int64())}), path)
    data = config(str(path))
    data["data"]["source"] = "parquet"
    assert refused(tmp_path, data).startswith(f"error: {path}: empty (no rows);")


def test_a_csv_given_as_criteo_tsv(tmp_path, util):
    path = clicks(tmp_path / "day_0.tsv", 100)
    cfg = util.criteo_config({"source": "criteo_tsv", "train_paths": [path]})
    with pytest.raises(DataError) as e:
        check_training_data(cfg, nproc=2)
    assert str(e.value) == (
        f"{path}: line 1 has 1 tab-separated fields, expected 40 (label, 13 integer, 26 "
        "categorical) for data.source criteo_tsv; a CSV file with a header reads with "
        "data.source csv and data.columns"
    )


def test_good_data_passes_and_counts_only_what_it_needs(tmp_path):
    path = clicks(tmp_path / "clicks.csv", 5000)
    cfg = config_from_dict(config(path))
    check_training_data(cfg, nproc=2)
    train = make_source(cfg, "train")
    # Asked for n, the count is at least n (reading may stop there), or exact when fewer.
    assert 32 <= train.samples_at_least(32) <= train.num_samples() == 4500
    assert train.samples_at_least(10**6) == 4500  # fewer than asked: the exact count
    assert count_lines(path, header=True, limit=100) >= 100
    assert count_lines(path, header=True) == 5000


def test_predict_reader_names_an_empty_file(tmp_path):
    cfg = config_from_dict(config(str(tmp_path / "unused.csv")))
    spec = feature_spec(cfg)
    for text, why in [("", "0 bytes"), (HEADER + "\n", "a header and no rows")]:
        path = tmp_path / "rows.csv"
        path.write_text(text)
        assert empty_reason(str(path), "csv") == why
        with pytest.raises(DataError) as e:
            read_raw(path, spec)
        assert str(e.value) == f"{path}: the file is empty ({why}): no rows to read"
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n")
    with pytest.raises(DataError, match=r"the file is empty \(only blank lines\)"):
        read_raw(jsonl, spec)
