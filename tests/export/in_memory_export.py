"""The export without streaming, kept as the reference the streamed export is compared with:
the whole float model loaded, and each table quantized into the served module's TBE storage in
one piece (no checkpoint reader, no row chunks).

Run in a fresh process (TorchScript numbers the classes it compiles per process, and those
numbers are in model.pt), so its file can be compared byte for byte with `rec export`'s:

    python -m tests.export.in_memory_export RUN OUT_DIR '{"t0": "int4", ...}'
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rec.contract.repository import model_file_in
from rec.export import served, torchscript_builder
from rec.export.load import load_run
from rec.export.module import sample_batch


def main(run: str, out: str, dtypes_json: str) -> None:
    loaded = load_run(run)
    cfg = loaded.cfg
    dtypes = {t.name: cfg.export.quantize for t in cfg.tables} | json.loads(dtypes_json)
    module, tbe = torchscript_builder.served_module(loaded.model, cfg, dtypes)
    sink = served.TbeSink(tbe)
    for name, bag in loaded.model.sparse_arch.embedding_bag_collection.embedding_bags.items():
        sink.write(name, 0, bag.weight.detach())
    sample = sample_batch(cfg.features.dense, len(cfg.features.sparse))
    scripted = torchscript_builder.to_torchscript(module, sample)
    Path(out).mkdir(parents=True)
    torch.jit.save(scripted, str(model_file_in(out)))


if __name__ == "__main__":
    main(*sys.argv[1:])
