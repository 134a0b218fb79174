"""rec plan's ZCH sizing places the data's own ids through rec's hash (rec.train.zch_sizing),
so what the hash does to real ids (shared homes) shows in the plan, and a large table's slice
stands for the whole."""

from __future__ import annotations

import numpy as np
import torch

from rec.train.zch_sizing import _first_seen, place
from rec.zch import home


def test_ids_that_share_a_home_meet_a_full_window():
    """20 ids with one home, 4 probes: 4 take the window, 16 find it full. A uniform estimate
    at this load (20 ids in 1,000 slots) says nearly none would."""
    slots = 1000
    candidates = torch.arange(1, 200_000, dtype=torch.int64)
    same = candidates[home(candidates, slots) == 7][:20].numpy()
    assert len(same) == 20
    p = place(same, slots, probes=4)
    assert (p.ids, p.held, p.full) == (20, 4, 16)
    spread = place(np.arange(1, 21), slots, probes=4)
    assert (spread.held, spread.full) == (20, 0)


def test_a_slice_of_a_large_table_gives_the_whole_tables_shares():
    """300,000 consecutive ids in 400,000 slots: simulated on a 65,536-slot slice, the load and
    full-window share are the whole table's to within sampling noise."""
    ids = np.arange(1, 300_001)
    whole = place(ids, 400_000, 8, sim_slots=1 << 20)
    part = place(ids, 400_000, 8, sim_slots=1 << 16)
    assert whole.slots == 400_000 and part.slots == 1 << 16
    assert abs(whole.load - part.load) < 0.01
    assert abs(whole.full_share - part.full_share) < 0.005


def test_ids_are_placed_in_the_order_they_first_appear():
    chunks = [np.array([5, 3, 5]), np.array([9, 3, 1])]
    assert _first_seen(chunks).tolist() == [5, 3, 9, 1]
    assert _first_seen([]).size == 0
