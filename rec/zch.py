"""Collision-free ids ("ZCH"): every admitted id its own row (docs/zch.md).

A ZCH table of `rows` rows holds `slots = rows - 1` rows for admitted ids and, last, the
default row. Its id map is two tensors over the slots:

    keys  int64 [slots]  the raw id that holds each slot
    used  bool  [slots]  whether a slot holds one

An id may hold only one of `probes` slots, its window: home(id), home(id) + 1, ... (mod
slots). A lookup compares the id with the keys of its window and reads the slot that holds it,
or the default row. So no two ids ever share a row, a lookup costs `probes` comparisons
whatever the load, and admitting or evicting an id changes one slot of the map, which the
update log can carry and a server can apply in place, with the row.

`home` uses only integer ops that cannot overflow int64 (no shifts, no bitwise ops: every
intermediate is non-negative and below 2^63), so every implementation computes the same window
for every id. There are three, tested equal on int64's extremes (tests/export/test_id_maps.py):
this module's tensor ops (the reference), the ops rec::zch_remap and rec::zch_remap_counted
(cpp/ops/zch.cpp with cpp/src/contract/zch_home.h: training's remap, TorchScript and
AOTInductor models, where the tensor ops cost 1.6 ms at B = 512 against the op's 0.05 ms; the
counted one also counts unknown ids for the servers, docs/zch.md), and export's ONNX form
(export/id_maps.py), which divides in float64 because ONNX's exporter turns an integer division
into a float32 one. This module itself does not compile to TorchScript (TorchScript reads no
module-level ints). Home version 2 (ZCH map layout 2):

    x    = id if id >= 0 else (id + (2^63 - 1)) + 1      the id's 64 bits as a value in [0, 2^63)
    lo   = x mod 2^32,  hi = x div 2^32                   (hi < 2^31)
    a    = mix(lo, M0, M1)
    b    = mix((hi * M2 + a) mod 2^32, M3, M4)
    a    = mix((a * M5 + b) mod 2^32, M0, M1)
    home = ((b mod 2^31) * 2^32 + a) mod slots           (< 2^63)
    mix(h, c, d): h += h div 2^16; h *= c; h += h div 2^15; h *= d; h += h div 2^16,
                  each step mod 2^32 (h < 2^32 and c, d odd < 2^31: every product < 2^63)

A multiply by an odd constant carries low bits up and each `h div 2^k` added brings high bits
down, so every output bit depends on every input bit: consecutive, strided (multiples of 2^k,
of 1000), small negative and timestamp-like ids fill a table as random ids do, m(1 - e^(-n/m))
distinct homes for n ids in m slots (tests/core/test_zch_home.py holds each family to it).

Admission and eviction (`IdMap.admit`) run in rounds, every `every_steps` training steps, on
counts every rank agrees on (train.zch gathers them); each round returns the slots it changed,
whose rows and optimizer state training then resets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rec.config import ConfigError, ZchConfig
from rec.contract.sections import ZCH_MAP_LAYOUT, ZCH_MAP_LAYOUT_V1

_INT64_MAX = 2**63 - 1
_WORD = 2**32
_M = (0x045D9F3B, 0x2C1B3C6D, 0x297A2D39, 0x5BD1E995, 0x68E31DA5, 0x1B873593)
"""home's multipliers M0..M5: odd, below 2^31 (so a word times one stays below 2^63)."""
HOME_CONSTANTS = (_INT64_MAX, _WORD, *_M)
"""What a TorchScript copy of `home` takes as an argument (it cannot read module-level ints)."""
CANDIDATE_ROUNDS = 8
"""Rounds an id may go unseen and still keep its sightings towards `admit_after`."""
RENORMALISE_SCALE = 2.0**-400
"""IdMap's lfu scale below which the stored counts take it in (every 400 rounds; float64's
smallest normal is 2^-1022, and stored counts stay below 2^400 x the largest count)."""


