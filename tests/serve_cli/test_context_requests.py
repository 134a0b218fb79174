"""The client's context form without a server: ContextRows against the contract's conversions,
the inputs it sends, the bytes tritonclient puts on the wire, and `rec predict --group-by`'s
grouping and `rec bench --candidates`' points."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from rec.contract.context import ContextSplit, repeat, split_flat
from rec.contract.io import CANDIDATE_OFFSETS, context_io_manifest
from rec.serve.bench import BenchConfig, Point, points, progress_line
from rec.serve.client import (
    ContextRows,
    Rows,
    infer_inputs,
    request_bytes,
    request_tensors,
    synthetic_request,
    synthetic_rows,
)
from rec.serve.groups import group_rows, parts
from rec.serve.repository import ServeError

# Half the sparse features and every dense feature are context, as in the benchmark's split.
KAGGLE = ContextSplit(tuple(range(13)), tuple(range(0, 26, 2)), 13, 26)
SPLITS = [
    ContextSplit((0,), (1, 2), 4, 4),  # every input
    ContextSplit((), (0,), 2, 3),  # no context dense
    ContextSplit((0, 1), (), 2, 3),  # no context sparse
    ContextSplit((0, 1), (2,), 2, 3),  # no candidate dense
]


def shared(split: ContextSplit, n: int, seed: int = 0, tokens: bool = False) -> Rows:
    """n flat rows sharing row 0's context (the rows a ranking request stands for)."""
    rows = ContextRows.from_flat(split, synthetic_rows(split.num_dense, split.num_sparse, n, seed))
    flat = rows.flat(split)
    return Rows(flat.dense, flat.lengths, None, [str(v) for v in flat.values]) if tokens else flat


def same(a: Rows, b: Rows) -> bool:
    return (np.array_equal(a.dense, b.dense) and np.array_equal(a.lengths, b.lengths)
            and (a.tokens == b.tokens if a.tokens is not None else
                 np.array_equal(a.values, b.values)))  # fmt: skip


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("tokens", [False, True])
def test_context_rows_are_the_contracts_conversions(split, tokens):
    """from_flat sends what split_flat gives for the request's rows (the context once: row 0's),
    and flat() is the contract's repeat: back to the same rows, ids or strings."""
    rows = shared(split, 5, seed=3, tokens=tokens)
    request = ContextRows.from_flat(split, rows)
    sent = {name: array for name, array, _ in request_tensors(request)}
    values = rows.values if rows.tokens is None else np.array(rows.tokens, dtype=object)
    whole = split_flat(split, rows.dense, rows.lengths, values)
    for name, array in sent.items():
        want = whole[name.replace("strings", "values")]
        if name.startswith("context_"):  # the first of the 5 identical contexts
            first = (
                int(whole["context_lengths"][0].sum())
                if "values" in name or "strings" in name
                else 1
            )
            want = want[:first]
        if name.endswith("strings"):
            array = np.array([t.decode() for t in array], dtype=object)
        assert np.array_equal(array, want), name
    assert same(request.flat(split), rows)
    dense, lengths, flat_values = repeat(split, sent)
    assert np.array_equal(dense, rows.dense) and np.array_equal(lengths, rows.lengths)
    assert len(flat_values) == len(values)


@pytest.mark.parametrize("split", SPLITS)
def test_a_context_request_carries_the_models_inputs_but_the_offsets(split):
    request = synthetic_request(split, 3, seed=1)
    names = [name for name, _, _ in request_tensors(request)]
    model = [i["name"] for i in context_io_manifest(split, 1)["inputs"]]
    assert names == [n for n in model if n != CANDIDATE_OFFSETS]
    assert len(request) == 3
    tokens = Rows(request.candidates.dense, request.candidates.lengths, None,
                  [str(v) for v in request.candidates.values])  # fmt: skip
    strings = ContextRows(request.context, tokens)
    assert "candidate_strings" in [n for n, _, _ in request_tensors(strings)]


def test_flat_form_of_a_synthetic_request_is_the_same_pairs():
    context = synthetic_request(KAGGLE, 16, "context", seed=5)
    flat = synthetic_request(KAGGLE, 16, "flat", seed=5)
    assert isinstance(flat, Rows) and same(context.flat(KAGGLE), flat)
    assert np.all(flat.dense[:, list(KAGGLE.dense)] == flat.dense[0, list(KAGGLE.dense)])


