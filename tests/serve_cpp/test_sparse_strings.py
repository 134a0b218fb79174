"""Sparse ids as text: `sparse_strings` (BYTES) in place of `sparse_values` (INT64).

rec-server maps the tokens with the feature spec of the model's rec.json when it validates a
request (cpp/src/common/feature_encoding.*), so every protocol form scores what the ids do, and
each bad request fails alone with 400 / INVALID_ARGUMENT naming the input. The tiny model's
rec.json gets a spec whose `item` feature is hex-encoded (Criteo's encoding), the only one with
bad tokens; the spec is all the server reads of it, so editing it is how these tests get one.
"""

from __future__ import annotations

import http.client
import json
import shutil

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from clients import (
    STRINGS,
    assert_same_rows,
    grpc_call,
    grpc_typed_strings_request,
    infer_inputs,
    string_inputs,
)
from server import Server, run_to_exit
from tiny_model import DENSE, SPARSE, Reference, make_batch, write_model
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from rec.contract.repository import ModelDir
from rec.features import HASH, FeatureSpec

FEATURE_SPEC = {
    "format": "csv",
    "labels": ["label"],
    "dense": [{"name": n, "column": n, "transform": "identity"} for n in DENSE],
    "sparse": [
        {
            "name": n,
            "column": n,
            "encoding": "hex" if n == "item" else "int_or_hash",
            "separator": "|",
        }
        for n in SPARSE
    ],
    "hash": dict(HASH),
}
ITEM = SPARSE.index("item")


def _set_feature_spec(model_dir, spec) -> None:
    path = ModelDir(model_dir).manifest
    manifest = json.loads(path.read_text())
    manifest["feature_spec"] = spec
    path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """`rec` with the feature spec; `plain` without one (an export from before it)."""
    repo = tmp_path_factory.mktemp("strings_repo")
    write_model(repo)
    _set_feature_spec(repo / "rec", FEATURE_SPEC)
    write_model(repo, name="plain", seed=1)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    s = Server(repo)
    yield s
    assert s.stop() == 0, s.stderr()


@pytest.fixture(scope="module")
def reference(repo) -> Reference:
    return Reference(ModelDir.of(repo, "rec").model_file(1))


def _features(lengths: np.ndarray) -> np.ndarray:
    """The feature of each value of a batch-major request."""
    return np.tile(np.arange(len(SPARSE)), len(lengths)).repeat(lengths.ravel())


def _tokens(lengths: np.ndarray, seed: int) -> list[str]:
    """Tokens for the values: hex for `item` (any case, up to 16 digits), decimal ids and
    words for the others."""
    rng = np.random.default_rng(seed)
    tokens = []
    for k, f in enumerate(_features(lengths).tolist()):
        if f == ITEM:
            token = format(int(rng.integers(2**63)) * 2 + k % 2, "x")
            tokens.append(token.upper() if k % 3 == 0 else token)
        elif k % 2:
            tokens.append(str(int(rng.integers(-(2**62), 2**62))))
        else:
            tokens.append(f"tag/{k}/é")
    return tokens


