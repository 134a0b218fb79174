"""The one error type of the data layer."""

from __future__ import annotations


class DataError(ValueError):
    """Input data that cannot be read: a missing file, an unknown column or a malformed row.

    The message names the file and, for a bad row, its 1-based line (text files) or row
    (Parquet) and the column where it is known, e.g.
    ``data/day_0.tsv: line 17, column I3: 'x1' is not a number``.
    """


def where(path: str, unit: str, number: int, column: str | None = None) -> str:
    """`path: line 17, column I3` — the location prefix every bad-row message starts with."""
    loc = f"{path}: {unit} {number}"
    return f"{loc}, column {column}" if column is not None else loc
