"""The served model's dense layers: batch invariant by construction.

fp32 (the default): `InvariantLinear`, rec's own op `rec::linear` (cpp/ops/linear.cpp). Every
output is one chain of fp32 fused multiply-adds over the layer's inputs, in input order,
started from zero, then the bias added:

    acc = 0;  for k in 0 .. K-1: acc = fma(x[k], W[j, k], acc);  y[j] = acc + b[j]

FMA rounds once, as IEEE 754 defines it, so that chain has one result, whichever batch the row
is in, whichever tile of the batch computes it, however many threads split the outputs, and
whichever of the op's AVX-512, AVX2 or scalar paths runs (tests/export/test_dense_kernel.py
checks all three against each other, and batch sizes 1 ... 600 over the examples' layer shapes
and odd ones). The kernels vectorize across outputs, never across the reduction, so no
horizontal sum (whose order a library would choose) exists. That is why it holds on every
x86-64 CPU, with or without AMX, and not only where it was seen to: a library GEMM (MKL, oneDNN)
picks kernels and blockings by CPU, batch size and shape, and a sample's score then depends on
its batch (MKL: ~7e-7 under 16 rows; oneDNN: the 46x48 layers of tests/export's dcn_v2 model
differed by 1.7e-6 at 37 rows on an AMD EPYC while they matched on a Xeon).

Speed, one thread, AMD EPYC (AVX-512, no AMX), against ONNX Runtime's fp32 Gemm on the same
weights: 1728x512 at M = 1 / 4 / 64 / 512 in 0.92 / 0.89 / 0.98 / 0.98x its time; small layers
(13x512, 512x256) 0.6-0.8x at M <= 64 (no per-call set-up). The weight is packed once into
16-column panels (`pack_weight`): a plain float tensor, saved with the model as it is.

bf16 (`export.dense_dtype: bf16`): oneDNN inner products (`mkldnn::_linear_pointwise`) on bf16
weights reordered once into oneDNN's blocked layout (`PackedLinear`), fp32 accumulation inside
oneDNN, each layer's output back in fp32. About 2x fp32's throughput at B = 512 with AVX-512
BF16, 3x and more with AMX. Its batch invariance is oneDNN's kernel choice, not a
construction: with AVX-512 BF16 alone every row is the same from 4 rows on (batches under
MIN_ROWS are zero-padded), while with AMX oneDNN picks AMX or AVX-512 kernels by batch size and
shape and rows differ (1728x512: M = 8 ... 36 against larger M). There export's batching check
refuses it; `batch_invariant: false` keeps the bf16 layers without the padding, or
`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` in every environment makes it invariant at ~1/11 of AMX's
speed. The packed weight cannot be saved, so `PackedLinear` keeps the plain weight as its state
and repacks in `__setstate__`, which torch.jit.load runs in Python and in LibTorch alike.
"""

from collections.abc import Callable

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear)
from rec.config import ConfigError
from rec.cpu import bf16_inner_product, cpu_info

# No `from __future__ import annotations`: TorchScript resolves these annotations at runtime.

# oneDNN's bf16 inner product gives every row the same result from this many rows on, on
# AVX-512 BF16 without AMX (measured M = 2 ... 700; below it, row 0 of M = 1 differs).
MIN_ROWS = 4
# bf16 layers up to this many weights stay fp32: oneDNN costs ~12 us per call, more than these
# layers' whole product (measured at 13x64 ... 64x32).
SMALL_LAYER = 4096
# rec::linear's panel width (cpp/ops/linear.cpp): one AVX-512 register of fp32.
PANEL = 16
# int8 layers: narrower inputs or outputs stay fp32 (rec::linear). A layer with few inputs has
# little to gain and its per-row quantization costs more than its product (13 x 512: 3.5 us
# against fp32's 2.0 at B = 1); one with few outputs is a last layer (logits) or an MMoE gate,
# where the error would land on the score unaveraged.
INT8_MIN_IN = 64
INT8_MIN_OUT = 16
DENSE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


