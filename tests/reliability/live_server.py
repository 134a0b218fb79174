"""Helpers of the reliability tests. tests/serve_cpp's (Server, the export recipe) are reused,
not copied."""

import sys
from pathlib import Path

SERVE_CPP = Path(__file__).resolve().parents[1] / "serve_cpp"
# pytest runs with --import-mode=importlib, which does not put test folders on sys.path.
sys.path.insert(0, str(SERVE_CPP))

from server import BINARY, Server, run_to_exit  # noqa: E402
from test_real_export import CONFIG, _batch, train_and_export  # noqa: E402
from tiny_model import DATATYPES, INPUT_NAMES  # noqa: E402

__all__ = [
    "BINARY",
    "CONFIG",
    "DATATYPES",
    "INPUT_NAMES",
    "Server",
    "batch",
    "export_model",
    "run_to_exit",
]


def export_model(tmp_path_factory) -> Path:
    """`rec train` (4 steps) then `rec export` (int8 TBE): the repository, shared with
    tests/serve_cpp/test_real_export.py (tests/artifacts.py; read only)."""
    return train_and_export(tmp_path_factory) / "repo"


def batch(manifest: dict, rows: int, seed: int):
    """Random valid inputs for the exported model (numpy arrays by input name)."""
    return _batch(manifest, rows, seed)


def infer_inputs(module, arrays) -> list:
    """tritonclient InferInputs (module: tritonclient.http or .grpc), binary data for HTTP."""
    out = []
    for name in INPUT_NAMES:
        i = module.InferInput(name, list(arrays[name].shape), DATATYPES[name])
        i.set_data_from_numpy(arrays[name])
        out.append(i)
    return out
