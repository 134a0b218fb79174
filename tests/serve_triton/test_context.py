"""The real tritonserver (nvidia-pytriton, rec's Python backend) serving a context model (#61):
one user and N candidates per request, sent with the stock tritonclient over HTTP JSON, HTTP
binary and gRPC.

A seeded run is exported twice by the real `rec export`, flat and with features.context. A
context request's scores must be, bit for bit, the flat scores of the same pairs with the
context repeated: from the server's flat form on the context model (split into contexts of one
candidate) and from the flat export's model.pt in this process. Each refusal of the context form
gives its pinned text (rec.contract.context.request_form, tests/data/request_golden.json). The
joining of requests into one forward is checked in this process on the same export
(ModelInstance, what model.py runs): Triton hands the Python backend one request per execute
with max_batch_size 0.
"""

from __future__ import annotations

import copy

import fbgemm_gpu  # noqa: F401  (registers the ops model.pt calls)
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, which model.pt calls)
from rec.contract import random_request
from rec.contract.context import ContextSplit, repeat, split_flat
from rec.contract.io import CANDIDATE_OFFSETS, DTYPES, INPUT_NAMES, context_io_manifest
from rec.contract.repository import ModelDir, read_version_manifest
from rec.export.pipeline import export_run
from rec.serve.python_backend.context_inputs import ContextModel
from rec.serve.python_backend.inputs import Failure, Inputs
from rec.serve.python_backend.instance import ModelInstance
from rec.serve.python_backend.metrics import MemoryMetrics
from rec.serve.repository import load_model
from rec.serve.triton import python_backend_config, start_triton
from tests.helpers import write_config
from tests.serve_triton.servers import FREE_PORTS, TRITON_AND_REDIS
from tests.serve_triton.test_python_backend_logic import staged_config
from tests.serve_triton.tiny_repo import MAX_BATCH_SIZE, TINY, write_seeded_run

pytestmark = TRITON_AND_REDIS[1:]  # the Triton binary (no redis here)

