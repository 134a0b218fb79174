"""Run under torchrun: load a checkpoint at this world size, then save it again unchanged.

    torchrun --nproc-per-node N tests/train/reshard_worker.py SRC_RUN DEST_RUN

The test compares the two checkpoints tensor for tensor: a load at another world size followed
by a save must not change a single value of the model or the optimizer state.
"""

import sys
from pathlib import Path

import torch.distributed as dist

from rec import run_dir
from rec.config import load_config
from rec.train.checkpoint import Checkpointer
from rec.train.distributed import exit_rank, init_distributed
from rec.train.trainer import Trainer


def main() -> None:
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = load_config(src / run_dir.CONFIG_FILE)
    ctx = init_distributed(cfg.training)
    if ctx.is_main:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / run_dir.CONFIG_FILE).write_text(cfg.to_yaml())
    dist.barrier()
    trainer = Trainer(cfg, dest, ctx)
    trainer.resume(run_dir.latest_checkpoint(src))
    Checkpointer(dest, cfg.checkpoint, ctx.rank).save(
        trainer.pos.step, trainer._state(), {"world_size": ctx.world_size}
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_rank()
