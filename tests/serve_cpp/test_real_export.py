"""`rec train` -> `rec export` -> rec-server: the real artifact, scored number for number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from clients import (
    grpc_call,
    grpc_scores,
    grpc_typed_strings_request,
    http_scores,
    infer_inputs,
    scores_concurrently,
    string_inputs,
)
from server import Server
from tiny_model import INPUT_NAMES
from tritonclient.utils import InferenceServerException

from rec.contract import random_request
from rec.contract.repository import ModelDir
from rec.features import FeatureSpec
from tests.artifacts import made

REC = str(Path(sys.executable).parent / "rec")

# Small enough that training and export take seconds; the export still quantizes to int8 TBE,
# and the DCN's cross and top layers (40 x 128 weights) run rec::linear, the op library
# rec-server loads (--ops-library).
CONFIG = {
    "tables": [
        {"name": f"t{i}", "rows": rows, "dim": 8, "features": [f"cat_{i}"]}
        for i, rows in enumerate([300, 500, 200, 400])
    ],
    "features": {"dense": 5},
    "model": {
        "arch": "dlrm_dcn",
        "dense_arch": [16, 8],
        "over_arch": [128, 1],
        "dcn_num_layers": 2,
        "dcn_low_rank_dim": 128,
    },  # fmt: skip
    "data": {"synthetic": {"train_samples": 2048, "eval_samples": 512}},
    "training": {"batch_size": 64, "steps": 4, "eval_every": 4, "log_every": 2},
    "checkpoint": {"every_steps": 4, "keep_last": 1},
}


def _rec(*args: str) -> None:
    proc = subprocess.run(
        [REC, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"rec {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


def train_and_export(tmp_path_factory) -> Path:
    """CONFIG's `rec train` (1 rank) and its default export (export.triton_batching: none):
    the directory with `run` and `repo` in it, shared (tests/artifacts.py; read only) with
    tests/reliability and with the sanitized stage."""

    def make(where: Path) -> None:
        (where / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        _rec("train", "-c", str(where / "config.yaml"), "--run-dir", str(where / "run"),
             "--nproc", "1")  # fmt: skip
        _rec("export", str(where / "run"), "--repo", str(where / "repo"), "--format",
             "torchscript")  # fmt: skip

    return made(tmp_path_factory, {"rec train, nproc 1, then rec export": CONFIG}, make)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train_and_export(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(trained) -> Path:
    return trained / "repo"


def _batch(manifest: dict, rows: int, seed: int) -> dict[str, np.ndarray]:
    dense, sparse = manifest["features"]["dense"], manifest["features"]["sparse"]
    return random_request(len(dense), len(sparse), rows, seed)


def test_exported_model_served_equals_in_process(exported):
    model_dir = exported / "rec"
    manifest = json.loads(ModelDir(model_dir).manifest.read_text())
    assert "max_batch_size: 0" in ModelDir(model_dir).config.read_text()  # the default form
    torch.set_num_threads(1)
    module = torch.jit.load(str(ModelDir(model_dir).model_file(1)))
    server = Server(exported, "--model", "rec")
    try:
        # The export's batch probe (rec.json), re-run on this CPU before serving.
        assert "version 1: batch probe passed on" in server.stderr()
        for rows in (1, 3, 64):
            batch = _batch(manifest, rows, seed=rows)
            with torch.inference_mode():
                want = module(*(torch.from_numpy(batch[k]) for k in INPUT_NAMES)).numpy()
            np.testing.assert_array_equal(http_scores(server.http, batch), want)
            np.testing.assert_array_equal(grpc_scores(server.grpc, batch), want)
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("form", ["none", "ragged"])
def test_both_export_forms_are_batched(trained, form, tmp_path):
    """Either config.pbtxt form export writes, rec-server merges concurrent multi-sample
    requests (fewer forwards than requests) and each gets the scores it gets alone: `ragged`
    from the config's dynamic_batching, `none` (max_batch_size 0) from rec.json's "serving"."""
    repo = tmp_path / f"repo_{form}"
    overrides = tmp_path / f"export_{form}.yaml"
    # A wide batching window, waited out (--batch-window fixed), so the merge does not depend
    # on scheduling luck.
    export = {"triton_batching": form, "max_batch_size": 128, "max_queue_delay_us": 50_000}
    overrides.write_text(yaml.safe_dump({"export": export}))
    _rec("export", str(trained / "run"), "--repo", str(repo), "--format", "torchscript",
         "-c", str(overrides))  # fmt: skip
    model_dir = repo / "rec"
    config = ModelDir(model_dir).config.read_text()
    assert ("max_batch_size: 0" in config) == (form == "none")
    manifest = json.loads(ModelDir(model_dir).manifest.read_text())
    torch.set_num_threads(1)
    module = torch.jit.load(str(ModelDir(model_dir).model_file(1)))
    sizes = [1, 7, 30, 2, 64, 5, 16, 3] * 2
    batches = [_batch(manifest, rows, seed=100 + i) for i, rows in enumerate(sizes)]
    with torch.inference_mode():
        alone = [module(*(torch.from_numpy(b[k]) for k in INPUT_NAMES)).numpy() for b in batches]
    server = Server(repo, "--model", "rec", "--executor-threads", "1", "--batch-window", "fixed")
    try:
        results = scores_concurrently(server, batches, workers=len(batches))
        for got, want in zip(results, alone, strict=True):
            np.testing.assert_array_equal(got, want)  # export.batch_invariant: bit for bit
        with httpclient.InferenceServerClient(server.http) as c:
            stats = c.get_inference_statistics("rec")["model_stats"][0]
            big = _batch(manifest, 129, seed=1)
            with pytest.raises(InferenceServerException, match="exceeds max_batch_size 128"):
                c.infer("rec", infer_inputs(httpclient, big))
        assert stats["inference_stats"]["success"]["count"] == len(batches)
        assert stats["inference_count"] == sum(sizes)
        assert stats["execution_count"] < len(batches), "no two requests were batched together"
    finally:
        assert server.stop() == 0


# Text that `int_or_hash` hashes: words, the decimal look-alikes it must not read as integers,
# an integer past int64, escapes and non-ASCII for JSON, and a token of several BLAKE2b blocks.
_WORDS = ["apple", "café", "日本語", "", " 7", "+5", "1_000", "9223372036854775808", 'a"b\tc\\']
_WORDS += ["x" * 300]


def _tokens(rng: np.random.Generator, n: int) -> list[str]:
    """n tokens: a third decimal ids (their own ids, "-0" and "007" among them), a third
    user-like names, a third the words above."""
    tokens = []
    for k in range(n):
        kind = k % 3
        if kind == 0:
            tokens.append(str(int(rng.integers(-(2**62), 2**62))) if k % 7 else "007")
        elif kind == 1:
            tokens.append(f"user_{int(rng.integers(10**6))}")
        else:
            tokens.append(_WORDS[int(rng.integers(len(_WORDS)))])
    return tokens


def test_string_ids_score_like_int_ids(exported):
    """The export's rec.json carries the feature spec, so rec-server takes the ids as text too
    (sparse_strings, BYTES) and maps them as training does: every protocol form of the strings
    scores exactly what the ids that rec.features computes from them score."""
    model_dir = exported / "rec"
    manifest = json.loads(ModelDir(model_dir).manifest.read_text())
    spec = FeatureSpec.from_dict(manifest["feature_spec"])
    torch.set_num_threads(1)
    module = torch.jit.load(str(ModelDir(model_dir).model_file(1)))
    server = Server(exported, "--model", "rec")
    try:
        strings_meta = {"name": "sparse_strings", "datatype": "BYTES", "shape": [-1]}
        with httpclient.InferenceServerClient(server.http) as c:
            assert strings_meta in c.get_model_metadata("rec")["inputs"]
        with grpcclient.InferenceServerClient(server.grpc) as c:
            inputs = c.get_model_metadata("rec", as_json=True)["inputs"]
            assert {"name": "sparse_strings", "datatype": "BYTES", "shape": ["-1"]} in inputs
        for rows in (1, 5, 64):
            rng = np.random.default_rng(1000 + rows)
            batch = _batch(manifest, rows, seed=rows)
            tokens = _tokens(rng, len(batch["sparse_values"]))
            batch["sparse_values"] = spec.encode_values(batch["sparse_lengths"], tokens)
            if rows == 64:  # both kinds of token are there: own ids and hashes
                own = [t.lstrip("-").isdigit() and abs(int(t)) < 2**63 for t in tokens]
                assert any(own) and not all(own)
                ids = batch["sparse_values"][np.array(own)]
                assert ids.tolist() == [int(t) for t, o in zip(tokens, own, strict=True) if o]
            with torch.inference_mode():
                want = module(*(torch.from_numpy(batch[k]) for k in INPUT_NAMES)).numpy()
            got = {"http ids": http_scores(server.http, batch)}
            got["grpc ids"] = grpc_scores(server.grpc, batch)
            with httpclient.InferenceServerClient(server.http) as c:
                for binary in (False, True):
                    inputs = string_inputs(httpclient, batch, tokens, binary=binary)
                    got[f"http strings, binary={binary}"] = c.infer("rec", inputs).as_numpy(
                        "scores"
                    )
            with grpcclient.InferenceServerClient(server.grpc) as c:
                inputs = string_inputs(grpcclient, batch, tokens)
                got["grpc strings, raw contents"] = c.infer("rec", inputs).as_numpy("scores")
            request = grpc_typed_strings_request("rec", batch, tokens)
            got["grpc strings, bytes_contents"] = grpc_call(server.grpc, request)
            for how, scores in got.items():
                np.testing.assert_array_equal(scores, want, err_msg=f"{rows} rows, {how}")
    finally:
        assert server.stop() == 0
