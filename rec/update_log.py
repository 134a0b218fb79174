"""Reading the update log (rec.contract.updates) in Python, and the reference of applying it.

`read_records` is how tests, benchmarks and the demo look into a stream. `ReplicaState` is the
rules a replica follows, written once in Python: rec-server's C++ applier is checked against it.

    - records of one rank are applied in log order; a record whose (gen, step) is older than the
      newest its rank has applied is refused (a watermark going backwards), the same one again
      is applied again (the publisher re-sends after a broker error: a row is its whole value);
    - a record for a table the served model lacks, of the wrong dtype or dim, or with ids outside
      the table, is refused whole and counted, never applied in part;
    - the watermark is the smallest (gen, step) over the run's ranks of their newest complete
      publish (`last`), once every rank has completed one; a new generation (a resume, maybe on
      another number of ranks) starts that count over.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from rec.contract.updates import UpdateError, UpdateRecord, decode, parse_url


def read_records(url: str, start: str = "0", count: int = 1000) -> list[tuple[str, UpdateRecord]]:
    """Every record of the stream at `url` after entry id `start`, as (entry id, record)."""
    import redis

    where = parse_url(url)
    client = redis.Redis(host=where.host, port=where.port)
    out: list[tuple[str, UpdateRecord]] = []
    try:
        while True:
            got = client.xread({where.stream: start}, count=count)
            if not got:
                return out
            for entry_id, fields in got[0][1]:
                start = entry_id.decode()
                out.append((start, decode(fields)))
    finally:
        client.close()


@dataclass(frozen=True)
class ServedTable:
    rows: int
    dim: int
    dtype: str


@dataclass
class ReplicaState:
    """What a replica holds after applying records: each table's changed rows (bytes, as stored)
    and the ranks' progress. `tables`: what the served model has."""

    tables: dict[str, ServedTable]
    export: tuple[int, int] = (0, 0)
    stored: dict[str, ServedTable] = field(default_factory=dict)
    """Tables in the embedding store (rec.contract.store): their records are checked and count
    toward the watermark, but their rows are written to the store (rec.store.follow), not kept."""
    """(gen, step) the served export holds: rows of records up to it are skipped."""
    rows: dict[str, dict[int, bytes]] = field(default_factory=dict)
    rank_version: dict[int, tuple[int, int]] = field(default_factory=dict)
    complete: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # gen, step, wall_ns
    world: int = 0
    refused: Counter = field(default_factory=Counter)
    applied_rows: int = 0

    def apply(self, rec: UpdateRecord) -> str | None:
        """Applies `rec`, or returns why it is refused (and counts the reason)."""
        reason = self._check(rec)
        if reason is not None:
            self.refused[reason.split(":")[0]] += 1
            return reason
        if self.fresh(rec) and rec.table not in self.stored:
            width = len(rec.rows) // rec.count
            table = self.rows.setdefault(rec.table, {})
            for i, row_id in enumerate(rec.ids):
                table[row_id] = rec.rows[i * width : (i + 1) * width]
            self.applied_rows += rec.count
        self.world = rec.world
        self.rank_version[rec.rank] = rec.version
        if self.complete and rec.gen > max(g for g, _, _ in self.complete.values()):
            self.complete.clear()  # a resumed run: its ranks (maybe fewer) start over
        if rec.last:
            self.complete[rec.rank] = (rec.gen, rec.step, rec.wall_ns)
        return None

    def fresh(self, rec: UpdateRecord) -> bool:
        """Whether `rec` (checked) carries rows newer than the served export."""
        return bool(rec.count) and rec.version > self.export

    def _check(self, rec: UpdateRecord) -> str | None:
        seen = self.rank_version.get(rec.rank)
        if seen is not None and rec.version < seen:
            return f"backwards: rank {rec.rank} sent {rec.version} after {seen}"
        if rec.count == 0:
            return None
        served = self.tables.get(rec.table) or self.stored.get(rec.table)
        if served is None:
            return f"unknown table: {rec.table!r} is not in the served model"
        if (rec.dtype, rec.dim) != (served.dtype, served.dim):
            return (f"row format: {rec.table!r} is served as {served.dtype} dim {served.dim}, "
                    f"the record has {rec.dtype} dim {rec.dim}")  # fmt: skip
        if rec.ids[-1] >= served.rows:
            return f"id range: id {rec.ids[-1]} is outside {rec.table!r}'s {served.rows} rows"
        return None

    def watermark(self) -> tuple[int, int, int] | None:
        """(gen, step, wall_ns) up to which every rank's rows are here, or None before then."""
        if not self.world or len(self.complete) < self.world:
            return None
        return min(self.complete.values())


