"""`rec export --store URL`: the chosen tables' rows into the embedding store (rec.contract.store)
as export streams them out of the checkpoint, after saying what the store will hold.

Which tables: export.store.tables, or every table whose stored size is export.store.min_bytes
or more. Before any row is written export prints the memory the store needs (rec.store.plan) in
all and per master, and refuses when a master's maxmemory cannot hold its share.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rec.config import RecConfig
from rec.contract import store as contract
from rec.resources import size
from rec.store.plan import chosen_tables, per_node, table_cost
from rec.store.writer import StoreSink

Log = Any


def run_tag(run: Path) -> str:
    """8 hex digits naming the run (its directory's resolved path): part of the key prefix."""
    return hashlib.sha1(str(run.resolve()).encode()).hexdigest()[:8]


def _masters(client) -> list[tuple[str, int | None]]:
    """(address, maxmemory or None) of each master."""
    out = []
    for node in client.get_primaries():
        r = client.get_redis_connection(node)
        limit = int(r.config_get("maxmemory").get("maxmemory", 0))
        out.append((f"{node.host}:{node.port}", limit or None))
    return out


def open_sink(cfg: RecConfig, dtypes: dict[str, str], model: str, version: int, run: Path,
              log: Log, maps: dict[str, Any] | None = None) -> StoreSink | None:  # fmt: skip
    """The store's sink for this export (None without export.store.url), after the plan.
    `maps`: the ZCH tables' id maps (rec.export.id_maps.read_maps), which key a stored ZCH
    table's rows by raw id."""
    sc = cfg.export.store
    if not sc.url:
        return None
    tables = chosen_tables(cfg, dtypes)
    if not tables:
        log(f"store: no table of {size(sc.min_bytes)} stored ({sc.min_bytes} bytes) or more, "
            "export.store.min_bytes; every table stays in the model (export.store.tables: "
            "[NAME, ...] in a --config file names the tables to store)")  # fmt: skip
        return None
    if cfg.export.format != "torchscript" or cfg.model.factory:
        raise contract.StoreError(
            f"export.store: tables {', '.join(tables)} would go to the embedding store, which "
            "serves TorchScript models of rec's own architectures for now (export.format "
            f"is {cfg.export.format!r}{', a model.factory' if cfg.model.factory else ''})"
        )
    prefix = contract.prefix(model, version, run_tag(run))
    sink = StoreSink(sc.url, prefix, tables, maps)
    masters = _masters(sink.client)
    total = sum(table_cost(t["rows"], t["dim"], t["dtype"], t["partitions"],
                           contract.is_raw_keyed(t)).bytes
                for t in tables.values())  # fmt: skip
    share = per_node(total, len(masters), 0)
    # From CLUSTER NODES: a replica joins CLUSTER SLOTS (redis-py's get_replicas) only once it
    # has synced with its master, seconds after the cluster was made.
    replicas = sum("slave" in n["flags"] and "fail" not in n["flags"]
                   for n in sink.client.cluster_nodes().values())  # fmt: skip
    log(f"store: {len(tables)} tables ({', '.join(tables)}) into {sc.url} under {prefix!r}: "
        f"{size(total)} of Redis memory per copy, {size(share)} per master "
        f"({len(masters)} masters" + (f", {replicas} replicas, each holding its master's share "
        "again)" if replicas else ", no replicas)"))  # fmt: skip
    for address, limit in masters:
        if limit is not None and limit < share:
            sink.close()
            raise contract.StoreError(
                f"store: master {address} has maxmemory {limit} bytes, "
                f"less than its share {share}: add masters or memory"
            )
    return sink


def section(sink: StoreSink) -> dict[str, Any]:
    return contract.section(sink.url, sink.prefix, sink.tables)
