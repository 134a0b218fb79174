"""rec.zch's id map alone: no collisions, the admission threshold, each eviction policy's order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rec.config import ConfigError, ZchConfig, config_from_dict
from rec.zch import IdMap, lookup


def _map(slots: int, **kw) -> IdMap:
    cfg = ZchConfig(slots=slots, **kw)
    return IdMap(cfg)


def _round(m: IdMap, seen: dict[int, int], step: int, now: float = 0.0, hits=None):
    """One round where the ids `seen` read the default row (id -> sightings) and the admitted
    ids in `hits` (id -> sightings) were seen at `step`."""
    h: dict[int, int] = {}
    for i, n in (hits or {}).items():
        slot = int(m.lookup(torch.tensor([i]))[0])
        assert slot < m.slots, f"id {i} is not admitted"
        h[slot] = n
    slots = np.array(sorted(h), dtype=np.int64)
    h_counts = np.array([h[s] for s in sorted(h)], dtype=np.float64)
    ids = np.array(sorted(seen), dtype=np.int64)
    counts = np.array([seen[i] for i in sorted(seen)], dtype=np.int64)
    return m.admit(ids, counts, slots, h_counts, np.full(len(slots), step), step, now)


def _rows(m: IdMap, ids: list[int]) -> list[int]:
    return m.lookup(torch.tensor(ids, dtype=torch.int64)).tolist()


def test_ids_with_the_same_remainder_get_rows_of_their_own():
    m = _map(100, probes=8)
    ids = [7 + k * 101 for k in range(50)]  # 101 = rows: every one is 7 under modulo
    ids += [-3, 2**63 - 1, -(2**63)]  # negative ids and the int64 extremes too
    _round(m, dict.fromkeys(ids, 1), step=1)
    rows = _rows(m, ids)
    assert all(r < m.slots for r in rows), rows  # all admitted (the map has room)
    assert len(set(rows)) == len(ids)
    assert _rows(m, [8, 7 + 51 * 101]) == [m.slots, m.slots]  # never seen: the default row


def test_lookup_reads_only_the_ids_window():
    keys, used = torch.zeros(10, dtype=torch.int64), torch.zeros(10, dtype=torch.bool)
    m = _map(10, probes=2)
    _round(m, {5: 1}, step=1)
    slot = _rows(m, [5])[0]
    keys[slot], used[slot] = 5, True
    assert lookup(torch.tensor([5]), keys, used, 2).tolist() == [slot]
    other = (slot + 5) % 10  # outside 5's window of two
    keys.zero_(), used.zero_()
    keys[other], used[other] = 5, True
    assert lookup(torch.tensor([5]), keys, used, 2).tolist() == [10]


def test_an_id_is_admitted_after_admit_after_sightings_across_rounds():
    m = _map(50, admit_after=3, probes=4)
    _round(m, {1: 2, 2: 3}, step=10)
    assert _rows(m, [1])[0] == m.slots  # 2 < 3: still the default row
    assert _rows(m, [2])[0] < m.slots
    changes = _round(m, {1: 1}, step=20)  # its earlier 2 sightings still count
    assert changes.admitted_ids == [1]
    assert _rows(m, [1])[0] < m.slots


def _full(policy: str, **kw) -> IdMap:
    """A map of 4 slots whose every id may take any slot (probes 4), holding ids 1..4."""
    m = _map(4, probes=4, eviction=policy, **kw)
    _round(m, {1: 1, 2: 1, 3: 1, 4: 1}, step=10, now=1000.0)
    assert sorted(m.keys.tolist()) == [1, 2, 3, 4]
    return m


def test_lfu_evicts_the_least_often_seen_id():
    m = _full("lfu")
    _round(m, {}, step=20, hits={1: 9, 2: 5, 3: 1, 4: 7})
    changes = _round(m, {100: 4}, step=30)
    assert changes.evicted_ids == [3] and changes.admitted_ids == [100]
    # a newcomer seen less often than every id held stays out
    changes = _round(m, {200: 1}, step=40, hits={1: 9, 2: 9, 4: 9, 100: 9})
    assert not changes and _rows(m, [200]) == [m.slots]


def test_the_checkpoint_holds_the_halved_lfu_counts_across_renormalisations():
    """A round halves the lfu counts by halving a scale, not every slot; state() (what the
    checkpoint saves, and loads into) must hold the counts a halving of every slot gives,
    bit for bit, also after the scale has been folded in (every 400 rounds)."""
    m = _full("lfu")
    want = {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}  # admitted with 1 sighting, halved once
    for step in range(20, 20 + 10 * 820, 10):
        hits = {1: 3, 2: 1} if step % 20 else {1: 1}
        _round(m, {}, step=step, hits=hits)
        want = {i: (c + hits.get(i, 0)) * 0.5 for i, c in want.items()}
        if step in (50, 4000, 8210):
            counts = m.state()["counts"]
            got = {int(m.keys[s]): float(counts[s]) for s in range(m.slots)}
            assert got == want and want[3] > 0.0
    assert m.state()["counts"].max() < 5  # stored over no scale after state()


def test_lru_evicts_the_longest_unseen_id():
    m = _full("lru")
    _round(m, {}, step=20, hits={1: 1, 2: 1, 4: 1})  # 3 last seen at step 10
    changes = _round(m, {100: 1}, step=30, hits={1: 1, 2: 1, 4: 1})
    assert changes.evicted_ids == [3]
    # every id seen since the last round: nothing is old enough to leave
    changes = _round(m, {200: 5}, step=40, hits={1: 1, 2: 1, 4: 1, 100: 1})
    assert not changes


def test_ttl_evicts_ids_unseen_for_ttl_hours_even_without_a_newcomer():
    m = _full("ttl", ttl_hours=1.0)
    _round(m, {}, step=20, now=1000.0 + 3000, hits={1: 1, 2: 1})
    changes = _round(m, {}, step=30, now=1000.0 + 3700)  # 3 and 4: unseen for 3700 s > 1 h
    assert sorted(changes.evicted_ids) == [3, 4] and not changes.admitted_ids
    assert m.live() == 2
    changes = _round(m, {100: 1, 200: 1, 300: 1}, step=40, now=1000.0 + 3800)
    assert sorted(changes.admitted_ids) == [100, 200]  # two free slots, the rest waits
    assert m.live() == 4


def test_a_zch_config_error_names_the_table():
    base = {"tables": [{"name": "goods", "rows": 100, "dim": 16, "features": ["f"]}]}
    cases = [
        ({"ids": {"zch": {"slots": 20}}}, {}, "tables[goods]: rows=100 but ids.zch.slots=20"),
        ({"ids": {"zch": {"probes": 200}}}, {}, "tables[goods].ids.zch.probes=200"),
        ({"ids": {"zch": {}}}, {"sharding": {"constraints": {
            "goods": {"sharding_types": ["data_parallel"]}}}}, "table 'goods' has ids.zch"),
    ]  # fmt: skip
    for table, extra, message in cases:
        data = {"tables": [{**base["tables"][0], **table}], **extra}
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            config_from_dict(data)
