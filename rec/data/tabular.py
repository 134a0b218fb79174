"""CSV and Parquet readers: `data.columns` maps a table's columns onto the model's inputs.

    data:
      source: csv            # or parquet
      train_paths: [clicks/*.csv]
      columns:
        label: clicked       # or labels: [clicked, bought] for a two-task model
        dense: [price, age]  # default: the dense feature names (dense_0, ... or dense_names)
        sparse: {user: user_id, items: recent_items}   # feature -> column; default: same name
        separator: "|"       # between the ids of a multi-valued cell, e.g. "12|7|3"

Labels are numbers in [0, 1]. Dense cells are numbers (an empty cell or a Parquet null is 0),
transformed as features.transforms says (default identity). Sparse cells hold one token or
several joined by the separator (empty: an empty bag); a token that is a decimal integer is
its own id, any other string is hashed to a stable int64 (rec.features, encoding
int_or_hash). Parquet sparse columns may also be integers or lists of integers or strings.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rec.config import ConfigError, RecConfig
from rec.contract.features import encode_tokens, negative_ints, to_batch_major
from rec.data.errors import DataError, where
from rec.data.files import FileSource, build_rows
from rec.data.parse import parse_floats, split_tokens
from rec.data.source import Rows
from rec.data.text import TextBlock, count_lines, read_lines


@dataclass(frozen=True)
class Columns:
    """Resolved column names: labels [T], dense [D], sparse [F] in features.sparse order."""

    labels: list[str]
    dense: list[str]
    sparse: list[str]
    separator: str

    @property
    def all(self) -> list[str]:
        return self.labels + self.dense + self.sparse


def resolve_columns(cfg: RecConfig) -> Columns:
    """data.columns with its defaults filled in, checked against the features and tasks."""
    cols = cfg.data.columns
    labels = cols.label_columns
    if len(labels) != cfg.model.num_tasks:
        raise ConfigError(
            f"data.columns gives {len(labels)} label column(s) {labels} for a model with "
            f"{cfg.model.num_tasks} tasks (model.tasks, else model.over_arch[-1]); list one per "
            "task in data.columns.labels"
        )
    dense = list(cols.dense) or list(cfg.features.dense_names)
    if len(dense) != cfg.features.dense:
        raise ConfigError(
            f"data.columns.dense lists {len(dense)} columns {dense} for "
            f"features.dense={cfg.features.dense}"
        )
    unknown = sorted(set(cols.sparse) - set(cfg.features.sparse))
    if unknown:
        raise ConfigError(
            f"data.columns.sparse maps {unknown}, which are not sparse features; "
            f"the features are {cfg.features.sparse}"
        )
    sparse = [cols.sparse.get(f, f) for f in cfg.features.sparse]
    return Columns(labels, dense, sparse, cols.separator)


def _missing(path: str, have: list[str], need: list[str], what: str) -> None:
    missing = [c for c in need if c not in have]
    if missing:
        raise DataError(
            f"{path}: no column {missing[0]!r} in the {what} (it has {have}); "
            "map the features to columns with data.columns"
        )


class TabularColumns:
    """Turns parsed columns into Rows and bad-row messages; shared by CSV and Parquet."""

    cols: Columns

    def _rows(
        self,
        path: str,
        unit: str,
        numbers: list[int],
        numeric: list[tuple[np.ndarray, np.ndarray]],
        show: Callable[[str, int], object],
        bags: list[tuple[np.ndarray, np.ndarray]],
        negative: list[np.ndarray] | None = None,
    ) -> tuple[Rows, dict[int, str]]:
        """Rows from n parsed rows.

        Args:
            numbers: [n] 1-based line or row number of each row, for messages.
            numeric: per label column then per dense column, (f64 values [n], bad [n]).
            show: (column, i) -> the raw cell, quoted in a message.
            bags: per sparse column, (lengths [n], ids [sum(lengths)]).
            negative: per sparse column, which of its ids are negative values [sum(lengths)],
                when features.negative is error: their rows are bad.
        Returns:
            The good rows and {row index: message} for the bad ones.
        """
        c, n = self.cols, len(numbers)
        values = np.stack([v for v, _ in numeric], axis=1).reshape(n, -1)
        bad_cell = np.stack([b for _, b in numeric], axis=1).reshape(n, -1)
        t = len(c.labels)
        bad_cell[:, :t] |= (values[:, :t] < 0) | (values[:, :t] > 1)
        bad: dict[int, str] = {}
        for i in np.flatnonzero(bad_cell.any(axis=1)).tolist():
            col = int(np.argmax(bad_cell[i]))
            name = (c.labels + c.dense)[col]
            what = "a label in [0, 1]" if col < t else "a number"
            bad[i] = f"{where(path, unit, numbers[i], name)}: {show(name, i)!r} is not {what}"
        lengths = np.stack([b[0] for b in bags], axis=1).reshape(n, len(bags))
        ids = to_batch_major(lengths, [b[1] for b in bags])
        good = ~bad_cell.any(axis=1)
        for i, message in _negative_rows(path, unit, numbers, c.sparse, bags, negative).items():
            bad.setdefault(i, message)
            good[i] = False
        return build_rows(values[:, :t], values[:, t:], lengths, ids, good), bad


def _negative_rows(path, unit, numbers, columns, bags, negative) -> dict[int, str]:
    """{row index: message} of the rows holding a negative id (features.negative: error)."""
    bad: dict[int, str] = {}
    for column, (lengths, ids), mask in zip(columns, bags, negative or [], strict=False):
        rows = np.repeat(np.arange(len(lengths)), lengths)[mask]
        for i, value in zip(rows.tolist(), ids[mask].tolist(), strict=True):
            bad.setdefault(
                i,
                f"{where(path, unit, numbers[i], column)}: {value} is a negative id; "
                "features.negative: error refuses them (modulo maps them into the table)",
            )
    return bad


class CsvSource(TabularColumns, FileSource):
    """A split of CSV files with a header line (data.source: csv).

    One record per line (no line breaks inside quoted cells); `data.delimiter` separates
    fields. Messages count lines from 1 at the header.
    """

    def __init__(self, cfg: RecConfig, split: str, raw_dense: bool = False) -> None:
        self.cols = resolve_columns(cfg)
        self.refuse_negative = cfg.features.negative == "error"
        self.delimiter = cfg.data.delimiter
        self._headers: dict[str, list[str]] = {}
        super().__init__(cfg, split, raw_dense)

    def _check_file(self, path: str) -> None:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            header = next(csv.reader([f.readline()], delimiter=self.delimiter), [])
        header = [h.strip() for h in header]
        _missing(path, header, self.cols.all, "CSV header")
        self._headers[path] = header

    def _count_rows(self, path: str, limit: int = 0) -> int:
        return count_lines(path, header=True, limit=limit)

    def _blocks(self, path: str, skip: int) -> Iterator[tuple[int, TextBlock, int]]:
        return read_lines(path, skip, header=True)

    def _parse(
        self, path: str, block: TextBlock, idx: np.ndarray, row0: int
    ) -> tuple[Rows, dict[int, str]]:
        header = self._headers[path]
        text = [block.line(i).decode("utf-8", errors="replace") for i in idx.tolist()]
        records = list(csv.reader(text, delimiter=self.delimiter))
        lines = [row0 + int(i) + 2 for i in idx]  # line 1 is the header
        bad: dict[int, str] = {}
        ok = []
        for i, rec in enumerate(records):
            if len(rec) == len(header):
                ok.append(i)
            else:
                bad[i] = (
                    f"{where(path, 'line', lines[i])}: {len(rec)} fields, expected "
                    f"{len(header)} (the header's; delimiter {self.delimiter!r})"
                )
        at = {name: header.index(name) for name in self.cols.all}
        cells = {name: [records[i][j] for i in ok] for name, j in at.items()}
        c = self.cols
        numeric = [
            parse_floats(np.array(cells[name], dtype=str), empty=None if k < len(c.labels) else 0.0)
            for k, name in enumerate(c.labels + c.dense)
        ]
        split = [split_tokens(cells[name], c.separator) for name in c.sparse]
        bags = [(lengths, encode_tokens(tokens, "int_or_hash")) for lengths, tokens in split]
        negative = [negative_ints(t) for _, t in split] if self.refuse_negative else None
        numbers = [lines[i] for i in ok]
        rows, bad_values = self._rows(
            path, "line", numbers, numeric, lambda name, i: cells[name][i], bags, negative
        )
        bad.update({ok[i]: msg for i, msg in bad_values.items()})
        return rows, bad


def _numeric(col: pa.Array, label: bool) -> tuple[np.ndarray, np.ndarray]:
    """A Parquet label or dense column -> (f64 values, bad mask); nulls: bad label, dense 0."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        cells = np.array([c or "" for c in col.to_pylist()], dtype=str)
        return parse_floats(cells, empty=None if label else 0.0)
    floats = pc.cast(col, pa.float64())
    values = floats.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~np.isfinite(values)
    if label:
        bad |= ~floats.is_valid().to_numpy(zero_copy_only=False)
    values[bad] = 0.0
    return values, bad


