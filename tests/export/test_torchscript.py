"""The exported TorchScript model: read from disk, it implements the model's I/O
(docs/architecture.md#model-io)."""

from __future__ import annotations

import json

import pytest
import torch

from rec.config import config_from_dict
from rec.contract import FORMATS
from rec.contract.repository import manifest_in, model_file_in
from rec.cpu import cpu_info
from rec.export.load import load_run
from rec.export.module import FloatReference, split_requests
from rec.model import table_rows
from tests.export.conftest import random_request, tiny_dict
from tests.helpers import needs_bf16_cpu, rec_in_process

NUM_DENSE, NUM_SPARSE = 4, 5


@pytest.fixture(scope="module")
def scripted(exported):
    return torch.jit.load(str(model_file_in(exported.models["torchscript"])))


@pytest.fixture(scope="module")
def float_module(seeded_run):
    loaded = load_run(seeded_run)
    return FloatReference(loaded.model, loaded.cfg.features.sparse, table_rows(loaded.cfg))


def test_io_table_from_disk(scripted):
    dense, lengths, values = random_request(NUM_DENSE, NUM_SPARSE, 7, seed=1)
    scores = scripted(dense, lengths, values)
    assert scores.dtype == torch.float32 and scores.shape == (7, 1)
    assert bool(((scores > 0) & (scores < 1)).all())
    args = [a.name for a in scripted.forward.schema.arguments][1:]
    assert args == ["dense_features", "sparse_lengths", "sparse_values"]  # Triton maps by name


def test_batched_equals_single_sample_requests_exactly(scripted):
    request = random_request(NUM_DENSE, NUM_SPARSE, 33, seed=2)
    with torch.no_grad():
        batched = scripted(*request)
        singles = torch.cat([scripted(*r) for r in split_requests(*request)])
    assert torch.equal(batched, singles)


def test_concatenated_requests_give_stacked_scores(scripted):
    a = random_request(NUM_DENSE, NUM_SPARSE, 5, seed=3)
    b = random_request(NUM_DENSE, NUM_SPARSE, 300, seed=4)
    both = tuple(torch.cat([x, y]) for x, y in zip(a, b, strict=True))
    with torch.no_grad():
        assert torch.equal(scripted(*both), torch.cat([scripted(*a), scripted(*b)]))


def test_ids_are_mapped_into_tables(scripted):
    dense, lengths, values = random_request(NUM_DENSE, NUM_SPARSE, 4, seed=5)
    rows = table_rows(config_from_dict(tiny_dict()))
    per_value = torch.repeat_interleave(rows.repeat(4), lengths.reshape(-1).long())
    shifted = values + 7 * per_value  # the same rows after the non-negative modulo
    assert torch.equal(scripted(dense, lengths, values), scripted(dense, lengths, shifted))


def test_int8_close_to_float_and_reload_identical(scripted, float_module, exported):
    request = random_request(NUM_DENSE, NUM_SPARSE, 64, seed=6)
    with torch.no_grad():
        diff = (scripted(*request) - float_module(*request)).abs().max().item()
    assert diff < 2e-2
    checks = json.loads(manifest_in(exported.models["torchscript"]).read_text())["verification"]
    assert checks["torchscript_reload_identical"] is True
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0


def test_int8_bytes_at_dim_64():
    """The quality bar's storage half: int8 <= 0.35x fp32 at dim 64 (FBGEMM's padded rows)."""
    from rec.export.served import make_tbe, table_storage

    data = tiny_dict()
    for t in data["tables"]:
        t["dim"] = 64
    data["model"]["dense_arch"] = [16, 64]
    cfg = config_from_dict(data)
    tbe = make_tbe(cfg, {t.name: "int8" for t in cfg.tables}, list(cfg.features.sparse))
    storage = table_storage(tbe)
    for t in cfg.tables:
        assert storage[t.name]["bytes_stored"] <= 0.35 * t.rows * t.dim * 4


