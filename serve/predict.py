"""`rec predict`: score rows from a file (or synthetic rows) on a running server.

Files: CSV (`.csv`), TSV (`.tsv`) with a header row, or JSON lines (`.jsonl`, `.ndjson`, `.json`),
one object per sample. Columns/keys are the model's feature names from rec.json: every dense
feature (a number) and every sparse feature (ids as "12|7|3", or in JSON also a list or a single
int; empty means no ids). Other columns (labels, ids) are ignored. The feature names come from
`--repo` (its rec.json) or else from the server, when its model config publishes them (Triton
started by `rec serve` does); synthetic rows need only the input sizes, which every server
publishes.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from rec.serve.client import Features, Rows, ScoreClient, synthetic_rows
from rec.serve.repository import ServeError, load_model

_SEPARATOR = "|"  # between ids of a multi-valued sparse cell, as in rec's CSV data source


class InputError(ServeError):
    """A row of the input file does not match the model's features."""


@dataclass(frozen=True)
class PredictConfig:
    url: str
    """host:port of the server (HTTP or gRPC port, matching `protocol`)."""
    protocol: str = "http"
    model: str = "rec"
    input: Path | None = None
    """CSV/TSV/JSON-lines file of rows; None means `synthetic` random rows."""
    synthetic: int = 0
    repo: Path | None = None
    """Repository to read feature names from (rec.json) instead of asking the server."""
    output: Path | None = None
    """Write scores here as CSV; None prints them."""
    batch_size: int = 64
    """Rows per request."""
    seed: int = 0


def read_rows(path: Path, features: Features) -> Rows:
    """Parses `path` into Rows; an InputError names the file, row and field of any mismatch."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        records = _json_records(path)
    elif suffix in (".csv", ".tsv"):
        records = _delimited_records(path, "\t" if suffix == ".tsv" else ",", features)
    else:
        raise InputError(f"{path}: unknown input format {suffix!r} (use .csv, .tsv or .jsonl)")
    dense, lengths, values = [], [], []
    for row, record in records:
        where = f"{path}: row {row}"
        dense.append([_number(record, name, where) for name in features.dense])
        ids = [_ids(record, name, where) for name in features.sparse]
        lengths.append([len(x) for x in ids])
        values.extend(v for x in ids for v in x)
    if not dense:
        raise InputError(f"{path}: no rows")
    return Rows(
        np.asarray(dense, dtype=np.float32).reshape(len(dense), len(features.dense)),
        np.asarray(lengths, dtype=np.int32).reshape(len(dense), len(features.sparse)),
        np.asarray(values, dtype=np.int64),
    )


def _json_records(path: Path):
    with open(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: row {line_no}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict):
                raise InputError(f"{path}: row {line_no}: expected a JSON object")
            yield line_no, record


def _delimited_records(path: Path, delimiter: str, features: Features):
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        missing = [
            n for n in (*features.dense, *features.sparse) if n not in (reader.fieldnames or [])
        ]
        if missing:
            raise InputError(
                f"{path}: header lacks feature column(s) {missing}; the model's features are "
                f"dense {list(features.dense)} and sparse {list(features.sparse)}"
            )
        # Rows are numbered from 1 after the header; line = row + 1.
        yield from enumerate(reader, start=1)


def _field(record: dict, name: str, where: str):
    if name not in record or record[name] is None:
        raise InputError(f"{where}: field {name!r} is missing")
    return record[name]


def _number(record: dict, name: str, where: str) -> float:
    value = _field(record, name, where)
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: field {name!r}: {value!r} is not a number") from None
    if not np.isfinite(number):
        raise InputError(f"{where}: field {name!r}: {value!r} is not finite")
    return number


def _ids(record: dict, name: str, where: str) -> list[int]:
    value = _field(record, name, where)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(_SEPARATOR)] if value.strip() else []
    elif isinstance(value, list):
        parts = value
    else:
        parts = [value]
    ids = []
    for p in parts:
        try:
            if isinstance(p, (bool, float)):
                raise ValueError
            ids.append(int(p))
        except (TypeError, ValueError):
            raise InputError(f"{where}: field {name!r}: id {p!r} is not an integer") from None
        if not -(2**63) <= ids[-1] < 2**63:
            raise InputError(f"{where}: field {name!r}: id {p!r} does not fit in int64")
    return ids


def resolve_features(client: ScoreClient, repo: Path | None) -> Features:
    if repo is not None:
        served = load_model(repo, client.model)
        return Features(served.dense_names, served.sparse_names)
    features = client.features()
    if features is None:
        raise ServeError(
            f"the server at {client.url} does not publish model {client.model!r}'s feature "
            "names; pass --repo <model repository> to read them from its rec.json"
        )
    return features


def predict(cfg: PredictConfig) -> np.ndarray:
    """Scores the rows of cfg.input (or cfg.synthetic random rows); writes or prints them."""
    if (cfg.input is None) == (cfg.synthetic <= 0):
        raise ServeError("give exactly one of --input FILE or --synthetic N")
    client = ScoreClient(cfg.url, cfg.protocol, cfg.model)
    try:
        if cfg.input is not None:
            rows = read_rows(cfg.input, resolve_features(client, cfg.repo))
        else:
            rows = synthetic_rows(*client.input_sizes(), batch=cfg.synthetic, seed=cfg.seed)
        scores = np.concatenate([client.score(chunk) for chunk in rows.split(cfg.batch_size)])
    except (InferenceServerException, OSError) as e:
        raise ServeError(f"request to {cfg.url} ({cfg.protocol}) failed: {e}") from e
    finally:
        client.close()
    text = format_scores(scores)
    if cfg.output is None:
        sys.stdout.write(text)
    else:
        Path(cfg.output).write_text(text)
    return scores


def format_scores(scores: np.ndarray) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", *(f"score_{t}" for t in range(scores.shape[1]))])
    for i, row in enumerate(scores):
        writer.writerow([i, *(f"{s:.7g}" for s in row)])
    return out.getvalue()
