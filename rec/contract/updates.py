"""Contract 3, the update log: trained rows on their way from training to every serving replica.

`rec train --publish URL` appends records to a Redis stream; rec-server (`--updates URL`) reads
the stream from its own cursor and writes the rows into the tables it serves. The log is Redis
Streams (XADD / XREAD): durable (the broker runs with an append-only file), ordered, and
re-readable from any entry id, so a replica that restarts, or a new dense version that starts
from its export's step, replays from where it stands. docs/update_log.md is the prose version;
tests/data/update_record_golden.json holds valid and refused records with their reasons, and
both languages' tests decode every one (row_bytes_golden.json and url_golden.json beside it pin
row sizes and URLs). This docstring is the one description of the fields.

The URL: `redis://HOST:PORT[/STREAM]` (rec.contract.urls, the event stream's rules too); the
stream key defaults to DEFAULT_STREAM. The path names the stream, not a database number (a number
is refused, so `redis://h:6379/0` fails loudly).

One stream entry is one record, every field a string or raw bytes:

    format    "rec.updates/3" (FORMAT) for every record of a ZCH table, "rec.updates/1"
              (FORMAT_V1) for any other; a reader takes all three versions, so logs written
              before version 3 still read ("rec.updates/2", FORMAT_V2: version 3 without `held`)
    run       the run's id: the same for every publisher of one training run
    gen       the publisher's generation: 1 for a fresh run, +1 on every resume. Steps go back on
              a resume (it restarts at its checkpoint); a replica orders records by (gen, step)
    rank      the publishing rank, in [0, world)
    world     the run's world size: a replica's watermark needs a record from every rank
    step      optimizer steps done when the rows were read (the rows are those of that step)
    wall_ns   when that step ended, ns since the Unix epoch
    last      "1" on the last record of this rank's publish at this step, else "0"
    table     the table's name ("" on a record that only advances the watermark: count 0)
    dtype     how the rows are stored: int8, int4, fp16 or fp32 (rec.contract.EMBEDDING_DTYPES)
    dim       the table's embedding dimension, at most MAX_DIM
    count     rows in this record, at most MAX_ROWS (the publisher sends up to 16,384)
    ids       count little-endian int64 row indices into the table, strictly increasing
    rows      count rows of row_bytes(dim, dtype) bytes each, in `ids` order; a row is its codes
              then, for int8/int4, its fp16 scale and fp16 bias (rec.quantize.fused_rows): the
              bytes a full export of that step stores for the row. An int4 row of odd dim is
              refused (row_bytes): its codes are not whole bytes, and FBGEMM neither quantizes
              nor serves such a table, so no export holds one

Version 2 adds a ZCH table's id map changes (rec.zch: slot <-> raw id), each slot's change in
the same record as its row, so a replica applies a slot's new id and its row together:

    evicts    slots whose id leaves, at most MAX_ROWS
    evicted   evicts pairs (slot, raw id), each two little-endian int64, slots strictly
              increasing: the slot held that id and holds none after the record
    admits    slots a new id takes, at most MAX_ROWS
    admitted  admits pairs (slot, raw id), slots strictly increasing: the slot holds that id
              after the record. Every admitted slot is one of `ids`, its row (the fresh row the
              id starts from) in `rows`. A slot both evicted and admitted changes hands

Version 3 (the writer's for every record of a ZCH table, map changes or not) adds the raw id each
row's slot holds, so a reader that keeps a ZCH table by raw id (the embedding store, its follower
and the servers' row caches) needs no map to place a row:

    holds     rows of `ids` whose slot holds an id after the record, at most MAX_ROWS
    held      holds pairs (slot, raw id), slots strictly increasing, each one of `ids`: the id
              the slot holds after the record (its evictions and admissions applied). A row of
              `ids` not in `held` is of a slot holding no id: the table's default row (its last,
              slot == slots) or a free slot, which no id reads. An admitted slot is in `held`
              with its admitted id; a slot evicted and not admitted is not in it

A replica that holds the map checks `held` against it after the record's changes (map_mismatch
when a held slot holds another id or none, or a row's slot holds an id `held` does not give);
one that keys the table by raw id writes each held row under its id, the default row as the
table's default, and deletes each evicted id before writing the record's rows.

A replica writes the rows, then the evictions, then the admissions, all under the lock a forward
pass holds. It refuses the whole record (nothing changed) when a slot is not one of the table's
slots or not in the admitted id's window (rec.zch.windows), when an admitted id is held by another
slot of the table after the record's evictions (or admitted twice in it), or when an eviction
names an id the slot does not hold or an admission a slot still held (rec.update_log.Applier).
A record of its rank's newest (gen, step) whose every change is already in place is one the
publisher sent again after a broker error: its rows are written again, the map left as it is.

A rank's rows at one step are one publish: records with that (gen, step) from that rank, the last
one marked `last`. The ranks own disjoint rows, so a replica's watermark is the smallest
(gen, step) over the ranks' newest complete publishes: every row trained up to it has arrived.

Example:
    >>> rec = UpdateRecord("r1", 1, 0, 1, 7, 0, True, "t0", "fp16", 2, (3,), bytes(4))
    >>> decode(encode(rec)) == rec
    True
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

from rec.contract.io import EMBEDDING_DTYPES
from rec.contract.urls import StreamUrl, parse_stream_url

FORMAT = "rec.updates/3"
FORMAT_V2 = "rec.updates/2"
"""A ZCH table's map changes without `held`: written before version 3, still read."""
FORMAT_V1 = "rec.updates/1"
"""Rows only: what a record of a table that is not ZCH is written as (any reader takes it)."""
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT)
MAX_ROWS = 1 << 20
"""Rows in one record at most (the publisher sends 16,384); a reader refuses more."""
MAX_DIM = 1 << 16
DEFAULT_STREAM = "rec:updates"
_INT_FIELDS = ("gen", "rank", "world", "step", "wall_ns", "dim", "count")
_MAP_FIELDS = ("evicts", "admits")
_HELD_FIELDS = ("holds",)


