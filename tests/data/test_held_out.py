"""Events a stream run holds out of training (rec.data.held_out, rec.data.stream_reader's
Assembler): chosen by name, consumed with the trained ones (position, digest), kept only up to a
checkpoint's position, and carried across a resume at another world size. No broker: entries are
decoded as a reader decodes them."""

from __future__ import annotations

import numpy as np

from rec.contract.events import decode, encode
from rec.data import held_out
from rec.data.held_out import HeldOut
from rec.data.stream_reader import (
    Assembler,
    StreamPosition,
    add_digests,
    event_digest,
    event_hashes,
    held_out_mask,
)
from rec.features import HASH, DenseFeature, FeatureSpec, SparseFeature

SPEC = FeatureSpec(
    "csv",
    ["clicked"],
    [DenseFeature("n", "n", "log1p")],
    [SparseFeature("item", "item", "int_or_hash", "|")],
    dict(HASH),
)


def _entries(count: int, per_entry: int, first_ms: int = 1_700_000_000_000):
    """(entry id, Events) pairs; event n has dense n and items n, n + 1 (consecutive ids)."""
    out = []
    for e in range(count):
        events = [{"clicked": n % 2, "n": n, "item": f"{n}|{n + 1}"}
                  for n in range(e * per_entry, (e + 1) * per_entry)]  # fmt: skip
        out.append((f"{first_ms + e}-0", decode(encode(events), SPEC)))
    return out


def _drain(asm: Assembler, batch: int) -> tuple[list[int], int, int]:
    """Takes batches until none is left: trained dense values (raw n), held out, digest."""
    trained, held, digest = [], 0, 0
    while asm.ready or asm.held:
        b = asm.take(batch)
        trained += np.expm1(b.dense[:, 0].numpy()).round().astype(int).tolist()
        held += asm.held_out
        digest = add_digests(digest, asm.digest)
        if not len(b) and not asm.held_out:
            break
    return trained, held, digest


def test_held_out_events_are_consumed_with_the_trained_ones_and_chosen_by_name():
    entries = _entries(100, 20)
    sink = HeldOut(every_nth=10, keep=10_000)
    asm = Assembler(SPEC, hold_out=sink)
    for entry, events in entries:
        asm.add(entry, events)
    trained, held, digest = _drain(asm, 64)
    want_held = {e * 20 + int(i) for e, (entry, ev) in enumerate(entries)
                 for i in ev.index[held_out_mask(entry, ev.index, 10)]}  # fmt: skip
    assert 0.06 < len(want_held) / 2000 < 0.14  # about one in ten
    assert held == len(want_held) and sorted(trained + sorted(want_held)) == list(range(2000))
    assert set(trained).isdisjoint(want_held)
    everything = 0
    for entry, ev in entries:
        everything = add_digests(everything, event_digest(entry, ev.index))
    assert digest == everything, "the digest covers held-out events: exactly once holds"
    rows, names = sink.covered(asm.at)
    assert sorted(np.round(rows.dense[:, 0]).astype(int).tolist()) == sorted(want_held)
    assert len(names) == len(want_held)


def test_an_entry_wholly_held_out_is_consumed_without_a_batch():
    ((entry, events),) = _entries(1, 5)
    sink = HeldOut(every_nth=1, keep=100)
    asm = Assembler(SPEC, hold_out=sink)
    asm.add(entry, events)
    b = asm.take(64)
    assert len(b) == 0 and asm.held_out == 5 and asm.at == StreamPosition(entry, 5, 5)
    assert asm.digest == event_digest(entry, events.index)