class PackedLinear(nn.Module):
    """nn.Linear on a oneDNN-packed weight (bf16); scriptable, saved as plain tensors.

    Batch invariant for inputs of MIN_ROWS rows or more on CPUs without AMX: ServedModule pads
    smaller batches.

    Args:
        weight: [out, in] float weight. bias: [out] or None.
        dtype: torch.float32 or torch.bfloat16: what the product is computed in.
    """

    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = weight.detach().to(dtype).contiguous()
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)

    @torch.jit.export
    def __getstate__(self):
        return (self.weight, self.bias, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, torch.Tensor | None, bool]) -> None:
        self.weight, self.bias, self.training = state
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The op's `Scalar?[]` argument: an empty list, typed so that TorchScript matches it.
        no_scalars: list[int | float | complex | None] = []
        if self.weight.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed, self.bias, "none", no_scalars, ""
            )
        out = torch.ops.mkldnn._linear_pointwise(
            x.to(self.weight.dtype), self.packed, self.bias, "none", no_scalars, ""
        )
        return out.float()


class InvariantLinear(nn.Module):
    """nn.Linear as rec::linear: batch invariant at every batch size, on every CPU (module doc).

    Args:
        weight: [out, in] float weight, packed here into 16-column panels. bias: [out] or None.
    """

    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features = int(weight.shape[0])
        self.register_buffer("packed", pack_weight(weight))
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rec.linear(x, self.packed, self.bias, self.out_features)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> rec::linear's layout [ceil(out / 16), in, 16]: panels of 16 output columns,
    input-major (packed[p, k, c] = weight[16 p + c, k]; zero past `out`)."""
    out, k = weight.shape
    panels = -(-out // PANEL)
    padded = weight.detach().float().new_zeros(panels * PANEL, k)
    padded[:out] = weight.detach().float()
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


class Int8Linear(nn.Module):
    """nn.Linear as rec::linear_int8 (cpp/ops/linear_int8.cpp): weights int8 per output channel,
    activations quantized per row (one scale per sample), int32 accumulation. Batch invariant by
    construction: a row's codes read only that row, and integer sums are exact in any order.

    Args:
        weight: [out, in] float weight, quantized here: w_scale[j] = max |W[j]| / 127 (1 for a
            zero row), codes round(W / w_scale) in [-127, 127]. bias: [out] or None (fp32).
    """

    bias: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        amax = w.abs().amax(1)
        scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        codes = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
        self.register_buffer("weight", codes.contiguous())
        self.register_buffer("w_scale", scale.contiguous())
        # The VNNI kernel feeds codes + 128 (unsigned): it takes 128 * sum_k W[j][k] off again.
        self.register_buffer("w_sum", codes.int().sum(1).int().contiguous())
        # The same codes in AMX's tile order, read as they are by the op's AMX kernel (on other
        # CPUs unused): stored rather than reordered per call, as at::_int_mm does.
        self.register_buffer("w_tiles", tile_order(codes))
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rec.linear_int8(
            x, self.weight, self.w_scale, self.w_sum, self.bias, self.w_tiles
        )

    def cross(self, h: torch.Tensor, x0: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x0 * self(h) + residual, bit for bit, in one pass over the output (rec::cross_int8)."""
        return torch.ops.rec.cross_int8(
            h, self.weight, self.w_scale, self.w_sum, self.bias, x0, residual, self.w_tiles
        )


