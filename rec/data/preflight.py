"""Checks of the data files before anything starts: one clear line, not a failed rank.

`check_training_data` runs in `rec train`'s launching process, before the run directory is
made and before any rank starts. It reads only what it needs: each file's header (CSV) or
schema (Parquet), a few leading rows to tell the types of the columns, and rows until the
training split holds one global batch (a Parquet file counts from its footer). `empty_reason`
is the emptiness test that `rec predict`'s reader (rec.data.raw) shares.

A bad row further into a file is still found by the ranks that read it (data.on_bad_row);
this check is for what makes the whole run wrong: a file that is empty, a column the config
maps that the file lacks, a text column mapped as a number.
"""

from __future__ import annotations

import csv
import itertools
import os

from rec.config import RecConfig
from rec.data.errors import DataError

HEAD_ROWS = 64
"""Leading rows read to tell a column's type: a column none of whose cells is a number there
is a text column, whatever the rows after them hold."""


def empty_reason(path: str, fmt: str) -> str | None:
    """Why the file holds no rows ('0 bytes', 'a header and no rows', 'only blank lines', 'no
    rows' for Parquet), or None.

    `fmt` is csv, tsv (a header line first), criteo_tsv, jsonl or parquet. Reads at most the
    first lines that are not blank (Parquet: the footer).
    """
    if os.path.getsize(path) == 0:
        return "0 bytes"
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 (the reader names what is wrong with the file)
            return None
        return None if rows else "no rows"
    header = fmt in ("csv", "tsv")
    with open(path, "rb") as f:
        filled = (line for line in f if line.strip())
        lines = list(itertools.islice(filled, 2 if header else 1))
    if len(lines) == (2 if header else 1):
        return None
    return "a header and no rows" if lines else "only blank lines"


def check_training_data(cfg: RecConfig, nproc: int) -> None:
    """Raises DataError (one line: the file, the column, the fix) if `cfg.data` cannot train
    `nproc` ranks: a missing or empty file, a column the config maps that a file lacks, a text
    column mapped as numbers, fewer training samples than one global batch. Synthetic data
    passes. A run training from a stream checks that its broker answers instead."""
    if cfg.data.stream.url:
        check_stream(cfg.data.stream.url)
        return
    if cfg.data.source == "synthetic":
        return
    from rec.data import make_source
    from rec.data.files import resolve_paths

    for key in ("train_paths", "eval_paths"):
        for path in resolve_paths(getattr(cfg.data, key)):
            if (why := empty_reason(path, cfg.data.source)) is not None:
                raise DataError(
                    f"{path}: empty ({why}); every file of data.{key} needs rows: remove it "
                    "from the list or fill it"
                )
    # The readers' own constructors check that every file has the mapped columns (the CSV
    # header, the Parquet schema and its types), as each rank would.
    train, held_out = make_source(cfg, "train"), make_source(cfg, "eval")
    for path in dict.fromkeys(train.paths + held_out.paths):
        _check_head(cfg, path)  # a text column mapped as numbers, from the leading rows
    window = cfg.training.batch_size * nproc
    have = train.samples_at_least(window)
    if have < window:
        raise DataError(_too_few(cfg, train.paths, have, nproc))


def _too_few(cfg: RecConfig, paths: list[str], have: int, nproc: int) -> str:
    name = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more files)"
    every = cfg.data.eval_every_nth_row
    if have == 0 and not cfg.data.eval_paths and every == 1:
        return (
            f"{name}: data.eval_every_nth_row=1 holds out every row, so none is left to train "
            "on; raise it (default 10) or give data.eval_paths"
        )
    held = "" if cfg.data.eval_paths else f" (1 row in {every} is held out for evaluation)"
    return (
        f"{name}: {have} training samples{held}, fewer than one global batch "
        f"({cfg.training.batch_size} x {nproc} ranks); lower training.batch_size (or --nproc), "
        "or add rows"
    )


