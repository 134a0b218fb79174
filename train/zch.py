"""Training with collision-free (ZCH) tables: remap, sightings, admission rounds, fresh rows.

Every rank holds every ZCH table's id map (rec.zch.IdMap), whole. A training batch's ids are
remapped through it as the data path makes the batch (`remap_train`), and the rank counts what
it saw: the ids that read the default row and the hits of each slot. Every `every_steps` steps,
at a step where the train pipeline has drained (Trainer._next_boundary), the ranks run a round
(`round`): they gather their sightings (one collective), every rank admits and evicts the same ids
(IdMap.admit is deterministic), and the rank(s) holding an admitted slot's row reset it to a
fresh draw of the table's initial distribution, with its fused optimizer state at zero. A batch
remapped before a round is trained before it, so no slot trains a sample of the id it held
before.

Sightings live only in memory, so a checkpoint leaves none behind: before each checkpoint (and
so at every stop: training.steps, the end of the data or of a stream, SIGTERM) every table that
has not had its round at that step has one (`round(..., flush=True)`). A run shorter than
every_steps still admits what it saw, and a resume continues as the uninterrupted run would
have: both ran a round at the checkpoint's step. Only a crash loses the sightings since the
last checkpoint, with the training of the batches they came from (a resume trains them again).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

import rec.ops  # noqa: F401  (rec::zch_remap; a clear ImportError naming the build when missing)
from rec.config import RecConfig, TableConfig
from rec.zch import Changes, IdMap

SUMMARY_EVERY_ROUNDS = 10
"""Rounds between two summary lines in the training log (and at every evaluation)."""
MAP_BYTES_PER_SLOT = 8 + 1 + 8 + 8 + 8 + 24
"""keys, used, counts, last_step, last_seen, and a candidate's id, count and round."""

# A table's weight in dmp.state_dict(): "...embedding_bags.<table>.weight" (pooled) or
# "...embeddings.<table>.weight" (a sequence table).
_WEIGHT_KEY = re.compile(r"\.(?:embedding_bags|embeddings)\.([^.]+)\.weight$")


@dataclass
class _Sightings:
    """This rank's sightings of every ZCH table since their last rounds, a chunk per batch."""

    unseen: list[torch.Tensor] = field(default_factory=list)  # raw ids that read a default row
    unseen_table: list[torch.Tensor] = field(default_factory=list)  # their table's index
    hits: list[torch.Tensor] = field(default_factory=list)  # slots read, in the flat map
    hit_steps: list[torch.Tensor] = field(default_factory=list)  # the step of each hit


@dataclass
class _Totals:
    """A table's counts since the last summary line."""

    admitted: int = 0
    evicted: int = 0
    default_reads: int = 0  # summed over ranks


