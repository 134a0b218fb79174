"""Process-group set-up for one rank, from the launcher's environment (torchrun or `rec train`)."""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

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
    # Which start of the workers this is, counted by the store (1: the first). Every rank of an
    # attempt sees the same number, unlike TORCHELASTIC_RESTART_COUNT (see _restart_scoped_store).
    attempt: int = 1

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


def _restart_scoped_store(timeout: timedelta) -> tuple[dist.Store, int] | None:
    """Under torchelastic, a store whose keys belong to this attempt alone, and the attempt's
    number (1 for the first start of the workers).

    With the c10d rendezvous the workers of every attempt share the agent's TCPStore, and gloo
    found the dead attempt's peer addresses there: the restarted ranks failed with "Gloo
    connectFullMesh failed ... Connection refused". Prefixing by attempt keeps them apart.

    The attempt is counted by the store, not TORCHELASTIC_RESTART_COUNT: on several hosts,
    the agents whose own workers did not fail restart them for the membership change, which
    torchelastic does not count as a restart, so two attempts had one count (measured with
    scripts/multihost.sh: the second attempt dialled the first's dead ports). Every rank joins
    once per attempt, so rank r's join count is the attempt's number on every rank.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or "MASTER_ADDR" not in os.environ:
        return None
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        is_master=not agent_hosts and os.environ["RANK"] == "0",
        timeout=timeout,
        multi_tenant=not agent_hosts,
    )
    attempt = store.add(f"rec/joins/rank_{os.environ['RANK']}", 1)
    return dist.PrefixStore(f"rec/attempt_{attempt}/", store), attempt


def set_rank_threads(local_ranks: int) -> int:
    """Gives this rank its share of the host's cores as intra-op threads, and returns it:
    OMP_NUM_THREADS when set, else cores / local ranks (at least 1), as torchrun sets it for
    several ranks. torch's default is every core in every rank, so 2 ranks on 2 cores ran 4
    threads that spin waiting on each other (benchmarks/README.md, training throughput)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, local_ranks))
    torch.set_num_threads(threads)
    return threads


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
    # The launcher's LOCAL_WORLD_SIZE (processes on this machine), before a simulated topology
    # (sharding.topology.local_world_size) overrides it for TorchRec.
    set_rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    device = pick_device(cfg, local_rank)
    backend = (
        cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    attempt = 1
    if not dist.is_initialized():
        timeout = timedelta(seconds=cfg.pg_timeout_s)
        scoped = _restart_scoped_store(timeout)
        if scoped is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            store, attempt = scoped
            dist.init_process_group(
                backend=backend,
                store=store,
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
                timeout=timeout,
            )
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,
        attempt=attempt,
    )


def all_mean(value: float, device: torch.device) -> float:
    """Mean of a float over ranks (for logged losses)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every rank's rows of `t` ([n_rank, ...], n_rank may differ), concatenated in rank order,
    on every rank."""
    world = dist.get_world_size()
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    padded = t.new_zeros((int(max(sizes)), *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(k)] for p, k in zip(parts, sizes, strict=True)])


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def exit_rank() -> NoReturn:
    """Ends a rank whose work is done and on disk (checkpoints fsynced, metrics written and
    closed) without the interpreter's teardown. That teardown can abort: c10d/gloo C++ threads
    still joinable at static destruction end in "terminate called without an active exception"
    (SIGABRT after the last checkpoint committed; about 1 run in 30 of a 2-rank load-and-save
    under load, the same symptom as pytorch/pytorch#190489), which the launcher reports as a
    failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
