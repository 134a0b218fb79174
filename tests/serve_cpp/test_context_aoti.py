"""rec-server and an AOTInductor context model (#61): test_context.py's checks on model.pt2.

A seeded run is exported once per dense dtype as an AOTI package with features.context (each
compile takes about a minute here, so no flat or TorchScript twin is compiled beside it). Over
HTTP JSON, HTTP binary and gRPC a context request scores, bit for bit, as the same server's flat
form of the same pairs with the context repeated (split into contexts of one candidate, so the
package runs another shape) and as the package in this process; concurrent requests of both
forms and different users are batched together and each gets its solo answer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from context_client import (
    CONTEXT,
    PROTOCOLS,
    check_both_forms_batched,
    context_request,
    context_server,
    flat_form,
    infer,
)

from rec.aoti_package import AotiModel
from rec.contract.context import ContextSplit, offsets
from rec.contract.io import CANDIDATE_OFFSETS, context_io_manifest
from rec.contract.repository import ModelDir
from rec.export.pipeline import export_run
from tests.export.conftest import write_seeded_run
from tests.helpers import write_config

MODEL = "rec_aoti"  # the name `rec export --format aoti` gives the model


@pytest.fixture(scope="module", params=["fp32", "int8"])
def exported(request, tmp_path_factory):
    """(the repository holding the AOTI context model, its rec.json), dense layers in
    `request.param`."""
    tmp = tmp_path_factory.mktemp(f"context_aoti_{request.param}")
    run = write_seeded_run(tmp / "run")
    overrides = {"export": {"dense_dtype": request.param}, "features": {"context": CONTEXT}}
    config = write_config(tmp / "c.yaml", overrides)
    result = export_run(run, tmp / "repo", fmt="aoti", config=config, log=lambda _: None)
    manifest = json.loads(ModelDir.of(result.repo, MODEL).manifest.read_text())
    assert manifest["verification"]["context_vs_flat_max_diff"] == {"aoti": 0.0}
    return result.repo, manifest


@pytest.fixture(scope="module")
def split(exported) -> ContextSplit:
    return ContextSplit.from_dict(exported[1]["context"])


@pytest.fixture(scope="module")
def server(exported):
    yield from context_server(exported[0])


@pytest.fixture(scope="module")
def package(exported):
    torch.set_num_threads(1)
    return AotiModel(ModelDir.of(exported[0], MODEL).version(1))


def in_process(package, split: ContextSplit, request: dict[str, np.ndarray]) -> np.ndarray:
    """The package's scores of one request, its inputs in forward order and the offsets filled
    as the server fills them (one context of all the candidates)."""
    names = [i["name"] for i in context_io_manifest(split, 1)["inputs"]]
    fn = len(split.cand_sparse)
    full = {**request, CANDIDATE_OFFSETS: offsets([len(request["candidate_lengths"])], fn)}
    with torch.inference_mode():
        return package(*(torch.from_numpy(full[n]) for n in names)).numpy()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_context_scores_are_the_flat_scores_with_the_context_repeated(
    server, split, package, protocol
):
    for candidates, user in ((1, 1), (7, 2), (64, 3)):
        request = context_request(split, candidates, user)
        got = infer(server, protocol, request, MODEL)
        assert got.shape == (candidates, 1)
        assert np.array_equal(got, infer(server, protocol, flat_form(split, request), MODEL))
        assert np.array_equal(got, in_process(package, split, request))


def test_concurrent_requests_of_both_forms_each_get_their_own_scores(server, split):
    check_both_forms_batched(server, split, MODEL, first_user=200)
