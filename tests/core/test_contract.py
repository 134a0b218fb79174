"""rec.contract: the one home of the model's I/O and of the embedding dtypes, checked against
what reads it (Triton's schema, FBGEMM's row sizes, the servers' names)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

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


def _spelled_names(tree: ast.AST, names: re.Pattern) -> list[int]:
    """Lines of the string literals that spell a repository file name as a path (the whole
    string, or a component between slashes); docstrings and other bare strings are prose."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in prose and names.search(node.value)
    )  # fmt: skip


def test_only_the_contract_spells_the_repository_file_names():
    """A file of the model repository is found through rec.contract (ModelDir, FORMATS...),
    so its name lives in one place: no other tracked module spells one as a string."""
    spelled = [
        contract.MANIFEST_FILE,
        contract.TRITON_CONFIG_FILE,
        contract.AOTI_TABLES_FILE,
        contract.AOTI_TABLES_INDEX,
        *(f.file for f in contract.FORMATS.values()),
    ]
    names = re.compile(r"(?:^|/)(?:" + "|".join(map(re.escape, spelled)) + r")(?=$|/)")
    root = Path(__file__).resolve().parents[2]
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    assert len(files) > 100  # the tree's modules, not an empty listing
    found = []
    for name in files:
        if name.startswith("rec/contract/") or not (root / name).is_file():
            continue
        tree = ast.parse((root / name).read_text(), name)
        found += [f"{name}:{line}" for line in _spelled_names(tree, names)]
    assert not found, "spelled outside rec.contract (use rec.contract.ModelDir):\n" + "\n".join(
        found
    )
