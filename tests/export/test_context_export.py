"""`rec export` of a context model (features.context from `-c`, as one run exports both forms):
rec.json's inputs and "context" section, config.pbtxt in both Triton forms, the verification's
context checks, and model.pt scoring as the flat export of the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.config import ExportConfig
from rec.contract.context import ContextSplit, repeat
from rec.contract.io import INPUT_NAMES, context_io_manifest
from rec.contract.repository import ModelDir
from rec.export import context_checks, verify
from rec.export.pipeline import export_run
from rec.export.repository import triton_config
from tests.helpers import write_config

CONTEXT = ["dense_0", "dense_2", "a", "c", "d"]  # c shares table t1 with the candidates' b
# features.sparse of EXPORT_TINY is [e, a, c, b, d]
SPLIT = ContextSplit(dense=(0, 2), sparse=(1, 2, 4), num_dense=4, num_sparse=5)
quiet = {"log": lambda _: None}


def parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def exports(seeded_run, tmp_path_factory):
    """The seeded run exported flat and with features.context (TorchScript, fp32 dense)."""
    where = tmp_path_factory.mktemp("context")
    overrides = {"export": {"format": "torchscript"}}
    flat = export_run(seeded_run, where / "flat", config=write_config(where / "f.yaml", overrides),
                      **quiet)  # fmt: skip
    with_context = {**overrides, "features": {"context": CONTEXT}}
    context = export_run(seeded_run, where / "ctx",
                         config=write_config(where / "c.yaml", with_context), **quiet)  # fmt: skip
    return flat, context


def test_rec_json_describes_the_context_model(exports):
    _, context = exports
    m = json.loads(ModelDir.of(context.repo, "rec").manifest.read_text())
    assert m["inputs"] == context_io_manifest(SPLIT, 1)["inputs"]
    assert [i["name"] for i in m["inputs"]] == [
        "context_dense", "context_lengths", "context_values", "candidate_dense",
        "candidate_lengths", "candidate_values", "candidate_offsets",
    ]  # fmt: skip
    assert m["context"] == SPLIT.to_dict()
    checks = m["verification"]
    assert checks["context_vs_flat_max_diff"] == {"torchscript": 0.0}
    assert checks["batched_vs_single_max_diff"] == {"torchscript": 0.0}
    # The servers' load-time probe: 3 contexts of 1, 3 and 5 candidates, by input name.
    probe = m["batch_probe"]  # and the same pairs flat, for readers of the flat form
    assert list(probe) == [i["name"] for i in m["inputs"]] + list(INPUT_NAMES)
    assert len(probe["dense_features"]) == 9
    assert probe["candidate_offsets"] == [0, 2, 8, 18]  # Fn = 2 (e, b)
    assert len(probe["context_lengths"]) == 3 and len(probe["candidate_lengths"]) == 9


def test_config_pbtxt_takes_either_form(exports):
    _, context = exports
    config = parse(ModelDir.of(context.repo, "rec").config)  # Triton's own schema
    dtype = model_config_pb2.DataType.Name
    got = [(i.name, dtype(i.data_type), list(i.dims), i.optional) for i in config.input]
    assert got == [
        ("dense_features", "TYPE_FP32", [-1, 4], True),
        ("sparse_lengths", "TYPE_INT32", [-1, 5], True),
        ("sparse_values", "TYPE_INT64", [-1], True),
        ("context_dense", "TYPE_FP32", [-1, 2], True),
        ("context_lengths", "TYPE_INT32", [-1, 3], True),
        ("context_values", "TYPE_INT64", [-1], True),
        ("candidate_dense", "TYPE_FP32", [-1, 2], True),
        ("candidate_lengths", "TYPE_INT32", [-1, 2], True),
        ("candidate_values", "TYPE_INT64", [-1], True),
        ("candidate_offsets", "TYPE_INT32", [-1], True),
    ]
    assert config.max_batch_size == 0 and not config.batch_input


def test_ragged_config_batches_one_context_per_request():
    export = ExportConfig(triton_batching="ragged", max_batch_size=64)
    text = triton_config("m", "pytorch_libtorch", 4, 5, 1, export, SPLIT)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    got = [(i.name, list(i.dims), i.allow_ragged_batch) for i in config.input]
    assert got == [
        ("context_dense", [2], False),
        ("context_lengths", [3], False),
        ("context_values", [-1], True),
        ("candidate_dense", [-1, 2], True),
        ("candidate_lengths", [-1, 2], True),
        ("candidate_values", [-1], True),
    ]
    (offsets,) = config.batch_input
    kind = model_config_pb2.BatchInput.Kind.Name(offsets.kind)
    assert kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"
    assert list(offsets.target_name) == ["candidate_offsets"]
    assert list(offsets.source_input) == ["candidate_lengths"]
    (scores,) = config.batch_output
    assert list(scores.target_name) == ["scores"]
    assert config.max_batch_size == 64


def test_model_pt_scores_as_the_flat_export(exports):
    """The context model.pt's forward takes rec.json's inputs by name; a request of one
    context and N candidates scores as the flat model.pt scores the flat batch, bit for bit;
    both sides read one table storage."""
    flat, context = exports
    flat_model = torch.jit.load(str(ModelDir.of(flat.repo, "rec").model_file(1)))
    model = torch.jit.load(str(ModelDir.of(context.repo, "rec").model_file(1)))
    names = [i["name"] for i in context_io_manifest(SPLIT, 1)["inputs"]]
    assert [a.name for a in model.forward.schema.arguments][1:] == names
    for counts, seed in (([1], 1), ([7], 2), ([2, 5, 1], 3)):
        request = context_checks.context_request(SPLIT, counts, seed)
        inputs = {k: v.numpy() for k, v in request.items()}
        want = flat_model(*(torch.from_numpy(a) for a in repeat(SPLIT, inputs)))
        got = model(*request.values())
        assert np.array_equal(got.numpy(), want.numpy())
    lookup = model.pairs.lookup
    assert lookup.ctx.weights_host.data_ptr() == lookup.cand.weights_host.data_ptr()


def test_a_context_model_that_scores_otherwise_is_refused(exports):
    """A context form that does not score as its flat form (here: one context's scores nudged
    by an ulp) is refused by run_checks; the check finds it on batches."""
    from rec.batch import RecBatch
    from rec.export.build import Built
    from rec.export.module import sample_batch
    from rec.export.pipeline import check_context
    from rec.export.verify import VerificationError

    _, context = exports
    model = torch.jit.load(str(ModelDir.of(context.repo, "rec").model_file(1)))

    def nudged(*inputs):
        scores = model(*inputs)
        one_context = inputs[-1].numel() == 2
        return torch.nextafter(scores, torch.ones_like(scores)) if one_context else scores

    batch = RecBatch(*sample_batch(4, 5, 16, seed=3), torch.zeros(16, 1))
    assert context_checks.context_vs_flat(model, SPLIT, [batch]) == 0.0
    diff = context_checks.context_vs_flat(nudged, SPLIT, [batch])
    assert 0 < diff < 1e-6
    none = torch.zeros(0)
    built = {"torchscript": Built(none, none, 0.0, {}, checks={"context_vs_flat": diff})}
    with pytest.raises(VerificationError, match="torchscript: held-out batches scored as one"):
        check_context({}, built)


def test_the_context_probe_finds_a_batch_dependent_model(exports):
    """rec.batch_probe.context_variance: 0 for the exported model; a model whose scores move
    with the number of contexts in its batch is found."""
    from rec.batch_probe import context_variance

    _, context = exports
    model = torch.jit.load(str(ModelDir.of(context.repo, "rec").model_file(1)))
    request = context_checks.probe_request(SPLIT)
    assert context_variance(model, request, len(SPLIT.cand_sparse)) == 0.0

    def variant(*inputs):
        return model(*inputs) + 1e-6 * (inputs[-1].numel() - 2)  # R - 1

    assert context_variance(variant, request, len(SPLIT.cand_sparse)) > 0


def test_a_zch_context_model_exports_with_each_sides_maps(tmp_path):
    """ZCH tables read by context features (t0: a) and by both sides (t1: c context, b
    candidate): the export's ZCH checks pass through the context model, and rec.json names
    every copy of a map, which the update log writes alike."""
    from tests.export.zch_run import write_zch_run

    run = write_zch_run(tmp_path / "run")
    overrides = {
        "export": {"format": "torchscript"},
        "features": {"context": ["dense_0", "a", "c"]},
    }
    result = export_run(run, tmp_path / "repo", config=write_config(tmp_path / "c.yaml", overrides),
                        **quiet)  # fmt: skip
    m = json.loads(ModelDir.of(result.repo, "rec").manifest.read_text())
    assert m["verification"]["context_vs_flat_max_diff"] == {"torchscript": 0.0}
    assert m["verification"]["zch"]["tables_with_admitted_ids"] == ["t0", "t1"]
    sides = {
        t: sorted({b.split(".")[2] for b in z["buffers"]}) for t, z in m["zch"]["tables"].items()
    }
    assert sides == {"t0": ["ctx"], "t1": ["cand", "ctx"]}


@pytest.mark.parametrize("arch", ["dlrm_dcn", "din"])
def test_aoti_package_scores_as_torchscript(tmp_path, arch):
    """AOTInductor: contexts and candidates are dynamic dimensions; the package scores one
    context (R = 1, a request) and three (R = 3, rec-server's batches) bit for bit as it
    scores the flat pairs (B contexts of one candidate), and as model.pt does within the
    flat package's bound; the export's context checks pass (din: its multi-id candidates
    summed in index order on every thread); tables.bin holds each table storage once."""
    from rec.config import config_from_dict
    from rec.export.aoti_builder import AotiModel
    from tests.export.conftest import write_seeded_run
    from tests.export.test_aoti import _config

    data = _config(arch)
    context = CONTEXT if arch == "dlrm_dcn" else ["history_items", "cat_0", "dense_0", "dense_1"]
    split = ContextSplit.from_config(
        config_from_dict({**data, "features": {**data["features"], "context": context}})
    )
    run = write_seeded_run(tmp_path / "run", data)
    overrides = write_config(tmp_path / "c.yaml", {"features": {"context": context}})
    repo = tmp_path / "repo"
    for fmt in ("torchscript", "aoti"):
        export_run(run, repo, fmt=fmt, config=overrides, **quiet)
    package = AotiModel(ModelDir.of(repo, "rec_aoti").version(1))
    scripted = torch.jit.load(str(ModelDir.of(repo, "rec").model_file(1)))
    m = json.loads(ModelDir.of(repo, "rec_aoti").manifest.read_text())
    assert m["inputs"] == context_io_manifest(split, 1)["inputs"]
    assert m["verification"]["context_vs_flat_max_diff"] == {"aoti": 0.0}
    assert m["verification"]["batched_vs_single_max_diff"] == {"aoti": 0.0}
    stored = [t["name"] for t in m["aoti"]["tables"] if t["name"].endswith("weights_host")]
    assert len(stored) == (1 if arch == "dlrm_dcn" else 2)  # din: pooled and sequence tables
    flat = context_checks.FlatScorer(package, split)
    for counts, seed in (([1], 1), ([6], 2), ([2, 5, 1], 3)):
        request = context_checks.context_request(split, counts, seed)
        inputs = {k: v.numpy() for k, v in request.items()}
        with torch.inference_mode():
            got = package(*request.values())
            repeated = flat(*(torch.from_numpy(a) for a in repeat(split, inputs)))
            assert torch.equal(got, repeated)
            # Inductor's sigmoid (SLEEF) may differ from ATen's in an ulp (verify.AOTI_TOLERANCE)
            assert (got - scripted(*request.values())).abs().max() <= verify.AOTI_TOLERANCE


def test_context_difference_is_recorded_not_refused_without_batch_invariance():
    """export.batch_invariant false (MKL's layers: a row's bits depend on its batch): the
    difference is recorded, as the batching check's is."""
    from rec.export.build import Built
    from rec.export.pipeline import check_context

    none = torch.zeros(0)
    built = {"torchscript": Built(none, none, 0.0, {}, checks={"context_vs_flat": 3e-8})}
    checks: dict = {}
    check_context(checks, built, exact=False)
    assert checks["context_vs_flat_max_diff"] == {"torchscript": 3e-8}


def test_a_published_row_reaches_both_sides(exports):
    """model.pt's two lookups share one storage after loading too: rows written where rec.json's
    "updates" places table t1 (the Python backend's writer) are read by the context's c and
    the candidates' b, so the context model still scores as the updated flat one."""
    from rec.quantize import quantize_rows
    from rec.update_log import write_rows

    models = {}
    for form, result in zip(("flat", "context"), exports, strict=True):
        model = torch.jit.load(str(ModelDir.of(result.repo, "rec").model_file(1)))
        place = json.loads(ModelDir.of(result.repo, "rec").manifest.read_text())["updates"][
            "tables"]["t1"]  # fmt: skip
        rows = torch.randn(place["rows"], place["dim"], generator=torch.Generator().manual_seed(4))
        codes, scale_bias = quantize_rows(rows, place["dtype"])
        log_rows = torch.cat([codes, scale_bias], 1).numpy().tobytes()  # the log's row layout
        buffer = dict(model.named_buffers())[place["buffer"]]
        models[form] = (model, buffer, place, log_rows)
    request = context_checks.context_request(SPLIT, [3, 4], seed=9)
    inputs = {k: v.numpy() for k, v in request.items()}
    flat_request = [torch.from_numpy(a) for a in repeat(SPLIT, inputs)]
    with torch.inference_mode():
        before = models["context"][0](*request.values())
        for _model, buffer, place, log_rows in models.values():
            write_rows(buffer, place, list(range(place["rows"])), log_rows)
        got = models["context"][0](*request.values())
        assert not torch.equal(got, before)
        assert torch.equal(got, models["flat"][0](*flat_request))
