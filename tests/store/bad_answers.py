"""The store's bad answers both servers must refuse by name (tests/serve_cpp/test_store.py,
tests/serve_triton/test_store.py): for one stored row, how to break it and what the error says."""

from __future__ import annotations

from collections.abc import Callable


def bad_answers(client, hash_key: str, table: str, row: int) -> dict[str, tuple[Callable, str]]:
    """fault -> (a function that makes the store answer so, a part of the message naming it).
    `client` is a redis-py cluster client; `row` of `table` lives in partition hash `hash_key`,
    which the caller saves (HGETALL) and puts back after each fault."""
    good = client.hget(hash_key, str(row))
    return {
        "row": (lambda: client.hdel(hash_key, str(row)),
                f"row {row} of table '{table}' is missing: not in partition hash '{hash_key}'"),
        # Named by the first of its rows the request reads: maybe another than `row`.
        "partition": (lambda: client.delete(hash_key),
                      f"of table '{table}' is missing: partition hash '{hash_key}' does not "
                      "exist"),
        "size": (lambda: client.hset(hash_key, str(row), good[:-1]),
                 f"row {row} of table '{table}' in partition hash '{hash_key}' has "
                 f"{len(good) - 1} bytes, want {len(good)}"),
    }  # fmt: skip