class Applier(ReplicaState):
    """ReplicaState's rules as a server applies them, written once for rec's Triton model
    (serve/triton_python_model.ServedTables) and the store's follower (rec.store.follow); its
    C++ twin is rec-server's EmbeddingTables. Beyond `_check` (backwards, unknown table, row
    format, id range): a record of another run is refused (an export with no run id takes the
    run of the first record it applies), rows of records at or before the export's (gen, step)
    are skipped (the export holds them), and accepted rows go to `write(rec)`. The watermark,
    `mark` (gen, step, wall_ns), starts at the export's (gen, step) and only grows.

    `lock` is held by apply() for a whole record; a reader that must not see a record half
    applied holds it too."""

    def __init__(self, tables: dict[str, ServedTable], export: tuple[int, int], run: str = "",
                 stored: dict[str, ServedTable] | None = None) -> None:  # fmt: skip
        super().__init__(tables=tables, export=export, stored=stored or {})
        self.run = run
        self.lock = threading.Lock()
        self.mark = (*export, 0)
        self._complete_gen = 0

    def write(self, rec: UpdateRecord) -> None:
        """Puts the rows of `rec` (checked, newer than the export) where they are served."""
        raise NotImplementedError

    def apply(self, rec: UpdateRecord) -> tuple[str, str]:
        """Applies `rec` whole or refuses it whole: (outcome, why); outcome is "applied",
        "skipped" or a refusal (rec-server's rec_update_records_total outcomes)."""
        with self.lock:
            if self.run and rec.run != self.run:
                why = f"record of run {rec.run!r}, the served version is of run {self.run!r}"
                outcome = "other_run"
            else:
                why = self._check(rec)
                outcome = why.split(":")[0].replace(" ", "_") if why else "applied"
            if why is not None:
                self.refused[outcome] += 1
                return outcome, why
            if rec.count and not self.fresh(rec):
                outcome = "skipped"
            elif rec.count:
                self.write(rec)
                self.applied_rows += rec.count
            self.run = self.run or rec.run
            self._advance(rec)
            return outcome, ""

    def _advance(self, rec: UpdateRecord) -> None:
        self.rank_version[rec.rank] = rec.version
        if rec.gen > self._complete_gen:  # a resumed run: its ranks (maybe fewer) start over
            self._complete_gen = rec.gen
            self.complete.clear()
        self.world = rec.world
        if not rec.last or rec.gen < self._complete_gen:
            return
        self.complete[rec.rank] = (rec.gen, rec.step, rec.wall_ns)
        low = self.watermark()  # the oldest complete publish, once every rank has one
        if low is not None and low[:2] > self.mark[:2]:
            self.mark = low


def decode_or_reason(fields: dict) -> UpdateRecord | str:
    try:
        return decode(fields)
    except UpdateError as e:
        return str(e)


def write_rows(buffer, place: dict, ids, rows: bytes) -> None:
    """Writes log rows into a served model's storage buffer (a uint8 torch tensor) at rec.json's
    `place` for their table ("updates.tables.<name>"): the Python twin of rec-server's
    EmbeddingTables::Apply, for rec's Triton model and the tests."""
    import torch

    n = len(ids)
    if n == 0:
        return
    data = torch.frombuffer(bytearray(rows), dtype=torch.uint8).view(n, -1)
    if place["scale_bias"] == "first":  # FBGEMM keeps scale and bias before the codes
        data = torch.cat([data[:, -4:], data[:, :-4]], dim=1)
    width = data.shape[1]
    starts = place["offset"] + torch.tensor(ids, dtype=torch.int64) * place["row_stride"]
    index = (starts[:, None] + torch.arange(width)).flatten()
    buffer.index_put_((index,), data.flatten())
