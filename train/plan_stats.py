"""The numbers of a sharding plan: memory per rank against capacity, estimated time per step,
and bytes per step through each collective, within a host and across hosts.

Memory and time are TorchRec's own estimates (each shard's `storage` and `perf`, from its
EmbeddingStorageEstimator and EmbeddingPerfEstimator). Bytes are counted here, from how
TorchRec's shardings exchange data, for `B` samples per rank per step:

    ids      = B x (ids per sample: the planner's pooling factor, 1.0 unless constrained)
    outputs  = B x features of the table (pooled), or = ids (a sequence table)
    input_dist  all_to_all   every rank sends its ids (8 bytes each) to the ranks holding
                             them; a row-sharded table's ids are split in proportion to the
                             rows each rank holds (ids drawn uniformly over rows)
    table_wise, column_wise, table_column_wise: per shard of dim d on rank r
      forward  all_to_all    r sends outputs x d x 4 bytes to every rank
      backward all_to_all    every rank sends its gradient, the same size, back to r
    row_wise (pooled)
      forward  reduce_scatter  each rank sends its partial sums of every other rank's
                               samples: outputs x D x 4 bytes to each
      backward all_gather      each rank sends its outputs' gradient to every rank
    row_wise (sequence): all_to_all both ways, each id's embedding from the rank holding it
    table_row_wise, grid_shard: per column group, placed on one host's ranks G
      forward  reduce_scatter within G (each sends the partials of W / |G| ranks' samples),
               then all_to_all from G's rank i to rank i of every other host
      backward the same two in reverse (all_to_all, then all_gather within G)
    (TorchRec skips a collective over a group of one rank: one rank, one host, a one-rank G)
    data_parallel
      backward all_reduce    ring over the ranks in order: each sends 2 (W-1)/W x table bytes

Bytes a rank sends to itself are not counted; the rest is within_host when both ranks are on
one host (rank // local_world_size) and cross_host otherwise. Lengths and offsets that travel
with the ids are not counted. A plan's totals per host count what its ranks send.

Each rank's `send_buffer_bytes` is the same model counted as training measures it
(train.step_profile): the send buffers its collectives take per step, its own slice included.
An all-to-all's or a reduce-scatter's buffer is everything the rank sends, itself included; an
all-gather's is the one chunk every peer receives; an all-reduce's is the gradient itself. Ids'
all-to-alls are `ids_all_to_all`, apart from the embeddings' `all_to_all`: ids per sample are
the planner's assumption and their lengths are not counted, while embedding sizes are exact.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from torch import nn
from torchrec.distributed.planner.types import PlannerError, ShardingOption, Topology

from rec.config import RecConfig
from rec.resources import ResourceError
from rec.train.sharding import (
    PlanCapture,
    format_plan,
    make_planner,
    make_sharders,
    plan_rows,
    planner_capture,
)

ID_BYTES = 8  # TorchRec's planner sizes ids as int64 (BIGINT_DTYPE)
VALUE_BYTES = 4  # fp32 embeddings and gradients
GIB = 1024**3

Flow = tuple[str, str, int, int, float]  # phase, collective, from rank, to rank, bytes


def _ids_and_outputs(so: ShardingOption, batch: int) -> tuple[float, float]:
    ids = batch * sum(so.input_lengths)
    return ids, (batch * so.num_inputs if so.is_pooled else ids)


def _to_shards(so: ShardingOption, world: int, batch: int) -> list[Flow]:
    """table_wise / column_wise / table_column_wise: each shard is a small table on one rank."""
    ids, outs = _ids_and_outputs(so, batch)
    flows = []
    for shard in so.shards:
        r, d = shard.rank, shard.size[1]
        for s in range(world):
            flows.append(("input_dist", "all_to_all", s, r, ids * ID_BYTES))
            flows.append(("forward", "all_to_all", r, s, outs * d * VALUE_BYTES))
            flows.append(("backward", "all_to_all", s, r, outs * d * VALUE_BYTES))
    return flows


def _row_wise(so: ShardingOption, world: int, batch: int) -> list[Flow]:
    ids, outs = _ids_and_outputs(so, batch)
    rows = so.tensor.shape[0]
    flows = []
    for shard in so.shards:
        r, d, share = shard.rank, shard.size[1], shard.size[0] / rows
        for s in range(world):
            flows.append(("input_dist", "all_to_all", s, r, ids * share * ID_BYTES))
            if so.is_pooled:
                flows.append(("forward", "reduce_scatter", r, s, outs * d * VALUE_BYTES))
                flows.append(("backward", "all_gather", s, r, outs * d * VALUE_BYTES))
            else:
                flows.append(("forward", "all_to_all", r, s, ids * share * d * VALUE_BYTES))
                flows.append(("backward", "all_to_all", s, r, ids * share * d * VALUE_BYTES))
    return flows


def _host_row_wise(so: ShardingOption, world: int, local: int, batch: int) -> list[Flow]:
    """table_row_wise / grid_shard: rows split over one host's ranks, per column group."""
    ids, outs = _ids_and_outputs(so, batch)
    rows = so.tensor.shape[0]
    groups: dict[int, list] = defaultdict(list)
    for shard in so.shards:
        groups[shard.offset[1]].append(shard)
    flows = []
    for shards in groups.values():
        ranks = sorted(s.rank for s in shards)
        per_peer = world / len(ranks)  # ranks whose samples each member reduces
        for shard in shards:
            g, d, share = shard.rank, shard.size[1], shard.size[0] / rows
            out_bytes = outs * d * VALUE_BYTES
            for s in range(world):
                flows.append(("input_dist", "all_to_all", s, g, ids * share * ID_BYTES))
            for peer in ranks if len(ranks) > 1 else ():
                flows.append(("forward", "reduce_scatter", g, peer, per_peer * out_bytes))
                flows.append(("backward", "all_gather", peer, g, per_peer * out_bytes))
            for s in range(world) if world > local else ():
                if s % local == g % local:  # the same local rank on every host, g's own too
                    flows.append(("forward", "all_to_all", g, s, out_bytes))
                    flows.append(("backward", "all_to_all", s, g, out_bytes))
    return flows