class ZchTables:
    """The id maps of a run's ZCH tables and this rank's sightings of them.

    Args:
        cfg: the run's config; its ZCH tables are those with `ids: {zch: ...}`.
        keys: the sparse features in the batch's order (cfg.features.sparse).
    """

    def __init__(self, cfg: RecConfig, keys: list[str]) -> None:
        self.cfg = cfg
        self.tables: dict[str, TableConfig] = {t.name: t for t in cfg.tables if t.zch}
        self.maps = {name: IdMap(t.zch) for name, t in self.tables.items()}  # type: ignore[arg-type]
        # Every map's keys and used are views into one flat pair (table i's slots from base[i]):
        # the sightings name a slot of the flat map. Admission and checkpoint loads write the
        # views in place, so the op's lists of views below always read the current maps.
        slots = [m.slots for m in self.maps.values()]
        self.base = torch.tensor([0, *np.cumsum(slots)[:-1].tolist()], dtype=torch.int64)
        self.slots = torch.tensor(slots, dtype=torch.int64)
        self.flat_keys = torch.zeros(sum(slots), dtype=torch.int64)
        self.flat_used = torch.zeros(sum(slots), dtype=torch.bool)
        for i, m in enumerate(self.maps.values()):
            at = int(self.base[i])
            m.keys, m.used = self.flat_keys[at : at + m.slots], self.flat_used[at : at + m.slots]
        owner, index = cfg.feature_to_table(), {n: i for i, n in enumerate(self.maps)}
        self.is_zch = torch.tensor([owner[f] in self.maps for f in keys])
        self._keys = [m.keys for m in self.maps.values()]
        self._used = [m.used for m in self.maps.values()]
        self._probes = [m.cfg.probes for m in self.maps.values()]
        self._table_of = [index.get(owner[f], -1) for f in keys]  # -1: a modulo feature
        self.feature_table = torch.tensor([index[owner[f]] for f in keys if owner[f] in index],
                                          dtype=torch.int64)  # fmt: skip
        self.num_features = len(keys)
        self.seen = _Sightings()
        self.totals = {name: _Totals() for name in self.maps}
        self.step = 0  # the training step of the last batch remapped by remap_train
        self._views: dict[str, list[tuple[torch.Tensor, int, int]]] | None = None

    @staticmethod
    def of(cfg: RecConfig, keys: list[str]) -> ZchTables | None:
        """The run's ZCH tables, or None when it has none."""
        return ZchTables(cfg, keys) if any(t.zch for t in cfg.tables) else None

    # ---- the data path ----------------------------------------------------------------------
    def remap_train(self, lengths_fm: torch.Tensor, raw: torch.Tensor, rows: torch.Tensor):
        """`remap` for the next training step's batch, counting its sightings."""
        self.step += 1
        return self.remap(lengths_fm, raw, rows, count=True)

    def remap(self, lengths_fm: torch.Tensor, raw: torch.Tensor, rows: torch.Tensor,
              count: bool = False) -> torch.Tensor:  # fmt: skip
        """`rows` (ids mapped by modulo, feature-major) with each ZCH feature's ids replaced
        by their rows in the table's map: its slot, or the default row. The same rows as
        rec.zch.lookup per table: rec's op rec::zch_remap (cpp/ops/zch.cpp, what the served
        models call), one call for all features (~100 M ids/s against the tensor ops' ~5 M)."""
        per_feature = lengths_fm.reshape(self.num_features, -1).sum(1)
        mask = torch.repeat_interleave(self.is_zch, per_feature)
        if not bool(mask.any()):
            return rows
        offsets = torch.zeros(lengths_fm.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths_fm.reshape(-1), 0, out=offsets[1:])
        rows = torch.ops.rec.zch_remap(raw, rows, offsets, self._keys, self._used, self._probes,
                                       self._table_of)  # fmt: skip
        if count:
            ids, mapped = raw[mask], rows[mask]
            table = torch.repeat_interleave(self.feature_table, per_feature[self.is_zch])
            slots = self.slots[table]
            default = mapped == slots
            self.seen.unseen.append(ids[default])
            self.seen.unseen_table.append(table[default])
            hits = (mapped + self.base[table])[~default]
            self.seen.hits.append(hits)
            self.seen.hit_steps.append(torch.full_like(hits, self.step))
        return rows

    # ---- rounds -----------------------------------------------------------------------------
    def round_steps(self, after: int, total: int) -> set[int]:
        """Steps in (after, total] where some table runs a round: the multiples of its
        every_steps, the same for any run length or resume point."""
        out: set[int] = set()
        for t in self.tables.values():
            every = t.zch.every_steps  # type: ignore[union-attr]
            out.update(range(every * (after // every + 1), total + 1, every))
        return out

    def round(self, step: int, dmp, optimizer, device: torch.device,
              flush: bool = False) -> dict[str, Changes]:  # fmt: skip
        """Every rank, at a drained step: sums the sightings, admits and evicts, and resets
        the admitted slots' rows and optimizer state this rank holds. `flush` (before a
        checkpoint, and so at every stop): every table that has not had its round at this step
        has one, so the checkpoint leaves no sighting behind; a flushed table that nobody saw
        since its last round is left as it is (no round, no decay)."""
        due = [n for n, t in self.tables.items()
               if (flush or step % t.zch.every_steps == 0)  # type: ignore[union-attr]
               and int(self.maps[n].meta[2]) != step]  # fmt: skip
        if not due:
            return {}
        regular = {n for n in due if step % self.tables[n].zch.every_steps == 0}  # type: ignore[union-attr]
        unseen, hits = self._local_counts(due)
        payload = (time.time(), unseen, hits)
        every: list = [payload]
        if dist.is_initialized():  # one gather: the unseen ids, the slots hit and their counts
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, payload)
        now = every[0][0]  # rank 0's clock, so ttl decides alike everywhere
        hit_slots, hit_counts, hit_last = _sum_hits([p[2] for p in every])
        out = {}
        for name in due:
            ids, counts = _sum_unseen([p[1][name] for p in every])
            part = self._part(name)
            hits = _table_hits(hit_slots, hit_counts, hit_last, part)
            if name not in regular and len(ids) == 0 and len(hits[0]) == 0:
                continue  # the same on every rank: the sightings are every rank's
            changes = self.maps[name].admit(ids, counts, *hits, step, now)
            tot = self.totals[name]
            tot.admitted += len(changes.admitted_slots)
            tot.evicted += len(changes.evicted_slots)
            tot.default_reads += int(counts.sum())
            if changes.admitted_slots:
                self._reset(name, sorted(changes.admitted_slots), step, dmp, optimizer)
            out[name] = changes
        return out

    def _part(self, name: str) -> slice:
        """Table `name`'s slots in the flat map."""
        i = list(self.maps).index(name)
        return slice(int(self.base[i]), int(self.base[i] + self.slots[i]))

    def _local_counts(self, due: list[str]):
        """This rank's sightings of the due tables: per table its unseen ids and their counts
        (numpy), and the slots hit in the flat map with their hits and last step (numpy). Sparse,
        so that a round costs the ids seen since the last one, not the tables' slots (33.8M at
        Kaggle size: dense counts and their all_reduces took about 1.5 s a round). The tables
        not due keep their sightings for their own rounds."""
        seen = self.seen
        cat = lambda parts: torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)  # noqa: E731
        unseen, unseen_table = cat(seen.unseen), cat(seen.unseen_table)
        hits, hit_steps = cat(seen.hits), cat(seen.hit_steps)
        out = {}
        for i, name in enumerate(self.maps):
            if name in due:
                ids, counts = torch.unique(unseen[unseen_table == i], return_counts=True)
                out[name] = (ids.numpy(), counts.numpy())
        later = torch.tensor([n not in due for n in self.maps])
        keep_unseen, keep_hits = later[unseen_table], later[_table_of(hits, self.base)]
        now = ~keep_hits
        slots, inverse = torch.unique(hits[now], return_inverse=True)
        counts = torch.bincount(inverse, minlength=slots.numel())
        last = torch.zeros(slots.numel(), dtype=torch.int64)
        last.scatter_reduce_(0, inverse, hit_steps[now], "amax", include_self=False)
        self.seen = _Sightings([unseen[keep_unseen]], [unseen_table[keep_unseen]],
                               [hits[keep_hits]], [hit_steps[keep_hits]])  # fmt: skip
        return out, (slots.numpy(), counts.numpy(), last.numpy())

    # ---- fresh rows -------------------------------------------------------------------------
    def _reset(self, name: str, slots: list[int], step: int, dmp, optimizer) -> None:
        """Admitted `slots` (sorted) of table `name`: rows to a fresh init draw, optimizer state
        to zero, in every local shard that holds them (row and column ranges)."""
        table = self.tables[name]
        fresh = fresh_rows(self.cfg.training.seed, name, step, len(slots), table.rows, table.dim)
        want = torch.tensor(slots, dtype=torch.int64)
        for tensor, row_at, col_at in self._shard_views(dmp, optimizer)[name]:
            inside = (want >= row_at) & (want < row_at + tensor.shape[0])
            if not bool(inside.any()):
                continue
            local = want[inside] - row_at
            with torch.no_grad():
                if col_at < 0:  # optimizer state: rowwise_adagrad's momentum1 [rows]
                    tensor[local] = 0
                else:
                    cols = slice(col_at, col_at + tensor.shape[1])
                    tensor[local] = fresh[inside][:, cols].to(tensor.dtype)

    def _shard_views(self, dmp, optimizer) -> dict[str, list[tuple[torch.Tensor, int, int]]]:
        """Per ZCH table: (local shard tensor, its first row, its first column or -1 for
        optimizer state). The tensors are views into FBGEMM's weights and optimizer buffers,
        found once (a resume loads into the same buffers)."""
        if self._views is not None:
            return self._views
        views: dict[str, list[tuple[torch.Tensor, int, int]]] = {n: [] for n in self.maps}
        params = {}
        for key, weight in dmp.state_dict().items():
            m = _WEIGHT_KEY.search(key)
            if m and m.group(1) in views:
                params[key] = m.group(1)
                for shard in _local_shards(weight, key):
                    rows_at, cols_at = shard.metadata.shard_offsets
                    views[m.group(1)].append((shard.tensor, int(rows_at), int(cols_at)))
        state = optimizer.state_dict()["state"]
        for key, name in params.items():
            for value in state.get(key, {}).values():
                if isinstance(value, torch.Tensor):
                    for shard in _local_shards(value, key):
                        views[name].append((shard.tensor, int(shard.metadata.shard_offsets[0]), -1))
        self._views = views
        return views

    # ---- reporting --------------------------------------------------------------------------
    def summary(self) -> tuple[str, dict[str, int]]:
        """Per table: live ids / slots, admitted and evicted, and default-row reads since the
        last summary (the counters restart), as a log line and as metrics.jsonl's numbers."""
        parts, numbers = [], {}
        for name, m in self.maps.items():
            tot = self.totals[name]
            parts.append(f"{name} {m.live()}/{m.slots} ids, +{tot.admitted} -{tot.evicted}, "
                         f"{tot.default_reads} default-row reads")  # fmt: skip
            numbers.update({f"{name}_live": m.live(), f"{name}_slots": m.slots,
                            f"{name}_admitted": tot.admitted, f"{name}_evicted": tot.evicted,
                            f"{name}_default_reads": tot.default_reads})  # fmt: skip
            self.totals[name] = _Totals()
        return "zch: " + "; ".join(parts), numbers

    def live_line(self) -> str:
        """Per table: live ids / slots and the rounds done."""
        return "; ".join(f"{n} {m.live()}/{m.slots} ids after {int(m.meta[1])} rounds"
                         for n, m in self.maps.items())  # fmt: skip

    def rounds_done(self) -> int:
        return max(int(m.meta[1]) for m in self.maps.values())


def _table_of(flat_slots: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The table index of each slot of the flat map."""
    return torch.searchsorted(base, flat_slots, right=True) - 1


def _local_shards(tensor, key: str):
    if not hasattr(tensor, "local_shards"):
        raise ValueError(
            f"{key}: a ZCH table must be sharded (not data_parallel) so that its rows and "
            "optimizer state live in FBGEMM's kernel"
        )
    return tensor.local_shards()


def _sum_hits(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """Every rank's (slots, hits, last step), summed per slot: sorted unique slots (int64), their
    hits summed (float64, exact: integer counts) and their last step (the largest)."""
    slots = np.concatenate([p[0] for p in parts]).astype(np.int64)
    hits = np.concatenate([p[1] for p in parts]).astype(np.float64)
    last = np.concatenate([p[2] for p in parts]).astype(np.int64)
    uniq, inverse = np.unique(slots, return_inverse=True)
    total = np.bincount(inverse, weights=hits, minlength=len(uniq)).astype(np.float64)  # empty: int
    latest = np.zeros(len(uniq), np.int64)
    np.maximum.at(latest, inverse, last)
    return uniq, total, latest


def _table_hits(slots: np.ndarray, hits: np.ndarray, last: np.ndarray, part: slice):
    """One table's hit slots (its own numbering), their hits and last steps, as IdMap.admit
    takes them, from the summed ones of the flat map (`slots` sorted): sparse, so that a round
    costs what it saw."""
    lo, hi = np.searchsorted(slots, [part.start, part.stop])
    return slots[lo:hi] - part.start, hits[lo:hi], last[lo:hi]


def _sum_unseen(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([p[0] for p in parts]).astype(np.int64)
    counts = np.concatenate([p[1] for p in parts]).astype(np.int64)
    uniq, inverse = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)


def fresh_rows(seed: int, table: str, step: int, n: int, rows: int, dim: int) -> torch.Tensor:
    """float32 [n, dim]: the rows a round at `step` gives the n slots it admitted (in slot
    order), drawn as TorchRec initialises a table, uniform(-sqrt(1/rows), sqrt(1/rows)), from a
    generator seeded by (seed, table, step): the same values on every rank."""
    gen = torch.Generator().manual_seed(_seed(seed, table, step))
    bound = math.sqrt(1.0 / rows)
    return torch.rand(n, dim, generator=gen, dtype=torch.float32) * (2 * bound) - bound


def _seed(seed: int, table: str, step: int) -> int:
    h = seed
    for ch in f"{table}:{step}".encode():
        h = (h * 1_000_003 + ch) % (2**61 - 1)  # no Python hash(): it changes per process
    return h
