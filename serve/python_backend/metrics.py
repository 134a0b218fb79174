"""The custom metrics of rec's Triton model, with rec-server's names, over a metric sink.

A sink is `families(name, description, kind) -> family`, and `family.metric(labels)` a value
with increment(n) and set(v). Inside tritonserver the adapter's sink makes Triton's metric
families (served on /metrics); MemoryMetrics keeps them in the process, for tests and for use
outside Triton. Every family is kept referenced here: Triton drops a family's metrics when the
family is collected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

COUNTER, GAUGE = "counter", "gauge"
OUTCOMES = ("applied", "skipped", "other_run", "unknown_table", "row_format", "id_range",
            "backwards", "malformed", "slot_range", "id_held", "map_mismatch")  # fmt: skip
"""What became of a log entry: rec-server's rec_update_records_total outcomes."""


class Family(Protocol):
    def metric(self, labels: dict[str, str]) -> Any: ...


Sink = Callable[[str, str, str], Family]


class Value:
    """One metric of MemoryMetrics."""

    def __init__(self) -> None:
        self.value = 0.0

    def increment(self, n: float) -> None:
        self.value += n

    def set(self, v: float) -> None:
        self.value = v


class MemoryFamily:
    def __init__(self, description: str, kind: str) -> None:
        self.description, self.kind = description, kind
        self.metrics: dict[frozenset, Value] = {}

    def metric(self, labels: dict[str, str]) -> Value:
        return self.metrics.setdefault(frozenset(labels.items()), Value())


class MemoryMetrics:
    """A sink that keeps the metrics in this process: value(name, **labels) reads one."""

    def __init__(self) -> None:
        self.families: dict[str, MemoryFamily] = {}

    def __call__(self, name: str, description: str, kind: str) -> MemoryFamily:
        return self.families.setdefault(name, MemoryFamily(description, kind))

    def value(self, name: str, **labels: str) -> float | None:
        """The metric's value, None when it was never declared."""
        family = self.families.get(name)
        metric = family and family.metrics.get(frozenset(labels.items()))
        return None if metric is None else metric.value


