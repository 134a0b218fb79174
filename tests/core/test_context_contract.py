"""rec.contract.context and the context model's I/O names: a flat batch split into contexts and
repeated back is the same batch, bit for bit, for every shape of split (no context dense, no
candidate dense, no context sparse, empty bags, string values); rec.json's section reads back
and refuses what no model can have."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest

from rec.contract import context as ctx
from rec.contract import io
from rec.contract.context import (
    ContextSplit,
    RequestError,
    offsets,
    repeat,
    request_form,
    split_flat,
)
from rec.contract.features import FeatureSpec
from rec.contract.manifest import parse_manifest, write_manifest
from rec.contract.requests import random_request
from rec.contract.sections import ManifestError

SPLITS = {
    "dense_and_sparse": ContextSplit((0, 2), (1, 3), 4, 5),
    "no_candidate_dense": ContextSplit((0, 1, 2, 3), (0,), 4, 5),
    "no_context_dense": ContextSplit((), (4,), 4, 5),
    "no_context_sparse": ContextSplit((1,), (), 4, 5),
    "no_dense_at_all": ContextSplit((), (0, 2), 0, 5),
}


def test_the_module_examples_hold():
    for module in (ctx, io):
        assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("name", SPLITS)
@pytest.mark.parametrize("bags", [(0, 3), (0, 0), (2, 2)])
def test_split_flat_then_repeat_row_by_row_gives_the_flat_batch(name, bags):
    split = SPLITS[name]
    r = random_request(split.num_dense, split.num_sparse, 7, seed=3, ids_per_bag=bags)
    parts = split_flat(split, r["dense_features"], r["sparse_lengths"], r["sparse_values"])
    assert list(parts) == [i["name"] for i in io.context_io_manifest(split, 1)["inputs"]]
    for name_, a in parts.items():
        assert a.dtype.name == io.NUMPY_DTYPES[io.DTYPES[name_]], name_
    assert parts["candidate_offsets"].tolist() == [len(split.cand_sparse) * i for i in range(8)]
    # All 7 contexts at once, through candidate_offsets ...
    dense, lengths, values = repeat(split, parts)
    assert np.array_equal(dense, r["dense_features"])
    assert np.array_equal(lengths, r["sparse_lengths"])
    assert np.array_equal(values, r["sparse_values"])
    # ... and as 7 requests of one context and one candidate each (no offsets sent).
    starts = {k: np.cumsum([0, *parts[k.replace("values", "lengths")].sum(axis=1)])
              for k in ("context_values", "candidate_values") if k in parts}  # fmt: skip
    got = []
    for row in range(7):
        one = {}
        for k, a in parts.items():
            if k in starts:
                one[k] = a[starts[k][row] : starts[k][row + 1]]
            elif k != "candidate_offsets":
                one[k] = a[row : row + 1]
        got.append(repeat(split, one))
    assert np.array_equal(np.concatenate([g[2] for g in got]), r["sparse_values"])
    assert np.array_equal(np.concatenate([g[0] for g in got]), r["dense_features"])


def test_repeat_gives_every_candidate_the_context():
    split = SPLITS["dense_and_sparse"]
    context = random_request(2, 2, 1, seed=1, ids_per_bag=(1, 4))
    cand = random_request(2, 3, 5, seed=2)
    request = {"context_dense": context["dense_features"],
               "context_lengths": context["sparse_lengths"],
               "context_values": context["sparse_values"],
               "candidate_dense": cand["dense_features"],
               "candidate_lengths": cand["sparse_lengths"],
               "candidate_values": cand["sparse_values"]}  # fmt: skip
    dense, lengths, values = repeat(split, request)
    assert dense.shape == (5, 4) and lengths.shape == (5, 5)
    assert np.array_equal(dense[:, [0, 2]], np.repeat(context["dense_features"], 5, axis=0))
    assert np.array_equal(dense[:, [1, 3]], cand["dense_features"])
    assert np.array_equal(lengths[:, [1, 3]], np.repeat(context["sparse_lengths"], 5, axis=0))
    # Splitting the repeated batch gives back each candidate with the same context.
    parts = split_flat(split, dense, lengths, values)
    assert np.array_equal(parts["candidate_values"], cand["sparse_values"])
    assert np.array_equal(parts["context_values"], np.tile(context["sparse_values"], 5))


def test_strings_move_like_ids():
    split = SPLITS["no_context_dense"]
    r = random_request(4, 5, 6, seed=4)
    strings = r["sparse_values"].astype(str).astype(object)
    parts = split_flat(split, r["dense_features"], r["sparse_lengths"], strings)
    request = {k.replace("_values", "_strings"): v for k, v in parts.items()}
    _, _, values = repeat(split, request)
    assert values.tolist() == strings.tolist()


def test_offsets_count_candidate_bags():
    assert offsets([3, 1, 5], 2).tolist() == [0, 6, 8, 18]
    assert offsets([], 4).tolist() == [0]
    assert offsets(np.array([2]), 1).dtype == np.int32


def test_repeat_refuses_contexts_that_do_not_match_the_candidates():
    split = SPLITS["dense_and_sparse"]
    parts = split_flat(split, *random_request(4, 5, 3, seed=1).values())
    del parts["candidate_offsets"]  # three contexts, no offsets: which candidate is whose?
    with pytest.raises(ValueError, match="1 contexts of \\[3\\] candidates"):
        repeat(split, parts)


def test_the_io_manifest_leaves_zero_width_inputs_out():
    def names(split):
        return [i["name"] for i in io.context_io_manifest(split, 2)["inputs"]]

    every = list(io.CONTEXT_INPUT_NAMES)
    assert names(SPLITS["dense_and_sparse"]) == every
    assert "candidate_dense" not in names(SPLITS["no_candidate_dense"])
    assert "context_dense" not in names(SPLITS["no_context_dense"])
    assert names(SPLITS["no_context_sparse"]) == [
        n for n in every if n not in ("context_lengths", "context_values")
    ]
    m = io.context_io_manifest(SPLITS["dense_and_sparse"], 2)
    shapes = {i["name"]: i["shape"] for i in m["inputs"]}
    assert shapes == {"context_dense": [-1, 2], "context_lengths": [-1, 2],
                      "context_values": [-1], "candidate_dense": [-1, 2],
                      "candidate_lengths": [-1, 3], "candidate_values": [-1],
                      "candidate_offsets": [-1]}  # fmt: skip
    assert all(i["role"] == i["name"] for i in m["inputs"])
    assert m["outputs"] == [{"name": "scores", "dtype": "FP32", "shape": [-1, 2]}]


def test_the_section_reads_back():
    for split in SPLITS.values():
        assert ContextSplit.from_dict(split.to_dict()) == split


GOOD = {"version": 1, "dense": [0], "sparse": [1], "num_dense": 2, "num_sparse": 3}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"version": 2}, '"context.version" must be 1, got 2'),
        ({"version": True}, '"context.version" must be 1, got true'),
        ({"num_sparse": -1}, '"context.num_sparse" must be an integer in [0, 2^30], got -1'),
        (
            {"dense": [1, 0]},
            '"context.dense" must be ascending distinct column indices in '
            "[0, num_dense=2), got [1,0]",
        ),
        ({"sparse": [1, 1]}, '"context.sparse" must be ascending'),
        ({"sparse": [3]}, '"context.sparse" must be ascending'),
        ({"dense": "0"}, '"context.dense" must be ascending'),
        (
            {"sparse": [0, 1, 2]},
            '"context.sparse" must be fewer than num_sparse=3 columns '
            "(a candidate needs a sparse feature), got [0,1,2]",
        ),
        ({"dense": [], "sparse": []}, '"context" must be at least one context column'),
    ],
)
def test_the_section_refuses_by_field(change, message):
    with pytest.raises(ManifestError) as e:
        ContextSplit.from_dict({**GOOD, **change}, "my_model")
    assert str(e.value).startswith(f"my_model: {message}")


def test_the_section_must_be_an_object():
    with pytest.raises(ManifestError, match='"context" must be an object or null, got \\[\\]'):
        ContextSplit.from_dict([])


# ---- tests/data/request_golden.json: what both servers accept and refuse ---------------------
GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "request_golden.json").read_text())
_NUMPY = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BYTES": object}


def _arrays(tensors: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(t["data"], dtype=_NUMPY[t["datatype"]]).reshape(t["shape"])
            for name, t in tensors.items()}  # fmt: skip


def _shapes(tensors: dict) -> dict[str, list[int]]:
    return {name: t["shape"] for name, t in tensors.items()}


def test_the_golden_model_reads_as_a_context_model():
    m = parse_manifest(GOLDEN["manifest"])
    assert m.context == ContextSplit((0, 2), (0, 2), 3, 4)
    assert list(m.roles) == [i["name"] for i in io.context_io_manifest(m.context, 1)["inputs"]]
    assert m.serving_max_batch_size == 8
    assert {c["form"] for c in GOLDEN["valid"]} == {"context", "flat"}
    assert len(GOLDEN["refused"]) >= 5


@pytest.mark.parametrize("case", GOLDEN["valid"], ids=lambda c: c["name"])
def test_golden_valid_requests_mean_their_flat_batch(case):
    split = parse_manifest(GOLDEN["manifest"]).context
    spec = FeatureSpec.from_dict(GOLDEN["manifest"]["feature_spec"])
    assert request_form(_shapes(case["inputs"]), 8) == case["form"]
    request, model, flat = (_arrays(case[k]) for k in ("inputs", "model_inputs", "flat"))
    assert list(model) == [i["name"] for i in GOLDEN["manifest"]["inputs"]]
    assert len(flat["sparse_lengths"]) == case["candidates"]
    want = offsets([1] * case["candidates"] if case["form"] == "flat" else [case["candidates"]], 2)
    assert model["candidate_offsets"].tolist() == want.tolist()
    # The model's inputs are the flat batch, context repeated per candidate ...
    for got, expected in zip(repeat(split, model), flat.values(), strict=True):
        assert np.array_equal(got, expected) and got.dtype == expected.dtype
    # ... the strings are each side's features' encodings ...
    if "sparse_strings" in request or "candidate_strings" in request:
        tokens = request.get("sparse_strings")
        if tokens is None:
            tokens = repeat(split, {k: v for k, v in request.items() if "_values" not in k})[2]
        ids = spec.encode_values(flat["sparse_lengths"], list(tokens))
        assert np.array_equal(ids, flat["sparse_values"])
    # ... and a flat request is split into one context per row.
    if case["form"] == "flat":
        values = flat["sparse_values"]
        parts = split_flat(split, request["dense_features"], request["sparse_lengths"], values)
        assert all(np.array_equal(parts[k], model[k]) for k in model)


@pytest.mark.parametrize("case", GOLDEN["refused"], ids=lambda c: c["name"])
def test_golden_refusals_have_the_servers_text(case):
    with pytest.raises(RequestError) as e:
        request_form(_shapes(case["inputs"]), 8)
    assert str(e.value) == case["error"]


def test_the_manifest_takes_the_context_roles_in_pairs():
    split = SPLITS["dense_and_sparse"]
    data = {"features": {"dense": list("abcd"), "sparse": list("vwxyz")}, "num_tasks": 1,
            **io.context_io_manifest(split, 1), "context": split.to_dict()}  # fmt: skip
    m = parse_manifest(data)
    assert m.roles["candidate_offsets"] == "candidate_offsets" and m.context == split
    no_values = [i for i in data["inputs"] if i["role"] != "context_values"]
    with pytest.raises(ManifestError, match="roles with both context_lengths and context_values"):
        parse_manifest({**data, "inputs": no_values})
    wider = {**data, "context": {**split.to_dict(), "num_sparse": 6}}
    with pytest.raises(ManifestError, match='"context.num_sparse" must be 5, the number of '):
        _ = parse_manifest(wider).context
    with pytest.raises(ManifestError, match='"context.num_sparse"'):
        write_manifest(Path("unwritten.json"), wider)
    assert not Path("unwritten.json").exists()


def test_random_request_sizes_each_features_bags_by_its_hotness():
    hotness = [(20, 30), (1, 1), (0, 2)]
    r = random_request(2, 3, 200, seed=5, hotness=hotness)
    lengths = r["sparse_lengths"]
    for f, (low, high) in enumerate(hotness):
        assert lengths[:, f].min() == low and lengths[:, f].max() == high
    assert len(r["sparse_values"]) == lengths.sum()
    with pytest.raises(ValueError, match="hotness has 1 \\(low, high\\) pairs for 3 sparse"):
        random_request(2, 3, 4, hotness=[(1, 2)])
