"""Helpers of the reliability tests. tests/serve_cpp's (Server, the export recipe) are reused,
not copied."""

import sys
from pathlib import Path

SERVE_CPP = Path(__file__).resolve().parents[1] / "serve_cpp"
# pytest runs with --import-mode=importlib, which does not put test folders on sys.path.
sys.path.insert(0, str(SERVE_CPP))

from server import BINARY, Server, run_to_exit  # noqa: E402
from test_real_export import CONFIG, _batch, _rec  # noqa: E402
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


def export_model(root: Path) -> Path:
    """`rec train` (4 steps) then `rec export` (int8 TBE) under root; returns the repository."""
    import yaml

    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    _rec("train", "-c", str(root / "config.yaml"), "--run-dir", str(root / "run"), "--nproc", "1")
    _rec("export", str(root / "run"), "--repo", str(root / "repo"), "--format", "torchscript")
    return root / "repo"


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
