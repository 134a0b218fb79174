"""The update log's record format (rec.contract.updates) and the replica rules (rec.update_log):
malformed records are refused naming the field, bad updates are refused whole and counted."""

from __future__ import annotations

import struct

import pytest

from rec.contract.updates import UpdateError, UpdateRecord, decode, encode, row_bytes
from rec.update_log import ReplicaState, ServedTable


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


@pytest.mark.parametrize(
    "change, fault",
    [
        ({"format": "rec.updates/2"}, '"format" must be'),
        ({"step": "-3"}, '"step" must be a non-negative integer'),
        ({"rank": "2"}, '"rank" 2 is not in [0, 2)'),
        ({"gen": "0"}, '"gen" must be at least 1'),
        ({"last": "yes"}, '"last" must be "0" or "1"'),
        ({"dtype": "int3"}, '"dtype" must be one of'),
        ({"rows": bytes(15)}, '"rows" holds 15 bytes, 2 int8 rows of dim 4 need 16'),
        ({"ids": bytes(12)}, '"ids" holds 12 bytes, 2 ids need 16'),
        ({"ids": struct.pack("<2q", 7, 1)}, '"ids" must be non-negative and strictly increasing'),
        ({"ids": struct.pack("<2q", 3, 3)}, '"ids" must be non-negative and strictly increasing'),
        ({"table": ""}, '"table" is empty but "count" is not 0'),
        ({"wall_ns": None}, '"wall_ns" is missing'),
        ({"count": str(1 << 61)}, f'"count" {1 << 61} is over 1048576 rows'),
        ({"step": str(1 << 63)}, '"step" must be a non-negative integer'),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(change, fault):
    fields = encode(_rec())
    for key, value in change.items():
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    with pytest.raises(UpdateError) as e:
        decode(fields)
    assert fault in str(e.value)


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
    state = ReplicaState(SERVED)
    assert state.apply(rec).startswith(reason)
    assert state.refused[reason] == 1 and state.rows == {} and state.applied_rows == 0


def test_the_watermark_waits_for_every_rank_and_never_goes_back():
    state = ReplicaState(SERVED)
    assert state.apply(_rec(rank=0, step=10)) is None
    assert state.watermark() is None  # rank 1 has published nothing yet
    assert (
        state.apply(_rec(rank=1, step=8, table="", dtype="fp32", dim=0, ids=(), rows=b"")) is None
    )
    assert state.watermark() == (1, 8, 5)
    assert state.apply(_rec(rank=0, step=9)).startswith("backwards")
    assert state.apply(_rec(rank=0, step=10)) is None  # the same publish again: re-sent
    assert state.apply(_rec(rank=0, step=3, gen=2)) is None  # a resumed run: a new generation
    assert state.refused["backwards"] == 1
