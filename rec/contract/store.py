"""Contract 4, the embedding store: tables that live in a Redis Cluster instead of the model.

`rec export RUN --store URL` writes the chosen tables there; rec.json's `store` section (below)
tells a server where, and the server looks rows up through its own cache. docs/store.md is the
prose version; tests/data/store_key_golden.json holds keys and tests/data/url_golden.json URLs
(valid and refused, with reasons) that both languages' tests check.

The URL: `redis://HOST:PORT[,HOST:PORT...]`, any nodes of the cluster (a client learns the rest
from them).

Layout. A table's rows are split into `partitions` by `row % partitions`; partition p of table T
of the export with key prefix P is one Redis hash,

    key    "{P:T:p}"     the braces make the whole key the hash tag: a partition lives on one
                         node, and one request per partition fetches any of its rows
    field  the row index in decimal ASCII ("0", "17", ...)
    value  the row's bytes as the update log sends them (rec.contract.updates): its codes, then
           for int8/int4 its fp16 scale and fp16 bias; row_bytes(dim, dtype) bytes

A model asks for rows by key, `table << TABLE_SHIFT | row` (store_key), the table counted in
the sorted order of the stored tables' names (store_order). And one hash "{P}:meta" says what
the export wrote (format, run, step, tables) once every row is in: a prefix with no meta is an
unfinished export. P is "rec:MODEL:VERSION:RUN8" (the model's name and version in the
repository, 8 hex digits naming the run), so a new version never writes over the one being
served.

rec.json:

    "store": {"format": "rec.store/1", "url": URL, "prefix": P,
              "tables": {T: {"rows": R, "dim": D, "dtype": "int8", "row_bytes": B,
                             "partitions": N}}}

Format rec.store/2: a ZCH table (ids: zch; rec.zch) keyed by raw id, `"keys": "raw_id"` in its
entry (a table without `keys` is keyed by row, as in /1; an export with no raw-keyed table is
still written as /1). Such a table's partition hashes hold

    field  the raw id in signed decimal ASCII ("-7", "9223372036854775807"), in partition
           raw_id_partition(id, partitions) = id mod partitions (non-negative): one field per
           id the table's map admitted at export, its slot's row as value
    field  "_" (MARKER_FIELD), empty, in every partition: Redis keeps no empty hash, and an
           HMGET cannot tell a missing hash from missing fields, so a reader asks for it too
    field  "default" (DEFAULT_FIELD), in partition 0 only: the table's default row (its last
           row, slots), stored once; an id the store lacks reads it

and a model asks for its rows by (table, raw id), so a rec.store/2 model's store_ids returns
int64 [U, 2] (table index, id) pairs (id: the row of a row-keyed table), sorted, distinct. The
served model holds no id map for a raw-keyed table: the store is the map.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rec.contract.io import EMBEDDING_DTYPES
from rec.contract.updates import UpdateError, row_bytes  # a stored row is a log row

FORMAT = "rec.store/1"
FORMAT_RAW_IDS = "rec.store/2"
"""An export with a table keyed by raw id (a ZCH table's; see above)."""
FORMATS = (FORMAT, FORMAT_RAW_IDS)
RAW_ID = "raw_id"
"""A stored table's `keys` when its rows are keyed by raw id."""
DEFAULT_FIELD = "default"
MARKER_FIELD = "_"
TABLE_SHIFT = 40
"""A store key is table << TABLE_SHIFT | row: rows under 2^40, table indices under 2^23."""
MAX_TABLES = 1 << (63 - TABLE_SHIFT)
MAX_PARTITIONS = 1 << 14
"""As many as the cluster has hash slots: more could not spread any further."""
_NODE = re.compile(r"^(?P<host>[^/:?#,\s]+):(?P<port>\d{1,5})$")


class StoreError(ValueError):
    pass


@dataclass(frozen=True)
class StoreUrl:
    nodes: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        return "redis://" + ",".join(f"{h}:{p}" for h, p in self.nodes)


def parse_store_url(url: str) -> StoreUrl:
    """`redis://HOST:PORT[,HOST:PORT...]`, or a StoreError naming what is wrong."""
    if not isinstance(url, str) or not url.startswith("redis://"):
        raise StoreError(f"store URL {url!r}: want redis://HOST:PORT[,HOST:PORT...]")
    nodes = []
    for part in url[len("redis://") :].split(","):
        m = _NODE.match(part)
        if not m or not 0 < int(m.group("port")) < 65536:
            raise StoreError(f"store URL {url!r}: {part!r} is not HOST:PORT (1-65535); a path or "
                             "database number is not part of a cluster URL")  # fmt: skip
        nodes.append((m.group("host"), int(m.group("port"))))
    return StoreUrl(tuple(nodes))


def store_key(table: int, row: int) -> int:
    """The key a model asks the store for: `table` (its index in store_order) << TABLE_SHIFT |
    `row`; a StoreError if either does not fit."""
    if not 0 <= table < MAX_TABLES:
        raise StoreError(f"store key: table index {table} is not in [0, {MAX_TABLES})")
    if not 0 <= row < 1 << TABLE_SHIFT:
        raise StoreError(f"store key: row {row} is not in [0, 2^{TABLE_SHIFT})")
    return table << TABLE_SHIFT | row


def split_key(key: int) -> tuple[int, int]:
    """store_key's inverse: (table index, row)."""
    if key < 0:
        raise StoreError(f"store key {key} is negative")
    return key >> TABLE_SHIFT, key & ((1 << TABLE_SHIFT) - 1)


def store_order(section: dict[str, Any]) -> list[str]:
    """The stored tables in the order a store key's table index counts them: sorted by name
    (by code point: what a C++ std::map of the names gives too)."""
    return sorted(section["tables"])


def raw_id_partition(raw_id: int, partitions: int) -> int:
    """The partition of a raw-keyed table's id: id mod partitions, non-negative."""
    return raw_id % partitions


def is_raw_keyed(table: dict[str, Any]) -> bool:
    """Whether a store section's table entry is keyed by raw id (a ZCH table's)."""
    return table.get("keys") == RAW_ID


def section_format(tables: dict[str, dict[str, Any]]) -> str:
    """rec.store/2 when a table is keyed by raw id, else rec.store/1 (what older readers read)."""
    return FORMAT_RAW_IDS if any(map(is_raw_keyed, tables.values())) else FORMAT


def prefix(model: str, version: int, run: str) -> str:
    return f"rec:{model}:{version}:{run[:8]}"


def partition_key(prefix_: str, table: str, partition: int) -> str:
    return "{" + f"{prefix_}:{table}:{partition}" + "}"


def meta_key(prefix_: str) -> str:
    return "{" + prefix_ + "}:meta"


def section(url: str, prefix_: str, tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """rec.json's `store` section, checked."""
    out = {"format": section_format(tables), "url": str(parse_store_url(url)), "prefix": prefix_,
           "tables": tables}  # fmt: skip
    check_section(out)
    return out


def check_section(data: Any, source: str = "rec.json") -> None:
    """A StoreError naming the first field of a `store` section that is wrong."""
    if not isinstance(data, dict):
        raise StoreError(f"{source}: store must be an object")
    if data.get("format") not in FORMATS:
        raise StoreError(f"{source}: store.format {data.get('format')!r}, want one of {FORMATS}")
    parse_store_url(data.get("url"))
    if not isinstance(data.get("prefix"), str) or not data["prefix"]:
        raise StoreError(f"{source}: store.prefix must be a non-empty string")
    tables = data.get("tables")
    if not isinstance(tables, dict) or not tables:
        raise StoreError(f"{source}: store.tables must name at least one table")
    for name, t in tables.items():
        where = f"{source}: store.tables.{name}"
        if not isinstance(t, dict):
            raise StoreError(f"{where} must be an object")
        for key, low, high in (("rows", 1, 1 << 40), ("dim", 1, 1 << 16),
                               ("partitions", 1, MAX_PARTITIONS)):  # fmt: skip
            v = t.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise StoreError(f"{where}.{key} must be an integer in [{low}, {high}], got {v!r}")
        if t.get("dtype") not in EMBEDDING_DTYPES:
            raise StoreError(f"{where}.dtype {t.get('dtype')!r} is not one of "
                             f"{sorted(EMBEDDING_DTYPES)}")  # fmt: skip
        try:
            want = row_bytes(t["dim"], t["dtype"])
        except UpdateError as e:
            raise StoreError(f"{where}: {e}") from None
        if t.get("row_bytes") != want:
            raise StoreError(f"{where}.row_bytes {t.get('row_bytes')!r}, want {want} for dim "
                             f"{t['dim']} {t['dtype']}")  # fmt: skip
        if t.get("keys", "row") not in ("row", RAW_ID):
            raise StoreError(f"{where}.keys {t['keys']!r}: want 'row' or {RAW_ID!r}")
        if is_raw_keyed(t) and t.get("slots") != t["rows"] - 1:
            raise StoreError(f"{where}.slots {t.get('slots')!r}, want {t['rows'] - 1} (rows - 1: "
                             "the last row is the default row)")  # fmt: skip
    if data["format"] != section_format(tables):
        raise StoreError(f"{source}: store.format {data['format']!r}, want "
                         f"{section_format(tables)!r} for these tables (rec.store/2: a table "
                         "keyed by raw id)")  # fmt: skip