# features.sparse of TINY is [item, user, tags, city]: the user's are user and tags (tags shares
# table t1 with the candidates' item), and 2 of the 4 dense features; city is mean-pooled.
CONTEXT = ["dense_0", "dense_2", "user", "tags"]
PROTOCOLS = ["http_json", "http_binary", "grpc"]
CLIENT_ERROR = {"http_json": "400", "http_binary": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


@pytest.fixture(scope="module", params=["fp32", "int8"])
def exports(request, tmp_path_factory):
    """(the context repository, the flat export's model.pt, the context split), with fp32 or
    int8 dense layers."""
    tmp = tmp_path_factory.mktemp(f"context_triton_{request.param}")
    run = write_seeded_run(tmp / "run", copy.deepcopy(TINY))
    quiet = {"fmt": "torchscript", "log": lambda _: None}
    dense = {"export": {"dense_dtype": request.param}}
    flat = export_run(run, tmp / "flat", config=write_config(tmp / "f.yaml", dense), **quiet)
    overrides = {**dense, "features": {"context": CONTEXT}}
    context = export_run(run, tmp / "ctx", config=write_config(tmp / "c.yaml", overrides), **quiet)
    split = read_version_manifest(ModelDir.of(context.repo, "rec").version(1)).context
    return context.repo, ModelDir.of(flat.repo, "rec").model_file(1), split


@pytest.fixture(scope="module")
def server(exports):
    s = start_triton(exports[0], **FREE_PORTS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def flat_module(exports):
    return torch.jit.load(str(exports[1]))


def context_request(split: ContextSplit, candidates: int, user: int) -> dict[str, np.ndarray]:
    """One user's context (from seed `user`) and `candidates` candidates, by input name."""
    d, f = split.num_dense, split.num_sparse
    ctx = split_flat(split, *random_request(d, f, 1, seed=user, ids_per_bag=(1, 4)).values())
    cand = split_flat(split, *random_request(d, f, candidates, seed=10_000 + user).values())
    request = {k: v for k, v in ctx.items() if k.startswith("context_")}
    request |= {k: v for k, v in cand.items() if k.startswith("candidate_")}
    del request[CANDIDATE_OFFSETS]  # the server's to fill
    return request


def test_the_staged_config_takes_both_forms_and_fills_the_offsets(exports):
    """Triton's config for model.py: the `none` form, every input of both forms optional (model.py
    says which form a request is), each side's strings; candidate_offsets declared only so that
    a client sending it gets the shared refusal from model.py."""
    config = python_backend_config(load_model(exports[0]))
    inputs = {i.name: i for i in config.input}
    model = [i["name"] for i in context_io_manifest(exports[2], 2)["inputs"]]
    strings = ["sparse_strings", "context_strings", "candidate_strings"]
    assert list(inputs) == [*INPUT_NAMES, *model, *strings]
    assert all(i.optional for i in config.input)
    assert list(inputs["context_lengths"].dims) == [-1, 2]
    assert list(inputs[CANDIDATE_OFFSETS].dims) == [-1]
    assert config.max_batch_size == 0 and not config.batch_input and not config.batch_output
    assert list(config.output[0].dims) == [-1, 2]


def flat_of(split: ContextSplit, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The flat batch the request means: its context repeated per candidate."""
    return dict(zip(INPUT_NAMES, repeat(split, request), strict=True))


def infer(server, protocol: str, inputs: dict[str, np.ndarray], model: str = "rec") -> np.ndarray:
    """Scores `inputs` (either form, by name) with `model` and a fresh stock client of
    `protocol`."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(getattr(server.endpoints, protocol.split("_")[0]))
    binary = {} if protocol == "grpc" else {"binary_data": protocol == "http_binary"}
    tensors = []
    for name, a in inputs.items():
        t = module.InferInput(name, list(a.shape), DTYPES.get(name, "BYTES"))
        t.set_data_from_numpy(a, **binary)
        tensors.append(t)
    outputs = [module.InferRequestedOutput("scores", **binary)]
    try:
        return client.infer(model, tensors, outputs=outputs).as_numpy("scores")
    finally:
        client.close()


def own_scores(module, flat: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return module(*(torch.from_numpy(flat[n]) for n in INPUT_NAMES)).numpy()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("candidates", [1, 7, MAX_BATCH_SIZE])
def test_context_scores_are_the_flat_scores_with_the_context_repeated(
    server, exports, flat_module, protocol, candidates
):
    split = exports[2]
    request = context_request(split, candidates, user=candidates)
    got = infer(server, protocol, request)
    assert got.dtype == np.float32 and got.shape == (candidates, 2)
    flat = flat_of(split, request)
    assert np.array_equal(got, own_scores(flat_module, flat))  # the flat export, in this process
    assert np.array_equal(got, infer(server, protocol, flat))  # the flat form, split by model.py


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_side_sends_strings_encoded_with_its_own_features(server, exports, protocol):
    split = exports[2]
    request = context_request(split, 5, user=3)
    strings = dict(request)
    for side in ("context", "candidate"):
        ids = strings.pop(f"{side}_values")
        strings[f"{side}_strings"] = np.array([str(v).encode() for v in ids], dtype=object)
    assert np.array_equal(infer(server, protocol, strings), infer(server, protocol, request))


def refusals(split: ContextSplit) -> dict[str, tuple[dict[str, np.ndarray], str]]:
    """Each refused request, with the text both servers give (request_form's)."""
    ok = context_request(split, 3, user=1)
    three = context_request(split, 3, user=2)
    three["context_lengths"] = np.repeat(three["context_lengths"], 3, axis=0)
    none = {k: v[:0] for k, v in ok.items() if k.startswith("candidate_")}
    offsets = {**ok, CANDIDATE_OFFSETS: np.array([0, 6], np.int32)}
    mixed = {"sparse_lengths": flat_of(split, ok)["sparse_lengths"],
             **{k: v for k, v in ok.items() if k.startswith("candidate_")}}  # fmt: skip
    big = context_request(split, MAX_BATCH_SIZE + 1, user=4)
    return {
        "three_contexts": (three, "input 'context_lengths': a request carries one context "
                                  "(batch 1), got 3"),
        "no_candidate": ({**ok, **none}, "input 'candidate_lengths': a request needs at least "
                                         "one candidate, got 0"),
        "offsets_sent": (offsets, "input 'candidate_offsets': filled by the server, do not send "
                                  "it"),
        "mixed_forms": (mixed, "a request carries either the flat inputs (dense_features, "
                               "sparse_lengths, sparse_values) or the context form (context_*, "
                               "candidate_*), not both: got 'sparse_lengths' and "
                               "'candidate_dense'"),
        "too_many": (big, f"request has {MAX_BATCH_SIZE + 1} candidates, above max_batch_size "
                          f"{MAX_BATCH_SIZE}"),
    }  # fmt: skip


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_refusal_gives_its_pinned_text(server, exports, protocol):
    for case, (request, message) in refusals(exports[2]).items():
        with pytest.raises(InferenceServerException) as err:
            infer(server, protocol, request)
        assert message in err.value.message(), (case, err.value.message())
        assert str(err.value.status()) == CLIENT_ERROR[protocol], case
    ok = context_request(exports[2], 2, user=9)  # and the server still serves
    assert infer(server, protocol, ok).shape == (2, 2)


def test_requests_handed_over_together_are_one_forward_each_scored_as_alone(exports, flat_module):
    """What model.py runs (ModelInstance, its load-time context probe included) given context
    requests of different users and sizes, flat ones and a refused one at once: each gets its
    own scores, the ones it gets alone and the flat export's with its context repeated."""
    split = exports[2]
    metrics = MemoryMetrics()
    instance = ModelInstance(staged_config(exports[0]), metrics)
    try:
        assert instance.context == ContextModel(split, MAX_BATCH_SIZE, instance.spec)
        assert metrics.value("rec_model_batch_variant", model="rec", version="1") == 0
        requests = [context_request(split, n, user=u) for n, u in ((1, 1), (7, 2), (64, 3))]
        flat = random_request(split.num_dense, split.num_sparse, 5, seed=8)
        bad = context_request(split, 2, user=5)
        bad["context_dense"] = np.repeat(bad["context_dense"], 2, axis=0)
        batch = [Inputs(requests[0]), Inputs(flat), Inputs(requests[1]), Inputs(bad),
                 Inputs(requests[2])]  # fmt: skip
        got = instance.execute(batch)
        alone = [instance.execute([b])[0] for b in batch]
    finally:
        instance.close()
    assert isinstance(got[3], Failure) and "got 2" in got[3].message
    wants = [flat_of(split, requests[0]), flat, flat_of(split, requests[1]), None,
             flat_of(split, requests[2])]  # fmt: skip
    for scores, solo, want in zip(got, alone, wants, strict=True):
        if want is not None:
            assert np.array_equal(scores, solo)
            assert np.array_equal(scores, own_scores(flat_module, want))
