"""rec::linear_int8 (cpp/ops/linear_int8.cpp), the int8 dense layer: the same bits as a
reference written here in plain torch (per-row codes, an exact integer product, the op's
element-wise dequantization), at every batch size and on every kernel path (AVX-512 VNNI,
oneDNN through at::_int_mm, our AVX2 kernel, the scalar fallback: test_kernel_paths.py)."""

from __future__ import annotations

import pytest
import torch

import rec.ops  # noqa: F401  (registers torch.ops.rec)
from rec.export.dense import Int8Linear, tile_order

MAX_ROWS = 600
# K past one 16/64-wide step with tails of every length, and the criteo cross net's 1728.
SHAPES = [(64, 16), (84, 46), (100, 3), (1728, 512), (1000, 97), (17, 33)]


def _layer(k: int, n: int, seed: int) -> tuple[Int8Linear, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    layer = Int8Linear(torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen))
    return layer, torch.randn(MAX_ROWS, k, generator=gen) * 3


def _reference(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """The op's definition, step by step in torch: int64 products, so nothing can overflow."""
    amax = x.abs().amax(1)
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    codes = torch.clamp(torch.round(x / s[:, None]), -127, 127).long()
    acc = codes @ layer.weight.long().t()
    y = acc.int().float() * s[:, None] * layer.w_scale
    return y + layer.bias


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_equals_the_reference_bit_for_bit(shape):
    layer, x = _layer(*shape, seed=sum(shape))
    x[3] = 0.0  # an all-zero row: scale 1
    for m in (1, 2, 5, 16, 17, 64, 513):
        assert torch.equal(layer(x[:m]), _reference(layer, x[:m])), f"batch of {m}"


@pytest.mark.parametrize("shape", [(84, 46), (1728, 512), (17, 33)], ids=str)
def test_batch_invariant_up_to_600(shape):
    """Every batch size 1 ... 600, each a different slice of the rows, against one by one."""
    layer, x = _layer(*shape, seed=7)
    singles = torch.cat([layer(x[i : i + 1]) for i in range(MAX_ROWS)])
    rows = torch.arange(MAX_ROWS)
    for m in range(1, MAX_ROWS + 1):
        pick = rows.roll(-7 * m)[:m]
        assert torch.equal(layer(x[pick]), singles[pick]), f"batch of {m}"


@pytest.mark.parametrize("shape", [(512, 1728), (46, 84), (64, 17)], ids=str)
def test_fused_cross_layer_equals_the_unfused_one(shape):
    """rec::cross_int8 is x0 * linear_int8(h) + residual with the same bits, at batch sizes on
    both sides of the small-batch kernel's limit."""
    layer, h = _layer(*shape, seed=11)
    gen = torch.Generator().manual_seed(12)
    x0, res = (
        torch.randn(MAX_ROWS, shape[1], generator=gen),
        torch.randn(MAX_ROWS, shape[1], generator=gen),
    )
    for m in (1, 7, 16, 17, 64, 600):
        want = x0[:m] * layer(h[:m]) + res[:m]
        assert torch.equal(layer.cross(h[:m], x0[:m], res[:m]), want), f"batch of {m}"


def test_int8_cross_net_scores_as_torchrec_unfused():
    """An int8 LowRankCrossNet is served fused (Int8CrossNet), scripted, with the same bits as the
    unfused CrossNet over the same layers."""
    from torchrec.modules.crossnet import LowRankCrossNet

    from rec.export.dense import CrossNet, Int8CrossNet, cross_net, invariant_linear

    torch.manual_seed(0)
    net = LowRankCrossNet(in_features=96, num_layers=3, low_rank=64)

    def linear(w, b):
        return invariant_linear(w, b, torch.int8)

    fused, unfused = cross_net(net, linear), CrossNet(net, linear)
    assert isinstance(fused, Int8CrossNet)
    x0 = torch.randn(37, 96)
    assert torch.equal(torch.jit.script(fused)(x0), unfused(x0))
    # A low rank under int8's minimum width keeps fp32 W layers: not fused.
    assert type(cross_net(LowRankCrossNet(96, 2, 8), linear)) is CrossNet


def test_tile_order_is_amx_s_operand_layout():
    """w_tiles[nb][kb][r][4c + q] = W[16 nb + c][64 kb + 4 r + q], zeros past N and K: checked
    here on any CPU, since only an AMX CPU reads it (and there the bit-for-bit tests above)."""
    codes = torch.randint(-127, 128, (33, 70), dtype=torch.int8)
    tiles = tile_order(codes)
    assert tiles.shape == (4, 2, 16, 64)
    for nb, kb, r, c, q in [(0, 0, 0, 0, 0), (1, 0, 3, 5, 2), (2, 1, 1, 0, 1), (0, 1, 0, 15, 3)]:
        n, k = 16 * nb + c, 64 * kb + 4 * r + q
        assert tiles[nb, kb, r, 4 * c + q] == codes[n, k], (nb, kb, r, c, q)
    assert not tiles[2, :, :, 4:].any() and not tiles[3].any()  # outputs 33 ... 63
    assert not tiles[:, 1, 2:].any()  # inputs 72 ... 127 (kb 1 from row 2 on)


def test_bad_arguments_are_named():
    layer, _ = _layer(64, 16, seed=1)
    args = (layer.weight, layer.w_scale, layer.w_sum, layer.bias)
    with pytest.raises(RuntimeError, match="x has 63 columns, the weight 64"):
        torch.ops.rec.linear_int8(torch.randn(2, 63), *args)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.rec.linear_int8(torch.randn(2, 64).double(), *args)
    assert torch.ops.rec.linear_int8(torch.randn(0, 64), *args).shape == (0, 16)
    x0 = torch.randn(2, 16)
    with pytest.raises(
        RuntimeError, match=r"rec::cross_int8: x0 and the residual must be float32 \[2, 16\]"
    ):
        torch.ops.rec.cross_int8(torch.randn(2, 64), *args, x0, torch.randn(2, 15))
    with pytest.raises(RuntimeError, match=r"w_tiles must be int8 \[2, 1, 16, 64\]"):
        torch.ops.rec.linear_int8(torch.randn(20, 64), *args, torch.zeros(1, 1, 16, 64).char())
    with pytest.raises(RuntimeError, match="rec::cross_int8: x has 63 columns"):
        torch.ops.rec.cross_int8(torch.randn(2, 63), *args, x0, x0)
