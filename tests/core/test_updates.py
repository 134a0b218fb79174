"""The update log's record format (rec.contract.updates) and the replica rules (rec.update_log):
malformed records are refused naming the field, bad updates are refused whole and counted (by
rec.update_log.Applier, the one Python copy of rec-server's rules). The
records, row sizes and URLs are the golden files' (tests/data/*_golden.json), which rec-server's
tests (cpp/tests/updates_test.cpp) decode too."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from rec.contract.store import row_bytes as store_row_bytes
from rec.contract.updates import (
    FORMAT,
    FORMATS,
    MAX_DIM,
    MAX_ROWS,
    UpdateError,
    UpdateRecord,
    UpdateUrl,
    decode,
    encode,
    parse_url,
    row_bytes,
)
from rec.update_log import Applier, ServedMap, ServedTable
from rec.zch import home, windows

DATA = Path(__file__).parents[1] / "data"


def _rec(**kw) -> UpdateRecord:
    base = dict(run="r", gen=1, rank=0, world=2, step=10, wall_ns=5, last=True, table="t0",
                dtype="int8", dim=4, ids=(1, 7), rows=bytes(range(16)))  # fmt: skip
    base.update(kw)
    return UpdateRecord(**base)


def test_a_record_round_trips_and_rows_are_codes_then_scale_and_bias():
    assert row_bytes(4, "int8") == 8 and row_bytes(4, "int4") == 6 and row_bytes(4, "fp16") == 8
    rec = _rec()
    fields = encode(rec)
    assert fields["ids"] == struct.pack("<2q", 1, 7)
    assert decode({k.encode(): v for k, v in fields.items()}) == rec


GOLDEN = json.loads((DATA / "update_record_golden.json").read_text())
ROW_BYTES = json.loads((DATA / "row_bytes_golden.json").read_text())
URLS = json.loads((DATA / "url_golden.json").read_text())["update_log"]


def _entry(case: dict) -> dict:
    """A golden case's stream entry: text fields as they are, binary ones from hex."""
    return {k: bytes.fromhex(v) if k in GOLDEN["binary_fields"] else v
            for k, v in case["fields"].items()}  # fmt: skip


@pytest.mark.parametrize("case", GOLDEN["valid"], ids=lambda c: c["name"])
def test_a_golden_record_decodes_to_its_values(case):
    pairs = {k: tuple(map(tuple, case["record"].get(k, []))) for k in ("evicted", "admitted")}
    if "held" in case["record"]:
        pairs["held"] = tuple(map(tuple, case["record"]["held"]))
    want = dict(case["record"], ids=tuple(case["record"]["ids"]),
                rows=bytes.fromhex(case["record"]["rows"]), **pairs)  # fmt: skip
    assert decode(_entry(case)) == UpdateRecord(**want)


@pytest.mark.parametrize("case", GOLDEN["refused"], ids=lambda c: c["name"])
def test_a_malformed_record_is_refused_naming_the_field(case):
    with pytest.raises(UpdateError) as e:
        decode(_entry(case))
    assert case["error"] in str(e.value)


def test_the_golden_bounds_are_the_readers():
    assert (GOLDEN["max_rows"], GOLDEN["max_dim"]) == (MAX_ROWS, MAX_DIM)
    assert (GOLDEN["format"], tuple(GOLDEN["formats"])) == (FORMAT, FORMATS)


def test_a_record_without_map_changes_stays_version_1_and_one_with_them_is_version_2():
    assert encode(_rec())["format"] == "rec.updates/1" and "evicts" not in encode(_rec())
    rec = _rec(evicted=((7, 42),), admitted=((7, -5),))
    fields = encode(rec)
    assert fields["format"] == "rec.updates/2" and fields["admitted"] == struct.pack("<2q", 7, -5)
    assert decode(fields) == rec


def test_a_record_that_says_which_id_each_slot_holds_is_version_3_even_without_map_changes():
    rec = _rec(held=((1, -3),))
    fields = encode(rec)
    assert fields["format"] == "rec.updates/3" and fields["held"] == struct.pack("<2q", 1, -3)
    assert fields["evicts"] == "0" and decode(fields) == rec
    assert encode(_rec(held=()))["holds"] == "0"


@pytest.mark.parametrize("case", GOLDEN["zch_home"], ids=lambda c: f"{c['id']}-{c['slots']}")
def test_the_golden_home_slots_are_rec_zch_home(case):
    assert home(torch.tensor([case["id"]]), case["slots"]).item() == case["home"]


