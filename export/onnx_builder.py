"""ONNX format: the served module (rec.export.served) with its lookup written in standard ops.

ONNX Runtime has no FBGEMM TBE, so the sparse part is stored in plain tensors, filled from the
streamed checkpoint rows with the same rowwise quantization FBGEMM uses
(`FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`):
int8/int4 codes stored as uint8 (int4 two codes per byte, low nibble first) with an fp16
scale and bias per row, fp16 tables as fp16, fp32 as fp32. In the graph: gather rows,
dequantize (`code * scale + bias`), sum (or average) each bag with index_add. The head is the
float model's own dense, interaction and over arches, plain fp32 (ONNX Runtime is not batch
invariant whatever the layers are).

A ZCH table's ids (rec.export.id_maps) are looked up in its map in the same plain ops (gather,
equal, argmax, where, remainder, div), every id of the request at once (IdMap.masked).

Bags are found without repeat_interleave (its output size is data-dependent): `ends` =
cumsum of the lengths; counting, for every value position j, how many bags end at or before j
gives j's bag. That is one index_add into a histogram and one cumsum, both plain ONNX ops, and
it keeps the batch size B and the id count N dynamic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from rec.config import RecConfig
from rec.contract import DENSE, INPUT_NAMES, LENGTHS, OUTPUT_NAME, VALUES
from rec.export.id_maps import IdMaps
from rec.export.served import ServedModule, flat_lookup, make_head
from rec.features import DenseTransform, feature_spec
from rec.model import table_rows
from rec.quantize import BITS, quantize_rows


class _TableGroup(nn.Module):
    """Tables of one stored dtype, concatenated row-wise; dequantizes gathered rows.

    Allocated empty for `total_rows` and filled by OnnxSink as the tables stream past."""

    def __init__(self, dtype: str, total_rows: int, dim: int) -> None:
        super().__init__()
        self.dtype = dtype
        self.dim = dim
        if dtype in BITS:
            row_bytes = dim * BITS[dtype] // 8
            self.register_buffer("codes", torch.empty(total_rows, row_bytes, dtype=torch.uint8))
            self.register_buffer("scale_bias", torch.empty(total_rows, 2, dtype=torch.float16))
        else:
            weight_dtype = torch.float16 if dtype == "fp16" else torch.float32
            self.register_buffer("weight", torch.empty(total_rows, dim, dtype=weight_dtype))

    def write(self, start: int, rows: torch.Tensor) -> None:
        """Quantizes fp32 `rows` into rows [start, start + n) of the group."""
        codes, scale_bias = quantize_rows(rows, self.dtype)
        stop = start + rows.shape[0]
        if scale_bias is None:
            self.weight[start:stop] = codes.view(self.weight.dtype)
        else:
            self.codes[start:stop] = codes
            self.scale_bias[start:stop] = scale_bias.contiguous().view(torch.float16)

    def bytes_of(self, rows: int) -> int:
        """Bytes that `rows` rows take in this group's storage."""
        return sum(rows * b[0].numel() * b.element_size() for b in self.buffers())

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        if self.dtype in ("fp32", "fp16"):
            return self.weight[rows].float()
        codes = self.codes[rows].float()
        if self.dtype == "int4":
            high = torch.floor(codes / 16.0)
            low = codes - 16.0 * high
            codes = torch.stack([low, high], dim=2).reshape(-1, self.dim)
        scale_bias = self.scale_bias[rows].float()
        return codes * scale_bias[:, 0:1] + scale_bias[:, 1:2]


