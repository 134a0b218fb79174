"""The real tritonserver serving an AOTInductor context model (model.pt2 through rec's Python
backend, #61): test_context.py's checks on the package.

A seeded run is exported once per dense dtype as an AOTI package with features.context (each
compile takes about a minute here, so no flat or TorchScript twin is compiled beside it). Over
HTTP JSON, HTTP binary and gRPC a context request scores, bit for bit, as the same server's flat
form of the same pairs with the context repeated (model.py splits it into contexts of one
candidate: column-major views, which the package must not read as row-major) and as the
package in this process; concurrent requests of both forms each get their solo answer. The
joining of requests into one forward is checked in this process (ModelInstance, what model.py
runs), since Triton hands model.py one request per execute.
"""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from google.protobuf import json_format

from rec.aoti_package import AotiModel
from rec.contract.context import ContextSplit, offsets
from rec.contract.io import CANDIDATE_OFFSETS, context_io_manifest
from rec.contract.repository import ModelDir, read_version_manifest
from rec.export.pipeline import export_run
from rec.serve.python_backend.config import InstanceConfig
from rec.serve.python_backend.inputs import Failure, Inputs
from rec.serve.python_backend.instance import ModelInstance
from rec.serve.python_backend.metrics import MemoryMetrics
from rec.serve.repository import load_model
from rec.serve.triton import python_backend_config, start_triton
from tests.helpers import write_config
from tests.serve_triton.servers import FREE_PORTS, TRITON_AND_REDIS
from tests.serve_triton.test_context import CONTEXT, PROTOCOLS, context_request, flat_of, infer
from tests.serve_triton.tiny_repo import MAX_BATCH_SIZE, TINY, write_seeded_run

pytestmark = TRITON_AND_REDIS[1:]  # the Triton binary (no redis here)

MODEL = "rec_aoti"  # the name `rec export --format aoti` gives the model


@pytest.fixture(scope="module", params=["fp32", "int8"])
def exports(request, tmp_path_factory):
    """(the repository holding the AOTI context model, its context split), with fp32 or int8
    dense layers."""
    tmp = tmp_path_factory.mktemp(f"context_triton_aoti_{request.param}")
    run = write_seeded_run(tmp / "run", copy.deepcopy(TINY))
    overrides = {"export": {"dense_dtype": request.param}, "features": {"context": CONTEXT}}
    config = write_config(tmp / "c.yaml", overrides)
    result = export_run(run, tmp / "repo", fmt="aoti", config=config, log=lambda _: None)
    manifest = read_version_manifest(ModelDir.of(result.repo, MODEL).version(1))
    assert manifest.data["verification"]["context_vs_flat_max_diff"] == {"aoti": 0.0}
    return result.repo, manifest.context


@pytest.fixture(scope="module")
def server(exports):
    s = start_triton(exports[0], model=MODEL, **FREE_PORTS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def package(exports):
    torch.set_num_threads(1)
    return AotiModel(ModelDir.of(exports[0], MODEL).version(1))


def in_process(package, split: ContextSplit, request: dict[str, np.ndarray]) -> np.ndarray:
    """The package's scores of one request (its inputs in forward order, the offsets filled as
    the servers fill them: one context of all the candidates)."""
    fn = len(split.cand_sparse)
    full = {**request, CANDIDATE_OFFSETS: offsets([len(request["candidate_lengths"])], fn)}
    names = [i["name"] for i in context_io_manifest(split, 2)["inputs"]]
    with torch.inference_mode():
        return package(*(torch.from_numpy(full[n]) for n in names)).numpy()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_context_scores_are_the_flat_scores_with_the_context_repeated(
    server, exports, package, protocol
):
    split = exports[1]
    for candidates in (1, 7, MAX_BATCH_SIZE):
        request = context_request(split, candidates, user=candidates)
        got = infer(server, protocol, request, MODEL)
        assert got.dtype == np.float32 and got.shape == (candidates, 2)
        assert np.array_equal(got, infer(server, protocol, flat_of(split, request), MODEL))
        assert np.array_equal(got, in_process(package, split, request))


def test_concurrent_requests_of_both_forms_each_get_their_own_scores(server, exports):
    split = exports[1]
    requests = []
    for i, n in enumerate([1, 7, 64, 3] * 3):
        request = context_request(split, n, user=200 + i)
        requests.append(flat_of(split, request) if i % 4 == 3 else request)
    solo = [infer(server, PROTOCOLS[i % 3], r, MODEL) for i, r in enumerate(requests)]
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [
            pool.submit(infer, server, PROTOCOLS[i % 3], r, MODEL) for i, r in enumerate(requests)
        ]
        together = [f.result() for f in futures]
    for got, want in zip(together, solo, strict=True):
        assert np.array_equal(got, want)


def staged(repo) -> InstanceConfig:
    """The InstanceConfig model.py makes of the config rec.serve.triton stages for the package."""
    config = python_backend_config(load_model(repo, MODEL))
    as_triton = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return InstanceConfig.from_triton(json.loads(json.dumps(as_triton)), MODEL, "1")


def test_requests_handed_over_together_are_one_forward_each_scored_as_alone(exports, package):
    """ModelInstance on the package (its load-time context probe passed) given context requests
    of different users and sizes, a flat one and a refused one at once: each gets the scores
    it gets alone, the package's in this process of its pairs in the context form."""
    repo, split = exports
    metrics = MemoryMetrics()
    instance = ModelInstance(staged(repo), metrics)
    try:
        assert isinstance(instance.model, AotiModel)
        assert metrics.value("rec_model_batch_variant", model=MODEL, version="1") == 0
        requests = [context_request(split, n, user=u) for n, u in ((1, 1), (7, 2), (64, 3))]
        twin = context_request(split, 5, user=8)  # sent flat
        bad = context_request(split, 2, user=5)
        bad["context_dense"] = np.repeat(bad["context_dense"], 2, axis=0)
        batch = [Inputs(requests[0]), Inputs(flat_of(split, twin)), Inputs(requests[1]),
                 Inputs(bad), Inputs(requests[2])]  # fmt: skip
        got = instance.execute(batch)
        alone = [instance.execute([b])[0] for b in batch]
    finally:
        instance.close()
    assert isinstance(got[3], Failure) and "got 2" in got[3].message
    wants = [requests[0], twin, requests[1], None, requests[2]]
    for scores, solo, want in zip(got, alone, wants, strict=True):
        if want is not None:
            assert np.array_equal(scores, solo)
            assert np.array_equal(scores, in_process(package, split, want))
