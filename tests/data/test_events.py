"""The event stream's entry format (rec.contract.events): every case of
tests/data/event_golden.json decodes to its values, or is refused with its reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rec.contract.events import (
    FORMAT,
    MAX_EVENTS,
    REASONS,
    EventError,
    _fast_parse,
    decode,
    decode_events,
    encode,
    parse_url,
)
from rec.features import FeatureSpec

GOLDEN = json.loads((Path(__file__).parent / "event_golden.json").read_text())
SPEC = FeatureSpec.from_dict(GOLDEN["spec"])


def test_the_golden_constants_are_the_contracts():
    assert (GOLDEN["format"], GOLDEN["max_events"]) == (FORMAT, MAX_EVENTS)
    assert tuple(GOLDEN["reasons"]) == REASONS
    used = {r["reason"] for case in GOLDEN["valid"] for r in case["refused"]}
    assert used | {"malformed_entry"} == set(REASONS), "every reason has a golden case"


def _per_event_ids(lengths: np.ndarray, values: np.ndarray) -> list[list[list[int]]]:
    out, at = [], 0
    for row in lengths.tolist():
        bags = []
        for k in row:
            bags.append(values[at : at + k].tolist())
            at += k
        out.append(bags)
    return out


@pytest.mark.parametrize("case", GOLDEN["valid"], ids=lambda c: c["name"])
def test_a_golden_entry_decodes_to_its_events_and_refusals(case):
    got = decode(case["fields"], SPEC)
    want = case["events"]
    assert got.labels.tolist() == [e["labels"] for e in want]
    assert got.dense.tolist() == [e["dense"] for e in want]
    assert _per_event_ids(got.lengths, got.values) == [e["ids"] for e in want]
    assert [(r.index, r.reason) for r in got.refused] == [
        (r["index"], r["reason"]) for r in case["refused"]
    ]
    assert got.size == len(want) + len(case["refused"])
    assert sorted(got.index.tolist() + [r.index for r in got.refused]) == list(range(got.size))


@pytest.mark.parametrize("case", GOLDEN["refused"], ids=lambda c: c["name"])
def test_a_malformed_entry_is_refused_whole_naming_what_is_wrong(case):
    with pytest.raises(EventError) as e:
        decode(case["fields"], SPEC)
    assert e.value.reason == "malformed_entry"
    assert case["error"] in str(e.value)


def test_an_entry_in_bytes_as_redis_returns_it_decodes_the_same():
    case = GOLDEN["valid"][0]
    raw = {k.encode(): v.encode() for k, v in case["fields"].items()}
    assert decode(raw, SPEC).dense.tolist() == decode(case["fields"], SPEC).dense.tolist()
    with pytest.raises(EventError, match="not UTF-8"):
        decode({b"format": FORMAT.encode(), b"events": b"\xff["}, SPEC)


def test_encode_round_trips_and_refuses_an_empty_or_oversized_entry():
    events = [{"clicked": i % 2, "price": i, "age_days": 1, "item": [i], "site": "a"}
              for i in range(5)]  # fmt: skip
    got = decode(encode(events), SPEC)
    assert got.dense[:, 0].tolist() == list(range(5)) and got.values[::2].tolist() == [*range(5)]
    for n in (0, MAX_EVENTS + 1):
        with pytest.raises(ValueError, match="1 to 4096 events"):
            encode([events[0]] * n)


def test_a_message_names_the_event_and_the_field():
    bad = [{"clicked": 1, "price": "abc", "age_days": 1, "item": "1", "site": "1"}]
    refusal = decode(encode(bad), SPEC).refused[0]
    assert refusal.message == 'event 0: price="abc" is not a number'


def test_a_dense_value_beyond_float32_and_a_lone_surrogate_are_refused_not_trained():
    """1e39 is a finite float64 but inf as the model's float32; "\\ud800" (a JSON escape) is
    text with no UTF-8 form, which hashing cannot read: both refused, the rest trained."""
    good = {"clicked": 1, "price": 2.5, "age_days": 1, "item": "7", "site": "a"}
    events = [good, {**good, "price": 1e39}, {**good, "item": "\ud800"}, {**good, "price": -1e300}]
    fields = {"format": FORMAT, "events": json.dumps(events)}  # json.dumps escapes the surrogate
    got = decode(fields, SPEC)
    assert len(got.dense) == 1 and got.dense[0, 0] == 2.5
    refused = {r.index: (r.reason, r.message) for r in got.refused}
    assert refused[1] == ("dense_not_numeric",
                          "event 1: price=1e+39 is beyond float32's range (3.4e38)")  # fmt: skip
    assert refused[2][0] == "bad_sparse" and "lone surrogate" in refused[2][1]
    assert refused[3][0] == "dense_not_numeric"


@pytest.mark.parametrize(
    ("url", "stream"), [("redis://h:1", "rec:events"), ("redis://h:1/", "rec:events"),
                        ("redis://h:1/clicks", "clicks")],
)  # fmt: skip
def test_the_url_names_host_port_and_stream(url, stream):
    assert parse_url(url).stream == stream


@pytest.mark.parametrize("url", ["redis://h:1/0", "http://h:1/x", "redis://h:70000/x"])
def test_a_bad_url_is_refused(url):
    with pytest.raises(ValueError, match="event stream URL"):
        parse_url(url)


# Events whose JSON orjson and json could read differently: the decoder must give the same
# arrays and refusals, reason and message, as from json's parse (the reference) for each.
_E = '{"clicked":%s,"price":%s,"age_days":%s,"item":%s,"site":"ab"}'
TRICKY = [
    _E % ("1", "1.0", "1e3", "[9223372036854775807,-9223372036854775808,-0]"),
    _E % ('"1.0"', "-0.0", "-0", '"\\u00e9t\\u00e9|\\ud83d\\ude00|x"'),
    _E % ("0", "2.5e-5", "3.4e38", "[0,1]"),
    _E % ("1", "5e-324", "123456789012345678901234567890.5", "7"),
    _E % ("1", "18446744073709551616", "-9223372036854775809", "[1]"),  # ints past 64 bits
    _E % ("1", "1", "1", "[9223372036854775808]"),  # past int64, within uint64
    _E % ("1", "1", "1", "[18446744073709551616]"),
    _E % ("18446744073709551616", "1", "1", "[1]"),
    _E % ("1", "NaN", "1", "[1]"),
    _E % ("1", "Infinity", "1", "[1]"),
    _E % ("1", "1e400", "1", "[1]"),
    '{"clicked":1,"price":1,"age_days":1,"item":1,"site":"ab","note":"\\ud800"}',  # lone surrogate
    '{"clicked":0,"clicked":1,"price":1,"age_days":1,"item":1,"site":"ab"}',  # a duplicate key
    _E % ("true", "1", "1", "[1]"),
    _E % ("1", "1", "1", "[1.0]"),
    _E % ("1", "1", "1", "1" + "0" * 400),
]


def _arrays(got) -> tuple:
    return (got.labels.tolist(), got.dense.tolist(), got.lengths.tolist(), got.values.tolist(),
            got.index.tolist(), got.size, got.refused)  # fmt: skip


@pytest.mark.parametrize("events", [f"[{e}]" for e in TRICKY] + ["[" + ",".join(TRICKY) + "]"])
def test_orjson_decodes_as_json_would(events):
    fields = {"format": FORMAT, "events": events}
    want = decode_events(json.loads(events), SPEC)
    assert _arrays(decode(fields, SPEC)) == _arrays(want)
    raw = {k.encode(): v.encode() for k, v in fields.items()}  # as Redis returns them
    assert _arrays(decode(raw, SPEC)) == _arrays(want)


def test_orjson_reads_the_values_the_decoder_inspects_as_json_does():
    """Type for type (int against float), where orjson parses: "1.0", "1e3", -0, the ends of
    int64 and uint64, unicode escapes and raw UTF-8."""
    text = ('[1.0,1e3,-0,-0.0,0,9223372036854775807,-9223372036854775808,18446744073709551615,'
            '"\\u00e9\\ud83d\\ude00","été",0.1,2.5e-5,1e-400,{"a":[1,"1"]}]')  # fmt: skip
    fast, ref = _fast_parse({"format": FORMAT, "events": text}), json.loads(text)
    assert fast == ref and [type(x) for x in fast] == [type(x) for x in ref]
    assert math.copysign(1.0, fast[3]) == -1.0