def _bags(
    col: pa.Array, separator: str, find_negative: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A Parquet sparse column -> (lengths [n] i32, ids, which ids are negative values when
    `find_negative`, else None); a null is an empty bag."""
    kind = col.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        flat = pc.list_flatten(col)
        parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
        valid = flat.is_valid().to_numpy(zero_copy_only=False)
        lengths = np.bincount(parents[valid], minlength=len(col)).astype(np.int32)
        flat = flat.filter(pa.array(valid))
        if pa.types.is_integer(flat.type):
            ids = flat.to_numpy(zero_copy_only=False).astype(np.int64)
            return lengths, ids, ids < 0 if find_negative else None
        tokens = [str(x) for x in flat.to_pylist()]
        return lengths, encode_tokens(tokens, "int_or_hash"), _negative(tokens, find_negative)
    if pa.types.is_integer(kind):
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        ids = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)[valid]
        return valid.astype(np.int32), ids, ids < 0 if find_negative else None
    lengths, tokens = split_tokens([c or "" for c in col.to_pylist()], separator)
    return lengths, encode_tokens(tokens, "int_or_hash"), _negative(tokens, find_negative)


def _negative(tokens: list[str], find: bool) -> np.ndarray | None:
    return negative_ints(tokens) if find else None


def _check_types(path: str, schema: pa.Schema, cols: Columns) -> None:
    def ok_numeric(t):
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)

    def ok_text(t):
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    def ok_id(t):
        return pa.types.is_integer(t) or ok_text(t)

    for name in cols.labels + cols.dense:
        kind = schema.field(name).type
        if not (ok_numeric(kind) or ok_text(kind)):
            raise DataError(f"{path}: column {name!r} has type {kind}; expected numbers")
    for name in cols.sparse:
        kind = schema.field(name).type
        is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if not (ok_id(kind) or (is_list and ok_id(kind.value_type))):
            raise DataError(
                f"{path}: column {name!r} has type {kind}; expected integer or string ids, "
                "or lists of them"
            )


class ParquetSource(TabularColumns, FileSource):
    """A split of Parquet files (data.source: parquet), read a record batch at a time.

    Messages count rows from 1 within each file.
    """

    unit = "row"
    read_rows = 65_536
    """Rows per record batch read; memory stays bounded whatever the row-group size."""

    def __init__(self, cfg: RecConfig, split: str, raw_dense: bool = False) -> None:
        self.cols = resolve_columns(cfg)
        self.refuse_negative = cfg.features.negative == "error"
        super().__init__(cfg, split, raw_dense)

    def _check_file(self, path: str) -> None:
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
        _missing(path, schema.names, self.cols.all, "Parquet schema")
        _check_types(path, schema, self.cols)

    def _count_rows(self, path: str, limit: int = 0) -> int:
        return pq.ParquetFile(path).metadata.num_rows

    def _blocks(self, path: str, skip: int) -> Iterator[tuple[int, pa.RecordBatch, int]]:
        pf = pq.ParquetFile(path)
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
        ends = np.cumsum(sizes)
        first = int(np.searchsorted(ends, skip, side="right"))  # row groups before skip: none
        row = int(ends[first - 1]) if first else 0
        columns = list(dict.fromkeys(self.cols.all))
        groups = list(range(first, pf.num_row_groups))
        if not groups:
            return
        for batch in pf.iter_batches(self.read_rows, row_groups=groups, columns=columns):
            yield row, batch, batch.num_rows
            row += batch.num_rows

    def _parse(
        self, path: str, block: pa.RecordBatch, idx: np.ndarray, row0: int
    ) -> tuple[Rows, dict[int, str]]:
        part = block.take(pa.array(idx))
        c = self.cols
        numeric = [_numeric(part.column(name), label=True) for name in c.labels]
        numeric += [_numeric(part.column(name), label=False) for name in c.dense]
        parsed = [_bags(part.column(n), c.separator, self.refuse_negative) for n in c.sparse]
        bags = [(lengths, ids) for lengths, ids, _ in parsed]
        negative = [m for _, _, m in parsed] if self.refuse_negative else None
        numbers = (row0 + idx + 1).tolist()
        return self._rows(
            path,
            "row",
            numbers,
            numeric,
            lambda name, i: part.column(name)[i].as_py(),
            bags,
            negative,
        )
