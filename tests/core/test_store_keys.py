"""The embedding store's keys and URL (rec.contract.store) against the golden files
(tests/data/store_key_golden.json, url_golden.json) that rec-server's tests read too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rec.contract.store import (
    DEFAULT_FIELD,
    FORMAT,
    FORMAT_RAW_IDS,
    MARKER_FIELD,
    TABLE_SHIFT,
    StoreError,
    StoreUrl,
    check_section,
    meta_key,
    parse_store_url,
    partition_key,
    prefix,
    raw_id_partition,
    section_format,
    split_key,
    store_key,
    store_order,
)

DATA = Path(__file__).parents[1] / "data"
KEYS = json.loads((DATA / "store_key_golden.json").read_text())
URLS = json.loads((DATA / "url_golden.json").read_text())["store"]


def test_the_key_layout_is_the_golden_one():
    assert KEYS["table_shift"] == TABLE_SHIFT
    for case in KEYS["prefix"]:
        assert prefix(case["model"], case["version"], case["run"]) == case["prefix"]
    for case in KEYS["partition_key"]:
        assert partition_key(case["prefix"], case["table"], case["partition"]) == case["key"]
    for case in KEYS["meta_key"]:
        assert meta_key(case["prefix"]) == case["key"]
    for case in KEYS["store_order"]:
        assert store_order({"tables": dict.fromkeys(case["tables"])}) == case["order"]


def test_slots_are_redis_cluster_s():
    from redis.crc import key_slot

    for case in KEYS["key_slot"] + KEYS["partition_key"] + KEYS["meta_key"]:
        assert key_slot(case["key"].encode()) == case["slot"], case["key"]


@pytest.mark.parametrize("case", KEYS["store_key"], ids=lambda c: f"{c['table']}-{c['row']}")
def test_a_store_key_is_table_then_row(case):
    assert store_key(case["table"], case["row"]) == case["key"]
    assert split_key(case["key"]) == (case["table"], case["row"])


@pytest.mark.parametrize(
    "case", KEYS["store_key_refused"], ids=lambda c: f"{c['table']}-{c['row']}"
)
def test_a_key_out_of_range_is_refused(case):
    with pytest.raises(StoreError) as e:
        store_key(case["table"], case["row"])
    assert case["error"] in str(e.value)


@pytest.mark.parametrize("case", URLS["valid"], ids=lambda c: c["url"])
def test_a_golden_store_url_parses(case):
    assert parse_store_url(case["url"]) == StoreUrl(tuple(map(tuple, case["nodes"])))


@pytest.mark.parametrize("case", URLS["refused"], ids=lambda c: c["url"])
def test_a_bad_store_url_is_refused(case):
    with pytest.raises(StoreError) as e:
        parse_store_url(case["url"])
    assert case["error"] in str(e.value)


def test_a_stored_int4_table_of_odd_dim_is_refused_as_the_log_refuses_it():
    table = {"rows": 10, "dim": 3, "dtype": "int4", "row_bytes": 6, "partitions": 1}
    section = {"format": "rec.store/1", "url": "redis://h:1", "prefix": "p", "tables": {"t": table}}
    with pytest.raises(StoreError, match="store.tables.t: a int4 row of dim 3 is not a whole"):
        check_section(section)
    check_section({**section, "tables": {"t": {**table, "dim": 4, "row_bytes": 6}}})


@pytest.mark.parametrize("case", KEYS["raw_id"], ids=lambda c: f"{c['id']}-{c['partitions']}")
def test_a_raw_id_s_partition_and_field_are_the_golden_ones(case):
    assert raw_id_partition(case["id"], case["partitions"]) == case["partition"]
    assert str(case["id"]) == case["field"]


def test_a_section_with_a_raw_keyed_table_is_rec_store_2():
    assert (KEYS["marker_field"], KEYS["default_field"]) == (MARKER_FIELD, DEFAULT_FIELD)
    assert (KEYS["formats"]["rows"], KEYS["formats"]["raw_ids"]) == (FORMAT, FORMAT_RAW_IDS)
    table = {"rows": 3, "dim": 4, "dtype": "fp32", "row_bytes": 16, "partitions": 2}
    raw = {**table, "keys": "raw_id", "slots": 2}
    assert section_format({"t": table}) == FORMAT
    assert section_format({"t": table, "z": raw}) == FORMAT_RAW_IDS
    section = {"format": FORMAT_RAW_IDS, "url": "redis://h:1", "prefix": "p", "tables": {"z": raw}}
    check_section(section)
    with pytest.raises(StoreError, match="want 'rec.store/2' for these tables"):
        check_section({**section, "format": FORMAT})
    with pytest.raises(StoreError, match="want 'rec.store/1' for these tables"):
        check_section({**section, "tables": {"t": table}})
    with pytest.raises(StoreError, match=r"store.tables.z.keys 'slot'"):
        check_section({**section, "tables": {"z": {**raw, "keys": "slot"}}})
    with pytest.raises(StoreError, match=r"store.tables.z.slots 3, want 2"):
        check_section({**section, "tables": {"z": {**raw, "slots": 3}}})