class UpdateError(ValueError):
    """A record (or an update URL) is malformed; the message names the field at fault."""


UpdateUrl = StreamUrl
"""An update log URL's parts (rec.contract.urls: the event stream's URLs read the same way)."""


def parse_url(url: str) -> UpdateUrl:
    """`redis://HOST:PORT[/STREAM]` -> its parts (stream default DEFAULT_STREAM); UpdateError
    naming what is wrong."""
    return parse_stream_url(url, "update log", DEFAULT_STREAM, UpdateError)


def row_bytes(dim: int, dtype: str) -> int:
    """Bytes of one row of a `dim`-wide table stored as `dtype`: its codes, then for int8/int4
    its fp16 scale and bias (rec.quantize.fused_rows). The one row size of the update log and
    the store (rec.contract.store); UpdateError for a dtype rec does not store or a row whose
    codes are not whole bytes (int4 of odd dim: FBGEMM packs two codes a byte and its TBE
    refuses such a table, so no export or publish ever makes one)."""
    if dtype not in EMBEDDING_DTYPES:
        raise UpdateError(f"dtype {dtype!r} is not one of {list(EMBEDDING_DTYPES)}")
    d = EMBEDDING_DTYPES[dtype]
    if dim < 0 or dim * d.bits % 8:
        raise UpdateError(f"a {dtype} row of dim {dim} is not a whole number of bytes")
    return dim * d.bits // 8 + (4 if d.rowwise else 0)


@dataclass(frozen=True)
class UpdateRecord:
    run: str
    gen: int
    rank: int
    world: int
    step: int
    wall_ns: int
    last: bool
    table: str
    dtype: str
    dim: int
    ids: tuple[int, ...]
    rows: bytes
    evicted: tuple[tuple[int, int], ...] = ()
    """(slot, raw id) pairs: the id leaves the slot (format version 2)."""
    admitted: tuple[tuple[int, int], ...] = ()
    """(slot, raw id) pairs: the id takes the slot, with the slot's row in `ids`/`rows`."""
    held: tuple[tuple[int, int], ...] | None = None
    """(slot, raw id) pairs: the id each row's slot holds after the record (format version 3,
    a ZCH table's); None: the record does not say (versions 1 and 2)."""

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def version(self) -> tuple[int, int]:
        """What orders records of one run: (generation, step)."""
        return (self.gen, self.step)


