"""Will it fit? RAM and disk estimated from the config, checked before the work starts.

A model whose tables outgrow the machine should stop at the first line with the numbers, not
be OOM-killed halfway through training or export. The estimates are deliberately simple and a
little generous; each names what it counts so a user can see why a model was refused.

    training, all ranks: 1.3 x (fp32 tables + embedding optimizer state) + 1 GiB per rank
        (the bar the scale benchmark holds training to, checkpoint saves included)
    training, disk: one checkpoint (tables + optimizer state) per kept copy, plus the next
    export: 1 GiB + the quantized tables (twice for ONNX: its module, then ONNX Runtime's copy)
        + the rows verification gathers + a few row chunks; disk: the model files
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rec.config import RecConfig

GIB = 1 << 30
PROCESS_BASE = GIB  # torch + torchrec + fbgemm imported, the dense model, buffers
TRAIN_OVERHEAD = 1.3
# Embedding optimizer state per table row, in fp32 values per element (adam) or per row.
_OPT_STATE_PER_ELEMENT = {"adam": 2, "sgd": 0, "rowwise_adagrad": 0}
_OPT_STATE_PER_ROW = {"adam": 0, "sgd": 0, "rowwise_adagrad": 1}


class ResourceError(RuntimeError):
    """The work would not fit in this machine's memory or disk; the message has the numbers."""


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def size(n: float) -> str:
    """Bytes in the largest decimal unit that keeps the number at 1 or more: 1.33 GB, 240 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def memory_available() -> int:
    """MemAvailable from /proc/meminfo, lowered to a cgroup memory limit if one is set."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        return 1 << 62  # not Linux: nothing to check against
    try:
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text())
        # memory.current counts page cache too (a checkpoint just written); the kernel drops
        # the inactive part under pressure, so it is not in use.
        stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
        used -= int(stat.get("inactive_file", 0))
        if limit != "max":
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def disk_free(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def table_bytes(cfg: RecConfig) -> int:
    return sum(t.rows * t.dim * 4 for t in cfg.tables)


def optimizer_state_bytes(cfg: RecConfig) -> int:
    opt = cfg.training.embedding_optimizer
    return sum(
        4 * (t.rows * t.dim * _OPT_STATE_PER_ELEMENT[opt] + t.rows * _OPT_STATE_PER_ROW[opt])
        for t in cfg.tables
    )


def require(what: str, ram: int, disk: int, disk_path: Path, counted: str,
            available: int | None = None, free: int | None = None) -> None:  # fmt: skip
    """Raises ResourceError if `ram` or `disk` bytes exceed what the machine has."""
    available = memory_available() if available is None else available
    free = disk_free(disk_path) if free is None else free
    if ram > available:
        raise ResourceError(
            f"{what} needs about {gb(ram)} of RAM ({counted}), but {gb(available)} is available "
            "on this machine; use a machine with more memory, more ranks on more hosts, smaller "
            "tables (rows, dim) or a lighter embedding optimizer"
        )
    if disk > free:
        raise ResourceError(
            f"{what} needs about {gb(disk)} of disk at {str(disk_path)!r}, but only {gb(free)} "
            "is free there"
        )


def check_training(cfg: RecConfig, nproc: int, run: Path, resume: bool = False, **machine) -> None:
    """Refuses a training run whose ranks together would not fit this machine (all local).

    On disk a new run needs its kept checkpoints plus the one being written; a resumed run has
    the kept ones already, and needs room for one more."""
    tables, state = table_bytes(cfg), optimizer_state_bytes(cfg)
    ram = int(TRAIN_OVERHEAD * (tables + state)) + nproc * PROCESS_BASE
    copies = 1 if resume or cfg.checkpoint.every_steps == 0 else cfg.checkpoint.keep_last + 1
    counted = (f"{gb(tables)} fp32 tables + {gb(state)} {cfg.training.embedding_optimizer} "
               f"state, x{TRAIN_OVERHEAD}, + {nproc} ranks x {gb(PROCESS_BASE)}")  # fmt: skip
    require("training", ram, copies * (tables + state), run, counted, **machine)


def check_export(cfg: RecConfig, formats: list[str], stored: int, reference_rows: int,
                 chunk_bytes: int, repo: Path, **machine) -> None:  # fmt: skip
    """Refuses an export whose quantized model (`stored` bytes per format) would not fit.
    Formats are built one after another, so RAM holds the hungriest one's copies."""
    from rec.contract import FORMATS

    dim = max(t.dim for t in cfg.tables)
    copies = max(FORMATS[f].ram_copies for f in formats)
    ref = reference_rows * dim * 4
    ram = PROCESS_BASE + int(copies * stored) + ref + 3 * chunk_bytes
    counted = (f"{gb(stored)} quantized tables per format, {gb(ref)} of rows for verification, "
               f"{gb(PROCESS_BASE)} for the process")  # fmt: skip
    require("export", ram, len(formats) * stored, repo, counted, **machine)
