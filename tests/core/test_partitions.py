"""Partitioned logs' keys and layout record (rec.contract.partitions), against
tests/data/partition_key_golden.json, which the C++ twin reads too, and against redis-py's own
slot function. tests/logs/test_keyslot.py checks the slots against a real cluster node."""

import json
from pathlib import Path

import pytest
from redis.crc import key_slot as redis_py_slot

from rec.contract import partitions as pt

DATA = Path(__file__).parents[1] / "data"
GOLDEN = json.loads((DATA / "partition_key_golden.json").read_text())
STORE = json.loads((DATA / "store_key_golden.json").read_text())


def _name(case: dict) -> str:
    return f"{case['stream']}-{case['partitions']}"


def test_the_golden_constants_are_the_modules():
    assert (GOLDEN["format"], GOLDEN["slots"], GOLDEN["max_partitions"]) == (
        pt.FORMAT, pt.SLOTS, pt.MAX_PARTITIONS)  # fmt: skip


@pytest.mark.parametrize("case", GOLDEN["key_slot"] + STORE["key_slot"], ids=lambda c: c["key"])
def test_a_key_has_redis_clusters_slot(case):
    assert pt.key_slot(case["key"]) == case["slot"]
    assert pt.key_slot(case["key"].encode()) == redis_py_slot(case["key"].encode())


def test_crc16_continues_an_earlier_call():
    assert pt.crc16(b"123456789") == 0x31C3  # CRC16/XMODEM's check value
    assert pt.crc16(b"56789", pt.crc16(b"1234")) == 0x31C3


@pytest.mark.parametrize("case", GOLDEN["layout_key"], ids=lambda c: c["stream"])
def test_a_layout_key_is_the_stream_in_braces(case):
    assert pt.layout_key(case["stream"]) == case["key"]


@pytest.mark.parametrize("case", GOLDEN["partitions"], ids=_name)
def test_golden_partition_keys(case):
    layout = pt.make_layout(case["stream"], case["partitions"])
    assert list(layout.keys) == [p["key"] for p in case["parts"]]
    for p in case["parts"]:
        assert pt.band(p["partition"], case["partitions"]) == tuple(p["band"])
        assert pt.key_slot(p["key"]) == p["slot"]
        assert pt.dead_key(p["key"]) == p["dead"]
        assert pt.key_slot(p["dead"]) == p["slot"]


@pytest.mark.parametrize("partitions", [1, 2, 3, 5, 6, 7, 16, 48, 100, 256])
def test_each_band_holds_exactly_its_partition_with_the_smallest_j(partitions):
    stream = "rec:events"
    bands = [pt.band(k, partitions) for k in range(partitions)]
    # The bands tile the slots: no gap, no overlap, widths within one slot of each other.
    assert bands[0][0] == 0 and bands[-1][1] == pt.SLOTS
    assert all(a[1] == b[0] for a, b in zip(bands, bands[1:], strict=False))
    assert max(h - lo for lo, h in bands) - min(h - lo for lo, h in bands) <= 1
    keys = pt.make_layout(stream, partitions).keys
    for k, key in enumerate(keys):
        j = int(key[1:-1].rsplit(":", 1)[1])
        assert key == "{" + f"{stream}:{k}:{j}" + "}"
        in_band = [i for i, (lo, hi) in enumerate(bands) if lo <= pt.key_slot(key) < hi]
        assert in_band == [k]
        assert not any(bands[k][0] <= pt.key_slot(f"{stream}:{k}:{i}") < bands[k][1]
                       for i in range(j))  # fmt: skip


@pytest.mark.parametrize("partitions", [3, 6, 12, 24, 48])
def test_masters_of_cluster_create_get_equal_shares(partitions):
    """redis-cli --cluster create's ranges for 3 masters; P a multiple of 3 gives each P/3."""
    masters = [(0, 5461), (5461, 10923), (10923, 16384)]
    keys = pt.make_layout("rec:events", partitions).keys
    shares = [sum(lo <= pt.key_slot(k) < hi for k in keys) for lo, hi in masters]
    assert shares == [partitions // 3] * 3


@pytest.mark.parametrize("case", GOLDEN["layout"], ids=lambda c: c["record"])
def test_a_layout_record_round_trips(case):
    layout = pt.make_layout(case["stream"], case["partitions"], case["key"])
    assert layout.to_json() == case["record"]
    assert pt.parse_layout(case["record"], pt.layout_key(case["stream"])) == layout
    assert pt.parse_layout(case["record"].encode(), "x") == layout


@pytest.mark.parametrize("case", GOLDEN["layout_refused"], ids=lambda c: c["record"])
def test_a_bad_layout_record_is_refused_naming_the_field(case):
    with pytest.raises(pt.PartitionError) as e:
        pt.parse_layout(case["record"], "{s}:layout")
    assert case["error"] in str(e.value)
    assert str(e.value).startswith("{s}:layout: ")


@pytest.mark.parametrize("case", GOLDEN["refused"], ids=_name)
def test_a_stream_or_count_that_cannot_be_partitioned_is_refused(case):
    with pytest.raises(pt.PartitionError) as e:
        pt.make_layout(case["stream"], case["partitions"])
    assert case["error"] in str(e.value)
