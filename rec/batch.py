"""The batch every data source yields, in the served model's own layout
(docs/architecture.md#model-io).

Batch-major jagged ids: `lengths[b, f]` ids of sparse feature f for sample b, and `values`
holding them sample by sample, feature by feature within a sample. Two batches concatenated
(dense, lengths and labels along dim 0, values end to end) are a valid batch, which is what
lets servers batch requests by concatenation. TorchRec wants the feature-major
KeyedJaggedTensor instead; `to_kjt` converts, and is TorchScript-able so the exported model
can do the same inside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

Remap = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(lengths_fm [F * B], raw ids [N], their rows by modulo [N]) -> rows [N]."""

PAD_LABEL = -1.0
"""The label of rows that only fill a batch up (RecBatch.padded); never a real 0/1 label."""


@dataclass
class RecBatch:
    """B samples: dense [B, D] f32, lengths [B, F] i32, values [N] i64, labels [B, T] f32."""

    dense: torch.Tensor
    lengths: torch.Tensor
    values: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    @staticmethod
    def concat(batches: list[RecBatch]) -> RecBatch:
        return RecBatch(
            dense=torch.cat([b.dense for b in batches]),
            lengths=torch.cat([b.lengths for b in batches]),
            values=torch.cat([b.values for b in batches]),
            labels=torch.cat([b.labels for b in batches]),
        )

    def padded(self, size: int) -> RecBatch:
        """This batch with rows appended up to `size`: zero dense values, empty bags and label
        PAD_LABEL, which evaluation leaves out of its metrics."""
        pad = size - len(self)
        if pad <= 0:
            return self
        return RecBatch.concat([self, RecBatch(
            dense=self.dense.new_zeros(pad, self.dense.shape[1]),
            lengths=self.lengths.new_zeros(pad, self.lengths.shape[1]),
            values=self.values.new_zeros(0),
            labels=self.labels.new_full((pad, self.labels.shape[1]), PAD_LABEL),
        )])  # fmt: skip

    def to_torchrec(self, keys: list[str], rows: torch.Tensor, remap: Remap | None = None) -> Batch:
        """TorchRec's Batch (what the train pipelines move and feed the model).

        Ids are mapped into their tables (`rows` per feature) exactly as the exported model does:
        by modulo, then `remap` (rec.train.zch) replaces the rows of collision-free tables.
        """
        lengths_fm, raw_fm = feature_major(self.lengths, self.values)
        values_fm = map_ids(lengths_fm, raw_fm, rows)
        if remap is not None:
            values_fm = remap(lengths_fm, raw_fm, values_fm)
        kjt = KeyedJaggedTensor(keys=keys, values=values_fm, lengths=lengths_fm.to(torch.int32))
        return Batch(dense_features=self.dense, sparse_features=kjt, labels=self.labels)


def feature_major(lengths: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorders batch-major jagged ids into feature-major order, O(N), no sort.

    Args:
        lengths: [B, F] ids per sample per feature.
        values: [N] ids, sample-major.
    Returns:
        (lengths [F * B], values [N]) with feature f's bags for samples 0..B-1 at f * B + b.
    """
    lengths = lengths.to(torch.int64)
    num_samples, num_features = lengths.shape[0], lengths.shape[1]
    flat = lengths.reshape(-1)
    starts_bm = torch.cumsum(flat, 0) - flat  # where each (b, f) bag starts in `values`
    order = torch.arange(num_samples * num_features, device=lengths.device)
    order = order.reshape(num_samples, num_features).t().reshape(-1)
    lengths_fm = flat[order]
    starts_fm = torch.cumsum(lengths_fm, 0) - lengths_fm
    # Each output slot j belongs to bag k; it reads values[starts_bm[k] + (j - starts_fm[k])].
    src = torch.repeat_interleave(starts_bm[order] - starts_fm, lengths_fm)
    src = src + torch.arange(src.numel(), device=lengths.device)
    return lengths_fm, values[src]


def to_kjt(lengths: torch.Tensor, values: torch.Tensor, keys: list[str]) -> KeyedJaggedTensor:
    """Batch-major (lengths [B, F], values) to a feature-major KeyedJaggedTensor."""
    lengths_fm, values_fm = feature_major(lengths, values)
    return KeyedJaggedTensor(keys=keys, values=values_fm, lengths=lengths_fm.to(torch.int32))


def map_ids(lengths_fm: torch.Tensor, values_fm: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Maps raw ids into their tables with a non-negative modulo, so no id reads outside.

    Args:
        lengths_fm: [F * B] feature-major bag lengths.
        values_fm: [N] feature-major raw ids (any int64, negative too).
        rows: [F] int64 row count of each feature's table.
    """
    num_features = rows.numel()
    per_bag = rows.repeat_interleave(lengths_fm.numel() // max(num_features, 1))
    return torch.remainder(values_fm, torch.repeat_interleave(per_bag, lengths_fm))


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