@pytest.mark.parametrize("case", ROW_BYTES["rows"], ids=lambda c: f"{c['dtype']}-{c['dim']}")
def test_row_bytes_of_every_dtype_and_dim_parity(case):
    assert row_bytes(case["dim"], case["dtype"]) == case["row_bytes"]
    assert store_row_bytes(case["dim"], case["dtype"]) == case["row_bytes"]


@pytest.mark.parametrize("case", ROW_BYTES["refused"], ids=lambda c: f"{c['dtype']}-{c['dim']}")
def test_a_row_that_is_not_whole_bytes_is_refused(case):
    with pytest.raises(UpdateError) as e:
        row_bytes(case["dim"], case["dtype"])
    assert case["error"] in str(e.value)


@pytest.mark.parametrize("case", URLS["valid"], ids=lambda c: c["url"])
def test_a_golden_update_url_parses(case):
    assert parse_url(case["url"]) == UpdateUrl(case["host"], case["port"], case["stream"])


@pytest.mark.parametrize("case", URLS["refused"], ids=lambda c: c["url"])
def test_a_bad_update_url_is_refused(case):
    with pytest.raises(UpdateError) as e:
        parse_url(case["url"])
    assert case["error"] in str(e.value)


SERVED = {"t0": ServedTable(rows=100, dim=4, dtype="int8")}


@pytest.mark.parametrize(
    "rec, reason",
    [
        (_rec(table="t9"), "unknown table"),
        (_rec(dtype="fp16"), "row format"),
        (_rec(dim=2, ids=(1, 7, 8, 9), rows=bytes(24)), "row format"),
        (_rec(ids=(1, 100)), "id range"),
    ],
)
def test_a_bad_update_is_refused_whole_and_counted(rec, reason):
    replica = Applier(SERVED)
    outcome, why = replica.apply(rec)
    assert outcome == reason.replace(" ", "_") and why.startswith(reason)
    assert replica.refused[outcome] == 1 and replica.rows == {} and replica.applied_rows == 0


def test_the_watermark_waits_for_every_rank_and_never_goes_back():
    replica = Applier(SERVED)
    assert replica.apply(_rec(rank=0, step=10)) == ("applied", "")
    assert replica.watermark() is None  # rank 1 has published nothing yet
    assert replica.apply(_rec(rank=1, step=8, table="", dtype="fp32", dim=0, ids=(), rows=b"")) == (
        "applied", "")  # fmt: skip
    assert replica.watermark() == (1, 8, 5) and replica.mark == (1, 8, 5)
    assert replica.apply(_rec(rank=0, step=9))[1].startswith("backwards")
    assert replica.apply(_rec(rank=0, step=10))[0] == "applied"  # the same publish again: re-sent
    assert replica.apply(_rec(rank=0, step=3, gen=2))[0] == "applied"  # a resumed run: new gen
    assert replica.refused["backwards"] == 1
    assert replica.rows["t0"] == {1: bytes(range(8)), 7: bytes(range(8, 16))}


def test_a_new_generation_starts_the_count_over_as_rec_server_does():
    """rec-server's EmbeddingTables::Advance: the first record of a newer generation clears the
    ranks' complete publishes, and a late complete publish of the older one no longer counts;
    the served watermark never goes back."""
    replica = Applier(SERVED)
    for rank in (0, 1):
        replica.apply(_rec(rank=rank, step=12))
    assert replica.mark == (1, 12, 5)
    assert replica.apply(_rec(rank=0, step=4, gen=2, last=False))[0] == "applied"
    assert replica.complete == {} and replica.watermark() is None
    assert replica.apply(_rec(rank=1, step=13))[0] == "applied"  # the dead run's rank, late
    assert replica.watermark() is None and replica.mark == (1, 12, 5)
    assert replica.apply(_rec(rank=0, step=4, gen=2, world=1, wall_ns=9))[0] == "applied"
    assert replica.mark == (2, 4, 9)


def test_rows_the_export_holds_are_skipped_and_another_run_is_refused():
    replica = Applier(SERVED, export=(1, 10), run="r")
    assert replica.apply(_rec(step=10)) == ("skipped", "")
    assert replica.rows == {} and replica.mark == (1, 10, 0)
    assert replica.apply(_rec(step=11))[0] == "applied" and set(replica.rows["t0"]) == {1, 7}
    outcome, why = replica.apply(_rec(step=12, run="other"))
    assert outcome == "other_run" and "'other'" in why


