"""`rec plan`'s ZCH block: each ZCH table's slots, map memory and expected load, from the
training data's own ids placed through rec's real hash (rec.zch.home) and probe window.

A uniform draw of ids would hide what real ids do: consecutive or strided integers through a
poor hash share homes (issue #59), and a table that looks 75 % loaded then meets full windows
far more often. So the ids placed are the data's: for files, the distinct ids of the table's
features in the first FILE_SAMPLES training samples, in the order they first appear; for
synthetic data, the live set the generator draws from (its ids 0..rows-1, or data.synthetic's
live-id space at time 0).

Placement is rec.zch.IdMap's for a map that never evicts: each id takes the first free slot of
its window, else it meets a full window (with lfu or lru it would evict a colder id; with ttl
it reads the default row). Large tables are simulated on a slice of their slots: the ids whose
home falls in the first SIM_SLOTS slots fill those slots exactly as in the whole table (the
hash spreads homes independently of the slot count), but for the `probes` slots at the slice's
edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rec.config import RecConfig, TableConfig, load_config
from rec.train.zch import MAP_BYTES_PER_SLOT
from rec.zch import home

FILE_SAMPLES = 1_000_000  # samples of a file rec plan reads to collect ids
SIM_SLOTS = 1 << 18  # slots simulated at most (a slice of a larger table)


@dataclass(frozen=True)
class Placement:
    """What placing a table's ids once, in order, gives (over the simulated slots)."""

    ids: int  # distinct ids placed (in the slice, for a large table)
    slots: int  # slots simulated
    held: int  # ids that found a free slot
    full: int  # ids whose whole window was taken

    @property
    def load(self) -> float:
        """The share of slots the ids take."""
        return self.held / self.slots

    @property
    def full_share(self) -> float:
        return self.full / max(self.ids, 1)


def place(ids: np.ndarray, slots: int, probes: int, sim_slots: int = SIM_SLOTS) -> Placement:
    """Places `ids` (distinct, in arrival order) into a table of `slots` slots, each in the first
    free slot of its window; a table larger than `sim_slots` on its first `sim_slots` slots."""
    homes = home(torch.from_numpy(np.asarray(ids, dtype=np.int64)), slots).numpy()
    span = min(slots, sim_slots)
    homes = homes[homes < span]
    used = bytearray(span)
    held = full = 0
    for h in homes.tolist():
        for k in range(probes):
            s = h + k
            if s >= span:
                s -= span  # a whole table wraps; a slice's edge wraps too (see the docstring)
            if not used[s]:
                used[s] = 1
                held += 1
                break
        else:
            full += 1
    return Placement(len(homes), span, held, full)


def synthetic_ids(cfg: RecConfig, table: TableConfig) -> np.ndarray:
    """The ids synthetic data draws a table's lookups from (rec.data.synthetic)."""
    from rec.data.churn import id_space

    space = id_space(cfg)
    if space is None:
        return np.arange(table.rows, dtype=np.int64)
    return space.live_set([t.name for t in cfg.tables].index(table.name), 0.0)


def file_ids(cfg: RecConfig, tables: list[TableConfig], max_samples: int = FILE_SAMPLES
             ) -> tuple[dict[str, np.ndarray], int, bool]:  # fmt: skip
    """Each table's distinct raw ids in the training data's first `max_samples` samples, in the
    order they first appear, how many samples were read, and whether that was all of them: a
    long log's count is a lower bound."""
    from rec.batch import feature_major
    from rec.data import make_source

    keys = list(cfg.features.sparse)
    seen: dict[str, list[np.ndarray]] = {t.name: [] for t in tables}
    read, complete = 0, True
    for batch in make_source(cfg, "train").batches(4096, 0, 1, drop_last=False):
        lengths_fm, raw_fm = feature_major(batch.lengths, batch.values)
        per_feature = lengths_fm.view(len(keys), -1).sum(1).tolist()
        for key, ids in zip(keys, raw_fm.split(per_feature), strict=True):
            for t in tables:
                if key in t.features:
                    seen[t.name].append(ids.numpy())
        read += len(batch)
        if read >= max_samples:
            complete = False
            break
    return {n: _first_seen(a) for n, a in seen.items()}, read, complete


def _first_seen(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.zeros(0, np.int64)
    ids = np.concatenate(chunks)
    uniq, first = np.unique(ids, return_index=True)
    return uniq[np.argsort(first, kind="stable")]


def plan_block(config: str | Path) -> str:
    """`rec plan`'s lines for the config's ZCH tables (after a blank line; "" with none)."""
    cfg = load_config(config)
    zch = [t for t in cfg.tables if t.zch]
    if not zch:
        return ""
    counted = None if cfg.data.source == "synthetic" else file_ids(cfg, zch)
    lines = [
        f"ZCH tables (each rank holds every id map, {MAP_BYTES_PER_SLOT} bytes per slot):",
        f"{'table':<16} {'slots':>12} {'map memory':>12} {'probes':>6} {'every_steps':>11} "
        f"{'live ids':>10} {'load':>6} {'full window':>11}",
    ]
    for t in zch:
        z = t.zch
        assert z is not None
        ids = synthetic_ids(cfg, t) if counted is None else counted[0][t.name]
        size = _bytes(z.slots * MAP_BYTES_PER_SLOT)
        if len(ids):
            p = place(ids, z.slots, z.probes)
            load, full = f"{p.load:.0%}", f"{p.full_share:.1%}"
        else:
            load = full = "-"
        lines.append(f"{t.name:<16} {z.slots:>12} {size:>12} {z.probes:>6} {z.every_steps:>11} "
                     f"{len(ids) or '-':>10} {load:>6} {full:>11}")  # fmt: skip
    lines.append(
        "load: the share of slots the live ids take, placed once through rec's hash in the "
        "order they arrive; full window: the share of them finding every slot of their window "
        "taken (they evict a colder id, or read the default row)"
    )
    if counted is not None and not cfg.data.train_paths:
        lines.append("live ids: the config names no training file (a stream run); the run's "
                     "`zch:` lines report the ids it holds")  # fmt: skip
    elif counted is not None:
        whole = " (all of them)" if counted[2] else ""
        lines.append(f"live ids: the distinct ids of the table's features in the first "
                     f"{counted[1]:,} training samples{whole}")  # fmt: skip
    else:
        lines.append("live ids: the ids synthetic data draws from (data.synthetic.live_ids, else "
                     "the table's rows)")  # fmt: skip
    return "\n\n" + "\n".join(lines)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} GiB"
