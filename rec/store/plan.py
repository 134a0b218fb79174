"""What a table costs in the store, before anything is written: Redis's own allocations per row.

A partition hash of more than 128 fields (Redis's hash-max-listpack-entries) is a hash table: per
row a dict entry (24 bytes), the field and the value as SDS strings (3-byte header, the bytes, a
NUL), each rounded up to jemalloc's size class, and 8 bytes of bucket array per row times the
table's fill (a power of two at least the entries). Smaller partitions are one listpack: about
the bytes plus 3 per field and per value. tests/store/test_store.py holds the estimate against
a real cluster's used_memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from rec.contract.store import row_bytes

LISTPACK_ENTRIES = 128
LISTPACK_VALUE = 64


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


def table_cost(rows: int, dim: int, dtype: str, partitions: int) -> TableCost:
    value = row_bytes(dim, dtype)
    per_part = -(-rows // partitions)
    digits = len(str(max(rows - 1, 0)))
    if per_part <= LISTPACK_ENTRIES and value <= LISTPACK_VALUE:
        part = jemalloc_class(per_part * (digits + 3 + value + 3) + 7)
        total = partitions * (part + 64)  # the key's dict entry, robj and name
    else:
        buckets = 1 << max(per_part - 1, 1).bit_length()
        per_row = jemalloc_class(24) + _sds(digits) + _sds(value)
        total = rows * per_row + partitions * (buckets * 8 + 128)
    return TableCost(rows, partitions, value, total)


def per_node(total_bytes: int, masters: int, replicas: int) -> int:
    """Bytes each node holds when the copies spread evenly: every master a 1/masters share, each
    of its replicas as much again (nodes = masters * (1 + replicas))."""
    return -(-total_bytes // masters)