SLOTS = 16
_HOMES = home(torch.arange(1, 5000), SLOTS)


def _id_at(slot: int, nth: int = 0) -> int:
    """The nth id (from 1 up) whose window starts at `slot`."""
    return int(torch.nonzero(slot == _HOMES)[nth]) + 1


def _zch(held: dict[int, int] | None = None, since: tuple[int, int] | None = None) -> Applier:
    """A replica of t0 (16 slots, probes 4, and the default row) whose map holds `held`
    {id: slot} (admitted at (gen, step) `since`; None: at or before the export), and of t1, a
    modulo table."""
    served = ServedMap.empty(SLOTS, 4)
    keys, used = served.copies[0]
    for raw, slot in (held or {}).items():
        keys[slot], used[slot] = raw, True
        if since is not None:
            served.changed[slot] = since
    tables = {"t0": ServedTable(SLOTS + 1, 4, "int8"), "t1": ServedTable(100, 4, "int8")}
    return Applier(tables, maps={"t0": served})


def _map(ids=(), evicted=(), admitted=(), **kw) -> UpdateRecord:
    return _rec(ids=tuple(ids), rows=bytes(range(8)) * len(ids), evicted=tuple(evicted),
                admitted=tuple(admitted), **kw)  # fmt: skip


def test_a_slot_changes_hands_with_its_row_and_a_lone_eviction_frees_it():
    a, b = _id_at(3), _id_at(3, 1)  # both may hold slots 3-6
    replica = _zch(held={a: 3})
    m = replica.maps["t0"]
    assert replica.apply(_map([3, 16], [(3, a)], [(3, b)])) == ("applied", "")
    assert m.held(3) == b and replica.rows["t0"][3] == bytes(range(8)) and 16 in replica.rows["t0"]
    assert replica.apply(_map([4], [], [(4, a)], step=11)) == ("applied", "")  # a's window
    assert replica.apply(_map([], [(3, b)], [], step=12)) == ("applied", "")
    assert m.held(3) is None and m.held(4) == a and replica.applied_rows == 3


def test_a_map_record_sent_again_rewrites_its_rows_and_leaves_the_map():
    a, b = _id_at(3), _id_at(3, 1)
    replica = _zch(held={a: 3})
    moved = _map([3], [(3, a)], [(3, b)])
    assert replica.apply(moved) == ("applied", "")
    assert replica.apply(moved) == ("applied", "")  # the publisher sent it again
    assert replica.maps["t0"].held(3) == b and replica.applied_rows == 2
    outcome, why = replica.apply(_map([4], [], [(4, b)]))  # the same step, not in place
    assert outcome == "id_held", why
    assert replica.apply(_map([16], [], [(16, b)]))[0] == "slot_range"


BAD_MAPS = {
    # slot 16 is t0's default row, not a slot
    "a slot past the slots": (_map([16], [], [(16, 5)]), "slot_range"),
    "a slot outside the id's window": (_map([9], [], [(9, _id_at(3))]), "slot_range"),
    "a table without a map": (_map([], [(0, 1)], [], table="t1"), "slot_range"),
    "an id another slot holds since the same step": (_map([4], [], [(4, _id_at(3))]), "id_held"),
    "an id admitted twice": (_map([5, 6], [], [(5, _id_at(5)), (6, _id_at(5))]), "id_held"),
    "an eviction of another id": (_map([], [(3, _id_at(3) + 1)], []), "map_mismatch"),
    "an eviction from a free slot": (_map([], [(8, 5)], []), "map_mismatch"),
    "an admission into a held slot": (_map([3], [], [(3, _id_at(3, 1))]), "map_mismatch"),
}


@pytest.mark.parametrize("bad", BAD_MAPS)
def test_a_bad_map_change_is_refused_whole_counted_and_changes_nothing(bad):
    # held since the records' own (gen, step) for the id_held case, else since the export
    replica = _zch(held={_id_at(3): 3}, since=(1, 10) if "same step" in bad else None)
    before = [t.clone() for t in replica.maps["t0"].copies[0]]
    rec, outcome = BAD_MAPS[bad]
    got, why = replica.apply(rec)
    assert (got, replica.refused[got]) == (outcome, 1), why
    assert why.startswith(outcome.replace("_", " ")), why
    assert all(torch.equal(x, y) for x, y in zip(before, replica.maps["t0"].copies[0], strict=True))
    assert replica.rows == {} and replica.applied_rows == 0 and replica.rank_version == {}


