"""The event stream's entry format (rec.contract.events): every case of
tests/data/event_golden.json decodes to its values, or is refused with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rec.contract.events import (
    FORMAT,
    MAX_EVENTS,
    REASONS,
    EventError,
    decode,
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
