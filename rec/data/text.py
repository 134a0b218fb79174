"""Text files read in blocks of whole lines, and byte-level vectorised field parsing.

A block is raw bytes plus where each line starts; a reader takes the lines it owns as one
buffer and parses all their fields at once with numpy (no Python object per field), which
is what makes the Criteo reader fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

BLOCK_BYTES = 1 << 22
"""Bytes of a text file read at a time (~30k Criteo lines); tests make it tiny."""

_TAB, _NEWLINE, _MINUS, _ZERO = 9, 10, 45, 48
# Byte -> hex digit value; -1 marks padding (NUL), -2 a byte that is not a hex digit.
_HEX = np.full(256, -2, dtype=np.int8)
_HEX[0] = -1
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


@dataclass
class TextBlock:
    """Whole lines of a file: data holds m lines, each ending in a newline (CRLF made LF).

    starts [m + 1]: line i is data[starts[i] : starts[i + 1] - 1].
    """

    data: bytes
    starts: np.ndarray

    def line(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.starts[i + 1] - 1]

    def gather(self, idx: np.ndarray) -> bytes:
        """Lines idx (sorted) as one buffer, each still ending in a newline."""
        if idx.size == len(self.starts) - 1:
            return self.data
        breaks = np.flatnonzero(np.diff(idx) != 1)  # runs of consecutive lines: one slice each
        firsts = np.concatenate([idx[:1], idx[breaks + 1]])
        lasts = np.concatenate([idx[breaks], idx[-1:]])
        s, e = self.starts[firsts], self.starts[lasts + 1]
        return b"".join(self.data[a:b] for a, b in zip(s.tolist(), e.tolist(), strict=True))


def _block(data: bytes) -> TextBlock:
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE)
    return TextBlock(data, np.concatenate([[0], ends + 1]))


def read_lines(path: str, skip: int, header: bool) -> Iterator[tuple[int, TextBlock, int]]:
    """(first row, block, rows in it) of a text file, BLOCK_BYTES at a time, never whole.

    Rows are the lines after the optional header; a last line without a newline counts.
    Blocks that end before row `skip` are only counted.
    """
    with open(path, "rb") as f:
        if header:
            f.readline()
        row, tail = 0, b""
        while True:
            data = f.read(BLOCK_BYTES)
            if not data:
                break
            data = tail + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a block: read on
                tail = data
                continue
            body, tail = data[:cut], data[cut:]
            count = body.count(b"\n")
            if row + count > skip:
                yield row, _block(body), count
            row += count
        if tail:
            yield row, _block(tail + b"\n"), 1


def count_lines(path: str, header: bool, limit: int = 0) -> int:
    """Rows of a text file as `read_lines` yields them, reading it in blocks.

    With a `limit`, reading stops once that many rows are counted (the result is then at
    least `limit`): enough to tell before training whether a file holds a batch.
    """
    newlines, last, size = 0, b"\n", 0
    block_size = 1 << 24 if not limit else 1 << 20
    with open(path, "rb") as f:
        while block := f.read(block_size):
            newlines += block.count(b"\n")
            last, size = block[-1:], size + len(block)
            if limit and newlines - header >= limit:
                return newlines - header
    lines = newlines + (1 if size and last != b"\n" else 0)
    return max(lines - (1 if header else 0), 0)


def split_fields(buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tab-separated lines (each ending in a newline) -> their fields, vectorised.

    Returns (starts [k], ends [k]) byte ranges of all k fields in order, and fields per
    line [n].
    """
    u8 = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero((u8 == _TAB) | (u8 == _NEWLINE))
    starts = np.concatenate([[0], ends[:-1] + 1])
    line_ends = np.flatnonzero(u8[ends] == _NEWLINE)  # which field ends each line
    per_line = np.diff(np.concatenate([[-1], line_ends]))
    return starts, ends, per_line


def field_bytes(buf: bytes, starts: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """Fields as a zero-padded byte matrix [..., width] (longer fields are cut: check lengths)."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    small = np.int32 if len(u8) < 2**31 - 64 else np.int64  # halves the index matrix
    at = starts.astype(small)[..., None] + np.arange(width, dtype=small)
    mat = u8[np.minimum(at, max(len(u8) - 1, 0))]
    mat[at >= ends.astype(small)[..., None]] = 0
    return mat


def parse_ints(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal integer fields -> (int64 values, ok mask); an empty field is 0 and not ok.

    Only [-]digits of up to 18 characters are ok; a caller parses the rest another way.
    """
    lengths = ends - starts
    width = int(min(lengths.max(initial=1), 18))
    mat = field_bytes(buf, starts, ends, width)
    neg = mat[..., 0] == _MINUS
    digit = mat.astype(np.int16) - _ZERO
    used = np.arange(width) < lengths[..., None]
    used[..., 0] &= ~neg
    ok = ((digit >= 0) & (digit <= 9) | ~used).all(axis=-1)
    ok &= (lengths > neg) & (lengths <= 18)
    value = np.zeros(starts.shape, dtype=np.int64)
    for k in range(width):  # Horner's rule over the character columns
        value = np.where(used[..., k], value * 10 + digit[..., k], value)
    return np.where(neg, -value, value), ok


def parse_hex(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hex fields -> (int64 ids, bad mask); up to 16 digits, read as uint64, viewed as int64.

    An empty field gives 0 and is not bad (the caller treats it as an empty bag).
    """
    lengths = ends - starts
    width = int(min(lengths.max(initial=1), 16))
    digits = _HEX[field_bytes(buf, starts, ends, width)]
    bad = (digits == -2).any(axis=-1) | (lengths > 16)
    value = np.zeros(starts.shape, dtype=np.uint64)
    for k in range(width):
        d = digits[..., k]
        value = np.where(d >= 0, value * np.uint64(16) + d.astype(np.uint64), value)
    return value.view(np.int64), bad


def parse_numbers(
    buf: bytes, starts: np.ndarray, ends: np.ndarray, empty: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """Number fields -> (f64 values, bad mask): integers vectorised, anything else by float().

    An empty field is `empty`, or bad if that is None; a non-finite value is bad.
    """
    ints, ok = parse_ints(buf, starts, ends)
    values = ints.astype(np.float64)
    blank = starts == ends
    bad = np.zeros(starts.shape, dtype=bool)
    for i in zip(*np.nonzero(~ok & ~blank), strict=True):  # "1.5", "1e3", " 7": rare
        try:
            values[i] = float(buf[starts[i] : ends[i]])
        except ValueError:
            values[i] = np.nan
    bad = ~np.isfinite(values)
    values[bad] = 0.0
    if empty is None:
        bad |= blank
    values[blank] = 0.0 if empty is None else empty
    return values, bad