def test_map_changes_the_export_holds_are_skipped_unchecked():
    replica = _zch()
    replica.export = (1, 10)
    assert replica.apply(_map([], [(3, 99)], []))[0] == "skipped"
    assert replica.maps["t0"].held(3) is None and replica.refused == {}


# ---- map changes out of order across ranks (rec.served_map) ----------------------------------


def _of(rank: int, step: int, ids=(), evicted=(), admitted=(), held=(), row: int = 0):
    """A t0 record of `rank` (of 2) at `step`, each row all `row`, saying which ids its rows'
    slots hold."""
    return _rec(rank=rank, step=step, ids=tuple(ids), rows=bytes([row] * 8) * len(ids),
                evicted=tuple(evicted), admitted=tuple(admitted), held=tuple(held))  # fmt: skip


def _apply_all(replica: Applier, records) -> None:
    for r in records:
        assert replica.apply(r) == ("applied", ""), (r.rank, r.step)


def test_an_admission_ahead_of_the_eviction_it_follows_is_applied_in_either_order():
    """Round 10: rank 0 evicts x from slot 5 (its shard) and gives the slot to y; round 12:
    rank 1 admits x into slot 8. Rank 0's sender a round behind sends its step-9 rows and the
    round after rank 1's admission: both orders end with the same map and rows."""
    x, y = _id_at(5), _id_at(5, 1)
    rank0 = [_of(0, 9, [5], held=[(5, x)], row=1),
             _of(0, 10, [5], [(5, x)], [(5, y)], [(5, y)], row=2)]  # fmt: skip
    rank1 = [_of(1, 12, [8], [], [(8, x)], [(8, x)], row=3)]
    ends = []
    for records in (rank0 + rank1, rank1 + rank0):
        replica = _zch(held={x: 5})
        _apply_all(replica, records)
        m = replica.maps["t0"]
        ends.append(([m.held(s) for s in range(SLOTS)], replica.rows["t0"]))
    assert ends[0] == ends[1]
    assert (
        ends[0][0][5] == y
        and ends[0][0][8] == x
        and ends[0][1] == {5: bytes([2] * 8), 8: bytes([3] * 8)}
    )


def test_the_vacated_slot_waits_for_its_own_eviction():
    """While slot 5 is vacated (x moved on, rank 0's eviction not in yet) it holds no id, a
    record of rank 0 older than the vacate still says x (held), and the eviction is accepted
    and leaves it free; an admission into it without that eviction, or an eviction of x newer
    than the vacate, is a mismatch."""
    x = _id_at(5)
    replica = _zch(held={x: 5})
    m = replica.maps["t0"]
    assert replica.apply(_of(1, 12, [8], [], [(8, x)], [(8, x)])) == ("applied", "")
    assert m.held(5) is None and m.held(8) == x and m.vacated == {5: (x, (1, 12))}
    assert replica.apply(_of(0, 9, [5], held=[(5, x)])) == ("applied", "")
    outcome, why = replica.apply(_of(0, 10, [5], [], [(5, _id_at(5, 1))], [(5, _id_at(5, 1))]))
    assert outcome == "map_mismatch" and "does not evict" in why, why
    outcome, why = replica.apply(_of(0, 13, [], [(5, x)]))
    assert outcome == "map_mismatch" and "evicts id" in why, why
    assert replica.apply(_of(0, 10, [], [(5, x)])) == ("applied", "")
    assert m.held(5) is None and m.vacated == {} and m.changed[5] == (1, 10)


def test_an_admission_older_than_its_ids_holder_is_applied_vacated():
    """Rank 1, two rounds behind: its admission of x (step 10) and eviction (step 12) arrive
    after rank 0 admitted x at step 14. x stays with rank 0's slot; rank 1's slot ends free."""
    x = _id_at(6)
    rank0 = [_of(0, 14, [6], [], [(6, x)], [(6, x)], row=4)]
    rank1 = [_of(1, 10, [8], [], [(8, x)], [(8, x)], row=5), _of(1, 11, [8], held=[(8, x)]),
             _of(1, 12, [], [(8, x)])]  # fmt: skip
    for records in (rank0 + rank1, rank1 + rank0, rank1[:1] + rank0 + rank1[1:]):
        replica = _zch()
        _apply_all(replica, records)
        m = replica.maps["t0"]
        assert (m.held(6), m.held(8), m.vacated) == (x, None, {}), [r.step for r in records]


