"""rec.model's architectures on a tiny seeded model: eager, FX-traced (TorchRec's tracer, as
its train pipelines trace) and scripted give the same logits, and configs that an
architecture cannot take are refused by name."""

from __future__ import annotations

import pytest
import torch
from torchrec.fx import symbolic_trace
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.config import ConfigError, config_from_dict
from rec.model import DcnV2, Mmoe, build_model

TABLES = [
    {"name": "t0", "rows": 40, "dim": 4, "features": ["a"]},
    {"name": "t1", "rows": 30, "dim": 8, "features": ["b", "c"], "pooling": "mean"},
    {"name": "t2", "rows": 20, "dim": 12, "features": ["d"]},
]
MODELS = {
    "dlrm": {"dense_arch": [16, 8], "over_arch": [16, 2]},
    "dlrm_dcn": {"dense_arch": [16, 8], "over_arch": [16, 2], "dcn_low_rank_dim": 4},
    "dcn_v2": {"dense_arch": [16, 6], "over_arch": [16, 2], "dcn_low_rank_dim": 4},
    "mmoe": {
        "dense_arch": [16, 6],
        "over_arch": [8, 1],
        "tasks": ["click", "buy"],
        "num_experts": 3,
        "expert_arch": [16, 8],
    },  # fmt: skip
    # Your own model: examples/custom_model.py's DeepFM, built by model.factory.
    "custom": {
        "factory": "examples.custom_model:build",
        "factory_args": {"deep_layers": [16, 8]},
        "tasks": ["click", "buy"],
    },  # fmt: skip
}


SEQUENCE = {"name": "item", "rows": 25, "dim": 4, "pooling": "none", "features": ["cand", "hist"]}
DIN = {"arch": "din", "dense_arch": [16, 6], "over_arch": [8, 2], "candidate": "cand",
       "history": "hist", "attention_arch": [8]}  # fmt: skip


def _config(arch: str):
    if arch == "din":  # the pooled tables at their dims beside a sequence table
        return config_from_dict(
            {"tables": [*TABLES, SEQUENCE], "features": {"dense": 3}, "model": DIN}
        )
    dims = arch in ("dcn_v2", "mmoe")  # the architectures whose tables may differ in dim
    tables = [{**t, "dim": t["dim"] if dims else 8} for t in TABLES]
    model = MODELS[arch] if "factory" in MODELS[arch] else {"arch": arch, **MODELS[arch]}
    return config_from_dict({"tables": tables, "features": {"dense": 3}, "model": model})


def _inputs(batch: int = 5, keys: tuple[str, ...] = ("a", "b", "c", "d")):
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 3, (len(keys) * batch,), generator=g)
    values = torch.randint(0, 20, (int(lengths.sum()),), generator=g)  # in every table
    kjt = KeyedJaggedTensor.from_lengths_sync(list(keys), values, lengths)
    return torch.randn(batch, 3, generator=g), kjt


@pytest.mark.parametrize("arch", [*MODELS, "din"])
def test_eager_traced_and_scripted_agree(arch):
    torch.manual_seed(0)
    model = build_model(_config(arch)).eval()
    dense, kjt = _inputs(keys=("a", "b", "c", "d", "cand", "hist") if arch == "din" else "abcd")
    with torch.no_grad():
        eager = model(dense, kjt)
        traced = symbolic_trace(model)
        scripted = torch.jit.script(traced)
        assert eager.shape == (5, 2)
        assert torch.equal(traced(dense, kjt), eager)
        assert torch.allclose(scripted(dense, kjt), eager, rtol=0, atol=1e-6)


def test_dcn_v2_reads_every_table_at_its_dim():
    """The cross net's input is the dense arch's output next to each feature's pooled
    embedding at its own dim: 6 + 4 + 8 + 8 + 12."""
    model = build_model(_config("dcn_v2"))
    assert isinstance(model, DcnV2)
    assert model.sparse_arch.sparse_feature_names == ["a", "b", "c", "d"]
    assert model.inter_arch.V_kernels[0].shape[1] == 6 + 4 + 8 + 8 + 12
    with torch.no_grad():
        pooled = model.sparse_arch(_inputs()[1])
    assert pooled.shape == (5, 32)


def test_mixed_dims_need_dcn_v2():
    tables = [{**t, "dim": t["dim"]} for t in TABLES]
    with pytest.raises(ConfigError, match=r"tables have dims \[4, 8, 12\].*dcn_v2"):
        config_from_dict({"tables": tables, "model": {"dense_arch": [16, 8]}})


