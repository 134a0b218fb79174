"""rec's own torch ops (cpp/ops), loaded into this process on import.

`torch.ops.rec.linear(x, packed_weight, bias, out_features)`: a dense layer whose every output
is one fixed chain of fp32 FMAs over the input, in input order, on every CPU and at every batch
size (cpp/ops/linear.cpp says why that makes a row's result independent of its batch).
`rec.export.dense` packs weights for it; a model that calls it needs this library loaded
before it is loaded: `import rec.ops` in Python, `rec-server --ops-library` (found at build
time) in C++, and Triton's Python-backend model imports it.
"""

from pathlib import Path

import torch

# Built into the package by `pip install` (setup.py); the same file rec-server dlopens.
LIBRARY = Path(__file__).with_name("_ops.so")


def _load() -> None:
    if not LIBRARY.is_file():
        raise ImportError(
            f"rec's op library {LIBRARY} is missing: it is built when the package is installed "
            "(scripts/setup.sh, or `pip install --no-build-isolation -e .` with torch installed)"
        )
    torch.ops.load_library(str(LIBRARY))


_load()


def linear_isa() -> str:
    """The instruction set rec::linear runs on here: avx512, avx2 or scalar (all give the same
    bits; REC_MAX_CPU_ISA=avx2|scalar holds it lower)."""
    return torch.ops.rec.linear_isa()
