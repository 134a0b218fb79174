"""Raw rows as a client holds them: dense numbers as read and sparse values as text tokens.

`read_raw` reads a file in any format rec trains on (CSV, Parquet, Criteo TSV) or JSON lines,
through the model's feature spec (rec.features): its columns, separators and label columns. It
is the serving side's reader, used by `rec predict` and by export's raw-row round trip; it
parses cell by cell (no vectorised fast path), so the round trip checks the training readers
against an independent reading of the same file. Ids and transforms are not computed here:
`FeatureSpec.encode_values` maps the tokens, the served model applies the transforms.

Cells follow the training readers' rules: an empty dense cell (or null) is 0, an empty sparse
cell an empty bag, empty tokens between separators are dropped; labels are numbers in [0, 1].
A bad cell raises DataError naming the file, row and column.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rec.data.errors import DataError, where
from rec.data.preflight import empty_reason
from rec.features import FeatureSpec

FORMATS = ("csv", "tsv", "criteo_tsv", "parquet", "jsonl")


@dataclass
class RawRows:
    """n rows: dense [n, D] f32 raw values, lengths [n, F] i32, tokens (batch-major, like
    sparse_values), labels [n, T] f32 or None when the file has no label column."""

    dense: np.ndarray
    lengths: np.ndarray
    tokens: list[str]
    labels: np.ndarray | None
    numbers: list[int]
    """Each row's 1-based line (text files) or row (Parquet), for messages."""
    unit: str = "line"
    extra: dict[str, list[str]] = field(default_factory=dict)
    """The `extra_columns` asked for, each row's cell as text ("" when empty or null): a
    request id `rec predict --group-by` reads, for example."""

    def __len__(self) -> int:
        return int(self.dense.shape[0])


def guess_format(path: Path, spec: FeatureSpec) -> str:
    """From the suffix; `.tsv` / `.txt` is Criteo's headerless TSV for a model trained on it."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    if suffix in (".tsv", ".txt"):
        return "criteo_tsv" if spec.format == "criteo_tsv" else "tsv"
    raise DataError(
        f"{path}: cannot tell the format from the suffix {suffix!r}; name one of {FORMATS}"
    )


def read_raw(
    path: Path,
    spec: FeatureSpec,
    fmt: str | None = None,
    limit: int = 0,
    extra_columns: tuple[str, ...] = (),
) -> RawRows:
    """The first `limit` rows of `path` (all if 0) as RawRows, with the text of
    `extra_columns` (columns besides the features', or features' own) in RawRows.extra."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    fmt = fmt or guess_format(path, spec)
    if fmt not in FORMATS:
        raise DataError(f"unknown input format {fmt!r}; use one of {FORMATS}")
    if (why := empty_reason(str(path), fmt)) is not None:
        raise DataError(f"{path}: the file is empty ({why}): no rows to read")
    try:
        return _read(path, spec, fmt, limit, tuple(extra_columns))
    except UnicodeDecodeError as e:
        byte = e.object[e.start : e.start + 1].hex()
        raise DataError(
            f"{path}: not UTF-8 text (byte 0x{byte}: {e.reason}); text files are read as UTF-8, "
            "as the training readers read them"
        ) from None


def _read(path: Path, spec: FeatureSpec, fmt: str, limit: int, extra: tuple[str, ...]) -> RawRows:
    if fmt == "criteo_tsv":
        records, columns = _criteo_records(path, spec), None
    elif fmt in ("csv", "tsv"):
        records, columns = _delimited_records(path, spec.delimiter if fmt == "csv" else "\t")
    elif fmt == "parquet":
        records, columns = _parquet_records(path)
    else:
        records, columns = _json_records(path), None
    unit = "line" if fmt != "parquet" else "row"
    return _collect(path, spec, records, columns, limit, unit, extra)


