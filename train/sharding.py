"""Sharding: topology, per-table constraints, the sharder, and the plan as a table and JSON.

TorchRec's EmbeddingBagCollectionSharder offers only data_parallel, table_wise, column_wise and
table_column_wise for a CPU compute device. row_wise, table_row_wise and grid_shard also train
on CPU with gloo (measured, docs/architecture.md#sharding-on-cpu), so `RecEBCSharder` offers
them there too.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption, Stats
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingType

from rec.config import SEQUENCE_SHARDING_TYPES, SHARDING_TYPES, ConfigError, RecConfig

GiB = 1024**3
# The planner warns on every directly built Topology and on dry-run size estimates; neither
# applies here, and the noise would bury the plan table.
logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)
logging.getLogger("torchrec.distributed.planner.storage_reservations").setLevel(logging.ERROR)
# Data-parallel tables have no sharding spec by design; TorchRec says so on the root logger.
logging.getLogger().addFilter(lambda r: "Sharding spec not found" not in r.getMessage())
_EXTRA_CPU_TYPES = (
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
)


class RecEBCSharder(EmbeddingBagCollectionSharder):
    """The stock sharder, plus row-wise, table-row-wise and grid sharding on CPU."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = list(super().sharding_types(compute_device_type))
        if compute_device_type == "cpu":
            types += [t for t in _EXTRA_CPU_TYPES if t not in types]
        return types


def make_sharders() -> list[ModuleSharder]:
    """rec's EBC sharder, and TorchRec's for din's EmbeddingCollection (sequence tables)."""
    return [RecEBCSharder(), EmbeddingCollectionSharder()]


def make_topology(cfg: RecConfig, world_size: int, compute_device: str) -> Topology:
    """The planner's view of the hardware: the config's `sharding.topology` (TorchRec's
    defaults unless set), and ranks per host from it or else from the launcher's env."""
    topo = cfg.sharding.topology
    local = topo.local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if world_size % local != 0:
        raise ConfigError(
            f"sharding.topology.local_world_size={local} does not divide the world size "
            f"{world_size}; hosts must have the same number of ranks"
        )
    return Topology(
        world_size=world_size,
        compute_device=compute_device,
        local_world_size=local,
        hbm_cap=int(topo.device_memory_gib * GiB),
        ddr_cap=int(topo.host_memory_gib * GiB),
        # TorchRec's bandwidths are in bytes per millisecond.
        intra_host_bw=topo.intra_host_bandwidth_gib_s * GiB / 1000,
        inter_host_bw=topo.cross_host_bandwidth_gib_s * GiB / 1000,
    )


def make_constraints(cfg: RecConfig, compute_device: str) -> dict[str, ParameterConstraints]:
    """Per-table constraints from the config.

    On CPU the extra types are there for the tables that ask for them; a table with no
    constraint keeps the stock choice (what TorchRec's own CPU sharder would offer). Sequence
    tables keep to SEQUENCE_SHARDING_TYPES on every device.
    """
    out = {}
    pooled = (
        EmbeddingBagCollectionSharder().sharding_types("cpu") if compute_device == "cpu" else None
    )
    stocks = {"pooled": pooled, "sequence": list(SEQUENCE_SHARDING_TYPES)}
    kind = {t.name: "sequence" if t.pooling == "none" else "pooled" for t in cfg.tables}
    for t in cfg.tables:
        if stocks[kind[t.name]] is not None:
            out[t.name] = ParameterConstraints(sharding_types=list(stocks[kind[t.name]]))
    for table, c in cfg.sharding.constraints.items():
        out[table] = ParameterConstraints(
            sharding_types=list(c.sharding_types) or None,
            compute_kernels=[EmbeddingComputeKernel(k).value for k in c.compute_kernels] or None,
            min_partition=c.min_partition or None,
        )
        if c.pooling_factor:
            features = next(t.features for t in cfg.tables if t.name == table)
            out[table].pooling_factors = [float(c.pooling_factor)] * len(features)
        if not c.sharding_types and stocks[kind[table]] is not None:
            out[table].sharding_types = list(stocks[kind[table]])
    _keep_zch_off_data_parallel(cfg, out)
    if cfg.publish.url:
        _keep_whole_rows(cfg, out)
    return out


def _keep_zch_off_data_parallel(cfg: RecConfig, constraints: dict[str, ParameterConstraints]):
    """A ZCH table's admitted rows and their optimizer state are reset in FBGEMM's kernel
    (rec.train.zch); a data_parallel table is a dense parameter the dense optimizer trains."""
    for t in cfg.tables:
        if t.zch is None:
            continue
        c = constraints.setdefault(t.name, ParameterConstraints())
        allowed = c.sharding_types or list(SHARDING_TYPES)
        kept = [s for s in allowed if s != "data_parallel"]
        if not kept:
            raise ConfigError(
                f"table {t.name!r} has ids.zch but may only be sharded data_parallel; a ZCH "
                "table's rows and optimizer state must live in the embedding kernel: allow "
                "another sharding type (table_wise, row_wise, ...)"
            )
        c.sharding_types = kept


PUBLISHABLE_SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise")
"""Sharding types whose shards hold whole rows, so a rank can quantize its rows alone."""


