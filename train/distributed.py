"""Process-group set-up for one rank, from the launcher's environment (torchrun or `rec train`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rec.config import TrainingConfig


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(cfg: TrainingConfig, local_rank: int) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("training.device='cuda' but torch sees no CUDA device")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(cfg: TrainingConfig) -> DistContext:
    """Joins the process group the launcher describes (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Without a launcher (no RANK in the environment) it starts a one-rank group, so the same
    code path runs in a plain `python` process.
    """
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29531"),
        )  # fmt: skip
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(cfg, local_rank)
    backend = (
        cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=cfg.pg_timeout_s))
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,
    )


def all_mean(value: float, device: torch.device) -> float:
    """Mean of a float over ranks (for logged losses)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()