def _check_head(cfg: RecConfig, path: str) -> None:
    if cfg.data.source == "criteo_tsv":
        _check_criteo_width(cfg, path)
        return
    from rec.data.tabular import resolve_columns

    cols = resolve_columns(cfg)
    numeric = cols.labels + cols.dense
    read = _csv_head if cfg.data.source == "csv" else _parquet_head
    dense_features = dict(zip(cols.dense, cfg.features.dense_names, strict=True))
    for name, cells in read(cfg, path, numeric).items():
        filled = [(where, c) for where, c in cells if c]
        if not filled or any(_is_number(c) for _, c in filled):
            continue
        where, cell = filled[0]
        if name in cols.labels:
            fix = "data.columns.label must name a column of 0/1 (or [0, 1]) labels"
        else:
            fix = (
                f"it is mapped to dense feature {dense_features[name]!r}; a categorical "
                "column belongs in data.columns.sparse"
            )
        raise DataError(
            f"{path}: column {name!r} holds text, not numbers ({cell!r} on {where}); {fix}"
        )


def _csv_head(cfg: RecConfig, path: str, names: list[str]) -> dict[str, list[tuple[str, str]]]:
    """The leading cells of columns `names`, each with its line ('line 2': the header is 1)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f, delimiter=cfg.data.delimiter)
        header = [h.strip() for h in next(reader, [])]
        rows = list(itertools.islice(reader, HEAD_ROWS))
    whole = [(k + 2, r) for k, r in enumerate(rows) if len(r) == len(header)]
    return {
        name: [(f"line {k}", r[header.index(name)].strip()) for k, r in whole] for name in names
    }


def _parquet_head(cfg: RecConfig, path: str, names: list[str]) -> dict[str, list[tuple[str, str]]]:
    """The leading cells of the string columns among `names` (typed numbers need no look)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    text = [n for n in dict.fromkeys(names) if pa.types.is_string(pf.schema_arrow.field(n).type)
            or pa.types.is_large_string(pf.schema_arrow.field(n).type)]  # fmt: skip
    if not text:
        return {}
    batch = next(pf.iter_batches(HEAD_ROWS, columns=text))
    return {
        n: [(f"row {k + 1}", (c or "").strip()) for k, c in enumerate(batch.column(n).to_pylist())]
        for n in text
    }


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _check_criteo_width(cfg: RecConfig, path: str) -> None:
    """Criteo TSV is headerless: its first line must have the fields of a training row."""
    with open(path, "rb") as f:
        first = f.readline().rstrip(b"\r\n")
    if not first:
        return  # empty: the row count says so
    fields = first.count(b"\t") + 1
    width = cfg.model.num_tasks + 13 + 26
    if fields != width:
        raise DataError(
            f"{path}: line 1 has {fields} tab-separated fields, expected {width} (label, 13 "
            "integer, 26 categorical) for data.source criteo_tsv; a CSV file with a header "
            "reads with data.source csv and data.columns"
        )


def check_stream(url: str) -> None:
    """Raises DataError unless the event stream's broker answers a PING within 3 s, or if the
    stream's key holds something else; says so when the stream does not exist yet (training
    creates it and waits for its first event: a misspelt name would wait forever)."""
    import redis

    from rec.contract.events import parse_url

    u = parse_url(url)
    client = redis.Redis(host=u.host, port=u.port, socket_timeout=3, socket_connect_timeout=3)
    try:
        kind = client.type(u.stream).decode()
        if kind == "none":
            found = client.scan_iter(count=1000, _type="stream")
            streams = sorted(k.decode(errors="replace") for k in found)[:10]
            print(f"[rec train] warning: stream {u.stream!r} does not exist yet at {u.host}:"
                  f"{u.port}; training creates it and waits for its first event (streams there: "
                  f"{', '.join(streams) or 'none'})", flush=True)  # fmt: skip
        elif kind != "stream":
            raise DataError(f"data.stream.url {url}: key {u.stream!r} holds a {kind}, not a "
                            "stream; name the event stream")  # fmt: skip
    except redis.RedisError as e:
        raise DataError(
            f"data.stream.url {url}: the broker does not answer ({e}); start it, or fix the URL"
        ) from None
    finally:
        client.close()