def _data_parallel(so: ShardingOption, world: int) -> list[Flow]:
    size = so.tensor.shape[0] * so.tensor.shape[1] * VALUE_BYTES
    if world == 1:
        return []
    per_rank = 2 * (world - 1) / world * size
    return [("backward", "all_reduce", r, (r + 1) % world, per_rank) for r in range(world)]


def table_flows(so: ShardingOption, world: int, local: int, batch: int) -> list[Flow]:
    """Every transfer one step of this table makes, rank to rank (see the module docstring)."""
    kind = so.sharding_type
    if world == 1:
        return []
    if kind in ("table_wise", "column_wise", "table_column_wise"):
        return _to_shards(so, world, batch)
    if kind == "row_wise":
        return _row_wise(so, world, batch)
    if kind in ("table_row_wise", "grid_shard"):
        return _host_row_wise(so, world, local, batch)
    if kind == "data_parallel":
        return _data_parallel(so, world)
    raise ValueError(f"no traffic model for sharding type {kind!r} (table {so.name})")


def _traffic(flows: list[Flow], local: int) -> list[dict[str, Any]]:
    """Flows summed per (phase, collective), split within_host / cross_host; self-sends out."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for phase, collective, src, dst, n in flows:
        if src == dst:
            continue
        where = "within_host" if src // local == dst // local else "cross_host"
        entry = out.setdefault((phase, collective), {"within_host": 0.0, "cross_host": 0.0})
        entry[where] += n
    order = {"input_dist": 0, "forward": 1, "backward": 2}
    return [
        {"phase": p, "collective": c, **{k: round(v) for k, v in sums.items()}}
        for (p, c), sums in sorted(out.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))
    ]


BUFFERS = ("ids_all_to_all", "all_to_all", "reduce_scatter", "all_gather", "all_reduce")


def send_buffers(flows: list[Flow], world: int) -> list[dict[str, int]]:
    """Per rank, bytes of send buffer per step by collective (BUFFERS), self-sends included."""
    out = [dict.fromkeys(BUFFERS, 0.0) for _ in range(world)]
    for phase, collective, src, dst, n in flows:
        key = "ids_all_to_all" if phase == "input_dist" else collective
        if collective == "all_gather":  # one chunk to every member: its copy to itself is it
            out[src][key] += n if src == dst else 0
        elif collective == "all_reduce":  # a ring step carries 2 (W-1)/W of the buffer
            out[src][key] += n * world / (2 * (world - 1))
        else:
            out[src][key] += n
    return [{k: round(v) for k, v in rank.items()} for rank in out]


def _memory(used: int, capacity: int, available: int) -> dict[str, int]:
    return {"used": used, "available": available, "capacity": capacity}


def _rank_stats(capture: PlanCapture, topology: Topology) -> list[dict[str, Any]]:
    local = topology.local_world_size
    reserved = capture.reserved or topology
    ranks = []
    for r, device in enumerate(topology.devices):
        shards = [s for so in capture.best_plan for s in so.shards if s.rank == r]
        perf = {"compute": 0.0, "input_dist": 0.0, "forward_comms": 0.0, "backward_comms": 0.0}
        for s in shards:
            perf["compute"] += s.perf.fwd_compute + s.perf.bwd_compute + s.perf.prefetch_compute
            perf["input_dist"] += s.perf.input_dist_comms
            perf["forward_comms"] += s.perf.fwd_comms
            perf["backward_comms"] += s.perf.bwd_comms
        perf["total"] = sum(perf.values())
        avail = reserved.devices[r].storage
        ranks.append({
            "rank": r,
            "host": r // local,
            "device_memory": _memory(sum(s.storage.hbm for s in shards), device.storage.hbm,
                                     avail.hbm),
            "host_memory": _memory(sum(s.storage.ddr for s in shards), device.storage.ddr,
                                   avail.ddr),
            "time_ms": perf,
        })  # fmt: skip
    return ranks


def _host_totals(ranks: list[dict], flows: list[Flow], local: int) -> list[dict[str, Any]]:
    hosts: dict[int, dict[str, Any]] = {}
    for r in ranks:
        h = hosts.setdefault(r["host"], {"host": r["host"], "ranks": [], "device_memory_used": 0,
                                         "host_memory_used": 0, "sent_within_host": 0.0,
                                         "sent_cross_host": 0.0})  # fmt: skip
        h["ranks"].append(r["rank"])
        h["device_memory_used"] += r["device_memory"]["used"]
        h["host_memory_used"] += r["host_memory"]["used"]
    for _, _, src, dst, n in flows:
        if src != dst:
            key = "sent_within_host" if src // local == dst // local else "sent_cross_host"
            hosts[src // local][key] += n
    for h in hosts.values():
        h["sent_within_host"], h["sent_cross_host"] = (round(h["sent_within_host"]),
                                                       round(h["sent_cross_host"]))  # fmt: skip
    return [hosts[k] for k in sorted(hosts)]


def plan_report(plan, capture: PlanCapture, topology_cfg: dict[str, Any],
                cfg: RecConfig | None = None, measure: bool = True) -> dict[str, Any]:  # fmt: skip
    """Everything `rec plan --json` prints: plan rows with traffic, ranks, hosts, totals, and
    with `cfg` the step and memory per rank this CPU's calibration estimates (train.
    plan_estimate; `calibrated`, None if not calibrated and not `measure`)."""
    topology = capture.topology
    assert topology is not None, "the planner did not report (no shardable tables?)"
    world, local, batch = topology.world_size, topology.local_world_size, capture.batch_size
    by_name = {so.name: so for so in capture.best_plan}
    tables, all_flows = [], []
    for row in plan_rows(plan):
        so = by_name[row["table"]]
        flows = table_flows(so, world, local, batch)
        all_flows += flows
        tables.append({**row, "ids_per_sample": sum(so.input_lengths),
                       "traffic": _traffic(flows, local)})  # fmt: skip
    ranks = _rank_stats(capture, topology)
    buffers = send_buffers(all_flows, world)
    for rank, sends in zip(ranks, buffers, strict=True):
        rank["send_buffer_bytes"] = sends
    calibrated = None
    if cfg is not None:
        from rec.train.plan_estimate import estimate

        calibrated = estimate(cfg, capture.best_plan, world, local, batch,
                              [sum(b.values()) for b in buffers], measure)  # fmt: skip
    return {
        "world_size": world,
        "local_world_size": local,
        "hosts": world // local,
        "batch_size_per_rank": batch,
        "compute_device": topology.compute_device,
        "topology": topology_cfg,
        # TorchRec's planner's (its perf model: a GPU's bandwidths); `calibrated` has this CPU's
        "estimated_step_ms": max(r["time_ms"]["total"] for r in ranks),
        "calibrated": calibrated,
        "tables": tables,
        "ranks": ranks,
        "host_totals": _host_totals(ranks, all_flows, local),
    }


def _table(header: tuple[str, ...], lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    return "\n".join(out + [fmt.format(*line) for line in lines])


def _gib(n: float) -> str:
    return f"{n / GIB:.3f}"


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps them >= 1 (refusals name small and big)."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} bytes"


def _bytes(n: float) -> str:
    return f"{n:,.0f}"


def format_report(report: dict[str, Any]) -> str:
    """The report as text: the plan's memory, time and traffic tables (what `rec plan` prints)."""
    r = report
    cal = r.get("calibrated")
    step = (f"estimated step (slowest rank) on this CPU: {cal['step_ms']:.3g} ms" if cal else
            "no calibration of this CPU")  # fmt: skip
    out = [f"{r['world_size']} ranks = {r['hosts']} host(s) x {r['local_world_size']}, "
           f"{r['batch_size_per_rank']} samples per rank per step, {r['compute_device']}; "
           f"{step}", ""]  # fmt: skip
    out += [format_plan(r["tables"]), ""]
    if cal:
        out += [format_calibrated(cal), ""]
    out.append(
        "TorchRec's planner's own numbers (its perf model is a GPU's bandwidths, not this "
        f"CPU's: {r['estimated_step_ms']:.3g} ms a step; memory: its shards only)"
    )
    out.append(_table(
        ("rank", "host", "host mem GiB used/avail", "device mem GiB used/avail", "compute ms",
         "ids a2a ms", "fwd comms ms", "bwd comms ms", "total ms"),
        [(str(k["rank"]), str(k["host"]),
          f"{_gib(k['host_memory']['used'])}/{_gib(k['host_memory']['available'])}",
          f"{_gib(k['device_memory']['used'])}/{_gib(k['device_memory']['available'])}",
          *(f"{k['time_ms'][f]:.3g}" for f in ("compute", "input_dist", "forward_comms",
                                               "backward_comms", "total")))
         for k in r["ranks"]]))  # fmt: skip
    lines = [(t["table"], t["sharding_type"], x["phase"], x["collective"],
              _bytes(x["within_host"]), _bytes(x["cross_host"]))
             for t in r["tables"] for x in t["traffic"]]  # fmt: skip
    if lines:
        out += ["", "bytes per step (ids per sample as the planner assumes: 1 unless constrained)"]
        out.append(_table(("table", "sharding type", "phase", "collective", "within host",
                           "cross host"), lines))  # fmt: skip
    out += ["", _table(
        ("host", "ranks", "host mem GiB", "device mem GiB", "sent within host", "sent cross host"),
        [(str(h["host"]), ",".join(map(str, h["ranks"])), _gib(h["host_memory_used"]),
          _gib(h["device_memory_used"]), _bytes(h["sent_within_host"]),
          _bytes(h["sent_cross_host"])) for h in r["host_totals"]])]  # fmt: skip
    return "\n".join(out)