def test_two_holders_of_one_id_at_one_step_are_still_refused():
    """Not explained by order: an id admitted by two ranks in the same round."""
    x = _id_at(6)
    replica = _zch()
    assert replica.apply(_of(0, 14, [6], [], [(6, x)], [(6, x)])) == ("applied", "")
    outcome, why = replica.apply(_of(1, 14, [8], [], [(8, x)], [(8, x)]))
    assert outcome == "id_held" and "since (1, 14)" in why, why
    assert replica.maps["t0"].held(6) == x and replica.maps["t0"].held(8) is None


def _valid_log(seed: int, rounds: int = 12) -> tuple[list[list[UpdateRecord]], dict, dict]:
    """Two ranks' records (slots 0-7 rank 0's, 8-15 rank 1's) of `rounds` random admission
    rounds over ids whose windows cross the ranks' boundary, as a publisher writes them: per
    round each rank's rows of the slots it holds (before the round), then its map changes with
    the admitted slots' fresh rows. Also the final map {slot: id} and rows {slot: bytes}."""
    gen = torch.Generator().manual_seed(seed)
    pool = [_id_at(s, n) for s in range(4, 12) for n in range(3)]  # windows over slots 4-14
    held: dict[int, int] = {}
    rows: dict[int, bytes] = {}
    logs: list[list[UpdateRecord]] = [[], []]
    pick = lambda n: int(torch.randint(n, (1,), generator=gen))  # noqa: E731
    for k in range(rounds):
        step, value = 10 + 2 * k, 16 * k
        for rank in (0, 1):
            mine = sorted(s for s in held if s // 8 == rank)
            logs[rank].append(_of(rank, step - 1, mine, held=[(s, held[s]) for s in mine],
                                  row=value + rank))  # fmt: skip
            rows.update({s: bytes([value + rank] * 8) for s in mine})
        evicted = {s: held.pop(s) for s in list(held) if pick(3) == 0}
        admitted = {}
        for raw in pool:
            if raw in held.values() or raw in admitted.values() or pick(4):
                continue
            free = [s for s in windows(torch.tensor([raw]), SLOTS, 4)[0].tolist()
                    if s not in held and s not in admitted]  # fmt: skip
            if free:
                admitted[free[0]] = raw
        held.update(admitted)
        for rank in (0, 1):
            ev = sorted((s, i) for s, i in evicted.items() if s // 8 == rank)
            ad = sorted((s, i) for s, i in admitted.items() if s // 8 == rank)
            if ev or ad:
                slots = [s for s, _ in ad]
                logs[rank].append(_of(rank, step, slots, ev, ad, ad, row=value + 8 + rank))
                rows.update({s: bytes([value + 8 + rank] * 8) for s in slots})
    return logs, held, rows


@pytest.mark.parametrize("seed", range(40))
def test_any_interleaving_of_the_ranks_logs_ends_with_the_final_map_and_rows(seed):
    """Random rounds, the two ranks' records interleaved at random (each rank's in its order,
    one rank up to the whole log behind): nothing refused, and the map and rows are the
    training side's final ones."""
    logs, final, rows = _valid_log(seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    order, at = [], [0, 0]
    while at[0] < len(logs[0]) or at[1] < len(logs[1]):
        rank = int(torch.randint(2, (1,), generator=gen))
        if at[rank] == len(logs[rank]):
            rank = 1 - rank
        order.append(logs[rank][at[rank]])
        at[rank] += 1
    replica = _zch()
    _apply_all(replica, order)
    m = replica.maps["t0"]
    assert {s: m.held(s) for s in range(SLOTS) if m.held(s) is not None} == final
    assert replica.rows["t0"] == rows and m.vacated == {}
    assert all(v >= replica.mark[:2] for v in m.changed.values())  # settled at the watermark


def test_a_resume_sees_a_slot_vacated_for_an_eviction_that_never_came_as_free():
    """rec.served_map.replayed, what republish_undone sets back: the dead run's rank 1 admitted
    x (held by slot 5 at the checkpoint) into slot 8; rank 0 died before sending x's eviction.
    A replica holds x at 8 and slot 5 free, so the resume must give slot 5 back its id."""
    from rec.served_map import replayed

    x = _id_at(5)
    keys, used = torch.zeros(SLOTS, dtype=torch.int64), torch.zeros(SLOTS, dtype=torch.bool)
    keys[5], used[5] = x, True
    assert replayed(keys, used, 4, [_of(1, 14, [8], [], [(8, x)], [(8, x)])]) == {8: x, 5: None}
    assert bool(used[5])  # the checkpoint's map itself is left as it is