def home(ids: torch.Tensor, slots: int) -> torch.Tensor:
    """The first slot of each id's window, int64 [N] in [0, slots) (see the module docstring)."""
    x = torch.where(ids >= 0, ids, (ids + _INT64_MAX) + 1)
    lo = torch.remainder(x, _WORD)
    hi = torch.div(x, _WORD, rounding_mode="floor")
    a = _mix(lo, _M[0], _M[1])
    b = _mix(torch.remainder(hi * _M[2] + a, _WORD), _M[3], _M[4])
    a = _mix(torch.remainder(a * _M[5] + b, _WORD), _M[0], _M[1])
    return torch.remainder(torch.remainder(b, 2**31) * _WORD + a, slots)


def _mix(h: torch.Tensor, c: int, d: int) -> torch.Tensor:
    """A word [0, 2^32) to a word, every output bit depending on every input bit."""
    h = torch.remainder(h + torch.div(h, 2**16, rounding_mode="floor"), _WORD)
    h = torch.remainder(h * c, _WORD)
    h = torch.remainder(h + torch.div(h, 2**15, rounding_mode="floor"), _WORD)
    h = torch.remainder(h * d, _WORD)
    return torch.remainder(h + torch.div(h, 2**16, rounding_mode="floor"), _WORD)


CHECKPOINT_LAYOUT_KEY = "zch_map_layout"
"""A checkpoint's meta.json key: the map layout its id maps were placed by (ZCH_MAP_LAYOUT).
A checkpoint without it predates the key: layout 1."""


class MapLayoutError(ConfigError):
    """A checkpoint's id maps were placed by another home() than this rec's."""


def check_checkpoint_layout(meta: dict, step_dir: object) -> None:
    """Refuses a checkpoint whose id maps another home() placed: under this one its admitted
    ids would look in other windows and read other ids' rows. Not re-placed: a ZCH table's rows
    and optimizer state are keyed by slot, sharded over the ranks, and would have to move with
    every id."""
    layout = meta.get(CHECKPOINT_LAYOUT_KEY, ZCH_MAP_LAYOUT_V1)
    if layout != ZCH_MAP_LAYOUT:
        raise MapLayoutError(
            f"checkpoint {str(step_dir)!r}: its ZCH id maps were placed by map layout "
            f"{layout!r} (an earlier home() hash), and this rec places ids by "
            f"{ZCH_MAP_LAYOUT!r}, under which its admitted ids would read other ids' rows. "
            "Resume or export it with the rec that trained it, or train the run afresh."
        )


def windows(ids: torch.Tensor, slots: int, probes: int) -> torch.Tensor:
    """int64 [N, probes]: the slots each id may hold, in probe order."""
    steps = torch.arange(probes, dtype=torch.int64, device=ids.device)
    return torch.remainder(home(ids, slots).unsqueeze(1) + steps.unsqueeze(0), slots)


def lookup(ids: torch.Tensor, keys: torch.Tensor, used: torch.Tensor, probes: int) -> torch.Tensor:
    """Rows of raw ids [N]: the slot that holds each id, or the default row (`slots`)."""
    slots = keys.shape[0]
    win = windows(ids, slots, probes)
    hit = (keys[win] == ids.unsqueeze(1)) & used[win]
    first = torch.argmax(hit.to(torch.int64), dim=1, keepdim=True)
    return torch.where(hit.any(dim=1), win.gather(1, first).squeeze(1), slots)


@dataclass
class Changes:
    """What one round changed: slots whose id left, and slots a new id took (a slot may be in
    both: evicted for the id that took it). Rows of every slot in `admitted` start fresh."""

    evicted_slots: list[int] = field(default_factory=list)
    evicted_ids: list[int] = field(default_factory=list)
    admitted_slots: list[int] = field(default_factory=list)
    admitted_ids: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.evicted_slots or self.admitted_slots)