def test_mmoe_mixes_shared_experts_per_task():
    """Every task's gate weighs the same experts, from the concatenation at each table's dim;
    the towers are the tasks' own, so the two score columns differ."""
    model = build_model(_config("mmoe")).eval()
    assert isinstance(model, Mmoe)
    top = model.over_arch
    assert len(top.experts) == 3 and len(top.tasks) == 2
    assert top.tasks[0].gate.in_features == 6 + 4 + 8 + 8 + 12
    assert top.tasks[0].gate.out_features == 3
    with torch.no_grad():
        logits = model(*_inputs())
    assert logits.shape == (5, 2)
    assert not torch.equal(logits[:, 0], logits[:, 1])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"arch": "mmoe", "dense_arch": [8]}, r"mmoe needs model.tasks"),
        ({"arch": "mmoe", "tasks": ["a", "b"], "over_arch": [8, 2]}, r"must end in 1"),
        ({"tasks": ["a", "b"], "dense_arch": [8]}, r"names 2 tasks but .* ends in 1"),
        ({"tasks": ["a", "a"], "over_arch": [8, 2], "dense_arch": [8]}, r"repeats a name"),
        ({"tasks": ["a b"], "dense_arch": [8]}, r"must be a Python identifier"),
    ],
)
def test_bad_task_configs_are_refused(model, message):
    tables = [{**t, "dim": 8} for t in TABLES]
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"tables": tables, "model": model})


def test_named_tasks_read_label_columns_of_their_names():
    tables = [{**t, "dim": 8} for t in TABLES]
    cfg = config_from_dict({"tables": tables, "model": {"arch": "mmoe", "tasks": ["click", "buy"]}})
    assert cfg.model.num_tasks == 2 and cfg.model.task_names == ["click", "buy"]
    assert cfg.data.columns.label_columns == ["click", "buy"]
    assert config_from_dict({"tables": tables, "model": {"dense_arch": [8]}}).model.task_names == [
        "label"
    ]


def test_din_attends_to_the_history():
    """The history changes the score only through the attention: emptying it, or making it
    the candidate itself, moves the logits; the candidate at dim 4 beside the pooled tables."""
    torch.manual_seed(0)
    model = build_model(_config("din")).eval()
    assert model.over_arch.model[0]._mlp[0]._linear.in_features == 6 + 4 + 8 + 8 + 12 + 3 * 4
    dense = torch.randn(2, 3)
    pooled = {"a": [1, 2], "b": [3, 4], "c": [5, 6], "d": [7, 8]}

    def kjt(history):
        keys = ["a", "b", "c", "d", "cand", "hist"]
        bags = [[[v] for v in pooled[k]] for k in "abcd"] + [[[9], [10]], history]
        lengths = torch.tensor([len(b) for per_key in bags for b in per_key])
        values = torch.tensor([v for per_key in bags for b in per_key for v in b])
        return KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)

    with torch.no_grad():
        empty = model(dense, kjt([[], []]))
        other = model(dense, kjt([[1, 2], [3]]))
        same = model(dense, kjt([[9], [10]]))
    assert not torch.equal(empty, other) and not torch.equal(other, same)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"model": {"dense_arch": [8]}},
            r"sequence tables \(pooling: none\); they need "
            r"model.arch: din",
        ),  # fmt: skip
        ({"model": {**DIN, "candidate": ""}}, r"din needs model.candidate"),
        (
            {"model": {**DIN, "candidate": "a"}},
            r"model.candidate='a' must be a feature of a "
            r"sequence table",
        ),  # fmt: skip
        ({"model": {**DIN, "history": "cand"}}, r"must be different features"),
        (
            {
                "model": DIN,
                "sharding": {"constraints": {"item": {"sharding_types": ["table_row_wise"]}}},
            },
            r"sharding.constraints.item.sharding_types\[\] \(a sequence table\)="
            r"'table_row_wise' is not allowed",
        ),  # fmt: skip
        ({"model": {**DIN, "factory": "tests.factories:good"}}, r"they need model.arch: din"),
    ],
)
def test_bad_sequence_configs_are_refused(change, message):
    tables = [{**t, "dim": 8} for t in TABLES] + [{**SEQUENCE, "dim": 8}]
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"tables": tables, **change})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sequence_tables_keep_to_their_sharding_types_on_every_device(device):
    from rec.train.sharding import make_constraints

    cfg = _config("din")
    constraints = make_constraints(cfg, device)
    assert constraints["item"].sharding_types == [
        "data_parallel", "table_wise", "column_wise", "row_wise"
    ]  # fmt: skip
    assert ("t0" in constraints) == (device == "cpu")  # pooled tables: the stock CPU choice