class GatherLookup(nn.Module):
    """Pooled embeddings of batch-major jagged ids in plain ONNX ops, [B, F, D] for the DLRMs
    or side by side, [B, sum of the features' dims], for dcn_v2 and mmoe (`flat_lookup`); the ONNX
    format's lookup in the served module (rec.export.served.ServedModule).

    Args:
        cfg: the run's config. table_dtypes: stored dtype of every table.
        feature_order: feature names in the order the head wants them (the model's SparseArch
            order). Storage is allocated here and filled by OnnxSink as the tables stream past.

    Tables of one stored dtype and dim share one group (one gather); bags are summed per dim.
    """

    def __init__(self, cfg: RecConfig, table_dtypes: dict[str, str], feature_order: list[str]):
        super().__init__()
        feats = list(cfg.features.sparse)
        owner = cfg.feature_to_table()
        tables = {t.name: t for t in cfg.tables}
        kinds = sorted({(table_dtypes[t.name], t.dim) for t in cfg.tables})
        self.num_features = len(feats)
        self.flat = flat_lookup(cfg)
        self.dims = sorted({t.dim for t in cfg.tables})
        self.groups = nn.ModuleList()
        self.table_bytes: dict[str, int] = {}
        self.placement: dict[str, tuple[int, int]] = {}  # table -> (group, first row)
        group_of, offset_of = [0] * len(feats), [0] * len(feats)
        for g, (dtype, dim) in enumerate(kinds):
            names = [t.name for t in cfg.tables if (table_dtypes[t.name], t.dim) == (dtype, dim)]
            total = 0
            for name in names:
                self.placement[name] = (g, total)
                total += tables[name].rows
            for f, feat in enumerate(feats):
                if owner[feat] in names:
                    group_of[f], offset_of[f] = g, self.placement[owner[feat]][1]
            group = _TableGroup(dtype, total, dim)
            for name in names:
                self.table_bytes[name] = group.bytes_of(tables[name].rows)
            self.groups.append(group)
        self.group_dim = [self.dims.index(dim) for _, dim in kinds]  # each group's sum
        mean = [tables[owner[f]].pooling == "mean" for f in feats]
        self.register_buffer("rows", table_rows(cfg))
        self.id_maps = IdMaps(cfg, feats)  # ZCH tables' maps, by request column
        self.register_buffer("row_offset", torch.tensor(offset_of, dtype=torch.int64))
        self.register_buffer("group_of", torch.tensor(group_of, dtype=torch.int64))
        self.register_buffer("is_mean", torch.tensor(mean, dtype=torch.bool))
        order = [feats.index(f) for f in feature_order]
        self.register_buffer("order", torch.tensor(order, dtype=torch.int64))
        # flat: feature k of the head's order is column block (its dim's sum, its request index)
        self.flat_plan = [(self.dims.index(tables[owner[feats[k]]].dim), k) for k in order]

    def forward(self, lengths: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        batch = lengths.shape[0]
        flat = lengths.reshape(-1).to(torch.int64)  # bag k = b * F + f
        n = values.shape[0]
        ends = torch.cumsum(flat, 0)
        hist = torch.zeros(n + 1, dtype=torch.int64).index_add(0, ends, torch.ones_like(ends))
        bag = torch.cumsum(hist, 0)[:n]
        feat = torch.remainder(bag, self.num_features)
        local = self.id_maps.masked(values, feat, torch.remainder(values, self.rows[feat]))
        rows = local + self.row_offset[feat]
        group = self.group_of[feat]
        sums = [torch.zeros(flat.shape[0], dim) for dim in self.dims]
        for g, table_group in enumerate(self.groups):
            if len(self.groups) == 1:
                emb = table_group(rows)
            else:  # other groups' ids read row 0 and are zeroed: shapes stay static
                mine = group == g
                emb = table_group(torch.where(mine, rows, 0)) * mine.unsqueeze(1).float()
            d = self.group_dim[g]
            sums[d] = sums[d].index_add(0, bag, emb)
        count = torch.clamp(flat, min=1).float().unsqueeze(1)
        mean = self.is_mean.repeat(batch).unsqueeze(1)
        sums = [torch.where(mean, s / count, s) for s in sums]
        per_dim = [s.reshape(batch, self.num_features, d) for s, d in zip(sums, self.dims)]  # noqa: B905
        if not self.flat:
            return per_dim[0][:, self.order, :]
        return torch.cat([per_dim[d][:, k, :] for d, k in self.flat_plan], 1)


def onnx_module(model: nn.Module, cfg: RecConfig, table_dtypes: dict[str, str]) -> ServedModule:
    """The served module over plain-op tables (allocated, to be filled by OnnxSink) and
    `model`'s own dense modules (shared, not copied; its tables are not read): exportable to
    ONNX with dynamic B and N. Dense layers stay plain fp32 for ONNX Runtime."""
    order = list(model.sparse_arch.sparse_feature_names)
    lookup = GatherLookup(cfg, table_dtypes, order)
    transform = DenseTransform(feature_spec(cfg).transforms)
    return ServedModule(transform, lookup, make_head(model, cfg), batch_invariant=False).eval()


class OnnxSink:
    """Writes streamed fp32 rows, quantized, into a GatherLookup (stream.TableSink)."""

    def __init__(self, lookup: GatherLookup) -> None:
        self.lookup = lookup

    def write(self, table: str, start: int, rows: torch.Tensor) -> None:
        group, first = self.lookup.placement[table]
        self.lookup.groups[group].write(first + start, rows)


# Models whose tables take more than this keep them in `model.onnx.data` beside the graph. The
# ONNX exporter switches on its own only past protobuf's 2 GB limit, and below it serializes the
# tables inline, which held 5.5x the model in memory at half Criteo Kaggle (benchmarks/scale.py).
EXTERNAL_DATA_BYTES = 64 << 20


def export_onnx(module: ServedModule, sample: tuple[torch.Tensor, ...], path: Path) -> None:
    """Writes `module` to `path` with dynamic batch size and id count (dynamo exporter); when its
    tables take over EXTERNAL_DATA_BYTES, they go to `<path>.data` (ONNX external data)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    ids = torch.export.Dim("ids", min=0, max=1 << 30)
    dynamic_shapes = {
        DENSE: {0: batch},
        LENGTHS: {0: batch},
        VALUES: {0: ids},
    }
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            sample,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            optimize=True,
            verbose=False,
        )
    stored = sum(b.numel() * b.element_size() for b in module.buffers())
    program.save(str(path), external_data=stored > EXTERNAL_DATA_BYTES)


def onnx_session(path: Path, threads: int = 1):
    """An ONNX Runtime CPU session of `path`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session, dense: torch.Tensor, lengths: torch.Tensor, values: torch.Tensor):
    """Scores [B, T] from an ONNX Runtime session, as a torch tensor."""
    feeds = {
        DENSE: dense.numpy().astype(np.float32, copy=False),
        LENGTHS: lengths.numpy().astype(np.int32, copy=False),
        VALUES: values.numpy().astype(np.int64, copy=False),
    }
    return torch.from_numpy(session.run([OUTPUT_NAME], feeds)[0])
