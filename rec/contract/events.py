"""Contract 5, the event stream: labelled events on their way from a producer to `rec train`.

A producer (an application, or `rec stream replay`) appends entries to a Redis stream; training
reads them through a consumer group (rec.data.stream). docs/stream.md is the prose version, and
tests/data/event_golden.json holds valid entries with their decoded values and refused ones with
their reasons. This docstring is the one description of the fields.

The URL: `redis://HOST:PORT[/STREAM]`, as the update log's (rec.contract.urls); the stream key
defaults to DEFAULT_STREAM, and the dead-letter stream to `<stream>:dead` (`dead_stream`).

One stream entry carries a small batch of events, format FORMAT, two fields:

    format    "rec.events/1"
    events    a UTF-8 JSON array of 1 to MAX_EVENTS events, each a JSON object

Why a batch, measured (benchmarks/stream_events.py: redis-server 7.0 and one Python process on
one core of an Intel Xeon with AMX and AVX-512, pure-Python redis-py): XADD, then XREADGROUP and
XACK of 40-field Criteo-shaped events moved 2,161 events/s with one event per entry (every cell
is a Redis bulk string, which the client parses one by one) and 105,905 events/s with 64 per
entry; with this module's decoder, 4,099 against 19,825 (docs/stream.md has the table, and how
noisy a shared machine made it). One event per entry would cap training far below what two
cores train, so an entry holds a batch, and a producer sends what it has (an entry of 1 event
is valid; the replayer sends up to 64).

An event has the feature spec's raw fields (rec.contract.features.FeatureSpec), named by their
columns, the same cells as one row of a CSV or Parquet file:

    label columns   0 or 1: a JSON number, or a string holding one ("0", "1", "1.0")
    dense columns   a number, or a string holding a decimal number (DECIMAL); "" or null is 0,
                    as an empty CSV cell. The feature's transform applies when it is read
    sparse columns  a string: tokens joined by the feature's separator ("" is no ids; a feature
                    without a separator, as Criteo's, holds one token); an integer: one id; a
                    list of tokens and integers; null: no ids. A token becomes an id by the
                    feature's encoding (int_or_hash or hex); an integer is its own id

Other keys of an event are ignored (a producer may add its own, such as a timestamp). The entry
id, which Redis stamps with its clock, is the time the events entered the stream.

Refusals. A malformed entry is refused whole (REASONS' "malformed_entry": no format field, an
unknown format, events that are not a JSON array of 1..MAX_EVENTS, not UTF-8 or not JSON). Within
a good entry each event is judged alone, and a refused one leaves the others trainable; the
first field, in the spec's order (labels, dense, sparse), that fails names the reason:

    not_an_object      the array element is not a JSON object
    missing_field      a label, dense or sparse column is absent
    label_not_binary   a label that is not 0 or 1 (0.5, 2, true, "yes", null)
    dense_not_numeric  a dense value that is not a finite number, or beyond float32's range
    bad_sparse         a sparse value of another JSON type, a hex token that is not hex, an
                       integer outside int64, or text with no UTF-8 form (a lone surrogate)

Example:
    >>> from rec.contract.features import FeatureSpec, DenseFeature, SparseFeature, HASH
    >>> spec = FeatureSpec("csv", ["clicked"], [DenseFeature("price", "price", "identity")],
    ...                    [SparseFeature("item", "item", "int_or_hash", "|")], dict(HASH))
    >>> got = decode(encode([{"clicked": 1, "price": 2.5, "item": "7|9"}]), spec)
    >>> got.labels.tolist(), got.dense.tolist(), got.lengths.tolist(), got.values.tolist()
    ([[1.0]], [[2.5]], [[2]], [7, 9])
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from rec.contract.features import (
    FeatureSpec,
    TokenError,
    encode_tokens,
    hex_id,
    string_id,
    to_batch_major,
)
from rec.contract.urls import StreamUrl, parse_stream_url

FORMAT = "rec.events/1"
MAX_EVENTS = 4096
"""Events in one entry at most; a reader refuses an entry with more."""
DEFAULT_STREAM = "rec:events"
DEFAULT_DEAD_SUFFIX = ":dead"
"""The dead-letter stream of stream S is S + this, unless configured otherwise."""
DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")
"""A number written as text: what a dense or label string must match (no spaces, no "nan")."""
REASONS = (
    "malformed_entry",
    "not_an_object",
    "missing_field",
    "label_not_binary",
    "dense_not_numeric",
    "bad_sparse",
)
_INT64 = (-(2**63), 2**63)


class EventError(ValueError):
    """A refused entry or event: `reason` is one of REASONS, the message says what is wrong."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.detail = reason, message


