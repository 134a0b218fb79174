"""Rows as the exported model stores them: FBGEMM's rowwise quantization, in one place.

Export (every format) and training's update publisher both call this, so a row published
at step N is bit for bit the row a full export of step N writes.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

from rec.contract import EMBEDDING_DTYPES

BITS = {name: d.bits for name, d in EMBEDDING_DTYPES.items() if d.rowwise}
"""Bits per value of the rowwise-quantized dtypes."""


def quantize_rows(rows: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FBGEMM's storage of rows: (codes uint8 [n, bytes], scale_bias uint8 [n, 4]) for int8/int4
    (rowwise, fp16 scale and bias), (the values as uint8 bytes, None) for fp16/fp32. Exactly what
    TorchRec's `quantize_state_dict` computes for a whole table."""
    rows = rows.float().contiguous()
    if dtype == "fp32":
        return rows.view(torch.uint8), None
    if dtype == "fp16":
        return rows.half().view(torch.uint8), None
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(rows, BITS[dtype])
    return fused[:, :-4], fused[:, -4:]


def fused_rows(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """`quantize_rows` as one uint8 [n, row_bytes] block: each row's codes, then (for int8/int4)
    its fp16 scale and bias. The row layout of the update log (rec.contract.updates)."""
    codes, scale_bias = quantize_rows(rows, dtype)
    if scale_bias is None:
        return codes.contiguous()
    return torch.cat([codes, scale_bias], dim=1).contiguous()
