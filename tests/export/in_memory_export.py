"""The pre-streaming export path, kept as the reference the streamed export is compared with:
the whole float model loaded, deep-copied and quantized by TorchRec's quantize_inference_model.

Run in a fresh process (TorchScript numbers the classes it compiles per process, and those
numbers are in model.pt), so its file can be compared byte for byte with `rec export`'s:

    python -m tests.export.in_memory_export RUN OUT_DIR '{"t0": "int4", ...}'
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from rec.export import torchscript
from rec.export.load import load_run
from rec.export.module import ServingModule, make_batch_invariant, sample_batch
from rec.model import table_rows


def main(run: str, out: str, dtypes_json: str) -> None:
    loaded = load_run(run)
    cfg = loaded.cfg
    dtypes = {t.name: cfg.export.quantize for t in cfg.tables} | json.loads(dtypes_json)
    float_module = ServingModule(loaded.model, cfg.features.sparse, table_rows(cfg)).eval()
    module = copy.deepcopy(float_module)
    make_batch_invariant(module)
    torchscript.quantize(module, dtypes)
    sample = sample_batch(cfg.features.dense, len(cfg.features.sparse))
    scripted = torchscript.to_torchscript(module, sample)
    Path(out).mkdir(parents=True)
    torch.jit.save(scripted, str(Path(out) / "model.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