def parse_url(url: str) -> StreamUrl:
    """`redis://HOST:PORT[/STREAM]` -> its parts (stream default DEFAULT_STREAM); ValueError
    naming what is wrong. The update log's URL rules (rec.contract.urls): the path names the
    stream, never a database number."""
    return parse_stream_url(url, "event stream", DEFAULT_STREAM)


def dead_stream(stream: str, configured: str = "") -> str:
    """The dead-letter stream of `stream`: `configured`, else `<stream>:dead`."""
    return configured or stream + DEFAULT_DEAD_SUFFIX


@dataclass(frozen=True)
class Refusal:
    index: int
    """The event's place in its entry's array, from 0."""
    reason: str
    message: str
    column: str = ""
    """The event's field that was refused ("" when none is to blame alone)."""


@dataclass
class Events:
    """The good events of one entry, as arrays, and the refused ones.

    labels [n, T] f32, dense [n, D] f32 (raw: the spec's transforms not applied), lengths [n, F]
    i32, values [sum(lengths)] i64 batch-major (sample by sample, feature by feature), index [n]
    i64: each good event's place in the entry. `size` counts every event of the entry.
    """

    labels: np.ndarray
    dense: np.ndarray
    lengths: np.ndarray
    values: np.ndarray
    index: np.ndarray
    size: int
    refused: list[Refusal] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.index.size)


def encode(events: Sequence[dict[str, Any]]) -> dict[str, str]:
    """An entry's fields for 1..MAX_EVENTS events (JSON-serialisable dicts)."""
    if not 0 < len(events) <= MAX_EVENTS:
        raise ValueError(f"an entry holds 1 to {MAX_EVENTS} events, not {len(events)}")
    return {"format": FORMAT, "events": json.dumps(list(events), separators=(",", ":"))}


def _text(fields: dict, key: str) -> str:
    value = fields.get(key, fields.get(key.encode()))
    if value is None:
        raise EventError("malformed_entry", f"no {key!r} field (fields: {_keys(fields)})")
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise EventError("malformed_entry", f"the {key!r} field is not UTF-8") from None
    return str(value)


def _keys(fields: dict) -> list[str]:
    return sorted(k.decode(errors="replace") if isinstance(k, bytes) else str(k) for k in fields)


def parse_entry(fields: dict) -> list[Any]:
    """The events array of an entry's fields (str or bytes keys and values); EventError
    "malformed_entry" naming what is wrong."""
    fmt = _text(fields, "format")
    if fmt != FORMAT:
        raise EventError("malformed_entry", f"format {fmt!r}; this reader reads {FORMAT!r}")
    try:
        events = json.loads(_text(fields, "events"))
    except json.JSONDecodeError as e:
        raise EventError("malformed_entry", f"the 'events' field is not JSON ({e})") from None
    if not isinstance(events, list) or not 0 < len(events) <= MAX_EVENTS:
        what = f"{len(events)} events" if isinstance(events, list) else type(events).__name__
        raise EventError(
            "malformed_entry", f"'events' must be a JSON array of 1 to {MAX_EVENTS}: {what}"
        )
    return events