def test_dlrm_dcn_exports_batch_invariant(tmp_path):
    from rec.export.pipeline import export_run
    from tests.export.conftest import write_seeded_run

    data = tiny_dict()
    data["model"]["arch"] = "dlrm_dcn"
    run = write_seeded_run(tmp_path / "run", data)
    result = export_run(run, tmp_path / "repo", log=lambda _: None)
    checks = json.loads(manifest_in(result.models["torchscript"]).read_text())["verification"]
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0


@needs_bf16_cpu
@pytest.mark.parametrize("invariant", [True, False])
def test_bf16_dense_layers_export_with_their_auc_recorded(tmp_path, invariant):
    """bf16 dense layers, batch invariant (padded to oneDNN's minimum rows) or not (the same
    oneDNN layers unpadded, for CPUs whose bf16 kernels depend on the batch size: AMX)."""
    from rec.export.dense import PackedLinear
    from rec.export.pipeline import export_run
    from tests.export.conftest import write_seeded_run

    data = tiny_dict(dense_dtype="bf16", accept_quality_loss=True, batch_invariant=invariant)
    # Cross and top layers of 40 x 96 weights: big enough for oneDNN, so bf16 applies.
    data["model"] = {"arch": "dlrm_dcn", "dense_arch": [16, 8], "over_arch": [96, 1],
                     "dcn_num_layers": 2, "dcn_low_rank_dim": 96}  # fmt: skip
    run = write_seeded_run(tmp_path / "run", data)
    result = export_run(run, tmp_path / "repo", log=lambda _: None)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    dense = manifest["dense"]
    assert (dense["dtype"], dense["batch_invariant"]) == ("bf16", invariant)
    assert dense["layers"]["bf16"] >= 4, dense  # the cross layers' and the top layer's
    checks = manifest["verification"]
    diff = checks["batched_vs_single_max_diff"]["torchscript"]
    assert diff == 0.0 if invariant else 0.0 <= diff < 1e-2
    if not invariant:
        from rec.export import torchscript_builder

        cfg = config_from_dict(data)
        dtypes = {t.name: "int8" for t in cfg.tables}
        module, _ = torchscript_builder.served_module(load_run(run, cfg=cfg).model, cfg, dtypes)
        packed = [m for m in module.modules() if isinstance(m, PackedLinear)]
        assert packed and all(m.weight.dtype == torch.bfloat16 for m in packed)
        assert module.min_rows == 1
    ratio = checks["eval"]["torchscript"]["auc_ratio"]
    assert 0.5 < ratio < 1.5
    assert ("accepted_quality_loss" in checks["eval"]) == (ratio < 0.999)


@pytest.mark.parametrize("invariant", [True, False])
def test_bf16_on_a_cpu_without_it_is_refused(tmp_path, monkeypatch, invariant):
    """Where oneDNN has no bf16 inner product (an AVX2-only EPYC; any CPU held to avx2 by the
    REC_MAX_CPU_ISA seam), a bf16 export stops with one error line naming the CPU and what to
    use instead, before writing anything, batch invariant or not."""
    from tests.export.conftest import write_seeded_run

    monkeypatch.setenv("REC_MAX_CPU_ISA", "avx2")

    data = tiny_dict(dense_dtype="bf16", accept_quality_loss=True, batch_invariant=invariant)
    data["model"] = {"arch": "dlrm_dcn", "dense_arch": [16, 8], "over_arch": [96, 1],
                     "dcn_num_layers": 2, "dcn_low_rank_dim": 96}  # fmt: skip
    run = write_seeded_run(tmp_path / "run", data)
    proc = rec_in_process("export", str(run), "--repo", str(tmp_path / "repo"))
    assert proc.returncode == 2, proc.stdout
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stdout
    error = errors[0]
    assert error.startswith("error: export.dense_dtype: bf16"), proc.stdout
    assert cpu_info()["model"] in error and "dense_dtype: int8" in error
    assert "Traceback" not in proc.stdout
    assert not (tmp_path / "repo").exists() or not any(
        (tmp_path / "repo").rglob(FORMATS["torchscript"].file)
    )


