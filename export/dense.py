"""The served model's dense layers: oneDNN inner products on weights packed at load time.

Why oneDNN, and why packed. CPU GEMM (MKL's sgemm behind nn.Linear) picks other kernels and
blockings for other batch sizes, so a sample's score would depend on which batch a server put
it in (measured: up to ~7e-7 for batches under 16). Measured on an AMD EPYC and an Intel Xeon
(Criteo Kaggle's DCN cross and top layers, one thread, B = 1 / 64 / 512), oneDNN's inner product
(`mkldnn::_linear_pointwise`) on a weight reordered once into its blocked layout
(`mkldnn::_reorder_linear_weight`) gives every row of a batch of 4 or more rows the same
result, bit for bit, at 0.76 / 0.82 / 0.86x plain nn.Linear's time on the EPYC and 1.28 / 0.89 /
1.07x on the Xeon (where MKL's M = 1 GEMV reads the weights faster). Batches of 1 to 3 rows are
zero-padded to 4. Given a plain weight instead, oneDNN reorders it on every call (1.5x plain at
B = 1); per-sample bmm, the previous way to invariance, cost 3.5x at B = 512.

The packed weight is an opaque oneDNN tensor that cannot be saved, so `PackedLinear` keeps the
plain weight as its state (`__getstate__`) and packs it in `__setstate__`, which
torch.jit.load runs (in Python and in LibTorch) before the model answers anything: the same
way torch's quantized Linear keeps its prepacked weights.

bf16 (`export.dense_dtype: bf16`): the same layers with bf16 weights and activations (fp32
accumulation inside oneDNN); about 2x fp32's throughput at B = 512 with AVX-512 BF16, 3x and
more with AMX. Each layer's output is returned as fp32, so the element-wise parts of the model
(ReLU, the cross layers' products, the sigmoid) stay fp32. With AVX-512 BF16 alone (measured on
an AMD EPYC) every row is the same from 4 rows on, as in fp32. On a CPU with AMX (measured on
a Xeon with amx_bf16) oneDNN picks AMX or AVX-512 kernels by batch size and shape, and rows
differ between batch sizes (1728x512: M = 8 ... 36 against larger M): there bf16 is not batch
invariant, export's batching check refuses it, and the choices are `batch_invariant: false`
(bf16 layers without the padding, AMX at every size, scores that depend on the batch at bf16's
precision) or oneDNN held to AVX-512 (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` in the export's and
every server's environment: invariant again, ~11x slower than AMX at B = 512).
"""

from collections.abc import Callable

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet

# No `from __future__ import annotations`: TorchScript resolves these annotations at runtime.

# oneDNN gives every row the same result from this many rows on (measured M = 2 ... 700 on
# AVX-512, one and two threads, with the padding below; below it, row 0 of M = 1 differs).
MIN_ROWS = 4
# Layers up to this many weights use per-sample products (measured at 13x64 ... 64x32: 3-6 us
# per call at B = 1 against oneDNN's 15 us; at 13x512 oneDNN is 1.4x faster from B = 64 on).
SMALL_LAYER = 4096
DENSE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class PackedLinear(nn.Module):
    """nn.Linear on a oneDNN-packed weight; scriptable, saved as plain tensors.

    Batch invariant for inputs of MIN_ROWS rows or more: ServedModule pads smaller batches.

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


class PerSampleLinear(nn.Module):
    """nn.Linear as B independent 1 x in x out products (one baddbmm): batch invariant at any
    B, for layers too small to pay oneDNN's fixed ~12 us per call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight_t = weight.detach().t().contiguous().unsqueeze(0)  # [1, in, out]
        out = weight.shape[0]
        b = torch.zeros(out) if bias is None else bias.detach()
        self.bias = b.reshape(1, 1, out).clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_t.expand(x.shape[0], -1, -1)
        return torch.baddbmm(self.bias, x.unsqueeze(1), w).squeeze(1)


def invariant_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> nn.Module:
    """The faster batch-invariant form of a layer: per-sample products below
    SMALL_LAYER multiply-adds per row (where oneDNN's per-call cost dominates), oneDNN above."""
    if weight.numel() <= SMALL_LAYER:
        return PerSampleLinear(weight, bias)
    return PackedLinear(weight, bias, dtype)


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


def _plain_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def swap_dense(module: nn.Module, batch_invariant: bool, dtype: str = "fp32") -> nn.Module:
    """Swaps every nn.Linear and LowRankCrossNet below `module`, in place, and returns it.

    batch_invariant: oneDNN layers computing in `dtype` (fp32 or bf16), or per-sample products
    for small layers. Otherwise plain fp32 nn.Linear (MKL sgemm), except that bf16 keeps its
    oneDNN layers (without the padding), and only the cross net swapped (TorchRec's does not
    script)."""
    torch_dtype = DENSE_DTYPES[dtype]
    reduced = torch_dtype != torch.float32

    def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        if batch_invariant:
            return invariant_linear(weight, bias, torch_dtype)
        if reduced and weight.numel() > SMALL_LAYER:
            return PackedLinear(weight, bias, torch_dtype)
        return _plain_linear(weight, bias)

    def swap(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (batch_invariant or reduced):
                setattr(parent, name, linear(child.weight, child.bias))
            elif isinstance(child, LowRankCrossNet):
                setattr(parent, name, CrossNet(child, linear))
            else:
                swap(child)

    swap(module)
    return module