def decode(fields: dict, spec: FeatureSpec) -> Events:
    """An entry's good events as arrays, and its refused ones (see the module docstring).

    Raises EventError("malformed_entry", ...) for an entry refused whole.

    orjson parses the array first, at about a quarter of json's cost (docs/stream.md, "Decoding
    cost"). json stays the reference: an entry orjson refuses (NaN, Infinity, a float beyond
    float64, a lone surrogate, ...), or whose array has any refused event, is decoded again from
    json's parse, so that every refusal, reason and message, is json's. Where the two parsers
    give different objects for an entry json accepts, an integer literal beyond int64 and uint64
    (orjson: a float of the same value), a dense column takes the same float64 either way, and
    anywhere else the decoder refuses it, so json decides. Tested against json in
    tests/data/test_events.py, "orjson"."""
    events = _fast_parse(fields)
    if events is not None:
        got = decode_events(events, spec)
        if not got.refused:
            return got
    return decode_events(parse_entry(fields), spec)


def _fast_parse(fields: dict) -> list[Any] | None:
    """orjson's parse of a well-formed entry's events array, or None: json's path decides."""
    try:
        if _text(fields, "format") != FORMAT:
            return None
        events = orjson.loads(_text(fields, "events"))
    except Exception:  # any refusal, orjson's or the entry's: parse_entry names it as json does
        return None
    return events if type(events) is list and 0 < len(events) <= MAX_EVENTS else None


def decode_events(events: list[Any], spec: FeatureSpec) -> Events:
    """The events of an entry's array (JSON values), judged one by one against `spec`."""
    n = len(events)
    bad: dict[int, Refusal] = {}
    rows = events
    if _types(events) != {dict}:
        for i, event in enumerate(events):
            if not isinstance(event, dict):
                bad[i] = Refusal(i, "not_an_object", f"event {i} is a {type(event).__name__}")
        rows = [e if isinstance(e, dict) else {} for e in events]
    t = len(spec.labels)
    numeric = _numeric_matrix(rows, spec.labels + [d.column for d in spec.dense], t)
    if numeric is None:  # some cell is missing, refused or of a rarer form: column by column
        labels = [_numbers(rows, c, bad, label=True) for c in spec.labels]
        dense = [_numbers(rows, d.column, bad, label=False) for d in spec.dense]
        numeric = np.stack(labels + dense, axis=1).reshape(n, t + len(dense))
    ints = None if bad else _int_matrix(rows, [s.column for s in spec.sparse])
    if ints is not None:  # every event good, every sparse cell an integer or a list of them
        lengths, values = ints
        good = np.ones(n, dtype=bool)
    else:
        lengths, values, good = _sparse_by_column(rows, spec, bad)
    return Events(
        labels=numeric[good, :t].astype(np.float32),
        dense=numeric[good, t:].astype(np.float32),
        lengths=lengths.astype(np.int32),
        values=values,
        index=np.flatnonzero(good).astype(np.int64),
        size=n,
        refused=[bad[i] for i in sorted(bad)],
    )


_MISSING = object()
_NUMBER = frozenset({int, float})
"""The Python types of a JSON number; bool (JSON true/false) is not one: `type(x)` is checked."""


def _types(cells) -> set[type]:
    """The types of `cells`, in one C-level pass (a generator of `type(c) is ...` per cell cost
    twice as much)."""
    return set(map(type, cells))


