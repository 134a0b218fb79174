"""rec-server and a context model (#61): one user and N candidates per request, over real sockets
with the stock tritonclient (HTTP JSON, HTTP binary, gRPC).

A seeded run is exported twice, flat and with features.context. A context request's scores must
be the flat scores of the same pairs with the context repeated, bit for bit: from the server's
flat form on the context model (which it splits into contexts of one candidate) and from the
flat export's model.pt in this process. Concurrent requests of both forms are batched together
and each gets its own answer; each refusal of the context form gives its pinned text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from context_client import (
    CONTEXT,
    PROTOCOLS,
    check_both_forms_batched,
    context_request,
    context_server,
    flat_form,
    infer,
)
from tritonclient.utils import InferenceServerException

from rec.contract.context import ContextSplit
from rec.contract.io import INPUT_NAMES
from rec.contract.repository import ModelDir
from rec.export.pipeline import export_run
from tests.export.conftest import write_seeded_run
from tests.helpers import write_config


@pytest.fixture(scope="module", params=["fp32", "int8"])
def exports(request, tmp_path_factory):
    """(context repository, the flat export's model.pt, its rec.json), the dense layers in
    `request.param` (rec::linear or Int8Linear, both row-invariant)."""
    tmp = tmp_path_factory.mktemp("context_server")
    run = write_seeded_run(tmp / "run")
    quiet = {"fmt": "torchscript", "log": lambda _: None}
    dense = {"export": {"dense_dtype": request.param}}
    flat = export_run(run, tmp / "flat", config=write_config(tmp / "f.yaml", dense), **quiet)
    overrides = {**dense, "features": {"context": CONTEXT}}
    context = export_run(run, tmp / "ctx", config=write_config(tmp / "c.yaml", overrides), **quiet)
    manifest = json.loads(ModelDir.of(context.repo, "rec").manifest.read_text())
    return context.repo, ModelDir.of(flat.repo, "rec").model_file(1), manifest


@pytest.fixture(scope="module")
def server(exports):
    yield from context_server(exports[0])


@pytest.fixture(scope="module")
def split(exports) -> ContextSplit:
    return ContextSplit.from_dict(exports[2]["context"])


@pytest.fixture(scope="module")
def flat_module(exports):
    torch.set_num_threads(1)
    return torch.jit.load(str(exports[1]))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_context_scores_are_the_flat_scores_with_the_context_repeated(
    server, split, flat_module, protocol
):
    for candidates, user in ((1, 1), (7, 2), (64, 3)):
        request = context_request(split, candidates, user)
        flat = flat_form(split, request)
        got = infer(server, protocol, request)
        assert got.shape == (candidates, 1)
        np.testing.assert_array_equal(got, infer(server, protocol, flat))
        with torch.inference_mode():
            want = flat_module(*(torch.from_numpy(flat[k]) for k in INPUT_NAMES)).numpy()
        np.testing.assert_array_equal(got, want)


def test_metadata_lists_both_forms_but_not_the_offsets(server):
    with httpclient.InferenceServerClient(server.http) as c:
        names = [i["name"] for i in c.get_model_metadata("rec")["inputs"]]
    assert names == [
        "context_dense", "context_lengths", "context_values", "candidate_dense",
        "candidate_lengths", "candidate_values", "context_strings", "candidate_strings",
        "dense_features", "sparse_lengths", "sparse_values", "sparse_strings",
    ]  # fmt: skip


def test_strings_on_each_side_score_as_their_ids(server, split, exports):
    request = context_request(split, 5, user=4)
    as_strings = {k: v for k, v in request.items() if not k.endswith("_values")}
    for side in ("context", "candidate"):
        ids = request[f"{side}_values"]
        as_strings[f"{side}_strings"] = np.array([str(i).encode() for i in ids], dtype=np.object_)
    for protocol in PROTOCOLS:
        np.testing.assert_array_equal(
            infer(server, protocol, as_strings), infer(server, protocol, request)
        )


def test_concurrent_requests_of_both_forms_each_get_their_own_scores(server, split):
    check_both_forms_batched(server, split, "rec", first_user=100)


def _refused(server, protocol: str, inputs: dict[str, np.ndarray]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        infer(server, protocol, inputs)
    status = str(e.value.status())
    assert status == "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400" in status
    return e.value


def test_each_refusal_gives_its_text_on_every_protocol(server, split, exports):
    max_batch = exports[2]["serving"]["max_batch_size"]
    good = context_request(split, 3, user=7)
    cases = [
        ({**good, "context_lengths": np.repeat(good["context_lengths"], 3, axis=0),
          "context_values": np.concatenate([good["context_values"]] * 3)},
         "input 'context_lengths': a request carries one context (batch 1), got 3"),
        ({**good, "candidate_dense": good["candidate_dense"][:0],
          "candidate_lengths": good["candidate_lengths"][:0], "candidate_values":
          good["candidate_values"][:0]},
         "input 'candidate_lengths': a request needs at least one candidate, got 0"),
        ({**good, "candidate_offsets": np.array([0, 6], np.int32)},
         "input 'candidate_offsets': filled by the server, do not send it"),
        ({**good, "sparse_lengths": flat_form(split, good)["sparse_lengths"]},
         "a request carries either the flat inputs (dense_features, sparse_lengths, "
         "sparse_values) or the context form (context_*, candidate_*), not both: got "
         "'sparse_lengths' and 'context_dense'"),
        (context_request(split, max_batch + 1, user=9),
         f"request has {max_batch + 1} candidates, above max_batch_size {max_batch}"),
    ]  # fmt: skip
    for inputs, text in cases:
        for protocol in PROTOCOLS:
            assert text in _refused(server, protocol, inputs).message(), (protocol, text)
    np.testing.assert_array_equal(infer(server, "grpc", good), infer(server, "http_json", good))
