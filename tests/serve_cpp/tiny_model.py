"""A tiny model repository in the layout `rec export` writes
(docs/architecture.md#model-repository).

The one place these tests get a model from, so they can switch to the real export: a scripted
module with the served I/O whose embeddings are FBGEMM int8 TBE lookups (a server that forgot to
register the FBGEMM ops cannot load it), plus config.pbtxt and rec.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.* for loading and running in-process)
import numpy as np
import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
    IntNBitTableBatchedEmbeddingBagsCodegen,
)

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear)
from rec.batch import feature_major
from rec.contract import (
    DTYPES,
    INPUT_NAMES,
    ModelDir,
    io_manifest,
    random_request,
)
from rec.export.dense import InvariantLinear

DENSE = ("age", "price", "hour", "score")
SPARSE = ("user", "item", "tags")
ROWS = (101, 67, 23)
DIM = 8
NUM_TASKS = 2
MAX_BATCH_SIZE = 512

CONFIG = """\
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: {max_batch_size}
input [
  {{ name: "dense_features" data_type: TYPE_FP32 dims: [ {num_dense} ] }},
  {{ name: "sparse_lengths" data_type: TYPE_INT32 dims: [ {num_sparse} ] }},
  {{ name: "sparse_values" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }}
]
output [ {{ name: "scores" data_type: TYPE_FP32 dims: [ {num_tasks} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


class TinyRec(torch.nn.Module):
    """sigmoid(MLP([dense, pooled int8 embeddings])): [B, D], [B, F], [N] -> [B, T]."""

    def __init__(self) -> None:
        super().__init__()
        specs = [
            (f"t_{n}", r, DIM, SparseType.INT8, EmbeddingLocation.HOST)
            for n, r in zip(SPARSE, ROWS, strict=True)
        ]
        self.tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=specs, device="cpu", pooling_mode=PoolingMode.SUM
        )
        self.tbe.fill_random_weights()
        self.register_buffer("rows", torch.tensor(ROWS, dtype=torch.int64))
        # rec::linear, as export writes dense layers: a row's scores are the same bits in any
        # batch on any CPU, so a server's batched answer can be compared with a request scored
        # alone. nn.Linear's kernels change with the batch size (oneDNN, AMX), and a test that
        # passed with them passed by luck of its data.
        first = torch.nn.Linear(len(DENSE) + DIM * len(SPARSE), 16)
        last = torch.nn.Linear(16, NUM_TASKS)
        self.mlp = torch.nn.Sequential(
            InvariantLinear(first.weight, first.bias),
            torch.nn.ReLU(),
            InvariantLinear(last.weight, last.bias),
        )

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        batch = dense_features.shape[0]
        lengths_fm, values_fm = feature_major(sparse_lengths, sparse_values)
        # A non-negative modulo into each feature's table, so any int64 id is safe.
        table_rows = torch.repeat_interleave(self.rows.repeat_interleave(batch), lengths_fm)
        ids = torch.remainder(values_fm, table_rows).to(torch.int32)
        offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths_fm).to(torch.int32)
        pooled = self.tbe(ids, offsets)  # [B, F * DIM]
        return torch.sigmoid(self.mlp(torch.cat([dense_features, pooled], dim=1)))


class BatchVariantRec(torch.nn.Module):
    """A genuinely batch-dependent model (test only): each score moves with the batch's mean
    dense value, as a model whose kernels change with the batch size would, only more."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyRec()

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_lengths: torch.Tensor,
        sparse_values: torch.Tensor,
    ) -> torch.Tensor:
        scores = self.inner(dense_features, sparse_lengths, sparse_values)
        return scores + 1e-3 * dense_features.mean()


def tiny_manifest() -> dict:
    """The fields of rec.json a server reads, for the tiny model, as export writes them."""
    return {
        **io_manifest(len(DENSE), len(SPARSE), NUM_TASKS),
        "features": {"dense": list(DENSE), "sparse": list(SPARSE)},
        "num_tasks": NUM_TASKS,
    }


def write_model(
    repo: Path,
    name: str = "rec",
    version: int = 1,
    seed: int = 0,
    delay_us: int = 2000,
    batch_probe: str | None = None,
) -> Path:
    """Writes <repo>/<name>/{config.pbtxt, rec.json, <version>/model.pt}; returns the model.pt.

    batch_probe: "variant" also writes <version>/rec.json as export does for a batch-invariant
    model (dense.batch_invariant and a batch_probe request), over BatchVariantRec, which breaks
    the claim (a real export's probe passing: tests/serve_cpp/test_real_export.py)."""
    torch.manual_seed(seed)
    model = ModelDir.of(repo, name)
    model.version(version).mkdir(parents=True, exist_ok=True)
    config = CONFIG.format(
        name=name,
        max_batch_size=MAX_BATCH_SIZE,
        num_dense=len(DENSE),
        num_sparse=len(SPARSE),
        num_tasks=NUM_TASKS,
        delay_us=delay_us,
    )
    model.write_config(config)
    manifest = tiny_manifest()
    model.manifest.write_text(json.dumps(manifest, indent=2))
    path = model.model_file(version)
    # Written beside and renamed, so a polling server never sees half a file.
    tmp = path.with_suffix(".tmp")
    module = BatchVariantRec() if batch_probe == "variant" else TinyRec()
    torch.jit.script(module.eval()).save(str(tmp))
    tmp.rename(path)
    if batch_probe:
        probe = {k: v.tolist() for k, v in make_batch(37, seed=11).items()}
        claim = {"dtype": "fp32", "batch_invariant": True, "verified_on": {"model": "a test CPU"}}
        versioned = {**manifest, "dense": claim, "batch_probe": probe}
        model.version_manifest(version).write_text(json.dumps(versioned))
    return path


def make_batch(batch: int, seed: int) -> dict[str, np.ndarray]:
    """A random request of `batch` rows: ids of any int64 value, some bags empty."""
    return random_request(len(DENSE), len(SPARSE), batch, seed)


class Reference:
    """The model scored in-process: what every server answer must equal."""

    def __init__(self, model_path: Path) -> None:
        # One thread: the server shares these 2 cores, and OpenMP spinning against it makes each
        # tiny forward ~10x slower.
        torch.set_num_threads(1)
        self.module = torch.jit.load(str(model_path))

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(inputs[k]) for k in INPUT_NAMES))
        return out.numpy()


DATATYPES = {name: DTYPES[name] for name in INPUT_NAMES}
