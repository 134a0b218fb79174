"""The Criteo TSV reader (the Terabyte / Kaggle display-advertising format).

One sample per line, tab-separated: the label, 13 integer features, 26 categorical features
as hex strings. Any field may be empty: an empty integer reads as 0, an empty categorical as
an empty bag (length 0). Dense values become log1p(max(x, 0)); hex strings become int64 ids.
A model with T > 1 tasks reads T leading label columns (then 13 + 26 as usual).

Example line (label 1, I1=5, I2 empty, ..., C1=68fd1e64, C2 empty, ...):
    1<TAB>5<TAB><TAB>...<TAB>68fd1e64<TAB><TAB>...
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rec.config import RecConfig
from rec.data.errors import where
from rec.data.files import FileSource, build_rows
from rec.data.source import Rows
from rec.data.text import (
    TextBlock,
    count_lines,
    parse_hex,
    parse_numbers,
    read_lines,
    split_fields,
)
from rec.features import check_criteo_shape
from rec.features import criteo_columns as _criteo_columns

NUM_DENSE = 13
NUM_SPARSE = 26


def criteo_columns(num_tasks: int) -> list[str]:
    """Column names used in messages: label (or label_0, ...), I1..I13, C1..C26."""
    labels, dense, sparse = _criteo_columns(num_tasks)
    return labels + dense + sparse


class CriteoSource(FileSource):
    """A split of Criteo TSV files (data.source: criteo_tsv)."""

    def __init__(self, cfg: RecConfig, split: str, raw_dense: bool = False) -> None:
        check_criteo_shape(cfg)
        super().__init__(cfg, split, raw_dense)
        self.columns = criteo_columns(self.num_tasks)

    def _check_file(self, path: str) -> None:
        pass  # no header: every line is checked when it is parsed

    def _count_rows(self, path: str, limit: int = 0) -> int:
        return count_lines(path, header=False, limit=limit)

    def _blocks(self, path: str, skip: int) -> Iterator[tuple[int, TextBlock, int]]:
        return read_lines(path, skip, header=False)

    def _parse(
        self, path: str, block: TextBlock, idx: np.ndarray, row0: int
    ) -> tuple[Rows, dict[int, str]]:
        """Parses lines `idx` of a block, all fields at once at the byte level."""
        t = self.num_tasks
        width = t + NUM_DENSE + NUM_SPARSE
        buf = block.gather(idx)
        starts, ends, per_line = split_fields(buf)
        bad: dict[int, str] = {}
        for i in np.flatnonzero(per_line != width).tolist():
            bad[i] = (
                f"{where(path, 'line', row0 + int(idx[i]) + 1)}: {per_line[i]} fields, expected "
                f"{width} (label{'s' if t > 1 else ''}, 13 integer, 26 categorical; tab-separated)"
            )
        ok = np.flatnonzero(per_line == width)
        keep = np.repeat(per_line == width, per_line)
        starts, ends = starts[keep].reshape(-1, width), ends[keep].reshape(-1, width)
        labels, bad_label = parse_numbers(buf, starts[:, :t], ends[:, :t], empty=None)
        bad_label |= (labels < 0) | (labels > 1)
        dense, bad_dense = parse_numbers(buf, starts[:, t : t + 13], ends[:, t : t + 13], 0.0)
        cats = slice(t + NUM_DENSE, width)
        ids, bad_hex = parse_hex(buf, starts[:, cats], ends[:, cats])
        present = ends[:, cats] > starts[:, cats]
        bad_cell = np.concatenate([bad_label, bad_dense, bad_hex], axis=1)
        for j in np.flatnonzero(bad_cell.any(axis=1)).tolist():
            col = int(np.argmax(bad_cell[j]))
            what = "a label in [0, 1]" if col < t else "a number" if col < t + 13 else "hex"
            cell = buf[starts[j, col] : ends[j, col]].decode(errors="replace")
            bad[int(ok[j])] = (
                f"{where(path, 'line', row0 + int(idx[ok[j]]) + 1, self.columns[col])}: "
                f"{cell!r} is not {what}"
            )
        good = ~bad_cell.any(axis=1)
        # ids[present] in row-major order is already batch-major: sample, then feature.
        return build_rows(labels, dense, present, ids[present], good), bad