def test_bf16_that_applies_to_no_layer_says_so(tmp_path):
    """The tiny model's layers are all under SMALL_LAYER weights: bf16 changes nothing, and
    export warns and records that every layer is fp32."""
    from rec.export.pipeline import export_run
    from tests.export.conftest import write_seeded_run

    run = write_seeded_run(
        tmp_path / "run", tiny_dict(dense_dtype="bf16", accept_quality_loss=True)
    )
    lines: list[str] = []
    result = export_run(run, tmp_path / "repo", log=lines.append)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    assert set(manifest["dense"]["layers"]) == {"fp32"}
    assert any("dense_dtype bf16 applies to no layer" in line for line in lines), lines


@pytest.mark.parametrize("ratio", [0.9985, None])
def test_reduced_precision_under_the_bar_is_refused(ratio):
    """A bf16 model whose AUC ratio is under 0.999, or cannot be measured, is not written unless
    export.accept_quality_loss says so; then the reason is kept in rec.json."""
    from rec.export import verify
    from rec.export.pipeline import check_reduced_precision

    def eval_checks():
        return {} if ratio is None else {"torchscript": {"auc_ratio": ratio}}

    cfg = config_from_dict(tiny_dict(dense_dtype="bf16"))
    with pytest.raises(verify.VerificationError, match="bf16.*accept_quality_loss"):
        check_reduced_precision(cfg, eval_checks())
    cfg = config_from_dict(tiny_dict(dense_dtype="bf16", accept_quality_loss=True))
    ev = eval_checks()
    check_reduced_precision(cfg, ev)
    assert "bf16" in ev["accepted_quality_loss"]
    ev = {"torchscript": {"auc_ratio": 0.9995}}
    check_reduced_precision(config_from_dict(tiny_dict(dense_dtype="bf16")), ev)
    assert "accepted_quality_loss" not in ev


def test_dense_transforms_run_inside_both_formats(tmp_path):
    """features.transforms: log1p(max(x, 0)) is part of model.pt and model.onnx, so a request
    carries raw values: a negative raw value reads as 0 where the feature is log1p'd, and the
    transform is what the training side computes (rec.features, one implementation)."""
    import numpy as np

    from rec.export import onnx_builder as onnx_lib
    from rec.export.pipeline import export_run
    from rec.features import feature_spec, transform_dense
    from tests.export.conftest import write_seeded_run

    data = tiny_dict(format="both")
    data["features"]["transforms"] = {"dense_0": "log1p", "dense_2": "log1p"}
    run = write_seeded_run(tmp_path / "run", data)
    result = export_run(run, tmp_path / "repo", log=lambda _: None)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    assert [d["transform"] for d in manifest["feature_spec"]["dense"]] == [
        "log1p", "identity", "log1p", "identity"
    ]  # fmt: skip
    scripted = torch.jit.load(str(model_file_in(result.models["torchscript"])))
    session = onnx_lib.onnx_session(model_file_in(result.models["onnx"], "onnx"))
    dense, lengths, values = random_request(NUM_DENSE, NUM_SPARSE, 9, seed=11)
    dense = dense * 50
    logged_zero = dense.clone()
    logged_zero[:, [0, 2]] = torch.where(dense[:, [0, 2]] < 0, 0.0, dense[:, [0, 2]])
    identity_zero = dense.clone()
    identity_zero[:, 1] = torch.where(dense[:, 1] < 0, 0.0, dense[:, 1])
    with torch.no_grad():
        raw = scripted(dense, lengths, values)
        assert torch.equal(raw, scripted(logged_zero, lengths, values))  # clamped inside
        assert not torch.equal(raw, scripted(identity_zero, lengths, values))
    onnx_scores = onnx_lib.run_onnx(session, dense, lengths, values)
    assert float((onnx_scores - raw).abs().max()) <= 1e-5
    # The training readers' transform is the model's: the same values, bit for bit.
    cfg = config_from_dict(data)
    spec = feature_spec(cfg)
    expected = np.log1p(np.maximum(dense[:, 0].double().numpy(), 0)).astype(np.float32)
    assert np.array_equal(transform_dense(spec, dense.numpy())[:, 0], expected)


