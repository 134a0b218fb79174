"""The served module (rec.export.served, rec.export.dense): the TBE lookup's ids, the
batch-invariant dense layers, and the whole module against the float model it was made from."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rec.config import config_from_dict
from rec.contract.repository import model_file_in
from rec.export import served, torchscript_builder
from rec.export.dense import Int8Linear, InvariantLinear, PackedLinear, swap_dense
from rec.export.module import FloatReference, sample_batch, split_requests
from rec.model import build_model, table_keys, table_rows
from rec.quantize import BITS, quantize_rows
from tests.export.conftest import tiny_dict
from tests.helpers import needs_bf16_cpu

I64 = torch.iinfo(torch.int64)
# Ids that break a naive modulo: int64's extremes, -1, around 2^31, and table sizes' multiples.
EXTREME = [I64.min, I64.min + 1, -(2**31) - 1, -300, -1, 0, 1, 49, 50, 2**31, I64.max - 1, I64.max]


MIXED_DIMS = [4, 8, 16, 12]


def _config(arch: str, dense_dtype: str = "fp32"):
    data = tiny_dict(dense_dtype=dense_dtype)
    # DCN: cross layers of 48 x 96 and a top layer of 48 x 96 weights are big enough for bf16
    # (oneDNN) and int8, the rest stay fp32 (rec.export.dense), so both kinds are in the model.
    data["model"] = {"arch": arch, "dense_arch": [80, 8], "over_arch": [96, 1],
                     "dcn_num_layers": 2, "dcn_low_rank_dim": 96}  # fmt: skip
    if arch == "mmoe":  # two tasks, three experts: the gates and experts are small layers
        data["model"] = {"arch": arch, "dense_arch": [80, 8], "over_arch": [16, 1],
                         "tasks": ["click", "buy"], "num_experts": 3,
                         "expert_arch": [96, 24]}  # fmt: skip
    if arch == "din":  # a sequence table (candidate, history) beside the pooled ones
        data["model"] = {"arch": arch, "dense_arch": [80, 8], "over_arch": [96, 1],
                         "candidate": "cand", "history": "hist",
                         "attention_arch": [96]}  # fmt: skip
        data["tables"].append({"name": "item", "rows": 70, "dim": 24, "pooling": "none",
                               "features": ["cand", "hist"]})  # fmt: skip
        data["features"]["sparse"] = ["e", "hist", "a", "c", "cand", "b", "d"]
    if arch in ("dcn_v2", "mmoe", "din"):  # over concatenated embeddings: tables of four dims
        for table, dim in zip(data["tables"], MIXED_DIMS, strict=False):
            table["dim"] = dim
    return config_from_dict(data)


def _request(cfg, batch: int = 8, seed: int = 0):
    return sample_batch(cfg.features.dense, len(cfg.features.sparse), batch, seed=seed)


def _served(cfg, dtypes: dict[str, str] | None = None, seed: int = 0):
    """(served module with the float model's tables quantized in, the float reference)."""
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    dtypes = dtypes or {t.name: "fp32" for t in cfg.tables}
    module, tbe = torchscript_builder.served_module(model, cfg, dtypes)
    sink = served.TbeSink(tbe)
    weights = model.state_dict()
    for name, key in table_keys(model).items():
        sink.write(name, 0, weights[key])
    return module, FloatReference(model, cfg.features.sparse, table_rows(cfg)).eval()


@pytest.mark.parametrize("batch", [1, 3, 37])
@pytest.mark.parametrize("reordered", [False, True])
def test_table_indices_stay_inside_their_tables(batch, reordered):
    """What the TBE's disabled bounds check rests on: every index is id mod rows in [0, rows),
    for int64's extremes too, in feature-major bags (checked against Python's own modulo)."""
    cfg = config_from_dict(tiny_dict())
    columns = len(cfg.features.sparse)
    column_of = torch.tensor([4, 0, 2, 1, 3]) if reordered else None
    cols = column_of.tolist() if reordered else list(range(columns))
    rows = table_rows(cfg)[cols]
    g = torch.Generator().manual_seed(batch)
    lengths = torch.randint(0, 5, (batch, columns), dtype=torch.int32, generator=g)
    pick = torch.randint(0, len(EXTREME), (int(lengths.sum()),), generator=g)
    values = torch.tensor(EXTREME, dtype=torch.int64)[pick]

    indices, offsets = served.table_indices(lengths, values, rows, column_of)

    starts = [0]
    for n in lengths.reshape(-1).tolist():
        starts.append(starts[-1] + n)
    want, want_offsets = [], [0]
    for k, c in enumerate(cols):
        for b in range(batch):
            bag = values[starts[b * columns + c] : starts[b * columns + c + 1]].tolist()
            want += [v % int(rows[k]) for v in bag]  # Python's % is non-negative here
            want_offsets.append(len(want))
    assert indices.tolist() == want
    assert offsets.tolist() == want_offsets
    ends = offsets[batch::batch].contiguous()
    feature = torch.bucketize(torch.arange(len(want)), ends, right=True)
    assert bool(((indices >= 0) & (indices < rows[feature])).all())


@pytest.mark.parametrize(
    ("lengths", "values", "column_of", "message"),
    [
        ([[1, 2]], [5, 6], None, "add up to 3 ids but sparse_values holds 2"),
        ([[2, -1]], [5], None, "negative length"),
        ([[1, 1]], [5, 6], [1, 1], "not a permutation"),
    ],
)
def test_feature_major_ids_refuses_lengths_that_do_not_describe_the_ids(
    lengths, values, column_of, message
):
    """rec::feature_major_ids reads only the ids it was given: lengths that add up to more (or
    are negative), or a column order that skips a column, are refused, not read past."""
    column = None if column_of is None else torch.tensor(column_of)
    with pytest.raises(RuntimeError, match=message):
        served.feature_major_ids(torch.tensor(lengths, dtype=torch.int32),
                                 torch.tensor(values), torch.tensor([3, 4]), column)  # fmt: skip


@pytest.mark.parametrize("arch", ["dlrm", "dlrm_dcn", "dcn_v2", "mmoe", "din"])
def test_served_module_computes_the_float_model(arch):
    """fp32 tables: the lean module (one TBE op, oneDNN / per-sample dense layers) scores what
    the float DLRM behind a KeyedJaggedTensor scores; a shared table, a mean-pooled one and
    request columns out of table order included (EXPORT_TINY); din's candidate and history
    from a second, unpooled TBE."""
    cfg = _config(arch)
    module, reference = _served(cfg)
    request = _request(cfg, 64, seed=3)
    with torch.no_grad():
        got, want = module(*request), reference(*request)
    assert (got - want).abs().max().item() < 1e-5


def _dequantized(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """What a table stored as `dtype` holds, as fp32."""
    codes, scale_bias = quantize_rows(rows, dtype)
    if scale_bias is None:
        return codes.view(torch.float16 if dtype == "fp16" else torch.float32).float()
    fused = torch.cat([codes, scale_bias], dim=1)
    return torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(fused, BITS[dtype])


@pytest.mark.parametrize("arch", ["dlrm_dcn", "dcn_v2", "mmoe", "din"])
def test_mixed_table_dtypes_read_what_was_stored(arch):
    """int4, fp16, int8 and fp32 tables in one TBE (for dcn_v2 each at its own dim): scores are
    the float model's with each table replaced by its stored (dequantized) values."""
    dtypes = {"t0": "int4", "t1": "fp16", "t2": "int8", "t3": "fp32", "item": "int4"}
    cfg = _config(arch)
    module, reference = _served(cfg, {t.name: dtypes[t.name] for t in cfg.tables})
    with torch.no_grad():
        for name, key in table_keys(reference.model).items():
            weight = reference.model.get_parameter(key)
            weight.copy_(_dequantized(weight, dtypes[name]))
    request = _request(cfg, 64, seed=4)
    with torch.no_grad():
        assert (module(*request) - reference(*request)).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("arch", "dense_dtype"),
    [
        ("dlrm_dcn", "fp32"),
        pytest.param("dlrm_dcn", "bf16", marks=needs_bf16_cpu),
        ("dlrm_dcn", "int8"),
        ("dcn_v2", "fp32"),
        ("din", "int8"),
        ("mmoe", "fp32"),
        ("din", "fp32"),
    ],  # fmt: skip
)
def test_scripted_reloaded_and_batch_invariant(tmp_path, arch, dense_dtype):
    """Saved and loaded (bf16's oneDNN weights are repacked on load), the module scores a batch
    exactly as its samples one by one, at every batch size around oneDNN's 4-row minimum (din:
    its attention's layers see one row per history item, down to none)."""
    cfg = _config(arch, dense_dtype)
    module, reference = _served(cfg)
    kinds = {type(m) for m in module.modules()}
    assert InvariantLinear in kinds and nn.Linear not in kinds
    assert (PackedLinear in kinds) == (dense_dtype == "bf16")
    assert (Int8Linear in kinds) == (dense_dtype == "int8")
    sample = _request(cfg)
    path = model_file_in(tmp_path)
    torch.jit.save(torchscript_builder.to_torchscript(module, sample), str(path))
    loaded = torch.jit.load(str(path))
    request = _request(cfg, 37, seed=5)
    with torch.no_grad():
        batched = loaded(*request)
        singles = torch.cat([loaded(*r) for r in split_requests(*request)])
        assert torch.equal(batched, singles)
        for n in (2, 3, 4, 5, 17):
            head = torch.cat([loaded(*r) for r in split_requests(*request)[:n]])
            first = [torch.cat([r[i] for r in split_requests(*request)[:n]]) for i in range(3)]
            assert torch.equal(loaded(*first), head)
        assert torch.equal(batched, module(*request))
        tolerance = {"fp32": 1e-5, "bf16": 2e-2, "int8": 5e-2}[dense_dtype]
        assert (batched - reference(*request)).abs().max().item() < tolerance


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_cross_net_is_torchrecs(batch_invariant):
    cfg = _config("dlrm_dcn")
    torch.manual_seed(1)
    net = build_model(cfg).inter_arch.crossnet
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    holder = nn.Module()
    holder.net = copy.deepcopy(net)
    swap_dense(holder, batch_invariant)
    x = torch.randn(33, net.V_kernels[0].shape[1])
    with torch.no_grad():
        assert (holder.net(x) - net(x)).abs().max().item() < 1e-5