def _sparse_by_column(
    rows: list[dict], spec: FeatureSpec, bad: dict[int, Refusal]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths [n_good, F], values batch-major, good [n]) of the sparse columns, feature by
    feature; refusals go into `bad`."""
    n = len(rows)
    bags = _hex_matrix(rows, spec)
    for f, s in enumerate(spec.sparse):
        if f not in bags:
            bags[f] = _bags(rows, s.column, s.separator, s.encoding, bad)
    good = np.array([i not in bad for i in range(n)], dtype=bool)
    lengths = np.stack([bags[f][0] for f in range(len(bags))], axis=1).reshape(n, len(bags))
    per_feature = [ids[np.repeat(good, lens)] for lens, ids in (bags[f] for f in range(len(bags)))]
    lengths = lengths[good]
    return lengths, to_batch_major(lengths, per_feature), good


def _int_matrix(rows: list[dict], columns: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(lengths [n, F] i32, values batch-major i64) of the sparse columns in one pass, when every
    cell is present and an integer, or every cell a list of integers (what the replayer sends
    for the synthetic generator); else None (column by column then names any refusal).

    Row after row, column after column is already the batch-major order, so the ids need no
    interleaving."""
    if not columns or not rows:
        return None
    get = itemgetter(*columns)
    try:
        table = list(map(get, rows)) if len(columns) > 1 else [(get(r),) for r in rows]
    except KeyError:  # a missing column: the slow path names the event
        return None
    cells = list(itertools.chain.from_iterable(table))
    kinds = _types(cells)
    if kinds == {int}:
        flat, lengths = cells, np.ones(len(cells), dtype=np.int32)
    elif kinds == {list}:
        flat = list(itertools.chain.from_iterable(cells))
        if flat and _types(flat) != {int}:
            return None
        lengths = np.fromiter(map(len, cells), dtype=np.int32, count=len(cells))
    else:
        return None
    try:
        values = np.array(flat, dtype=np.int64)
    except OverflowError:  # outside int64: the slow path names the event
        return None
    return lengths.reshape(len(rows), len(columns)), values


def _refuse(bad: dict[int, Refusal], i: int, reason: str, message: str, column: str = "") -> None:
    if i not in bad:  # the first failing field names the reason
        bad[i] = Refusal(i, reason, message, column)


def _numbers(rows: list[dict], column: str, bad: dict[int, Refusal], label: bool) -> np.ndarray:
    """f64 [n] of one label or dense column; refusals go into `bad` (their value is 0)."""
    cells = [r.get(column, _MISSING) for r in rows]
    kinds = _types(cells)
    if kinds <= _NUMBER:  # the fast path: JSON numbers
        try:
            out = np.array(cells, dtype=np.float64)
        except OverflowError:  # an integer beyond float64: let the slow path name it
            out = None
        if out is not None and _fits(out) and (not label or _binary(out).all()):
            return out
    if kinds == {str}:  # text cells, as a CSV file's
        out = _decimal_cells(cells, empty=None if label else 0.0)
        if out is not None and (not label or _binary(out).all()):
            return out
    out = np.zeros(len(cells), dtype=np.float64)
    for i, cell in enumerate(cells):
        if cell is _MISSING:
            _refuse(bad, i, "missing_field", f"event {i} has no {column!r}", column)
            continue
        value = _number(cell, empty=None if label else 0.0)
        if label and (value is None or value not in (0.0, 1.0)):
            _refuse(bad, i, "label_not_binary", f"event {i}: {column}={_show(cell)} is not 0 or 1",
                    column)  # fmt: skip
        elif value is None:
            message = f"event {i}: {column}={_show(cell)} is not a number"
            _refuse(bad, i, "dense_not_numeric", message, column)
        elif abs(value) > FLOAT32_MAX:  # float32 in the model: it would train and serve as inf
            message = f"event {i}: {column}={_show(cell)} is beyond float32's range (3.4e38)"
            _refuse(bad, i, "dense_not_numeric", message, column)
        else:
            out[i] = value
    return out


def _decimal_cells(cells: list[str], empty: float | None) -> np.ndarray | None:
    """f64 [n] of text cells that are all DECIMAL (or "" with `empty`), else None.

    Made only of DECIMAL's characters, a cell that numpy reads as a float matches DECIMAL, so
    the check is one vectorised pass; anything else goes to the cell-by-cell path."""
    arr = np.array(cells, dtype=str)
    blank = arr == ""
    if (blank.any() and empty is None) or (np.char.strip(arr, "0123456789.eE+-") != "").any():
        return None
    try:
        out = np.where(blank, "0", arr).astype(np.float64)
    except ValueError:
        return None
    out[blank] = empty or 0.0
    return out if _fits(out) else None