def tile_order(codes: torch.Tensor) -> torch.Tensor:
    """int8 weight codes [N, K] in AMX-INT8's tile order for rec::linear_int8: [N/16 rounded up
    to even, K/64 rounded up, 16, 64], tile [nb][kb] holding W[16 nb + c][64 kb + 4 r + q] at
    row r, byte 4 c + q (tdpbssd's right operand: 16 outputs x 64 inputs, 4 consecutive inputs
    of one output per 32-bit lane); zeros past N and K."""
    n, k = codes.shape
    rows, cols = -(-n // 32) * 32, -(-k // 64) * 64
    padded = codes.new_zeros(rows, cols)
    padded[:n, :k] = codes
    tiles = padded.view(rows // 16, 16, cols // 64, 16, 4).permute(0, 2, 3, 1, 4)
    return tiles.reshape(rows // 16, cols // 64, 16, 64).contiguous()


def invariant_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> nn.Module:
    """The batch-invariant form of a layer computing in `dtype`: rec::linear for fp32 and for
    layers too small to gain from a narrower type; rec::linear_int8 for int8 (at least
    INT8_MIN_IN inputs and INT8_MIN_OUT outputs); oneDNN's bf16 inner product above
    SMALL_LAYER weights for bf16."""
    out, k = weight.shape
    if dtype == torch.int8 and k >= INT8_MIN_IN and out >= INT8_MIN_OUT:
        return Int8Linear(weight, bias)
    if dtype != torch.bfloat16 or weight.numel() <= SMALL_LAYER:
        return InvariantLinear(weight, bias)
    require_bf16_cpu()
    return PackedLinear(weight, bias, dtype)


def require_bf16_cpu() -> None:
    """Refuses bf16 layers on a CPU whose oneDNN has no bf16 inner product: it needs AVX-512
    (BW, VL, DQ) or AVX-NE-CONVERT (an AVX2-only AMD EPYC has neither; oneDNN's own error
    there was "mkldnn_reorder_linear_weight: bf16 path needs the cpu support ...")."""
    if bf16_inner_product():
        return
    info = cpu_info()
    raise ConfigError(
        "export.dense_dtype: bf16 runs oneDNN's bf16 inner product, which needs a CPU with "
        f"AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; this one, {info['model']} (kernel flags: "
        f"{', '.join(info['flags']) or 'none'}), has neither. Use export.dense_dtype: int8 "
        "(batch invariant on every CPU, and faster) or fp32"
    )


class CrossNet(nn.Module):
    """TorchRec's LowRankCrossNet (DLRM-DCN) over given layers; TorchScript-able as it is.

    x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l, with b_l as W_l's bias."""

    def __init__(self, net: LowRankCrossNet, linear: Callable[..., nn.Module]) -> None:
        super().__init__()
        self.v = nn.ModuleList([linear(v, None) for v in net.V_kernels])
        self.w = nn.ModuleList([linear(w, b) for w, b in zip(net.W_kernels, net.bias, strict=True)])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v, w in zip(self.v, self.w):  # noqa: B905 (TorchScript has no strict=)
            x = x0 * w(v(x)) + x
        return x


class Int8CrossNet(CrossNet):
    """CrossNet whose W layers are all Int8Linear: each layer's x0 * W(..) + x_l is fused into
    W's epilogue (rec::cross_int8), the same bits as CrossNet's three passes over the [B, width]
    output in one. At Kaggle size and B = 512 those passes were ~6 ms of int8's ~23 ms."""

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v, w in zip(self.v, self.w):  # noqa: B905 (TorchScript has no strict=)
            x = w.cross(v(x), x0, x)
        return x


def cross_net(net: LowRankCrossNet, linear: Callable[..., nn.Module]) -> CrossNet:
    """The served form of `net` with layers made by `linear`: fused when every W is int8."""
    served = CrossNet(net, linear)
    if all(isinstance(w, Int8Linear) for w in served.w):
        return Int8CrossNet(net, linear)  # the same layers again (quantizing them is cheap)
    return served


def padding_rows(module: nn.Module) -> int:
    """Rows a batch must have for `module`'s layers to be batch invariant: MIN_ROWS when it
    has oneDNN (bf16) layers, else 1 (rec::linear needs no padding)."""
    return MIN_ROWS if any(isinstance(m, PackedLinear) for m in module.modules()) else 1


def _plain_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def swap_dense(module: nn.Module, batch_invariant: bool, dtype: str = "fp32") -> nn.Module:
    """Swaps every nn.Linear and LowRankCrossNet below `module`, in place, and returns it.

    batch_invariant: rec::linear layers (fp32), or for `dtype` int8 rec::linear_int8 layers,
    or for bf16 oneDNN layers above SMALL_LAYER (invariant_linear). Otherwise plain fp32
    nn.Linear (MKL sgemm), except that int8 is the same as with batch_invariant (it is
    invariant whatever runs it), bf16 keeps its oneDNN layers (without the padding), and only
    the cross net is swapped (TorchRec's does not script)."""
    torch_dtype = DENSE_DTYPES[dtype]
    reduced = torch_dtype != torch.float32

    def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        if batch_invariant or torch_dtype == torch.int8:
            return invariant_linear(weight, bias, torch_dtype)
        if weight.numel() > SMALL_LAYER:  # oneDNN: bf16, or the cross net's layers in fp32
            if torch_dtype == torch.bfloat16:
                require_bf16_cpu()
            return PackedLinear(weight, bias, torch_dtype)
        return _plain_linear(weight, bias)

    def swap(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (batch_invariant or reduced):
                setattr(parent, name, linear(child.weight, child.bias))
            elif isinstance(child, LowRankCrossNet):
                setattr(parent, name, cross_net(child, linear))
            else:
                swap(child)

    swap(module)
    return module
