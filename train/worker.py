"""Entry point of one training process: `python -m rec.train.worker --run-dir DIR [--config F]`.

`rec train --nproc N` starts N of these through torch.distributed's elastic launcher; for
several hosts run the same module under plain torchrun with the usual variables, e.g.
`torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint host:29500 -m rec.train.worker
--config cfg.yaml --run-dir /shared/run`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from rec import run_dir, warnings_filter
from rec.config import load_config
from rec.train.distributed import exit_rank


@record  # the launcher reports this rank's exception text instead of "exitcode 1"
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rec.train.worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--config", type=Path, default=None,
                        help="YAML config; default: the run directory's config.yaml")  # fmt: skip
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--publish", default=None, help="publish.url for this start")
    args = parser.parse_args(argv)

    warnings_filter.install()  # the known third-party warnings (rec --verbose shows them)
    from rec.train.trainer import run_training  # heavy imports after argument errors

    saved = args.run_dir / run_dir.CONFIG_FILE
    cfg = load_config(saved if saved.is_file() else args.config)
    # Under plain torchrun nobody wrote the run dir yet; every rank checks, rank 0 writes.
    if not saved.is_file() and os.environ.get("RANK", "0") == "0":
        args.run_dir.mkdir(parents=True, exist_ok=True)
        saved.write_text(cfg.to_yaml())
    if args.publish is not None:
        cfg.publish.url = args.publish
    run_training(cfg, args.run_dir, resume=args.resume)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_rank()