class StoreMetrics:
    """The embedding store's metrics of one model version (not rec_store_node_requests_total:
    redis-py's cluster client does not say which node got what). Updated after each batch from
    the reader's counters."""

    COUNTERS = {
        "cache_hits": ("rec_store_cache_hits_total", "Embedding store rows found in the row cache"),
        "cache_misses": ("rec_store_cache_misses_total", "Rows read from the store"),
        "lookups": ("rec_store_lookups_total", "Batches that read rows from the store"),
        "lookup_us": ("rec_store_lookup_us_total", "Time those batches waited for the store"),
        "failed_lookups": ("rec_store_failed_lookups_total",
                           "Batches refused for the store: unavailable, or a row missing"),
        "refreshed_rows": ("rec_store_cache_refreshed_rows_total",
                           "Rows of stored tables the update log wrote into the row cache"),
    }  # fmt: skip

    def __init__(self, families: Sink, name: str, version: str, capacity: int) -> None:
        labels = {"model": name, "version": str(version)}
        self.families = [families(n, h, COUNTER) for n, h in self.COUNTERS.values()]
        self.counters = {k: f.metric(labels)
                         for k, f in zip(self.COUNTERS, self.families, strict=True)}  # fmt: skip
        self.families += [
            families("rec_store_cache_bytes", "Bytes the row cache holds", GAUGE),
            families("rec_store_cache_capacity_bytes", "The row cache's bound", GAUGE),
        ]
        self.cache_bytes = self.families[-2].metric(labels)
        self.capacity = self.families[-1].metric(labels)  # kept, as every metric here
        self.capacity.set(capacity)
        self.seen = dict.fromkeys(self.COUNTERS, 0)

    def update(self, reader) -> None:
        stats = vars(reader.stats) | {"lookup_us": reader.stats.lookup_ns // 1000}
        for key, metric in self.counters.items():
            if stats[key] > self.seen[key]:
                metric.increment(stats[key] - self.seen[key])
                self.seen[key] = stats[key]
        self.cache_bytes.set(reader.cache.bytes if reader.cache is not None else 0)


class UpdateMetrics:
    """The update log's metrics of one model version: rec_update_records_total{outcome},
    rec_update_rows_applied_total, rec_update_watermark_step, rec_update_watermark_wall_ms,
    rec_update_log_connected, rec_update_watermark_held_by (the partition holding the
    watermark back, -1: none) and rec_update_partition_silent_ms{partition}."""

    def __init__(self, families: Sink, name: str, version: str) -> None:
        labels = {"model": name, "version": str(version)}
        self.families = {
            "records": families("rec_update_records_total",
                                "update log entries by what became of them", COUNTER),
            "rows": families("rec_update_rows_applied_total",
                             "rows the update log wrote into the tables", COUNTER),
            "step": families("rec_update_watermark_step", "the embedding watermark's step", GAUGE),
            "wall": families("rec_update_watermark_wall_ms",
                             "when the watermark's step ended (ms since the epoch)", GAUGE),
            "connected": families("rec_update_log_connected",
                                  "1 while the update log's broker answers", GAUGE),
            "held_by": families("rec_update_watermark_held_by",
                                "the partition holding the watermark back (-1: none)", GAUGE),
            "silent": families("rec_update_partition_silent_ms",
                               "time since a partition's newest record was read", GAUGE),
        }  # fmt: skip
        self.labels = labels
        self.records = {o: self.families["records"].metric({**labels, "outcome": o})
                        for o in OUTCOMES}  # fmt: skip
        self.single = {k: self.families[k].metric(labels)
                       for k in ("rows", "step", "wall", "connected", "held_by")}  # fmt: skip
        self.single["step"].set(-1)  # as rec-server: -1 until a record is applied
        self.single["held_by"].set(-1)

    def count(self, outcome: str) -> None:
        self.records[outcome].increment(1)

    def set(self, name: str, value: float) -> None:
        self.single[name].set(value)

    def watch(self, held_by: int, silent_ms: dict[int, float]) -> None:
        """The partition holding the watermark back and each partition's silence."""
        self.single["held_by"].set(held_by)
        for partition, ms in silent_ms.items():
            labels = {**self.labels, "partition": str(partition)}
            self.families["silent"].metric(labels).set(ms)

    def applied(self, rows: int, mark) -> None:
        self.single["rows"].increment(rows)
        self.single["step"].set(mark[1])
        self.single["wall"].set(mark[2] // 1_000_000)


class NegativeIds:
    """rec_questionable_ids_total{reason="negative"} per sparse feature, as rec-server counts
    them: negative integer tokens of `sparse_strings` requests. (Ids sent as `sparse_values`
    are encoded already, where a hashed string is negative half the time: not counted.) And
    {reason="unknown"}: ids of a ZCH feature that the model's map does not hold (count_unknown)."""

    def __init__(self, families: Sink, model: str, version: str, spec) -> None:
        self.spec = spec
        self.family = families(
            "rec_questionable_ids_total",
            "Sparse values the model maps but may not expect, by feature and reason "
            "(negative: a negative integer token, mapped by modulo; unknown: an id of a ZCH "
            "table that its map does not hold, read as the default row; a modulo table has no "
            "id memory, so its unseen ids are not counted: use ids: zch)",
            COUNTER,
        )
        self.labels = {"model": model, "version": str(version)}
        labels = {**self.labels, "reason": "negative"}
        self.counters = {s.name: self.family.metric({**labels, "feature": s.name})
                         for s in spec.sparse if s.encoding == "int_or_hash"}  # fmt: skip
        self.unknown = {}

    def count(self, lengths, tokens, spec=None) -> None:
        """A string request's negative tokens; `spec` holds lengths' columns (a context
        model's side: a subset of the model's features, by name), the model's by default."""
        for name, n in (spec or self.spec).negative_counts(lengths, tokens).items():
            if n:
                self.counters[name].increment(n)

    def count_unknown(self, per_column) -> None:
        """A forward's unknown ids per request column (rec::zch_take_unknowns; -1: not a ZCH
        feature). Counting 0 declares the feature, as rec-server does."""
        for s, n in zip(self.spec.sparse, per_column, strict=False):
            if n >= 0 and s.name not in self.unknown:
                labels = {**self.labels, "reason": "unknown", "feature": s.name}
                self.unknown[s.name] = self.family.metric(labels)
            if n > 0:
                self.unknown[s.name].increment(n)


def batch_variant(families: Sink, name: str, version: str, variant: bool) -> tuple:
    """rec_model_batch_variant: 1 when the version fails the load-time batch probe. Returns
    the family and the metric, which the caller keeps."""
    what = "1 when the served version fails the load-time batch probe"
    family = families("rec_model_batch_variant", what, GAUGE)
    metric = family.metric({"model": name, "version": str(version)})
    metric.set(1 if variant else 0)
    return family, metric