STEP_PARTS = ("loop", "data", "embeddings", "dense", "optimizer", "communication")
MEMORY_PARTS = ("process", "tables_and_optimizer", "dense", "activations", "data")


def format_calibrated(cal: dict[str, Any]) -> str:
    """The calibrated step and memory per rank (train.plan_estimate), part by part."""
    ids = cal.get("ids_per_feature")
    load = cal.get("load_avg")
    head = (f"this CPU's estimate ({cal['cpu']}, calibrated {cal['measured_at']}"
            f"{f' at load average {load:.1f}' if load is not None else ''}: "
            f"{cal['calibration']}, rec plan --calibrate measures again; ids per sample per "
            f"feature {f'{ids:.2f}, measured' if ids else 'as planned'}; the README's rec plan "
            "says what is measured)")  # fmt: skip
    rows = [(str(k), f"{x['step_ms']['total']:.1f}",
             *(f"{x['step_ms'][p]:.2f}" for p in STEP_PARTS),
             f"{_gib(x['memory_bytes']['total'])}",
             *(_gib(x["memory_bytes"][p]) for p in MEMORY_PARTS))
            for k, x in enumerate(cal["ranks"])]  # fmt: skip
    header = ("rank", "step ms", *(f"{p} ms" for p in STEP_PARTS), "memory GiB",
              *(f"{p} GiB" for p in MEMORY_PARTS))  # fmt: skip
    return head + "\n" + _table(header, rows)