def test_a_checkpoint_keeps_only_what_its_position_covers_and_a_resume_takes_its_share(tmp_path):
    entries = _entries(60, 10)
    sinks = [HeldOut(every_nth=5, keep=10_000) for _ in range(2)]
    positions = []
    for rank, sink in enumerate(sinks):  # two ranks, each its half of the entries
        asm = Assembler(SPEC, hold_out=sink)
        for entry, events in entries[rank::2]:
            asm.add(entry, events)
        asm.take(100)
        positions.append(asm.at)  # the checkpoint's position
        asm.take(100)  # read ahead of the checkpoint: not in it
    step = tmp_path / "step_1"
    for rank, sink in enumerate(sinks):
        sink.save(step, rank, positions[rank])
    rows, names = held_out.load(step)
    for rank, at in enumerate(positions):
        mine = names[np.isin(names[:, 0] % 2, [(rank + 1_700_000_000_000) % 2])]
        assert len(mine) > 0
        last = max(map(tuple, mine[:, :2].tolist()))
        assert last <= tuple(map(int, at.entry.split("-"))), "nothing past the position"
    assert (np.diff(names[:, 0]) >= 0).all(), "in the stream's order"
    for world in (1, 3):
        resumed = [HeldOut(every_nth=5, keep=10_000) for _ in range(world)]
        for r, sink in enumerate(resumed):
            sink.restore(step, r, world)
        shares = [sink.covered(None) for sink in resumed]
        together = np.concatenate([s[1] for s in shares if s is not None])
        assert sorted(map(tuple, together.tolist())) == sorted(map(tuple, names.tolist()))
    batches = held_out.batches(step, 16)
    assert sum(len(b) for b in batches) == len(rows) and all(len(b) <= 16 for b in batches)
    # Raw dense values (a client's): the export's model applies log1p itself.
    raw = np.concatenate([b.dense[:, 0].numpy() for b in batches])
    assert np.array_equal(raw, rows.dense[:, 0]) and raw.max() > 100


def test_keep_bounds_what_a_rank_holds_to_the_newest():
    entries = _entries(50, 20)
    sink = HeldOut(every_nth=2, keep=30)
    asm = Assembler(SPEC, hold_out=sink)
    for entry, events in entries:
        asm.add(entry, events)
    _drain(asm, 50)
    rows, names = sink.covered(asm.at)
    assert len(rows) == 30
    assert names[:, 0].min() >= 1_700_000_000_000 + 45, "the newest ones"


def test_partition_0_names_events_as_before_partitions_and_others_apart():
    index = np.arange(3)
    # Pinned from before partitions: legacy digests and held-out choices must not move.
    assert event_hashes("1700000000000-7", index).tolist() == [
        2058598245699125137, 12545903805965174339, 4988443883567960758]  # fmt: skip
    assert event_hashes("1700000000000-7", index, 0).tolist() == \
        event_hashes("1700000000000-7", index).tolist()  # fmt: skip
    digests = {event_digest("1700000000000-7", index, k) for k in range(8)}
    assert len(digests) == 8, "the same entry id in two partitions names other events"
    masks = [held_out_mask("1700000000000-7", np.arange(400), 4, k) for k in (0, 1)]
    assert (masks[0] != masks[1]).any()


def test_held_out_names_carry_the_partition_and_old_files_load_as_partition_0(tmp_path):
    ((e0, ev0), (e1, ev1)) = _entries(2, 40)
    sink = HeldOut(every_nth=1, keep=1_000)
    at = {}
    for k, (entry, events) in ((0, (e0, ev0)), (3, (e1, ev1))):
        asm = Assembler(SPEC, hold_out=sink, partition=k)
        asm.add(entry, events)
        asm.take(64)
        at[k] = asm.at
        assert asm.digest == event_digest(entry, events.index, k)
    step = tmp_path / "step_1"
    sink.save(step, 0, {0: at[0]})  # partition 3's position is not in this checkpoint
    rows, names = held_out.load(step)
    assert names.shape == (40, 4) and set(names[:, 3].tolist()) == {0}
    sink.save(step, 0, at)
    rows, names = held_out.load(step)
    assert sorted(set(names[:, 3].tolist())) == [0, 3] and len(names) == 80
    for world, rank, want in ((2, 1, {3}), (2, 0, {0}), (3, 0, {0, 3}), (4, 3, {3})):
        resumed = HeldOut(every_nth=1, keep=1_000)
        resumed.restore(step, rank, world, partitioned=True)
        got = resumed.covered(None)
        assert set(got[1][:, 3].tolist()) == want, (world, rank)
    # A file written before partitions: 3 columns (ms, seq, place), read as partition 0.
    old = tmp_path / "step_0" / held_out.DIR
    old.mkdir(parents=True)
    with np.load(step / held_out.DIR / "rank0.npz") as f:
        np.savez(old / "rank0.npz", **{k: f[k] for k in f.files if k != "names"},
                 names=f["names"][:, :3])  # fmt: skip
    rows, names = held_out.load(tmp_path / "step_0")
    assert names.shape == (80, 4) and not names[:, 3].any()
