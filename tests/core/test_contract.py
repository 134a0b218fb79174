"""rec.contract: the one home of the model's I/O and of the embedding dtypes, checked against
what reads it (Triton's schema, FBGEMM's row sizes, the servers' names)."""

from __future__ import annotations

import pytest
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import unpadded_row_size_in_bytes
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec import contract
from rec.config import QUANT_DTYPES, ExportConfig
from rec.export.repository import triton_config
from rec.export.served import _SPARSE_TYPES


@pytest.mark.parametrize("dtype", QUANT_DTYPES)
@pytest.mark.parametrize("dim", [4, 16, 36, 64, 128])
def test_stored_row_sizes_are_fbgemms(dtype, dim):
    want = unpadded_row_size_in_bytes(dim, _SPARSE_TYPES[dtype])
    assert contract.EMBEDDING_DTYPES[dtype].bytes_per_row(dim) == want


@pytest.mark.parametrize("batching", ["none", "ragged"])
def test_triton_config_says_what_rec_json_says(batching):
    io = contract.io_manifest(13, 26, 2)
    text = triton_config("m", "torch_aoti", 13, 26, 2, ExportConfig(triton_batching=batching))
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    dtype = model_config_pb2.DataType.Name
    got = [(t.name, dtype(t.data_type)) for t in [*config.input, *config.output]]
    assert got == [(s["name"], "TYPE_" + s["dtype"]) for s in io["inputs"] + io["outputs"]]
    dims = [list(t.dims) for t in [*config.input, *config.output]]
    shapes = [s["shape"] for s in io["inputs"] + io["outputs"]]
    if batching == "none":
        assert dims == shapes
    else:  # the batch dimension implicit, but for the ragged ids
        assert dims == [shapes[0][1:], shapes[1][1:], [-1], shapes[3][1:]]
        assert [t.allow_ragged_batch for t in config.input] == [False, False, True]
