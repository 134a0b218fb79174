"""What a table costs in the store, before anything is written: Redis's own allocations per row.

A partition hash of more than 128 fields (Redis's hash-max-listpack-entries) is a hash table: per
row a dict entry (24 bytes), the field and the value as SDS strings (3-byte header, the bytes, a
NUL), each rounded up to jemalloc's size class, and 8 bytes of bucket array per row times the
table's fill (a power of two at least the entries). Smaller partitions are one listpack: about
the bytes plus 3 per field and per value. tests/store/test_store_export.py holds the estimate
against a real cluster's used_memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rec.contract.store import RAW_ID, is_raw_keyed, row_bytes

LISTPACK_ENTRIES = 128
LISTPACK_VALUE = 64
ENTRY_OVERHEAD = 128
"""What rec-server's row cache counts per row beyond its bytes (cpp/src/store/row_cache.h); the
Python RowCache (rec.store.reader) counts the same."""


def jemalloc_class(size: int) -> int:
    """The size class jemalloc serves `size` bytes from (4 classes per doubling above 64)."""
    if size <= 8:
        return 8
    if size <= 128:
        return (size + 15) // 16 * 16
    step = 1 << (size - 1).bit_length() - 3  # a quarter of the power of two below
    return (size + step - 1) // step * step


def _sds(n: int) -> int:
    return jemalloc_class(n + 4 if n < 256 else n + 6)


@dataclass(frozen=True)
class TableCost:
    rows: int
    partitions: int
    row_bytes: int
    bytes: int
    """Redis memory for one copy of the table (one master; each replica holds as much again)."""


def table_cost(rows: int, dim: int, dtype: str, partitions: int,
               raw_ids: bool = False) -> TableCost:  # fmt: skip
    """`raw_ids`: a ZCH table keyed by raw id (rec.store/2): at most `rows` fields (the admitted
    ids and the default row), each as wide as an int64's longest decimal, the bound."""
    value = row_bytes(dim, dtype)
    per_part = -(-rows // partitions)
    digits = 20 if raw_ids else len(str(max(rows - 1, 0)))
    if per_part <= LISTPACK_ENTRIES and value <= LISTPACK_VALUE:
        part = jemalloc_class(per_part * (digits + 3 + value + 3) + 7)
        total = partitions * (part + 64)  # the key's dict entry, robj and name
    else:
        buckets = 1 << max(per_part - 1, 1).bit_length()
        per_row = jemalloc_class(24) + _sds(digits) + _sds(value)
        total = rows * per_row + partitions * (buckets * 8 + 128)
    return TableCost(rows, partitions, value, total)


def per_node(total_bytes: int, masters: int, replicas: int = 0) -> int:
    """Bytes each node holds when the copies spread evenly: every master a 1/masters share, each
    of its replicas as much again (nodes = masters * (1 + replicas), so `replicas` does not
    change a node's share)."""
    return -(-total_bytes // masters)


def chosen_tables(cfg, dtypes: dict[str, str]) -> dict[str, dict]:
    """rec.json's store.tables for the tables export.store sends to the store: by name, or every
    table whose stored size is export.store.min_bytes or more."""
    from rec.contract import EMBEDDING_DTYPES

    sc = cfg.export.store
    out = {}
    for t in cfg.tables:
        stored = t.rows * EMBEDDING_DTYPES[dtypes[t.name]].bytes_per_row(t.dim)
        if (t.name in sc.tables) if sc.tables else stored >= sc.min_bytes:
            out[t.name] = {
                "rows": t.rows,
                "dim": t.dim,
                "dtype": dtypes[t.name],
                "row_bytes": row_bytes(t.dim, dtypes[t.name]),
                "partitions": sc.table_partitions.get(t.name, sc.partitions),
            }
            if t.zch is not None:  # keyed by raw id (rec.store/2): the store is its id map
                out[t.name].update(keys=RAW_ID, slots=t.zch.slots)
    return out


def _harmonic(n: float, alpha: float) -> float:
    """sum_{k=1..n} k^-alpha, by Euler-Maclaurin (exact enough for a plan)."""
    if n <= 0:
        return 0.0
    integral = math.log(n) if abs(alpha - 1.0) < 1e-9 else (n ** (1 - alpha) - 1) / (1 - alpha)
    return integral + 0.5 * (1 + n**-alpha) + alpha / 12 * (1 - n ** (-alpha - 1))


def rows_for_hit_rate(rows: int, alpha: float, hit_rate: float) -> int:
    """The fewest most-frequent rows that draw `hit_rate` of a Zipf(alpha) table's lookups: what
    a cache that kept exactly those would need. rec-server's CLOCK cache keeps a little worse, so
    this is the smallest cache that could reach the rate."""
    total = _harmonic(rows, alpha)
    lo, hi = 0, rows
    while lo < hi:
        mid = (lo + hi) // 2
        if _harmonic(mid, alpha) / total >= hit_rate:
            hi = mid
        else:
            lo = mid + 1
    return lo


def store_plan(cfg, dtypes: dict[str, str], masters: int, replicas: int, hit_rate: float,
               alpha: float) -> dict:  # fmt: skip
    """What export.store would put in a cluster of `masters` masters with `replicas` replicas
    each: per table and in all, Redis memory per copy, per master and per node, and the cache
    a replica needs for `hit_rate` of lookups if each table's ids are Zipf(alpha)."""
    tables = chosen_tables(cfg, dtypes)
    out_tables, total, cache = {}, 0, 0
    for name, t in tables.items():
        cost = table_cost(t["rows"], t["dim"], t["dtype"], t["partitions"], is_raw_keyed(t))
        hot = rows_for_hit_rate(t["rows"], alpha, hit_rate)
        out_tables[name] = {**t, "store_bytes_per_copy": cost.bytes, "cache_rows": hot,
                            "cache_bytes": hot * (t["row_bytes"] + ENTRY_OVERHEAD)}  # fmt: skip
        total += cost.bytes
        cache += out_tables[name]["cache_bytes"]
    share = per_node(total, masters, replicas)
    return {"masters": masters, "replicas": replicas, "nodes": masters * (1 + replicas),
            "tables": out_tables, "store_bytes_per_copy": total, "bytes_per_node": share,
            "store_bytes_all_copies": total * (1 + replicas),
            "cache": {"hit_rate": hit_rate, "zipf_alpha": alpha, "bytes": cache}}  # fmt: skip


def format_store_plan(plan: dict) -> str:
    gb = 1e9
    lines = [f"embedding store: {len(plan['tables'])} tables on {plan['masters']} masters x "
             f"{1 + plan['replicas']} copies ({plan['nodes']} nodes)"]  # fmt: skip
    for name, t in plan["tables"].items():
        lines.append(f"  {name}: {t['rows']} rows {t['dtype']} dim {t['dim']}, "
                     f"{t['partitions']} partitions, {t['store_bytes_per_copy'] / gb:.2f} GB per "
                     f"copy; cache {t['cache_rows']} rows")  # fmt: skip
    lines.append(f"  Redis memory: {plan['store_bytes_per_copy'] / gb:.2f} GB per copy, "
                 f"{plan['bytes_per_node'] / gb:.2f} GB per node, "
                 f"{plan['store_bytes_all_copies'] / gb:.2f} GB in all")  # fmt: skip
    c = plan["cache"]
    lines.append(
        f"  row cache per replica for {c['hit_rate']:.0%} hits if ids are "
        f"Zipf({c['zipf_alpha']}): {c['bytes'] / 1e6:.1f} MB "
        "(rec-server --store-cache-bytes; the most frequent rows, so a lower bound)"
    )
    return "\n".join(lines)
