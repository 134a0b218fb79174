"""`rec predict --group-by`: a file's rows sharing a request id as requests of one context each.

A ranking service sends one user and the candidates to rank; a file of such traffic holds one
row per (request, candidate), the request's id in a column. Rows sharing an id make one request
(the groups may interleave in the file), split in parts of at most max_batch_size candidates;
each part goes as the context form (ContextRows: the context's columns once) or, to compare,
as the flat rows themselves. The context columns (rec.json's context section) must hold the same
value on every row of a request, since the request carries them once: a row that differs is
refused, naming the file, line, column, request id and both values.
"""

from __future__ import annotations

import numpy as np

from rec.contract.context import ContextSplit
from rec.data.raw import RawRows
from rec.features import FeatureSpec
from rec.serve.repository import ServeError


class InputError(ServeError):
    """A row of the input file does not match the model's features."""


def group_rows(ids: list[str]) -> list[tuple[str, np.ndarray]]:
    """(id, its rows in file order) per distinct id, in the order ids first appear.

    Example:
        >>> [(i, r.tolist()) for i, r in group_rows(["a", "b", "a", "c", "b"])]
        [('a', [0, 2]), ('b', [1, 4]), ('c', [3])]
    """
    rows: dict[str, list[int]] = {}
    for i, key in enumerate(ids):
        rows.setdefault(key, []).append(i)
    return [(key, np.asarray(index, dtype=np.int64)) for key, index in rows.items()]


def parts(groups: list[tuple[str, np.ndarray]], limit: int) -> list[np.ndarray]:
    """Each group's rows in consecutive parts of at most `limit` (0: no limit), one request
    each.

    Example:
        >>> [p.tolist() for p in parts([("a", np.array([0, 2, 5])), ("b", np.array([1]))], 2)]
        [[0, 2], [5], [1]]
    """
    out = []
    for _, index in groups:
        size = limit if limit > 0 else max(len(index), 1)
        out += [index[lo : lo + size] for lo in range(0, len(index), size)]
    return out


def check_ids(raw: RawRows, column: str, path: object) -> list[str]:
    """The request id of every row; an empty one is refused (it names no request)."""
    ids = raw.extra[column]
    for i, key in enumerate(ids):
        if key == "":
            where = f"{path}: {raw.unit} {raw.numbers[i]}, column {column}"
            raise InputError(f"{where}: empty, expected a request id (--group-by {column})")
    return ids


def _bags(raw: RawRows, features: tuple[int, ...]) -> list[tuple[tuple[str, ...], ...]]:
    """Each row's tokens of these sparse features, as tuples (one per feature)."""
    flat = raw.lengths.reshape(-1).astype(np.int64)
    starts = (np.cumsum(flat) - flat).reshape(raw.lengths.shape)
    return [
        tuple(tuple(raw.tokens[starts[r, f] : starts[r, f] + raw.lengths[r, f]]) for f in features)
        for r in range(len(raw))
    ]


def check_context(
    raw: RawRows,
    spec: FeatureSpec,
    split: ContextSplit,
    groups: list[tuple[str, np.ndarray]],
    column: str,
    path: object,
) -> None:
    """Refuses the first row (in file order) whose context cell differs from its request's
    first row: the request carries the context once, so it would be scored with another's."""
    dense = raw.dense[:, list(split.dense)]
    bags = _bags(raw, split.sparse)
    first = np.empty(len(raw), dtype=np.int64)  # each row's request's first row
    for _, index in groups:
        first[index] = index[0]
    differs = np.flatnonzero(
        (dense != dense[first]).any(axis=1) | [bags[r] != bags[first[r]] for r in range(len(raw))]
    )
    if differs.size == 0:
        return
    row = int(differs[0])
    head = int(first[row])
    cells = [(spec.dense[c].column, str(dense[row, j]), str(dense[head, j]))
             for j, c in enumerate(split.dense)]  # fmt: skip
    cells += [(spec.sparse[c].column, repr(list(bags[row][j])), repr(list(bags[head][j])))
              for j, c in enumerate(split.sparse)]  # fmt: skip
    name, here, there = next(cell for cell in cells if cell[1] != cell[2])
    key = raw.extra[column][row]
    raise InputError(
        f"{path}: {raw.unit} {raw.numbers[row]}, column {name}: request {key!r} (--group-by "
        f"{column}) has {here} here but {there} on {raw.unit} {raw.numbers[head]}; a context "
        "feature (rec.json's context) must be the same on every row of a request"
    )