def _string_batch(rows: int, seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """A batch whose sparse_values are the ids of its tokens, and the tokens."""
    batch = make_batch(rows, seed)
    tokens = _tokens(batch["sparse_lengths"], seed)
    ids = FeatureSpec.from_dict(FEATURE_SPEC).encode_values(batch["sparse_lengths"], tokens)
    return {**batch, "sparse_values": ids}, tokens


def test_metadata_lists_strings_only_with_a_feature_spec(server):
    with httpclient.InferenceServerClient(server.http) as c:
        inputs = c.get_model_metadata("rec")["inputs"]
        assert inputs[-1] == {"name": STRINGS, "datatype": "BYTES", "shape": [-1]}
        assert STRINGS not in [i["name"] for i in c.get_model_metadata("plain")["inputs"]]
    with grpcclient.InferenceServerClient(server.grpc) as c:
        inputs = c.get_model_metadata("rec", as_json=True)["inputs"]
        assert [i["name"] for i in inputs][-2:] == ["sparse_values", STRINGS]
        assert inputs[-1]["datatype"] == "BYTES"


@pytest.mark.parametrize("rows", [1, 9, 64])
def test_every_form_of_strings_scores_like_the_ids(server, reference, rows):
    batch, tokens = _string_batch(rows, seed=rows)
    want = reference(batch)
    with httpclient.InferenceServerClient(server.http) as c:
        for binary in (False, True):
            got = c.infer("rec", string_inputs(httpclient, batch, tokens, binary=binary))
            assert_same_rows(got.as_numpy("scores"), want)
    with grpcclient.InferenceServerClient(server.grpc) as c:
        assert_same_rows(
            c.infer("rec", string_inputs(grpcclient, batch, tokens)).as_numpy("scores"), want
        )
    assert_same_rows(grpc_call(server.grpc, grpc_typed_strings_request("rec", batch, tokens)), want)


def test_negative_integer_tokens_are_counted_per_feature(server):
    """rec_questionable_ids_total{reason="negative"}: per int_or_hash feature, the tokens that
    are negative integers, as rec.features counts them; hex `item` has no counter, and ids sent
    as sparse_values (half of the hashes are negative) are not counted."""
    batch, tokens = _string_batch(32, seed=7)
    want = FeatureSpec.from_dict(FEATURE_SPEC).negative_counts(batch["sparse_lengths"], tokens)
    del want["item"]
    assert sum(want.values()) > 0 and (batch["sparse_values"] < 0).sum() > sum(want.values())

    def negative(feature):
        return server.metric("rec_questionable_ids_total", feature=feature, reason="negative")

    before = {f: negative(f) for f in want}
    with pytest.raises(KeyError):
        negative("item")
    with httpclient.InferenceServerClient(server.http) as c:
        c.infer("rec", string_inputs(httpclient, batch, tokens))
        c.infer("rec", infer_inputs(httpclient, batch))
    with grpcclient.InferenceServerClient(server.grpc) as c:
        c.infer("rec", string_inputs(grpcclient, batch, tokens))
    assert {f: negative(f) - before[f] for f in want} == {f: 2 * n for f, n in want.items()}


def _bytes(tokens: list) -> np.ndarray:
    return np.array([t.encode() if isinstance(t, str) else t for t in tokens], dtype=np.object_)


def _bad_cases():
    """(id, model, [(name, array, datatype)], expected message text)."""
    batch, tokens = _string_batch(4, seed=40)
    dense = ("dense_features", batch["dense_features"], "FP32")
    lengths = ("sparse_lengths", batch["sparse_lengths"], "INT32")
    ids = ("sparse_values", batch["sparse_values"], "INT64")
    strings = (STRINGS, _bytes(tokens), "BYTES")
    either = (
        "a request carries either 'sparse_values' (INT64 ids) or 'sparse_strings' (BYTES tokens)"
    )
    bad_hex = list(tokens)
    at = int(np.flatnonzero(_features(batch["sparse_lengths"]) == ITEM)[0])
    bad_hex[at] = "0x1f"
    n = len(tokens)
    return [
        ("both", "rec", [dense, lengths, ids, strings], either + "; this one has both"),
        ("neither", "rec", [dense, lengths], either + "; this one has neither"),
        (
            "bad hex",
            "rec",
            [dense, lengths, (STRINGS, _bytes(bad_hex), "BYTES")],
            f"input 'sparse_strings': feature 'item', value at flat index {at}: '0x1f' is not hex "
            "(1 to 16 hex digits)",
        ),
        (
            "count",
            "rec",
            [dense, lengths, (STRINGS, _bytes(tokens[:-1]), "BYTES")],
            f"input 'sparse_strings': has {n - 1} values but sum of 'sparse_lengths' is {n}",
        ),
        (
            "not bytes",
            "rec",
            [dense, lengths, (STRINGS, batch["sparse_values"], "INT64")],
            "input 'sparse_strings': expected datatype BYTES, got INT64",
        ),
        (
            "no feature spec",
            "plain",
            [dense, lengths, strings],
            "input 'sparse_strings': model 'plain' has no feature spec",
        ),
    ]


def _inputs(module, tensors, binary: bool) -> list:
    out = []
    for name, array, datatype in tensors:
        i = module.InferInput(name, list(array.shape), datatype)
        if module is httpclient:
            i.set_data_from_numpy(array, binary_data=binary)
        else:
            i.set_data_from_numpy(array)
        out.append(i)
    return out


@pytest.mark.parametrize("protocol", ["http-json", "http-binary", "grpc"])
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_string_requests_fail_alone(server, reference, case, protocol):
    _, model, tensors, expected = case
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc if protocol == "grpc" else server.http
    good, tokens = _string_batch(2, seed=7)
    with module.InferenceServerClient(url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer(model, _inputs(module, tensors, binary=protocol == "http-binary"))
        status = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
        assert str(e.value.status()) == status, str(e.value)
        assert expected in e.value.message(), e.value.message()
        # The same connection still serves.
        scores = c.infer("rec", string_inputs(module, good, tokens)).as_numpy("scores")
        assert_same_rows(scores, reference(good))


def _bad_prefix(batch) -> bytes:
    """sparse_strings' data whose last element claims 2^31 - 1 bytes."""
    n = int(batch["sparse_lengths"].sum())
    return b"\x01\x00\x00\x00a" * (n - 1) + b"\xff\xff\xff\x7fab"


def test_malformed_length_prefix_http(server):
    batch = make_batch(2, seed=3)
    data = _bad_prefix(batch)
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": datatype,
                "shape": list(batch[name].shape),
                "data": batch[name].ravel().tolist(),
            }
            for name, datatype in (("dense_features", "FP32"), ("sparse_lengths", "INT32"))
        ]
    }
    n = int(batch["sparse_lengths"].sum())
    header["inputs"].append(
        {
            "name": STRINGS,
            "datatype": "BYTES",
            "shape": [n],
            "parameters": {"binary_data_size": len(data)},
        }
    )
    head = json.dumps(header).encode()
    host, port = server.http.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(
            "POST",
            "/v2/models/rec/infer",
            body=head + data,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
        reply = conn.getresponse()
        body = json.loads(reply.read())
    finally:
        conn.close()
    assert reply.status == 400
    assert body["error"] == (
        f"input 'sparse_strings': BYTES element {n - 1} has length 2147483647 but only 2 bytes of "
        "data follow its prefix"
    )


def test_malformed_length_prefix_grpc(server):
    batch = make_batch(2, seed=3)
    request = service_pb2.ModelInferRequest(model_name="rec")
    for name, datatype in (("dense_features", "FP32"), ("sparse_lengths", "INT32")):
        request.inputs.add(name=name, datatype=datatype, shape=list(batch[name].shape))
        request.raw_input_contents.append(batch[name].tobytes())
    n = int(batch["sparse_lengths"].sum())
    request.inputs.add(name=STRINGS, datatype="BYTES", shape=[n])
    request.raw_input_contents.append(_bad_prefix(batch))
    with pytest.raises(grpc.RpcError) as e:
        grpc_call(server.grpc, request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        f"input 'sparse_strings': BYTES element {n - 1} has length 2147483647" in e.value.details()
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"hash": {**HASH, "version": 2}},
            "feature_spec.hash.version is 2, not implemented: rec-server implements hash version 1 "
            "(blake2b, 8-byte digest)",
        ),
        ({"hash": {**HASH, "algorithm": "sha256"}}, "not implemented: rec-server implements"),
        (
            {"sparse": [{**f, "encoding": "murmur3"} for f in FEATURE_SPEC["sparse"]]},
            "feature_spec.sparse[0] (feature 'user'): unknown encoding 'murmur3'",
        ),
    ],
    ids=["hash version", "hash algorithm", "encoding"],
)
def test_unimplemented_feature_spec_refuses_to_load(repo, tmp_path, change, expected):
    bad = tmp_path / "repo"
    shutil.copytree(repo / "rec", bad / "rec")
    _set_feature_spec(bad / "rec", {**FEATURE_SPEC, **change})
    out = run_to_exit(
        "--model-repository",
        str(bad),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
    )
    assert out.returncode == 1, out.stderr
    assert expected in out.stderr, out.stderr
    assert str(ModelDir.of(bad, "rec").manifest) in out.stderr