def _numeric_matrix(rows: list[dict], columns: list[str], labels: int) -> np.ndarray | None:
    """f64 [n, C] of the label and dense columns in one pass, when every cell is a JSON number
    or every cell is DECIMAL text (a label not empty) and all are good; else None."""
    n, c = len(rows), len(columns)
    if not c or not n:
        return np.zeros((n, c), dtype=np.float64)
    get = itemgetter(*columns)
    try:
        table = list(map(get, rows)) if c > 1 else [(get(r),) for r in rows]
    except KeyError:  # a missing column: the column-by-column path names the event
        return None
    cells = list(itertools.chain.from_iterable(table))
    kinds = _types(cells)
    if kinds <= _NUMBER:
        try:
            out = np.array(cells, dtype=np.float64).reshape(n, c)
        except OverflowError:
            return None
        if not _fits(out):
            return None
    elif kinds == {str}:
        text = np.array(cells, dtype=str).reshape(n, c)
        if labels and (text[:, :labels] == "").any():
            return None
        flat = _decimal_cells(text.ravel().tolist(), empty=0.0)
        if flat is None:
            return None
        out = flat.reshape(n, c)
    else:
        return None
    return out if _binary(out[:, :labels]).all() else None


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _fits(x: np.ndarray) -> bool:
    """Every value finite, and finite as float32 too, the dtype the model reads."""
    return bool(np.isfinite(x).all() and (np.abs(x) <= FLOAT32_MAX).all())


def _binary(x: np.ndarray) -> np.ndarray:
    return (x == 0.0) | (x == 1.0)


def _number(cell: Any, empty: float | None) -> float | None:
    """A label or dense cell's value, or None if it is not a finite number."""
    if type(cell) is bool:  # JSON true/false: a number in Python, not in the contract
        return None
    if isinstance(cell, int | float):
        try:
            value = float(cell)
        except OverflowError:
            return None
        return value if math.isfinite(value) else None
    if cell is None or cell == "":
        return empty
    if isinstance(cell, str) and DECIMAL.match(cell):
        value = float(cell)
        return value if math.isfinite(value) else None
    return None


def _show(cell: Any, limit: int = 40) -> str:
    text = json.dumps(cell)
    return text if len(text) <= limit else text[:limit] + "..."


def _bags(
    rows: list[dict], column: str, separator: str | None, encoding: str, bad: dict[int, Refusal]
) -> tuple[np.ndarray, np.ndarray]:
    """(lengths [n] i32, ids [sum] i64) of one sparse column; a refused event's bag is empty."""
    cells = [r.get(column, _MISSING) for r in rows]
    ints = _int_bags(cells)
    if ints is not None:
        return ints
    if _types(cells) == {str}:  # the fast path: text cells, as a CSV file's
        if separator is None:
            lengths = np.array([c != "" for c in cells], dtype=np.int32)
            tokens = [c for c in cells if c != ""]
        else:
            bags = [[t for t in c.split(separator) if t != ""] for c in cells]
            lengths = np.array([len(b) for b in bags], dtype=np.int32)
            tokens = [t for b in bags for t in b]
        ids = _hex_ids(tokens) if encoding == "hex" else None
        if ids is not None:
            return lengths, ids
        try:
            return lengths, encode_tokens(tokens, encoding)
        except TokenError:
            pass  # a hex token that is not hex: find its event below
    lengths = np.zeros(len(cells), dtype=np.int32)
    ids: list[int] = []
    for i, cell in enumerate(cells):
        if cell is _MISSING:
            _refuse(bad, i, "missing_field", f"event {i} has no {column!r}", column)
            continue
        try:
            bag = _bag(cell, separator, encoding)
        except EventError as e:
            _refuse(bad, i, e.reason, f"event {i}: {column}={_show(cell)}: {e.detail}", column)
            continue
        lengths[i] = len(bag)
        ids.extend(bag)
    return lengths, np.array(ids, dtype=np.int64)


