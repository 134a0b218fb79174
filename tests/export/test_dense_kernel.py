"""rec::linear (cpp/ops/linear.cpp), the served model's fp32 dense layers: batch invariant by
construction. Scanned over every batch size up to the largest max batch a server uses, on the
examples' layer shapes and odd ones (the AVX-512, AVX2 and scalar paths against each other:
test_kernel_paths.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet

import rec.ops
from rec.config import load_config
from rec.export.dense import InvariantLinear, pack_weight
from rec.model import build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MAX_ROWS = 600  # past export.max_batch_size's default (512)
# Odd shapes no example has: widths that fill no panel, K = 1, a 1-output last layer.
ODD_SHAPES = [(46, 48), (84, 96), (1, 1), (17, 33), (1728, 1), (3, 1000), (96, 46)]


@functools.cache
def example_shapes() -> list[tuple[int, int]]:
    """(in, out) of every dense layer of every example model (built on the meta device)."""
    shapes: set[tuple[int, int]] = set()
    for path in sorted(EXAMPLES.glob("*.yaml")):
        cfg = load_config(path)
        if cfg.model.factory:
            continue  # its module may not be importable from here; its layers are nn.Linear
        model = build_model(cfg, device="meta")
        for m in model.modules():
            if isinstance(m, nn.Linear):
                shapes.add((m.in_features, m.out_features))
            elif isinstance(m, LowRankCrossNet):
                shapes.update((v.shape[1], v.shape[0]) for v in m.V_kernels)
                shapes.update((w.shape[1], w.shape[0]) for w in m.W_kernels)
    return sorted(shapes)


def _layer(k: int, n: int, seed: int) -> tuple[InvariantLinear, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen)
    x = torch.randn(MAX_ROWS, k, generator=gen)
    return InvariantLinear(weight, bias), x


def _sizes(k: int, n: int) -> list[int]:
    """Every batch size 1 ... MAX_ROWS; past 200,000 weights (the Kaggle-size and DLRM-v2 layers,
    up to half a minute each in full), every size to 64, which crosses every row-tile boundary
    (8 rows) many times, then every 17th and MAX_ROWS: the kernel treats rows alike past that."""
    if k * n <= 200_000:
        return list(range(1, MAX_ROWS + 1))
    return sorted({*range(1, 65), *range(65, MAX_ROWS, 17), MAX_ROWS})


def _scan(layer: InvariantLinear, x: torch.Tensor) -> None:
    """Batch sizes 1 ... MAX_ROWS (`_sizes`), each batch a different slice of the rows, against
    the rows scored one at a time."""
    singles = torch.cat([layer(x[i : i + 1]) for i in range(MAX_ROWS)])
    rows = torch.arange(MAX_ROWS)
    for m in _sizes(x.shape[1], layer.out_features):
        pick = rows.roll(-7 * m)[:m]  # another start for every size, wrapping around
        got = layer(x[pick])
        if not torch.equal(got, singles[pick]):
            diff = (got - singles[pick]).abs().max().item()
            raise AssertionError(f"batch of {m} differs from its rows one by one by {diff:g}")


def test_example_shapes_are_scanned():
    shapes = example_shapes()
    # criteo / criteo_kaggle: the low-rank cross net over the 1728-wide concatenation.
    assert (1728, 512) in shapes and (512, 1728) in shapes
    assert len(shapes) >= 10


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_odd_shapes_batch_invariant_up_to_600(shape):
    _scan(*_layer(*shape, seed=shape[0] * 1000 + shape[1]))


def test_example_shapes_batch_invariant_up_to_600():
    with torch.no_grad():
        for k, n in example_shapes():
            _scan(*_layer(k, n, seed=k * 1000 + n))


@pytest.mark.parametrize("threads", [1, 2])
def test_matches_float64_and_nn_linear(threads):
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for k, n in [(1728, 512), (13, 512), (46, 48)]:
            layer, x = _layer(k, n, seed=3)
            reference = nn.Linear(k, n).double()
            with torch.no_grad():
                w = torch.zeros(-(-n // 16) * 16, k)
                w[:n] = layer.packed.transpose(1, 2).reshape(-1, k)[:n]
                reference.weight.copy_(w[:n].double())
                reference.bias.copy_(layer.bias.double())
                got = layer(x)
                want = reference(x.double())
            # fp32 rounding of K products: well under 1e-5 relative to the outputs' scale.
            assert (got.double() - want).abs().max().item() < 1e-5 * k**0.5 * 4
    finally:
        torch.set_num_threads(prev)


def test_the_op_names_bad_arguments():
    packed = pack_weight(torch.randn(20, 8))
    with pytest.raises(RuntimeError, match="x has 7 columns, the weight 8"):
        torch.ops.rec.linear(torch.randn(3, 7), packed, None, 20)
    with pytest.raises(RuntimeError, match="must be float32"):
        torch.ops.rec.linear(torch.randn(3, 8).double(), packed, None, 20)
    with pytest.raises(RuntimeError, match="40 outputs do not fit 2 panels"):
        torch.ops.rec.linear(torch.randn(3, 8), packed, None, 40)
    with pytest.raises(RuntimeError, match=r"bias must be float32 \[20\]"):
        torch.ops.rec.linear(torch.randn(3, 8), packed, torch.randn(19), 20)
    assert torch.ops.rec.linear(torch.randn(0, 8), packed, None, 20).shape == (0, 20)
    assert rec.ops.linear_isa() in ("avx512", "avx2", "scalar")