def _pairs(pairs: tuple[tuple[int, int], ...]) -> bytes:
    return struct.pack(f"<{2 * len(pairs)}q", *(v for pair in pairs for v in pair))


def encode(rec: UpdateRecord) -> dict[str, Any]:
    """The record's stream-entry fields (what XADD takes): version 3 when it says which id each
    row's slot holds (`held`: a ZCH table's), else version 2 when it changes an id map, else
    version 1 (rows alone, readable by any reader)."""
    changes = rec.evicted or rec.admitted
    fields = {
        "format": FORMAT if rec.held is not None else FORMAT_V2 if changes else FORMAT_V1,
        "run": rec.run,
        "gen": str(rec.gen),
        "rank": str(rec.rank),
        "world": str(rec.world),
        "step": str(rec.step),
        "wall_ns": str(rec.wall_ns),
        "last": "1" if rec.last else "0",
        "table": rec.table,
        "dtype": rec.dtype,
        "dim": str(rec.dim),
        "count": str(rec.count),
        "ids": struct.pack(f"<{rec.count}q", *rec.ids),
        "rows": rec.rows,
    }
    if changes or rec.held is not None:
        fields.update(evicts=str(len(rec.evicted)), evicted=_pairs(rec.evicted),
                      admits=str(len(rec.admitted)), admitted=_pairs(rec.admitted))  # fmt: skip
    if rec.held is not None:
        fields.update(holds=str(len(rec.held)), held=_pairs(rec.held))
    return fields


def _text(fields: dict[str, bytes], key: str) -> str:
    if key not in fields:
        raise UpdateError(f'update record: "{key}" is missing')
    try:
        return fields[key].decode()
    except UnicodeDecodeError as e:
        raise UpdateError(f'update record: "{key}" is not text') from e