def test_request_bytes_are_tritonclients():
    """HTTP binary: the JSON header then each tensor's raw bytes; JSON: the values as text;
    gRPC: the message, raw bytes plus a few per input."""
    rows = synthetic_rows(13, 26, 32, seed=2)
    inputs, outputs = infer_inputs(httpclient, rows, binary=True)
    _, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    raw = rows.dense.nbytes + rows.lengths.nbytes + rows.values.nbytes
    assert request_bytes(rows, "http", binary=True) == json_size + raw
    assert request_bytes(rows, "http", binary=False) > raw  # numbers as decimal text
    assert raw < request_bytes(rows, "grpc") < raw + 300
    with pytest.raises(ServeError, match="protocol"):
        request_bytes(rows, "tcp")


@pytest.mark.parametrize(("protocol", "binary"), [("http", False), ("http", True), ("grpc", True)])
def test_request_bytes_shrink_with_candidates(protocol, binary):
    """The context's bytes are sent once: context / flat falls as N grows (about the
    candidate's share of a row, here under 0.6), while at N = 1 the context form is larger (its
    extra inputs' headers)."""
    ratios = []
    for n in (1, 16, 128, 512):
        context = synthetic_request(KAGGLE, n, "context", seed=0)
        flat = synthetic_request(KAGGLE, n, "flat", seed=0)
        ratios.append(
            request_bytes(context, protocol, binary) / request_bytes(flat, protocol, binary)
        )
    assert ratios[0] > 1 > ratios[1] > ratios[2] and ratios[2] < 0.6 and ratios[3] < 0.6, ratios


def test_rows_take_keeps_each_rows_bags():
    rows = synthetic_rows(2, 3, 6, seed=4)
    rows.tokens = [str(v) for v in rows.values]
    picked = rows.take([4, 1, 4])
    for out, i in enumerate([4, 1, 4]):
        alone = rows.split(1)[i]
        assert np.array_equal(picked.split(1)[out].values, alone.values)
        assert picked.split(1)[out].tokens == alone.tokens
    assert np.array_equal(picked.lengths, rows.lengths[[4, 1, 4]])


def test_groups_interleave_and_split_above_the_limit():
    ids = ["u1", "u2", "u1", "u3", "u1", "u2", "u1"]
    grouped = group_rows(ids)
    assert [(k, v.tolist()) for k, v in grouped] == [
        ("u1", [0, 2, 4, 6]), ("u2", [1, 5]), ("u3", [3]),
    ]  # fmt: skip
    assert [p.tolist() for p in parts(grouped, 3)] == [[0, 2, 4], [6], [1, 5], [3]]
    assert [p.tolist() for p in parts(grouped, 0)] == [[0, 2, 4, 6], [1, 5], [3]]


def test_bench_candidates_sweep_the_forms():
    cfg = BenchConfig(targets=[None], candidates=(16, 128), form="both", concurrency=(1, 4),
                      rates=(10.0,))  # fmt: skip
    got = points(cfg)
    assert got[:2] == [Point(16, 1, 0.0, "context"), Point(16, 4, 0.0, "context")]
    assert {(p.batch, p.form) for p in got} == {(n, f) for n in (16, 128)
                                                for f in ("context", "flat")}  # fmt: skip
    assert len(got) == 2 * 2 * 3
    default = points(BenchConfig(targets=[None]))  # no candidates: the batch sweep as before
    assert {p.form for p in default} == {""} and {p.batch for p in default} == {1, 256}
    row = {"target": "t", "batch": 128, "form": "flat", "offered_rps": None, "concurrency": 4,
           "ok": 0, "latency_ms": {}}  # fmt: skip
    assert "N=128 flat c=4" in progress_line(1, 1, row)
    with pytest.raises(ServeError, match="--form"):
        BenchConfig(targets=[None], candidates=(4,), form="ragged")
    with pytest.raises(ServeError, match="candidate count"):
        BenchConfig(targets=[None], candidates=(0,))


def test_hotness_gives_each_feature_its_bags():
    """A history of 20 ids per context feature beside one id per candidate feature."""
    hot = tuple((20, 20) if i in KAGGLE.sparse else (1, 1) for i in range(26))
    request = synthetic_request(KAGGLE, 8, "context", seed=0, hotness=hot)
    assert request.context.lengths.tolist() == [[20] * 13]
    assert request.candidates.lengths.tolist() == [[1] * 13] * 8
    assert len(request.context.values) == 260 and len(request.candidates.values) == 104