def _int_bags(cells: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The fast path for cells that are all integers, or all lists of integers (what the
    replayer sends for the synthetic generator): (lengths, ids), or None for any other mix."""
    kinds = _types(cells)
    if kinds == {int}:
        flat, lengths = cells, np.ones(len(cells), dtype=np.int32)
    elif kinds == {list}:
        flat = list(itertools.chain.from_iterable(cells))
        if flat and _types(flat) != {int}:
            return None
        lengths = np.array([len(c) for c in cells], dtype=np.int32)
    else:
        return None
    try:
        return lengths, np.array(flat, dtype=np.int64)
    except OverflowError:  # outside int64: the slow path names the event
        return None


_HEX_DIGIT = np.full(128, -2, dtype=np.int64)
_HEX_DIGIT[0] = -1  # padding of a token shorter than 16
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_DIGIT[ord(_c)] = _HEX_DIGIT[ord(_c.upper())] = _i


def _hex_matrix(rows: list[dict], spec: FeatureSpec) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{feature: (lengths, ids)} of every single-token hex feature (Criteo's) in one pass, when
    all their cells are text and good; else {} (they go column by column)."""
    hexes = [f for f, s in enumerate(spec.sparse) if s.encoding == "hex" and s.separator is None]
    if not hexes:
        return {}
    cells = [r.get(spec.sparse[f].column, _MISSING) for r in rows for f in hexes]
    if _types(cells) != {str}:
        return {}
    ids = _hex_ids(cells)
    if ids is None:
        return {}
    present = np.array([x != "" for x in cells], dtype=bool).reshape(len(rows), len(hexes))
    ids = ids.reshape(len(rows), len(hexes))
    return {f: (present[:, h].astype(np.int32), ids[present[:, h], h]) for h, f in enumerate(hexes)}


def _hex_ids(tokens: list[str]) -> np.ndarray | None:
    """`hex` ids of tokens, vectorised (rec.contract.features.hex_id's values; "" gives 0), or
    None if one is not 0 to 16 hex digits (the caller then finds and names it)."""
    if not tokens:
        return np.zeros(0, dtype=np.int64)
    if max(map(len, tokens)) > 16:
        return None
    codes = np.array(tokens, dtype="U16").view(np.uint32).reshape(len(tokens), 16)
    if (codes >= 128).any():
        return None
    digits = _HEX_DIGIT[codes]
    if (digits == -2).any():
        return None
    # Digit k of a token of length L is worth 16^(L-1-k): shift it there and OR the digits.
    length = (digits >= 0).sum(axis=1, keepdims=True)
    shift = (4 * (length - 1 - np.arange(16))).clip(min=0).astype(np.uint64)
    value = np.bitwise_or.reduce(digits.clip(min=0).astype(np.uint64) << shift, axis=1)
    return value.view(np.int64)


def _bag(cell: Any, separator: str | None, encoding: str) -> list[int]:
    """The ids of one sparse cell; EventError "bad_sparse" if it has none of the allowed forms."""
    if cell is None:
        return []
    if isinstance(cell, str):
        if separator is None:
            tokens = [cell] if cell else []
        else:
            tokens = [t for t in cell.split(separator) if t]
        return [_token_id(t, encoding) for t in tokens]
    if isinstance(cell, list):
        out = []
        for item in cell:
            if type(item) is int or isinstance(item, str):
                out.extend(_bag(item, None, encoding))
            else:
                raise EventError("bad_sparse", f"a list item of type {type(item).__name__}")
        return out
    if type(cell) is int:
        if not _INT64[0] <= cell < _INT64[1]:
            raise EventError("bad_sparse", "an integer outside int64")
        return [cell]
    raise EventError("bad_sparse", f"a {type(cell).__name__} is not a sparse value")


def _token_id(token: str, encoding: str) -> int:
    if encoding == "hex":
        try:
            return hex_id(token)
        except TokenError as e:
            raise EventError("bad_sparse", str(e)) from None
    try:
        return string_id(token)
    except TokenError as e:  # text with no UTF-8 form (a lone surrogate from a JSON escape)
        raise EventError("bad_sparse", str(e)) from None


__all__ = [
    "DECIMAL",
    "DEFAULT_STREAM",
    "FORMAT",
    "MAX_EVENTS",
    "REASONS",
    "EventError",
    "Events",
    "Refusal",
    "StreamUrl",
    "decode",
    "decode_events",
    "dead_stream",
    "encode",
    "parse_entry",
    "parse_url",
]