def test_dcn_v2_with_mixed_dims_exports_both_formats(tmp_path):
    """Tables of four dims and four stored dtypes under dcn_v2: export verifies both formats
    (ONNX Runtime against TorchScript, held-out AUC, batched = single-sample) and rec.json
    stores each table at its own dim."""
    from rec.export.pipeline import export_run
    from tests.export.conftest import write_seeded_run

    data = tiny_dict(format="both", table_dtypes={"t0": "int4", "t1": "fp16", "t3": "fp32"})
    data["model"] = {"arch": "dcn_v2", "dense_arch": [16, 6], "over_arch": [96, 1],
                     "dcn_num_layers": 1, "dcn_low_rank_dim": 48}  # fmt: skip
    for table, dim in zip(data["tables"], [4, 8, 16, 12], strict=True):
        table["dim"] = dim
    run = write_seeded_run(tmp_path / "run", data)
    result = export_run(run, tmp_path / "repo", log=lambda _: None)
    manifest = json.loads(manifest_in(result.models["torchscript"]).read_text())
    checks = manifest["verification"]
    assert checks["batched_vs_single_max_diff"]["torchscript"] == 0.0
    # Export checked it against ONNX_TOLERANCE; the seeded weights (std 0.5) put logits in the
    # hundreds, where oneDNN's and ONNX Runtime's sums differ in the last bits.
    assert checks["onnx_vs_torchscript_max_abs_diff"] <= 1e-4
    assert checks["eval"]["torchscript"]["auc_ratio"] > 0.99
    tables = {t["name"]: t for t in manifest["tables"]}
    assert [tables[f"t{i}"]["dim"] for i in range(4)] == [4, 8, 16, 12]
    assert [tables[f"t{i}"]["stored_dtype"] for i in range(4)] == ["int4", "fp16", "int8", "fp32"]


def test_a_batch_dependent_model_is_refused_with_the_reason():
    """The batching check compares a batch with its samples one by one; an export that claims
    invariance and differs is refused, with what to do for bf16 (BF16_NOT_INVARIANT)."""
    from rec.export import verify
    from rec.export.build import BF16_NOT_INVARIANT, check_batching

    def scorer(dense, lengths, values):  # a score that depends on the batch's size
        return dense[:, :1] * (1 + 1e-3 * dense.shape[0])

    sample = random_request(3, 2, 8, seed=0)
    with pytest.raises(verify.VerificationError, match="batch of 8 samples.*AMX"):
        check_batching("torchscript", scorer, sample, True, BF16_NOT_INVARIANT)
    assert check_batching("torchscript", scorer, sample, False) > 0


def test_plain_fp32_cross_net_swaps_on_any_cpu():
    """batch_invariant: false keeps the cross net's large layers on oneDNN in fp32, which every
    CPU runs: the bf16 CPU check must not refuse them (it did on an AVX2-only EPYC)."""
    from torchrec.modules.crossnet import LowRankCrossNet

    from rec.export.dense import SMALL_LAYER, PackedLinear, swap_dense

    net = LowRankCrossNet(in_features=128, num_layers=2, low_rank=64)
    assert SMALL_LAYER < 128 * 64  # large enough for the oneDNN branch
    x = torch.randn(5, 128)
    with torch.no_grad():
        want = net(x)
        holder = swap_dense(torch.nn.Sequential(net), batch_invariant=False, dtype="fp32")
        got = holder(x)
    layers = [m for m in holder.modules() if isinstance(m, PackedLinear)]
    assert layers and all(m.weight.dtype == torch.float32 for m in layers)
    assert torch.allclose(got, want, atol=1e-5)


def test_freezing_keeps_a_batch_norm_models_bits():
    """torch.jit.freeze folds a linear layer into the batch norm after it by default, which
    changes the scores by an ulp; export's freeze must not (a factory model with batch norm
    would be refused by the scripting check)."""
    from rec.export.torchscript_builder import freeze

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.BatchNorm1d(64)).eval()
    with torch.no_grad():
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
        net[1].weight.normal_()
        x = torch.randn(37, 13)
        assert torch.equal(freeze(torch.jit.script(net), net)(x), net(x))