_KINDS = (("hbm", "device memory", "device_memory_gib"), ("ddr", "host memory", "host_memory_gib"))


def _least_storage(search_space: list[ShardingOption]) -> dict[str, tuple[int, int]]:
    """Per memory kind: (total, largest shard) of each table's smallest option, summed/maxed."""
    best: dict[str, ShardingOption] = {}
    for so in search_space:
        total = sum(s.storage.hbm + s.storage.ddr for s in so.shards)
        if so.name not in best or total < sum(s.storage.hbm + s.storage.ddr
                                               for s in best[so.name].shards):  # fmt: skip
            best[so.name] = so
    shards = [s for so in best.values() for s in so.shards]
    return {k: (sum(getattr(s.storage, k) for s in shards),
                max((getattr(s.storage, k) for s in shards), default=0))
            for k, _, _ in _KINDS}  # fmt: skip


def refusal(cfg: RecConfig, planner, error: PlannerError) -> str:
    """Why no plan fits, per rank: the least memory a rank needs against what it has.

    TorchRec's error names global totals only; the per-shard estimates it planned with are in
    its enumerator's search space (planner._enumerator, not public API in torchrec 1.8.0)."""
    capture = planner_capture(planner)
    topology = capture.topology or planner._topology
    reserved = (capture.reserved or topology).devices[0].storage
    world = topology.world_size
    least = _least_storage(planner._enumerator.last_stored_search_space or [])
    for kind, label, knob in _KINDS:
        total, largest = least[kind]
        needed, available = max(-(-total // world), largest), getattr(reserved, kind)
        if needed > available:
            topo = cfg.sharding.topology
            return (
                f"the sharding plan cannot fit: each of the {world} ranks needs at least "
                f"{_size(needed)} of {label} ({_size(total)} of tables, optimizer state and "
                f"buffers over {world} ranks; the largest shard, which one rank must hold, is "
                f"{_size(largest)}), but a rank has {_size(available)} "
                f"(sharding.topology.{knob}={getattr(topo, knob)!r}, reserve "
                f"{topo.storage_reserve_percent:g}% of device memory); use more ranks, "
                f"smaller tables, or raise {knob} if the machines have more"
            )
    first = str(error).strip().splitlines()[0]
    return f"TorchRec's planner found no plan under the sharding constraints: {first}"


def plan_or_refuse(cfg: RecConfig, model: nn.Module, world_size: int,
                   compute_device: str = "cpu"):  # fmt: skip
    """Plans `model` in this process; a plan that cannot fit is a ResourceError with numbers.

    Returns the ShardingPlan and the planner's PlanCapture (see plan_report)."""
    planner = make_planner(cfg, world_size, compute_device)
    try:
        plan = planner.plan(model, make_sharders())
    except PlannerError as e:
        raise ResourceError(refusal(cfg, planner, e)) from None
    return plan, planner_capture(planner)


def check_plan_fits(cfg: RecConfig, world_size: int) -> None:
    """`rec train` before launch: the planner must find a plan for this many ranks. Also
    makes sure this CPU's calibration and the config's data probe are cached, for the ranks'
    estimate at the end of the run (a rank never measures: its peers would slow it)."""
    from rec.model import TrainModel, build_model
    from rec.train import calibration
    from rec.train.plan_estimate import cached_probe

    plan_or_refuse(cfg, TrainModel(build_model(cfg, "meta")), world_size)
    calibration.load(cfg.training.embedding_optimizer, cfg.training.dense_optimizer)
    cached_probe(cfg, measure=True)


def plan_report_for(config: Path | None, world_size: int, local_world_size: int | None = None,
                    calibrate: bool = False, quiet: bool = False):  # fmt: skip
    """The library function behind `rec plan`: load, plan (or refuse), report. This CPU's
    calibration is measured first if not cached, or if `calibrate`; its progress lines go to
    stderr unless `quiet`."""
    import dataclasses

    from rec.config import load_config
    from rec.model import TrainModel, build_model
    from rec.train import calibration

    cfg = load_config(config)
    if local_world_size:
        cfg.sharding.topology.local_world_size = local_world_size
    elif not cfg.sharding.topology.local_world_size:
        cfg.sharding.topology.local_world_size = world_size  # one host, not the caller's env
    plan, capture = plan_or_refuse(cfg, TrainModel(build_model(cfg, "meta")), world_size)
    t = cfg.training
    calibration.load(t.embedding_optimizer, t.dense_optimizer, force=calibrate,
                     progress=(lambda _: None) if quiet else None)  # fmt: skip
    return plan_report(plan, capture, dataclasses.asdict(cfg.sharding.topology), cfg)