def _keep_whole_rows(cfg: RecConfig, constraints: dict[str, ParameterConstraints]) -> None:
    """Publishing the rows a step changed (rec.train.publish) needs every table's shards to hold
    whole rows: the sharding types are cut to those, and a table allowed none of them is an
    error that names it."""
    for t in cfg.tables:
        c = constraints.setdefault(t.name, ParameterConstraints())
        allowed = c.sharding_types or list(SHARDING_TYPES)
        kept = [s for s in allowed if s in PUBLISHABLE_SHARDING_TYPES]
        if not kept:
            raise ConfigError(
                f"table {t.name!r} may only be sharded {allowed}; publish.url needs whole rows on "
                f"each rank ({', '.join(PUBLISHABLE_SHARDING_TYPES)})"
            )
        c.sharding_types = kept


class OrderedEnumerator(EmbeddingEnumerator):
    """TorchRec's enumerator with the sharding types and kernels in the sharder's order.

    With constraints, TorchRec intersects the allowed and constrained types as Python sets,
    whose order changes with the interpreter's string-hash seed (PYTHONHASHSEED). Where two
    options rate the same (a column_wise table of one shard costs what table_wise does), the
    planner keeps the first it met, so `rec plan` printed column_wise in one run and
    table_wise in the next. Keeping the sharder's list order makes the plan a function of
    the config alone.
    """

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        kept = set(super()._filter_sharding_types(name, allowed_sharding_types, sharder_key))
        return [t for t in allowed_sharding_types if t in kept]

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        kept = set(super()._filter_compute_kernels(name, allowed_compute_kernels, sharding_type))
        return [k for k in allowed_compute_kernels if k in kept]


class PlanCapture(Stats):
    """Keeps what the planner reports at the end of `plan()`: the chosen sharding options
    (each shard with its rank, storage and perf estimate), the topology and the reservation.
    On failure TorchRec reports its last proposal instead, with every shard at rank -1."""

    def __init__(self) -> None:
        self.best_plan: list[ShardingOption] = []
        self.topology: Topology | None = None
        self.reserved: Topology | None = None
        self.batch_size = 0

    def log(self, sharding_plan, topology, batch_size, storage_reservation, num_proposals,
            num_plans, run_time, best_plan, *args, **kwargs) -> None:  # fmt: skip
        self.best_plan = list(best_plan)
        self.topology = topology
        self.batch_size = batch_size
        self.reserved = getattr(storage_reservation, "last_reserved_topology", None)


def make_planner(
    cfg: RecConfig, world_size: int, compute_device: str, batch_size: int | None = None
) -> EmbeddingShardingPlanner:
    """TorchRec's planner over the config's topology and constraints; its `stats` is a
    PlanCapture (`planner_capture(planner)`), which `rec plan` turns into numbers."""
    topology = make_topology(cfg, world_size, compute_device)
    batch_size = batch_size or cfg.training.batch_size
    constraints = make_constraints(cfg, compute_device)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=OrderedEnumerator(topology, batch_size, constraints),
        storage_reservation=FixedPercentageStorageReservation(
            percentage=cfg.sharding.topology.storage_reserve_percent / 100
        ),
        constraints=constraints,
        stats=PlanCapture(),
        debug=False,
    )


def planner_capture(planner: EmbeddingShardingPlanner) -> PlanCapture:
    # The planner keeps the stats it was given in `_stats` (torchrec 1.8.0); make_planner put
    # exactly one PlanCapture there.
    return next(s for s in planner._stats if isinstance(s, PlanCapture))


def plan_rows(plan: ShardingPlan) -> list[dict[str, Any]]:
    """One row per table: sharding type, kernel, ranks and shard sizes ([rows, cols] each)."""
    rows = []
    for module_path, module_plan in plan.plan.items():
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            shards = []
            if ps.sharding_spec is not None:
                for s in ps.sharding_spec.shards:  # type: ignore[attr-defined]
                    shards.append(
                        {
                            "rank": s.placement.rank(),
                            "offsets": list(s.shard_offsets),
                            "sizes": list(s.shard_sizes),
                        }
                    )
            rows.append(
                {
                    "module": module_path,
                    "table": table,
                    "sharding_type": ps.sharding_type,
                    "compute_kernel": ps.compute_kernel,
                    "ranks": list(ps.ranks) if ps.ranks is not None else [],
                    "shards": shards,
                }
            )
    return rows


def format_plan(rows: list[dict[str, Any]]) -> str:
    """The plan as an aligned text table (what `rec plan` and rank 0 of `rec train` print)."""
    header = ("table", "sharding type", "kernel", "ranks", "shard sizes")
    lines = []
    for r in rows:
        sizes = " ".join("x".join(str(d) for d in s["sizes"]) for s in r["shards"]) or "full"
        ranks = ",".join(str(x) for x in r["ranks"]) or "all"
        lines.append((r["table"], r["sharding_type"], r["compute_kernel"], ranks, sizes))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


def write_plan(path: Path, report: dict[str, Any]) -> None:
    """plan.json: the plan rows under "tables" (with "world_size"), and rec.train.plan_stats'
    numbers beside them (memory and time per rank, bytes per collective, host totals)."""
    path.write_text(json.dumps(report, indent=2) + "\n")


def compute_device_type(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"
