"""The served module: DESIGN.md's I/O table around the DLRM, in plain TorchScript-able torch.

    dense_features f32 [B, num_dense], sparse_lengths i32 [B, F], sparse_values i64 [N]
        -> scores f32 [B, T] (sigmoid)

Inside: batch-major ids to TorchRec's feature-major KeyedJaggedTensor, every raw id mapped into
its table (non-negative modulo, so no request reads outside a table), the DLRM, a sigmoid.

Dense layers are swapped for batch-invariant ones (`make_batch_invariant`): CPU GEMM picks
other kernels for small M (measured: B < 16 differs from the batched result by ~7e-7), so
without the swap a sample's score would depend on which batch the server put it in. One bmm
per layer gives every sample the same kernel, so batched == unbatched bit for bit.
"""

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.batch import feature_major, map_ids

# No `from __future__ import annotations` here: FX copies forward() annotations into the
# generated code, and string annotations there are names TorchScript cannot resolve.

# Floats per unrolled step of ATen's vectorized CPU loops (2 x AVX-512), with room to spare.
_VECTOR_STEP = 64
INPUT_NAMES = ("dense_features", "sparse_lengths", "sparse_values")
OUTPUT_NAME = "scores"


class ServingModule(nn.Module):
    """Wraps a DLRM (float or with quantized embeddings) into the served I/O.

    Args:
        model: DLRM or DLRM_DCN taking (dense [B, D], KeyedJaggedTensor) and returning logits.
        feature_names: sparse feature names in `sparse_lengths` column order.
        rows: [F] int64 row count of each feature's table, same order.

    Example:
        >>> from rec.config import default_config
        >>> from rec.model import build_model, table_rows
        >>> cfg = default_config()
        >>> m = ServingModule(build_model(cfg), cfg.features.sparse, table_rows(cfg))
        >>> m(torch.zeros(2, 13), torch.ones(2, 8, dtype=torch.int32), torch.arange(16)).shape
        torch.Size([2, 1])
    """

    def __init__(self, model: nn.Module, feature_names: list[str], rows: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.feature_names: list[str] = list(feature_names)
        self.register_buffer("rows", rows.to(torch.int64).clone())
        self.batch_invariant = False  # set by make_batch_invariant

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        lengths_fm, values_fm = feature_major(sparse_lengths, sparse_values)
        ids = map_ids(lengths_fm, values_fm, self.rows)
        features = KeyedJaggedTensor(
            keys=self.feature_names, values=ids, lengths=lengths_fm.to(torch.int32)
        )
        return self._sigmoid(self.model(dense_features, features))

    def _sigmoid(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.batch_invariant:
            return torch.sigmoid(logits)
        # ATen's vectorized sigmoid and its scalar tail loop differ in the last bit, and which
        # one a score gets depends on its position in the batch. Padded to a multiple of the
        # widest unrolled vector step, every element takes the vectorized path.
        flat = logits.reshape(-1)
        n = flat.shape[0]
        padded = torch.cat([flat, flat.new_zeros((_VECTOR_STEP - n % _VECTOR_STEP) % _VECTOR_STEP)])
        return torch.sigmoid(padded)[:n].reshape(logits.shape)


def _per_sample_linear(
    x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [B, I] @ weight_t [I, O] (+ bias [O]) as B independent 1 x I x O products."""
    w = weight_t.unsqueeze(0).expand(x.shape[0], weight_t.shape[0], weight_t.shape[1])
    out = torch.bmm(x.unsqueeze(1), w).squeeze(1)
    if bias is not None:
        out = out + bias
    return out


class BatchInvariantLinear(nn.Module):
    """nn.Linear whose result for a sample does not depend on the rest of the batch."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _per_sample_linear(x, self.weight_t, self.bias)


class BatchInvariantCrossNet(nn.Module):
    """TorchRec's LowRankCrossNet (DLRM-DCN) with per-sample products; same parameters."""

    def __init__(self, net: LowRankCrossNet) -> None:
        super().__init__()
        self.num_layers: int = net._num_layers
        self.v_t = nn.ParameterList(
            [nn.Parameter(v.detach().t().contiguous(), False) for v in net.V_kernels]
        )
        self.w_t = nn.ParameterList(
            [nn.Parameter(w.detach().t().contiguous(), False) for w in net.W_kernels]
        )
        self.bias = nn.ParameterList([nn.Parameter(b.detach().clone(), False) for b in net.bias])

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v_t, w_t, b in zip(self.v_t, self.w_t, self.bias, strict=True):
            xw = _per_sample_linear(_per_sample_linear(x, v_t, None), w_t, None)
            x = x0 * (xw + b) + x
        return x


def make_batch_invariant(module: nn.Module) -> nn.Module:
    """Swaps every nn.Linear and LowRankCrossNet below `module` in place, and makes a
    ServingModule's sigmoid batch-invariant; returns `module`."""
    if isinstance(module, ServingModule):
        module.batch_invariant = True
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, BatchInvariantLinear(child))
        elif isinstance(child, LowRankCrossNet):
            setattr(module, name, BatchInvariantCrossNet(child))
        else:
            make_batch_invariant(child)
    return module


def sample_batch(
    num_dense: int, num_sparse: int, batch_size: int = 8, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A request in the I/O table's layout: empty bags, multi-id bags, negative and huge ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (batch_size, num_sparse), dtype=torch.int32, generator=g)
    n = int(lengths.sum())
    values = torch.randint(-(2**62), 2**62, (n,), dtype=torch.int64, generator=g)
    return torch.randn(batch_size, num_dense, generator=g), lengths, values


def split_requests(
    dense: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The batch as single-sample requests (the inverse of concatenating them)."""
    per_sample = lengths.to(torch.int64).sum(1).tolist()
    starts = [0]
    for n in per_sample:
        starts.append(starts[-1] + n)
    return [
        (dense[b : b + 1], lengths[b : b + 1], values[starts[b] : starts[b + 1]])
        for b in range(dense.shape[0])
    ]
