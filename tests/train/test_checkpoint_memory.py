"""Saving does not copy the tables: DCP gets tensors over the TBE's own memory."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from rec.train.checkpoint import NoCopySavePlanner, _own_storage


def test_views_of_one_flat_buffer_are_passed_without_a_copy():
    flat = torch.arange(60, dtype=torch.float32)  # like a TBE's weights: tables end to end
    view = flat[20:60].view(10, 4)
    own = _own_storage(view)
    assert own.data_ptr() == view.data_ptr()  # the same memory
    assert own.untyped_storage().nbytes() == own.nbytes  # so DCP's writer does not clone it
    assert torch.equal(own, view)
    whole = torch.ones(3, 3)
    assert _own_storage(whole) is whole


def test_a_no_copy_checkpoint_loads_like_a_default_one(tmp_path):
    flat = torch.randn(1000)
    state = {
        "t0": flat[:400].view(100, 4),
        "t1": flat[400:].view(150, 4),
        "bf16": torch.randn(5, 3).to(torch.bfloat16)[1:4],
        "step": torch.tensor(7),
    }
    dcp.save(state, checkpoint_id=str(tmp_path / "nocopy"), planner=NoCopySavePlanner())
    dcp.save(state, checkpoint_id=str(tmp_path / "default"))
    for name in ("nocopy", "default"):
        loaded = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(loaded, checkpoint_id=str(tmp_path / name))
        for k in state:
            assert torch.equal(loaded[k], state[k]), (name, k)
    assert (tmp_path / "nocopy" / "__0_0.distcp").stat().st_size == (
        tmp_path / "default" / "__0_0.distcp"
    ).stat().st_size
