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
from rec.zch import home

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


def _zch(held: dict[int, int] | None = None) -> Applier:
    """A replica of t0 (16 slots, probes 4, and the default row) whose map holds `held`
    {id: slot}, and of t1, a modulo table."""
    served = ServedMap.empty(SLOTS, 4)
    keys, used = served.copies[0]
    for raw, slot in (held or {}).items():
        keys[slot], used[slot] = raw, True
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
    "an id another slot holds": (_map([4], [], [(4, _id_at(3))]), "id_held"),
    "an id admitted twice": (_map([5, 6], [], [(5, _id_at(5)), (6, _id_at(5))]), "id_held"),
    "an eviction of another id": (_map([], [(3, _id_at(3) + 1)], []), "map_mismatch"),
    "an eviction from a free slot": (_map([], [(8, 5)], []), "map_mismatch"),
    "an admission into a held slot": (_map([3], [], [(3, _id_at(3, 1))]), "map_mismatch"),
}


@pytest.mark.parametrize("bad", BAD_MAPS)
def test_a_bad_map_change_is_refused_whole_counted_and_changes_nothing(bad):
    replica = _zch(held={_id_at(3): 3})
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