class IdMap:
    """One ZCH table's map and the statistics its eviction policy reads; the same on every rank.

    Every tensor is in `state()`, which the checkpoint holds, so a resumed run (at any world
    size: nothing here is per rank) continues with the same map and counts. `keys` and `used`
    are only ever written in place (training makes them views into one buffer for all tables,
    rec.train.zch).
    """

    def __init__(self, cfg: ZchConfig) -> None:
        self.cfg = cfg
        n = cfg.slots
        self.keys = torch.zeros(n, dtype=torch.int64)
        self.used = torch.zeros(n, dtype=torch.bool)
        # lfu: sightings, halved each round. Stored over `_scale` (a power of two): the halving
        # halves the scale, not every slot, and the stored values are exact in float64 either
        # way; state() folds the scale in, so the checkpoint holds the counts themselves.
        self.counts = torch.zeros(n, dtype=torch.float64)
        self._scale = 1.0
        self.last_step = torch.zeros(n, dtype=torch.int64)  # lru: the last step that saw it
        self.last_seen = torch.zeros(n, dtype=torch.float64)  # ttl: unix seconds
        # Ids not admitted yet: their sightings and the last round that saw them. Fixed-size
        # tensors (checkpoints load into existing shapes); `candidates` says how many are live.
        self.cand_ids = torch.zeros(n, dtype=torch.int64)
        self.cand_counts = torch.zeros(n, dtype=torch.int64)
        self.cand_round = torch.zeros(n, dtype=torch.int64)
        # [live candidates, rounds done, the step of the last round]
        self.meta = torch.zeros(3, dtype=torch.int64)

    @property
    def slots(self) -> int:
        return self.cfg.slots

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return lookup(ids, self.keys, self.used, self.cfg.probes)

    def state(self) -> dict[str, torch.Tensor]:
        self._fold_scale()
        names = ("keys", "used", "counts", "last_step", "last_seen", "cand_ids", "cand_counts",
                 "cand_round", "meta")  # fmt: skip
        return {name: getattr(self, name) for name in names}

    def _fold_scale(self) -> None:
        """Makes the stored counts the counts (one pass over every slot: at a checkpoint, or
        when the scale reaches RENORMALISE_SCALE, so that it never underflows)."""
        if self._scale != 1.0:
            self.counts *= self._scale
            self._scale = 1.0

    def live(self) -> int:
        return int(self.used.sum())

    # ---- a round ----------------------------------------------------------------------------
    def admit(self, seen_ids: np.ndarray, seen_counts: np.ndarray, hit_slots: np.ndarray,
              hit_counts: np.ndarray, hit_last: np.ndarray, step: int, now: float
              ) -> Changes:  # fmt: skip
        """One round, from every rank's sightings since the last one, summed. It costs the
        slots and ids seen, not the map's slots (33.8M at Kaggle size): only the slots hit are
        touched.

        Args:
            seen_ids, seen_counts: the ids that read the default row, unique, and their
                sightings (int64 numpy arrays).
            hit_slots, hit_counts, hit_last: the slots hit (unique), their admitted ids'
                sightings and the last step that saw each (numpy).
            step: the training step the round runs at; now: unix seconds (rank 0's).
        """
        cfg = self.cfg
        round_start = int(self.meta[2])
        keys, used, cnt = self.keys.numpy(), self.used.numpy(), self.counts.numpy()
        last_step, last_seen = self.last_step.numpy(), self.last_seen.numpy()
        hit_slots = np.asarray(hit_slots, np.int64)
        hit_counts, hit_last = np.asarray(hit_counts, np.float64), np.asarray(hit_last, np.int64)
        # exact: a power-of-two scale changes no float64 sum's rounding
        cnt[hit_slots] += hit_counts / self._scale
        last_step[hit_slots] = np.maximum(last_step[hit_slots], hit_last)
        last_seen[hit_slots[hit_counts > 0]] = now
        changes = Changes()
        if cfg.eviction == "ttl":
            self._expire(now, changes)
        ids, counts = self._merge_candidates(seen_ids, seen_counts)
        ready = counts >= cfg.admit_after
        order = np.lexsort((ids[ready], -counts[ready]))  # most seen first, then by id
        ready_ids, ready_counts = ids[ready][order], counts[ready][order]
        wins = windows(torch.from_numpy(ready_ids), self.slots, cfg.probes).numpy()
        # numpy views of the map: one candidate at a time (each sees the slots the ones before
        # it took), at numpy's cost per element rather than torch's per op
        may = self._may_place(wins, ready_counts, round_start, used, cnt, last_step)
        ready_ids, ready_counts, wins = ready_ids[may], ready_counts[may], wins[may]
        for cid, count, win in zip(ready_ids.tolist(), ready_counts.tolist(), wins, strict=True):
            slot = self._place(win, count, round_start, used, cnt, last_step)
            if slot < 0:
                continue
            if used[slot]:
                changes.evicted_slots.append(slot)
                changes.evicted_ids.append(int(keys[slot]))
            keys[slot], used[slot] = cid, True
            cnt[slot], last_step[slot], last_seen[slot] = count / self._scale, step, now
            changes.admitted_slots.append(slot)
            changes.admitted_ids.append(cid)
        self._keep_candidates(ids, counts, set(changes.admitted_ids))
        self._scale *= 0.5  # lfu: a once-popular id loses its claim within a few rounds
        if self._scale < RENORMALISE_SCALE:
            self._fold_scale()
        self.meta[1] += 1
        self.meta[2] = step
        return changes

    def _expire(self, now: float, changes: Changes) -> None:
        old = self.used & (now - self.last_seen > self.cfg.ttl_hours * 3600.0)
        changes.evicted_slots.extend(torch.nonzero(old).flatten().tolist())
        changes.evicted_ids.extend(self.keys[old].tolist())
        self.used[old] = False
        self.counts[old] = 0.0

    def _may_place(self, wins: np.ndarray, counts: np.ndarray, round_start: int,
                   used: np.ndarray, slot_counts: np.ndarray,
                   last_step: np.ndarray) -> np.ndarray:  # fmt: skip
        """Which candidates `_place` could place, judged for all at once before any is placed.

        Exact, not a guess: while a round places ids, slots only become used, a slot's count
        only grows (lfu replaces an id by one seen more often) and a slot's last step becomes
        this round's, so a window that has no free slot and no victim now never gets one."""
        may = ~used[wins].all(axis=1)
        if self.cfg.eviction == "lfu":
            may |= slot_counts[wins].min(axis=1) * self._scale < counts
        elif self.cfg.eviction == "lru":
            may |= (last_step[wins] < round_start).any(axis=1)
        return may

    def _place(self, win: np.ndarray, count: int, round_start: int, used: np.ndarray,
               counts: np.ndarray, last_step: np.ndarray) -> int:  # fmt: skip
        """The slot an id of window `win` takes: a free one (the first in probe order), else
        the policy's victim, or -1."""
        taken = used[win]
        if not taken.all():
            return int(win[int(np.argmin(taken))])
        policy = self.cfg.eviction
        if policy == "lfu":
            at = int(np.argmin(counts[win]))
            return int(win[at]) if count > counts[win[at]] * self._scale else -1
        if policy == "lru":
            at = int(np.argmin(last_step[win]))
            return int(win[at]) if last_step[win[at]] < round_start else -1
        return -1  # ttl: only expired ids leave, and they already have

    def _merge_candidates(self, seen_ids: np.ndarray, seen_counts: np.ndarray):
        n = int(self.meta[0])
        ids = np.concatenate([self.cand_ids[:n].numpy(), seen_ids.astype(np.int64)])
        counts = np.concatenate([self.cand_counts[:n].numpy(), seen_counts.astype(np.int64)])
        rounds = np.concatenate([self.cand_round[:n].numpy(),
                                 np.full(len(seen_ids), int(self.meta[1]), np.int64)])  # fmt: skip
        uniq, inverse = np.unique(ids, return_inverse=True)
        total = np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)
        last = np.zeros(len(uniq), np.int64)
        np.maximum.at(last, inverse, rounds)
        self._cand_last = last
        return uniq, total

    def _keep_candidates(self, ids: np.ndarray, counts: np.ndarray, admitted: set[int]) -> None:
        """Candidates not admitted and seen in the last CANDIDATE_ROUNDS rounds, the most seen
        first, as many as there are slots."""
        keep = (self._cand_last >= int(self.meta[1]) - CANDIDATE_ROUNDS + 1) & ~np.isin(
            ids, np.fromiter(admitted, np.int64, len(admitted))
        )
        ids, counts, last = ids[keep], counts[keep], self._cand_last[keep]
        if len(ids) > self.slots:
            top = np.argsort(-counts, kind="stable")[: self.slots]
            ids, counts, last = ids[top], counts[top], last[top]
        n = len(ids)
        self.cand_ids[:n] = torch.from_numpy(ids)
        self.cand_counts[:n] = torch.from_numpy(counts)
        self.cand_round[:n] = torch.from_numpy(last)
        self.meta[0] = n