def decode(fields: dict[Any, Any]) -> UpdateRecord:
    """A stream entry's fields (str or bytes keys and values) -> the checked record."""
    raw = {(k.decode() if isinstance(k, bytes) else k): (v.encode() if isinstance(v, str) else v)
           for k, v in fields.items()}  # fmt: skip
    fmt = _text(raw, "format")
    if fmt not in FORMATS:
        raise UpdateError(f'update record: "format" must be one of {list(FORMATS)}, got {fmt!r}')
    ints: dict[str, int] = {}
    extra = {FORMAT_V1: (), FORMAT_V2: _MAP_FIELDS, FORMAT: _MAP_FIELDS + _HELD_FIELDS}[fmt]
    for key in _INT_FIELDS + extra:
        text = _text(raw, key)
        if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) >= 1 << 63:
            raise UpdateError(
                f'update record: "{key}" must be a non-negative integer, got {text!r}'
            )
        ints[key] = int(text)
    if not 0 <= ints["rank"] < ints["world"]:
        raise UpdateError(f'update record: "rank" {ints["rank"]} is not in [0, {ints["world"]})')
    if ints["gen"] < 1:
        raise UpdateError('update record: "gen" must be at least 1')
    last = _text(raw, "last")
    if last not in ("0", "1"):
        raise UpdateError(f'update record: "last" must be "0" or "1", got {last!r}')
    dtype, table, count = _text(raw, "dtype"), _text(raw, "table"), ints["count"]
    if count > MAX_ROWS:
        raise UpdateError(f'update record: "count" {count} is over {MAX_ROWS} rows')
    if ints["dim"] > MAX_DIM:
        raise UpdateError(f'update record: "dim" {ints["dim"]} is over {MAX_DIM}')
    if dtype not in EMBEDDING_DTYPES:
        raise UpdateError(f'update record: "dtype" must be one of {list(EMBEDDING_DTYPES)}, '
                          f"got {dtype!r}")  # fmt: skip
    if count and not table:
        raise UpdateError('update record: "table" is empty but "count" is not 0')
    for key in _MAP_FIELDS + _HELD_FIELDS:
        if ints.get(key, 0) > MAX_ROWS:
            raise UpdateError(f'update record: "{key}" {ints[key]} is over {MAX_ROWS} slots')
    ids_raw, rows = raw.get("ids", b""), raw.get("rows", b"")
    if len(ids_raw) != 8 * count:
        raise UpdateError(f'update record: "ids" holds {len(ids_raw)} bytes, {count} ids need '
                          f"{8 * count}")  # fmt: skip
    try:  # checked on every record, rows or not: the dtype and dim must name a real row
        want = count * row_bytes(ints["dim"], dtype)
    except UpdateError as e:
        raise UpdateError(f"update record: {e}") from None
    if len(rows) != want:
        raise UpdateError(f'update record: "rows" holds {len(rows)} bytes, {count} {dtype} rows '
                          f"of dim {ints['dim']} need {want}")  # fmt: skip
    ids = struct.unpack(f"<{count}q", ids_raw)
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)) or (ids and ids[0] < 0):
        raise UpdateError('update record: "ids" must be non-negative and strictly increasing')
    evicted = _decode_pairs(raw, "evicted", ints.get("evicts", 0))
    admitted = _decode_pairs(raw, "admitted", ints.get("admits", 0))
    if (evicted or admitted) and not table:
        raise UpdateError('update record: "table" is empty but the record changes an id map')
    rowed = set(ids)
    for slot, _ in admitted:
        if slot not in rowed:
            raise UpdateError(f'update record: "admitted" slot {slot} has no row in "ids": a '
                              "slot's new id comes with its row")  # fmt: skip
    held = None
    if fmt == FORMAT:
        held = _decode_pairs(raw, "held", ints["holds"])
        _check_held(held, rowed, evicted, admitted)
    return UpdateRecord(
        _text(raw, "run"), ints["gen"], ints["rank"], ints["world"], ints["step"],
        ints["wall_ns"], last == "1", table, dtype, ints["dim"], ids, rows, evicted, admitted,
        held,
    )  # fmt: skip


Pairs = tuple[tuple[int, int], ...]


def _check_held(held: Pairs, rowed: set[int], evicted: Pairs, admitted: Pairs) -> None:
    """Version 3's `held` agrees with the record: each held slot has a row, an admitted slot is
    held by its admitted id, a slot only evicted is held by none."""
    holder = dict(held)
    for slot, _ in held:
        if slot not in rowed:
            raise UpdateError(f'update record: "held" slot {slot} has no row in "ids"')
    for slot, raw_id in admitted:
        if holder.get(slot) != raw_id:
            raise UpdateError(f'update record: "held" does not give admitted slot {slot} its '
                              f"id {raw_id}")  # fmt: skip
    taken = {slot for slot, _ in admitted}
    for slot, _ in evicted:
        if slot in holder and slot not in taken:
            raise UpdateError(f'update record: "held" slot {slot} is evicted and not admitted: '
                              "it holds no id after the record")  # fmt: skip


def _decode_pairs(raw: dict[str, bytes], key: str, n: int) -> tuple[tuple[int, int], ...]:
    """`n` (slot, raw id) pairs of field `key`: slots non-negative and strictly increasing."""
    data = raw.get(key, b"")
    if len(data) != 16 * n:
        raise UpdateError(f'update record: "{key}" holds {len(data)} bytes, {n} (slot, id) pairs '
                          f"need {16 * n}")  # fmt: skip
    flat = struct.unpack(f"<{2 * n}q", data)
    slots = flat[0::2]
    if any(b <= a for a, b in zip(slots, slots[1:], strict=False)) or (slots and slots[0] < 0):
        raise UpdateError(f'update record: "{key}" slots must be non-negative and strictly '
                          "increasing")  # fmt: skip
    return tuple(zip(slots, flat[1::2], strict=True))