def _collect(
    path, spec: FeatureSpec, records, columns, limit: int, unit: str, extra: tuple[str, ...] = ()
) -> RawRows:
    dense_cols = [d.column for d in spec.dense]
    sparse_cols = [s.column for s in spec.sparse]
    has_labels = columns is None or all(c in columns for c in spec.labels)
    if columns is not None:
        missing = [c for c in dense_cols + sparse_cols if c not in columns]
        if missing:
            raise DataError(
                f"{path}: no column {missing[0]!r} (it has {columns}); the model reads "
                f"dense {dense_cols} and sparse {sparse_cols}"
            )
        if unknown := [c for c in extra if c not in columns]:
            raise DataError(f"{path}: no column {unknown[0]!r} (it has {columns})")
    dense, lengths, tokens, labels, numbers = [], [], [], [], []
    extra_cells: dict[str, list[str]] = {c: [] for c in extra}
    for number, record in records:
        if limit and len(dense) >= limit:
            break
        at = (str(path), unit, number)
        numbers.append(number)
        if columns is None and labels == [] and not dense:  # JSON / Criteo: the first row says
            has_labels = all(c in record for c in spec.labels)
        dense.append([_number(record, c, at, empty=0.0) for c in dense_cols])
        row_lengths = []
        for s in spec.sparse:
            bag = _tokens(record, s.column, s.separator, at)
            row_lengths.append(len(bag))
            tokens.extend(bag)
        lengths.append(row_lengths)
        for c in extra:
            extra_cells[c].append(_text(record, c, at))
        if has_labels:
            row = [_number(record, c, at, empty=None) for c in spec.labels]
            for c, y in zip(spec.labels, row, strict=True):
                if not 0 <= y <= 1:
                    raise DataError(f"{where(*at, c)}: {record[c]!r} is not a label in [0, 1]")
            labels.append(row)
    if not dense:
        raise DataError(f"{path}: no rows")
    n = len(dense)
    return RawRows(
        np.asarray(dense, dtype=np.float32).reshape(n, len(dense_cols)),
        np.asarray(lengths, dtype=np.int32).reshape(n, len(sparse_cols)),
        tokens,
        np.asarray(labels, dtype=np.float32).reshape(n, -1) if has_labels else None,
        numbers,
        unit,
        extra_cells,
    )


def _cell(record: dict, column: str, at: tuple):
    if column not in record:
        raise DataError(f"{where(*at, column)}: the column is missing")
    return record[column]


def _text(record: dict, column: str, at: tuple) -> str:
    value = _cell(record, column, at)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        raise DataError(f"{where(*at, column)}: {value!r} is not a single value")
    return str(value)


def _number(record: dict, column: str, at: tuple, empty: float | None) -> float:
    value = _cell(record, column, at)
    if value is None or (isinstance(value, str) and value == ""):
        if empty is None:
            raise DataError(f"{where(*at, column)}: empty, expected a number")
        return empty
    try:
        if isinstance(value, (list, dict)):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where(*at, column)}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise DataError(f"{where(*at, column)}: {value!r} is not a number")
    return number


def _tokens(record: dict, column: str, separator: str | None, at: tuple) -> list[str]:
    value = _cell(record, column, at)
    if value is None:
        return []
    if isinstance(value, str):
        parts = value.split(separator) if separator else [value]
    elif isinstance(value, list):
        parts = value
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = [value]
    else:
        raise DataError(
            f"{where(*at, column)}: {value!r} is not an id, a string of ids or a list of them"
        )
    out = []
    for p in parts:
        if p is None:
            continue
        if isinstance(p, bool) or not isinstance(p, (str, int)):
            raise DataError(f"{where(*at, column)}: {p!r} in a list is not an id or a string")
        if p != "":
            out.append(str(p))
    return out


def _delimited_records(path: Path, delimiter: str) -> tuple[Iterator, list[str]]:
    f = open(path, newline="", encoding="utf-8")  # noqa: SIM115 (closed by the generator)
    reader = csv.reader(f, delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]

    def records():
        with f:
            for row in reader:
                line = reader.line_num
                if len(row) != len(header):
                    raise DataError(
                        f"{where(str(path), 'line', line)}: {len(row)} fields, expected "
                        f"{len(header)} (the header's; delimiter {delimiter!r})"
                    )
                yield line, dict(zip(header, row, strict=True))

    return records(), header


def _criteo_records(path: Path, spec: FeatureSpec) -> Iterator:
    """Criteo lines: [labels,] 13 counts, 26 hex ids; with or without the label column(s)."""
    dense, sparse = [d.column for d in spec.dense], [s.column for s in spec.sparse]
    with open(path, encoding="utf-8", newline="") as f:
        for line, text in enumerate(f, start=1):
            fields = text.rstrip("\r\n").split("\t")
            with_labels = len(spec.labels) + len(dense) + len(sparse)
            if len(fields) == with_labels:
                names = spec.labels + dense + sparse
            elif len(fields) == len(dense) + len(sparse):
                names = dense + sparse
            else:
                raise DataError(
                    f"{where(str(path), 'line', line)}: {len(fields)} fields, expected "
                    f"{with_labels} (labels, 13 integer, 26 categorical; tab-separated) or "
                    f"{with_labels - len(spec.labels)} without labels"
                )
            yield line, dict(zip(names, fields, strict=True))


def _parquet_records(path: Path) -> tuple[Iterator, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None

    def records():
        row = 0
        for batch in pf.iter_batches(65_536):
            for record in batch.to_pylist():
                row += 1
                yield row, record

    return records(), pf.schema_arrow.names


def _json_records(path: Path) -> Iterator:
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{where(str(path), 'line', line)}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{where(str(path), 'line', line)}: expected a JSON object")
            yield line, record
