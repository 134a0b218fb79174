"""Stream URLs with a node list (rec.contract.urls): tests/data/stream_url_golden.json, the same
node-list form as the store's URL, and every one-node URL of url_golden.json read as before."""

import json
from pathlib import Path

import pytest

from rec.contract import events, updates
from rec.contract.store import parse_store_url
from rec.contract.urls import StreamUrl

DATA = Path(__file__).parents[1] / "data"
NODES = json.loads((DATA / "stream_url_golden.json").read_text())
ONE_NODE = json.loads((DATA / "url_golden.json").read_text())


@pytest.mark.parametrize("case", NODES["valid"], ids=lambda c: c["url"])
def test_a_golden_node_list_parses_to_its_nodes_the_first_one_its_host(case):
    u = updates.parse_url(case["url"])
    assert u.nodes == tuple(map(tuple, case["nodes"]))
    assert (u.host, u.port, u.stream) == (case["host"], case["port"], case["stream"])
    # The event stream reads the same nodes; only its default stream differs.
    e = events.parse_url(case["url"])
    has_path = "/" in case["url"][len("redis://") :].rstrip("/")
    assert (e.nodes, e.stream) == (u.nodes, u.stream if has_path else events.DEFAULT_STREAM)
    # Written back, a URL names its every node and its stream, and reads the same again.
    assert updates.parse_url(str(u)) == u


@pytest.mark.parametrize("case", NODES["refused"], ids=lambda c: c["url"])
def test_a_bad_node_list_is_refused_naming_the_node(case):
    with pytest.raises(updates.UpdateError) as e:
        updates.parse_url(case["url"])
    assert case["error"] in str(e.value)
    with pytest.raises(ValueError) as e:
        events.parse_url(case["url"])
    assert case["error"].replace("update log", "event stream", 1) in str(e.value)


@pytest.mark.parametrize("case", ONE_NODE["update_log"]["valid"], ids=lambda c: c["url"])
def test_a_one_node_url_is_one_node(case):
    u = updates.parse_url(case["url"])
    assert u.nodes == ((case["host"], case["port"]),)
    assert u == StreamUrl(case["host"], case["port"], case["stream"])
    assert str(u) == f"redis://{case['host']}:{case['port']}/{case['stream']}"


@pytest.mark.parametrize("case", ONE_NODE["store"]["valid"], ids=lambda c: c["url"])
def test_the_store_url_names_the_same_nodes_as_a_stream_url(case):
    """`--stream`, `--publish` and `--updates` take what `rec store cluster` prints."""
    assert updates.parse_url(case["url"]).nodes == parse_store_url(case["url"]).nodes


def test_a_comma_in_the_stream_is_the_streams():
    u = events.parse_url("redis://a:1,b:2/x,y:z")
    assert (u.nodes, u.stream) == ((("a", 1), ("b", 2)), "x,y:z")
