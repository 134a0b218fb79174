"""Triton Python-backend model that serves rec's exported TorchScript `model.pt`.

Copied as `<staging>/<model>/<version>/model.py` by rec.serve.triton; runs inside Triton's
`triton_python_backend_stub`, with the venv's packages (torch, fbgemm_gpu). It stands in for the
pytorch_libtorch backend, which nvidia-pytriton's tritonserver does not ship, and serves the same
inputs and outputs (docs/architecture.md#model-io). The path of model.pt comes from the config
parameter `model_path`, so the user's repository is read, never copied or changed.

Like the recommended Triton backend: requests that Triton's dynamic batcher hands over together
are validated one by one (an error goes to its own request), concatenated into one batch (valid
because the input is batch-major jagged), run once, and the scores sliced back per request.

A request may carry its ids as strings (`sparse_strings`, BYTES) instead of `sparse_values`; they
are mapped with the model's feature spec by rec.features, the code the training readers use.

Fresh embeddings (docs/update_log.md, Contract 3): when the version's rec.json has an `updates`
section, a daemon thread reads the update log (rec.update_log.LogReader, from entry "0") and
writes the rows of the records after the export's (gen, step) into model.pt's TBE storage
buffers in place, as rec-server does. The log's URL is rec.json's `updates.url`, or the config
parameter `updates_url` (rec-server's `--updates URL|none`: a URL overrides it, `none` turns the
log off); rec.serve.triton.start_triton(updates=...) writes that parameter. The rules are
rec.update_log.Applier's, which are rec-server's (a record is applied whole or refused whole:
other run, unknown table, wrong dtype or dim, id out of range, backwards, malformed), the writer is
rec.update_log.write_rows. A ZCH table's id map changes (format version 2) are checked by the same
rules (slot_range, id_held, map_mismatch) and written into model.pt's map buffers
(rec.json "zch.tables.<t>.buffers") with the rows, under the same lock. A forward pass and the
applying of a record exclude each other, so a batch never sees a half-written row, nor a slot's
new id with its old row. The counts and the watermark are Triton custom metrics
(rec-server's names): rec_update_records_total{outcome}, rec_update_rows_applied_total,
rec_update_watermark_step, rec_update_watermark_wall_ms, rec_update_log_connected. Each model
instance (its own stub process) keeps its own copy of the tables and its own reader.

Stored tables (docs/store.md, Contract 4): when the version's rec.json has a `store` section, its
large tables are in a Redis Cluster and model.pt's plain forward refuses to run. initialize opens
a rec.store.reader.StoreReader on the section (a store that cannot be reached, or that holds no
finished export under the version's prefix, fails the load naming the store, and
rec.serve.triton retries such a load every 2 s), and every batch, the load-time batch probe's
included, is scored as rec-server does: store_ids, the rows through the reader's row cache
(`store_cache_bytes`; the misses read with one pipelined HMGET per partition),
forward_with_rows. A row the store does not have, or one of the wrong size, fails the batch
with an error naming the row (INTERNAL); a store that does not answer fails it naming the store
(UNAVAILABLE). Never a zero row. The update log writes the in-process tables, and its rows of
stored tables go into the row cache. The retries after a moved slot or a lost node are redis-py's
cluster client's own, not rec-server's 3 s.

Not done here, unlike rec-server: responses do NOT carry the embedding watermark
(`embedding_watermark_gen`, `_step`, `_wall_ns`). This Triton's (2.51) Python backend cannot set
response parameters: its pb_utils.InferenceResponse takes only `output_tensors` and `error`
(passing `parameters=` fails with "incompatible constructor arguments"), so a client learns the
watermark from /metrics only, not per response. Also missing: `--updates-max-behind-s` (a Python
model cannot make Triton's ready routes answer not ready) and the log for an AOTInductor
version (model.pt2 is served export-fresh).
"""

import contextlib
import json
import os
import threading
from collections import Counter

import fbgemm_gpu  # noqa: F401  (registers the torch.ops.fbgemm kernels model.pt calls)
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, the dense layers model.pt calls)
from rec import batch_probe
from rec.contract import DENSE, LENGTHS, SCORES, STRINGS, VALUES, ManifestError
from rec.contract.repository import read_version_manifest
from rec.contract.store import StoreError, check_section, meta_key
from rec.contract.updates import UpdateError, parse_url, row_bytes
from rec.cpu import cpu_info, describe
from rec.features import FeatureSpec, TokenError
from rec.malloc import keep_freed_memory
from rec.update_log import Applier, LogReader, ServedMap, ServedTable, write_rows

STORE_CACHE_PARAMETER = "store_cache_bytes"
"""Config parameter: the row cache's bound in bytes (rec-server's --store-cache-bytes)."""
DEFAULT_STORE_CACHE = 256 << 20
UPDATES_PARAMETER = "updates_url"
"""Config parameter overriding rec.json's `updates.url`: a redis:// URL, or `none`."""
STORE_RETRY_NOTE = "the load is retried every 2 s"
"""Ends a load failure that the launcher retries (rec.serve.triton.STORE_RETRY_NOTE)."""
OUTCOMES = ("applied", "skipped", "other_run", "unknown_table", "row_format", "id_range",
            "backwards", "malformed", "slot_range", "id_held", "map_mismatch")  # fmt: skip
"""What became of a log entry: rec-server's rec_update_records_total outcomes."""
_BLOCK_MS = 300  # how long one XREAD waits for news; bounds how long finalize() waits
_BATCH_ENTRIES = 256


def _invalid(message):
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    )


def _check(dense, lengths, values, max_rows, values_name=VALUES):
    """Message for what Triton's own shape checks cannot see (the jagged pair), or None.

    Messages match the C++ server's (cpp/src/model/request.cpp), so clients see one wording.
    """
    if dense.shape[0] < 1:
        width = dense.shape[1]
        return f"input '{DENSE}': expected shape [B,{width}] with B >= 1, got [0,{width}]"
    if 0 < max_rows < dense.shape[0]:
        return f"input '{DENSE}': batch size {dense.shape[0]} exceeds max_batch_size {max_rows}"
    if dense.shape[0] != lengths.shape[0]:
        return (
            f"input '{LENGTHS}': batch size {lengths.shape[0]} differs from other inputs' "
            f"{dense.shape[0]}"
        )
    bad = np.argwhere(~np.isfinite(dense))
    if bad.size:
        r, c = (int(x) for x in bad[0])
        what = "nan" if np.isnan(dense[r, c]) else ("inf" if dense[r, c] > 0 else "-inf")
        return f"input '{DENSE}': value {what} at [{r}, {c}]: every value must be a finite number"
    negative = np.flatnonzero(lengths.reshape(-1) < 0)
    if negative.size:
        i = int(negative[0])
        return f"input '{LENGTHS}': negative length {int(lengths.reshape(-1)[i])} at flat index {i}"
    total = int(lengths.sum(dtype=np.int64))
    if values.size != total:
        return f"input '{values_name}': has {values.size} values but sum of '{LENGTHS}' is {total}"
    return None


class StoreUnavailable(StoreError):
    """The store did not answer (a node down or unreachable, the cluster down, a timeout)."""


class StoreRows:
    """The stored tables of a tiered model (rec.export.tiered) behind a rec.json `store`
    section: rows(lengths, values) are the batch's rows, store_ids' keys read through a
    rec.store.reader.StoreReader, for forward_with_rows. Opening it checks that the store
    answers and holds a finished export under the section's prefix (its meta hash)."""

    def __init__(self, model, section, cache_bytes=0, raw_columns=()):
        from rec.store.reader import StoreReader  # loaded only for a version with a store

        check_section(section)
        self.model, self.url = model, section["url"]
        # Per request column: its stored table's index when keyed by raw id (ZCH), else -1;
        # the raw ids the store lacked are counted per column, per thread, as unknown ids.
        self.raw_columns = list(raw_columns)
        self.unknown = threading.local()
        try:
            self.reader = StoreReader(section, cache_bytes)
        except StoreError as e:  # "store URL: cannot reach the cluster (...)"
            why = str(e).removeprefix(f"store {self.url}: ")
            raise StoreUnavailable(f"embedding store {self.url} unreachable: {why}") from None
        try:
            finished = self.reader.client.exists(meta_key(section["prefix"]))
        except Exception as e:
            self.reader.close()
            raise self._unavailable(e) from None
        if not finished:
            self.reader.close()
            raise StoreUnavailable(f"embedding store {self.url}: no finished export under "
                                   f"'{section['prefix']}' (its meta hash is missing)")  # fmt: skip

    def rows(self, lengths, values):
        keys = self.model.store_ids(lengths, values)
        defaulted = [] if any(t >= 0 for t in self.raw_columns) else None
        try:
            rows = self.reader.rows(keys, defaulted)
        except StoreError as e:  # a row missing or of the wrong size: the reader names it
            raise StoreError(f"embedding {e}" if str(e).startswith("store ") else str(e)) from None
        except Exception as e:
            raise self._unavailable(e) from None
        if defaulted is not None:
            self.unknown.per_column = self._count(lengths, values, set(defaulted))
        return rows

    def _count(self, lengths, values, lacked):
        """Per request column, its ids whose (table, raw id) is in `lacked` (-1: not a stored
        ZCH table's column)."""
        cols = len(self.raw_columns)
        column = np.arange(lengths.numel()) % cols
        owner = np.repeat(column, lengths.reshape(-1).numpy())
        table = np.asarray(self.raw_columns)[owner]
        ids = values.numpy()
        out = [0 if t >= 0 else -1 for t in self.raw_columns]
        for k in np.flatnonzero(table >= 0).tolist():
            if (int(table[k]), int(ids[k])) in lacked:
                out[owner[k]] += 1
        return out

    def take_unknown(self):
        """The unknown ids per column counted on this thread since the last take (or [])."""
        out = getattr(self.unknown, "per_column", [])
        self.unknown.per_column = []
        return out

    def _unavailable(self, e):
        from redis.exceptions import RedisClusterException, RedisError

        if not isinstance(e, (RedisError, RedisClusterException, OSError)):
            return e  # not the store's: raised as it is
        return StoreUnavailable(f"embedding store {self.url} unavailable: {type(e).__name__}: {e}")

    def close(self):
        self.reader.close()


def _raw_columns(manifest):
    """Per request column (manifest.sparse_names), the index (store order) of its stored table
    when that is keyed by raw id (a ZCH table, rec.store/2), else -1."""
    store = manifest.store
    order = sorted(store.tables)
    owner = {f: t["name"] for t in manifest.data.get("tables", []) for f in t.get("features", [])}
    return [order.index(owner[f]) if owner.get(f) in order and
            store.tables[owner[f]].keys == "raw_id" else -1
            for f in manifest.sparse_names]  # fmt: skip


class StoreMetrics:
    """The embedding store's Triton custom metrics of one model version, rec-server's names
    (not rec_store_node_requests_total: redis-py's cluster client does not say which node got
    what). Updated after each batch from the reader's counters."""

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

    def __init__(self, name, version, capacity):
        labels = {"model": name, "version": str(version)}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = [pb_utils.MetricFamily(n, h, counter) for n, h in self.COUNTERS.values()]
        self.counters = {k: f.Metric(labels=labels)
                         for k, f in zip(self.COUNTERS, self.families, strict=True)}  # fmt: skip
        self.families += [
            pb_utils.MetricFamily("rec_store_cache_bytes", "Bytes the row cache holds", gauge),
            pb_utils.MetricFamily("rec_store_cache_capacity_bytes", "The row cache's bound", gauge),
        ]
        self.cache_bytes = self.families[-2].Metric(labels=labels)
        self.families[-1].Metric(labels=labels).set(capacity)
        self.seen = dict.fromkeys(self.COUNTERS, 0)

    def update(self, reader):
        stats = vars(reader.stats) | {"lookup_us": reader.stats.lookup_ns // 1000}
        for key, metric in self.counters.items():
            if stats[key] > self.seen[key]:
                metric.increment(stats[key] - self.seen[key])
                self.seen[key] = stats[key]
        self.cache_bytes.set(reader.cache.bytes if reader.cache is not None else 0)


class ServedTables(Applier):
    """The loaded model's tables as the update log writes them: rec.update_log.Applier's rules,
    accepted rows written into the storage buffers (rec.update_log.write_rows). Rows of tables
    in the embedding store (`stored`, rec.json "store") are checked and count toward the
    watermark, but are not written here: the store's follower (rec.store.follow) writes them to
    the store, where every batch reads them.

    `lock` (Applier's) is held by apply() for a whole record and by a forward pass for its whole
    run: a plain mutex, not rec-server's writer-preferring reader-writer lock, because the Python
    backend runs one execute() at a time per instance (each instance is its own stub process
    with its own tables), so there are never two readers to share it, and with one reader and
    one writer that each release it after one pass or one record neither can starve the other.
    """

    def __init__(self, updates, buffers, stored=None, refresh=None, zch=None):
        places, stored = updates["tables"], stored or {}
        self.refresh = refresh  # a stored table's fresh rows into the store reader's cache
        super().__init__(
            tables={n: ServedTable(p["rows"], p["dim"], p["dtype"]) for n, p in places.items()},
            export=(int(updates.get("gen") or 0), int(updates.get("step") or 0)),
            run=updates.get("run") or "",
            stored={n: ServedTable(t["rows"], t["dim"], t["dtype"]) for n, t in stored.items()},
            maps={n: _served_map(n, t, buffers) for n, t in (zch or {}).items()},
        )
        self.places = places
        self.buffers = {}
        for name, place in places.items():
            buffer = buffers.get(place["buffer"])
            if buffer is None:
                raise ValueError(f'rec.json: "updates.tables.{name}.buffer" names '
                                 f"{place['buffer']!r}, which the model does not hold")  # fmt: skip
            size, stride = buffer.numel(), place["row_stride"]
            rowwise = place["dtype"] in ("int8", "int4")
            fits = (buffer.dtype == torch.uint8 and buffer.is_contiguous() and buffer.dim() == 1
                    and stride >= row_bytes(place["dim"], place["dtype"]) and stride > 0
                    and 0 <= place["offset"] <= size and place["rows"] >= 0
                    and place["rows"] <= (size - place["offset"]) // stride
                    and (place["scale_bias"] == "first") == rowwise)  # fmt: skip
            if not fits:
                raise ValueError(
                    f'rec.json: "updates.tables.{name}" (offset {place["offset"]}, '
                    f"{place['rows']} rows of {stride} bytes) does not fit its buffer of "
                    f"{size} bytes"
                )
            self.buffers[name] = buffer

    def write(self, rec):
        if rec.table in self.buffers:
            write_rows(self.buffers[rec.table], self.places[rec.table], rec.ids, rec.rows)
        elif self.refresh is not None:
            self.refresh(rec)


def _served_map(name, table, buffers):
    """ZCH table `name`'s id map in model.pt (rec.json "zch.tables.<name>": its buffers, keys
    and used of every lookup reading it), which the update log's map changes write in place."""
    names = table["buffers"]
    copies = []
    for keys_name in (b for b in names if b.endswith(".keys")):
        used_name = keys_name[: -len(".keys")] + ".used"
        keys, used = buffers.get(keys_name), buffers.get(used_name)
        if keys is None or used is None or used_name not in names:
            raise ValueError(f'rec.json: "zch.tables.{name}.buffers" names {keys_name!r} and '
                             f"{used_name!r}, which the model does not hold")  # fmt: skip
        slots = table["slots"]
        if (keys.dtype, used.dtype, keys.shape, used.shape) != (
            torch.int64,
            torch.bool,
            (slots,),
            (slots,),
        ):
            raise ValueError(f"ZCH table {name!r}: the model's map is not int64 and bool "
                             f"[{slots}] (zch.tables.{name}.slots)")  # fmt: skip
        copies.append((keys, used))
    if not copies:
        raise ValueError(f'rec.json: "zch.tables.{name}.buffers" names no id map')
    return ServedMap(table["probes"], copies)


class UpdateReader:
    """The daemon thread that reads the update log at `url` from entry "0" (rec.update_log.
    LogReader: XREAD BLOCK, up to _BATCH_ENTRIES entries a read; a broker that goes away or
    errors is retried from the same cursor, so nothing is lost or applied twice out of order)
    and applies each record to `tables`. Refusals are counted and the first few of each kind
    logged."""

    def __init__(self, model, url, tables, metrics):
        self.model, self.tables, self.metrics = model, tables, metrics
        self.log = LogReader(url, "0", count=_BATCH_ENTRIES, block_ms=_BLOCK_MS,
                             on_event=self._event)  # fmt: skip
        self._stop = threading.Event()
        self._logged = Counter()
        self._thread = threading.Thread(target=self._loop, name="rec-updates", daemon=True)
        self._thread.start()

    def stop(self, timeout=5.0):
        self._stop.set()
        self._thread.join(timeout)

    def _say(self, level, message):
        getattr(pb_utils.Logger, f"log_{level}")(f"model '{self.model}': {message}")

    def _event(self, kind, message):
        if kind != "error":
            self.metrics.set("connected", 1 if kind == "up" else 0)
        self._say("info" if kind == "up" else "warn", message)

    def _loop(self):
        for entries in self.log.follow(self._stop):
            for entry_id, record in entries:
                try:
                    self._take(entry_id, record)
                except Exception as e:  # the reader must outlive one bad entry
                    self._say("error", f"update log entry {entry_id}: {e!r}")

    def _take(self, entry_id, record):
        if isinstance(record, UpdateError):
            outcome, why = "malformed", str(record)
        else:
            outcome, why = self.tables.apply(record)
        self.metrics.count(outcome)
        if outcome == "applied":
            self.metrics.applied(record.count, self.tables.mark)
        elif outcome != "skipped":
            self._logged[outcome] += 1
            n = self._logged[outcome]
            if n <= 5 or n % 1000 == 0:  # a bad publisher must not flood the log
                self._say("warn", f"refused update log entry {entry_id} ({outcome}): {why}")


class NegativeIds:
    """rec_questionable_ids_total{reason="negative"} per sparse feature, as rec-server counts
    them: negative integer tokens of `sparse_strings` requests. (Ids sent as `sparse_values`
    are encoded already, where a hashed string is negative half the time: not counted.) And
    {reason="unknown"}: ids of a ZCH feature that the model's map does not hold (count_unknown)."""

    def __init__(self, model, version, spec):
        self.spec = spec
        # The family is kept: Triton drops a family's metrics when it is collected.
        self.family = pb_utils.MetricFamily(
            name="rec_questionable_ids_total",
            description="Sparse values the model maps but may not expect, by feature and reason "
            "(negative: a negative integer token, mapped by modulo; unknown: an id of a ZCH "
            "table that its map does not hold, read as the default row; a modulo table has no "
            "id memory, so its unseen ids are not counted: use ids: zch)",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.labels = {"model": model, "version": str(version)}
        labels = {**self.labels, "reason": "negative"}
        self.counters = {s.name: self.family.Metric(labels={**labels, "feature": s.name})
                         for s in spec.sparse if s.encoding == "int_or_hash"}  # fmt: skip
        self.unknown = {}

    def count(self, lengths, tokens):
        for name, n in self.spec.negative_counts(lengths, tokens).items():
            if n:
                self.counters[name].increment(n)

    def count_unknown(self, per_column):
        """A forward's unknown ids per request column (rec::zch_take_unknowns; -1: not a ZCH
        feature). Counting 0 declares the feature, as rec-server does."""
        for s, n in zip(self.spec.sparse, per_column, strict=False):
            if n >= 0 and s.name not in self.unknown:
                labels = {**self.labels, "reason": "unknown", "feature": s.name}
                self.unknown[s.name] = self.family.Metric(labels=labels)
            if n > 0:
                self.unknown[s.name].increment(n)


class UpdateMetrics:
    """The update log's Triton custom metrics of one model version (rec-server's names). The
    families are kept: Triton drops a family's metrics when it is collected."""

    def __init__(self, name, version):
        labels = {"model": name, "version": str(version)}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = {
            "records": pb_utils.MetricFamily("rec_update_records_total",
                                             "update log entries by what became of them",
                                             counter),
            "rows": pb_utils.MetricFamily("rec_update_rows_applied_total",
                                          "rows the update log wrote into the tables", counter),
            "step": pb_utils.MetricFamily("rec_update_watermark_step",
                                          "the embedding watermark's step", gauge),
            "wall": pb_utils.MetricFamily("rec_update_watermark_wall_ms",
                                          "when the watermark's step ended (ms since the epoch)",
                                          gauge),
            "connected": pb_utils.MetricFamily("rec_update_log_connected",
                                               "1 while the update log's broker answers", gauge),
        }  # fmt: skip
        self.records = {o: self.families["records"].Metric(labels={**labels, "outcome": o})
                        for o in OUTCOMES}  # fmt: skip
        self.single = {k: self.families[k].Metric(labels=labels)
                       for k in ("rows", "step", "wall", "connected")}  # fmt: skip
        self.single["step"].set(-1)  # as rec-server: -1 until a record is applied

    def count(self, outcome):
        self.records[outcome].increment(1)

    def set(self, name, value):
        self.single[name].set(value)

    def applied(self, rows, mark):
        self.single["rows"].increment(rows)
        self.single["step"].set(mark[1])
        self.single["wall"].set(mark[2] // 1_000_000)


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        path = params["model_path"]["string_value"]
        self.max_rows = int(params["max_rows"]["string_value"])
        threads = int(params.get("intra_op_threads", {}).get("string_value", "1"))
        if threads > 0:
            torch.set_num_threads(threads)
        keep_freed_memory()  # as rec-server does (rec/malloc.py: page faults on every request)
        if path.endswith(".pt2"):  # AOTInductor: tables memory-mapped, the CPU's ISA checked
            from rec.aoti_package import AotiModel

            self.model = AotiModel(os.path.dirname(path))
        else:
            self.model = torch.jit.load(path, map_location="cpu").eval()
        self.tables, self.reader = None, None  # the update log's, after the probe
        self.store = self._open_store(path, args["model_name"], args["model_version"])
        allow = params.get("allow_batch_variant", {}).get("string_value") == "true"
        self._probe_batching(path, args["model_name"], args["model_version"], allow)
        spec = params.get("feature_spec", {}).get("string_value")
        self.spec = FeatureSpec.from_dict(json.loads(spec)) if spec else None
        name, version = args["model_name"], args["model_version"]
        self.negative_ids = NegativeIds(name, version, self.spec) if self.spec else None
        self.num_tasks = int(config["output"][0]["dims"][0])
        url = params.get(UPDATES_PARAMETER, {}).get("string_value", "")
        self._start_updates(path, args["model_name"], args["model_version"], url)

    def _open_store(self, path, name, version):
        """The version's StoreRows when its rec.json has a `store` section, else None. A store
        that cannot serve fails the load, naming it."""
        manifest = read_version_manifest(os.path.dirname(path))
        if manifest is None or not manifest.has("store"):
            return None
        where = f"model '{name}' version {version}"
        if not hasattr(self.model, "store_ids"):
            raise pb_utils.TritonModelException(
                f'{where}: rec.json has a "store" section but {os.path.basename(path)} has no '
                "store_ids/forward_with_rows (not a tiered TorchScript export)"
            )
        params = json.loads(self.args["model_config"]).get("parameters", {})
        cache = int(params.get(STORE_CACHE_PARAMETER, {}).get("string_value", DEFAULT_STORE_CACHE))
        try:
            section = manifest.store
            store = StoreRows(self.model, section.to_dict(), cache, _raw_columns(manifest))
        except StoreUnavailable as e:  # not the model's fault: rec.serve.triton reloads it
            raise pb_utils.TritonModelException(f"{where}: {e}; {STORE_RETRY_NOTE}") from None
        except StoreError as e:
            raise pb_utils.TritonModelException(f"{where}: {e}") from None
        self.store_metrics = StoreMetrics(name, version, cache)
        pb_utils.Logger.log_info(
            f"{where}: tables {', '.join(sorted(section.tables))} read from embedding store "
            f"{section.url} under '{section.prefix}'"
        )
        return store

    def _start_updates(self, path, name, version, url):
        """The version's tables and their update log reader, as rec.json's "updates" and the
        `updates_url` parameter say (rec-server's `--updates`: empty takes rec.json's url)."""
        self.tables, self.reader = None, None
        manifest = read_version_manifest(os.path.dirname(path))
        try:
            updates = manifest.updates if manifest is not None else None
        except ManifestError as e:
            raise pb_utils.TritonModelException(f"model '{name}': {e}") from None
        url = url or (updates.url if updates else None) or ""
        if not url or url == "none":
            return  # no log: served as exported, with no lock taken
        try:
            parse_url(url)
        except UpdateError as e:
            raise pb_utils.TritonModelException(f"model '{name}': {e}") from None
        if not updates or path.endswith(".pt2"):
            pb_utils.Logger.log_warn(
                f"model '{name}' version {version} cannot take updates (rec's Triton model "
                'applies the update log to a TorchScript export with rec.json "updates" '
                "only); serving it as exported"
            )
            return
        try:
            stored = manifest.store.to_dict()["tables"] if manifest.has("store") else None
            refresh = self._refresh if self.store is not None else None
            zch = manifest.zch.to_dict()["tables"] if manifest.has("zch") else None
            # A stored ZCH table (keyed by raw id) has no map in model.pt: its records go into
            # the store reader's cache by the raw ids they name (rec.updates/3's `held`).
            raw = {n for n, t in (stored or {}).items() if t.get("keys") == "raw_id"}
            zch = {n: t for n, t in zch.items() if n not in raw} if zch else zch
            self.tables = ServedTables(updates.to_dict(), dict(self.model.named_buffers()),
                                       stored, refresh, zch)  # fmt: skip
            self.tables.raw_keyed = raw
        except (KeyError, ValueError) as e:
            raise pb_utils.TritonModelException(f"model '{name}': {e}") from None
        self.reader = UpdateReader(name, url, self.tables, UpdateMetrics(name, version))

    def _refresh(self, rec):
        """A stored table's record into the cache (a ZCH table's by raw id), and the metrics
        that count them (under the tables' lock, as _score's update of them is)."""
        if rec.table in self.tables.raw_keyed:
            self.store.reader.refresh_raw(rec.table, rec)
        else:
            self.store.reader.refresh(rec.table, rec.ids, rec.rows)
        self.store_metrics.update(self.store.reader)

    def finalize(self):
        if getattr(self, "reader", None) is not None:
            self.reader.stop()
        if getattr(self, "store", None) is not None:
            self.store.close()

    def _probe_batching(self, path, name, version, allow):
        """rec.json's batch probe on this CPU (rec.batch_probe): a model that scores it
        differently as one batch than one by one fails its load, or with `allow` is served with
        a warning and rec_model_batch_variant 1, as rec-server does."""
        manifest = read_version_manifest(os.path.dirname(path))
        request = batch_probe.from_manifest(manifest)
        if request is None:
            return
        try:  # the path requests take: a tiered model's rows come from the store
            diff = batch_probe.batch_variance(self._score, request)
        except StoreError as e:
            raise pb_utils.TritonModelException(
                f"model '{name}' version {version}: batch probe: {e}"
            ) from None
        # The family is kept too: Triton drops a family's metrics when it is collected.
        self._variant_family = pb_utils.MetricFamily(
            name="rec_model_batch_variant",
            description="1 when the served version fails the load-time batch probe",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        labels = {"model": name, "version": str(version)}
        self._variant_metric = self._variant_family.Metric(labels=labels)
        self._variant_metric.set(1 if diff else 0)
        if diff == 0:
            return
        verified = manifest.dense.verified_cpu
        here = describe(cpu_info())
        message = batch_probe.refusal(name, version, len(request[0]), diff, here, verified)
        if not allow:
            raise pb_utils.TritonModelException(
                message + ". Serve it anyway with --allow-batch-variant"
            )
        pb_utils.Logger.log_warn(message + "; serving it anyway (--allow-batch-variant)")

    def execute(self, requests):
        responses = [None] * len(requests)
        batch, rows = [], []  # (request index, dense, lengths, values) of valid requests
        for i, request in enumerate(requests):
            dense = pb_utils.get_input_tensor_by_name(request, DENSE).as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, LENGTHS).as_numpy()
            values, problem = self._values(request, dense, lengths)
            if problem is None:
                problem = _check(dense, lengths, values, self.max_rows)
            if problem is not None:
                responses[i] = _invalid(problem)
                continue
            batch.append((i, dense, lengths, values))
            rows.append(dense.shape[0])
        if batch:
            try:
                scores = self._run(batch)
            except StoreError as e:  # the store's failure fails the batch, naming what failed
                code = (pb_utils.TritonError.UNAVAILABLE if isinstance(e, StoreUnavailable)
                        else pb_utils.TritonError.INTERNAL)  # fmt: skip
                for i, *_ in batch:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(str(e), code)
                    )
                return responses
            except RuntimeError as e:  # a model failure fails the batch it ran, not the server
                for i, *_ in batch:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"model failed: {e}")
                    )
                return responses
            start = 0
            for (i, *_), n in zip(batch, rows, strict=True):
                out = pb_utils.Tensor(SCORES, scores[start : start + n])
                responses[i] = pb_utils.InferenceResponse(output_tensors=[out])
                start += n
        return responses

    def _values(self, request, dense, lengths):
        """(sparse_values [N] int64, None), or (None, message) for the request's error."""
        ids = pb_utils.get_input_tensor_by_name(request, VALUES)
        strings = pb_utils.get_input_tensor_by_name(request, STRINGS)
        if (ids is None) == (strings is None):
            both = "both" if ids is not None else "neither"
            return None, (
                f"a request carries either '{VALUES}' (INT64 ids) or '{STRINGS}' "
                f"(BYTES tokens); this one has {both}"
            )
        if ids is not None:
            # Ragged ids arrive as [1, N] from batching clients or [N]; the model wants [N].
            return ids.as_numpy().reshape(-1), None
        tokens = [t.decode("utf-8", errors="surrogateescape") for t in
                  strings.as_numpy().reshape(-1).tolist()]  # fmt: skip
        # Shapes and counts first, with the messages sparse_values gets, naming this input.
        problem = _check(dense, lengths, np.empty(len(tokens)), self.max_rows, STRINGS)
        if problem is not None:
            return None, problem
        try:
            values = self.spec.encode_values(lengths, tokens)
        except TokenError as e:
            return None, f"input '{STRINGS}': {e}"
        self.negative_ids.count(lengths, tokens)
        return values, None

    def _run(self, batch):
        def cat(k):
            # Copies (Triton's input buffers are read-only), which from_numpy wants anyway.
            return torch.from_numpy(np.concatenate([b[k] for b in batch]))

        torch.ops.rec.zch_take_unknowns()  # drops what the load-time probe left (per thread)
        if self.store is not None:
            self.store.take_unknown()
        scores = self._score(cat(1), cat(2), cat(3))
        if self.negative_ids is not None:  # the remap's counts, taken on the thread that ran it
            self.negative_ids.count_unknown(torch.ops.rec.zch_take_unknowns().tolist())
            if self.store is not None:  # and the store's: raw ids of stored ZCH tables it lacked
                self.negative_ids.count_unknown(self.store.take_unknown())
        return scores.numpy().astype(np.float32, copy=False)

    def _score(self, dense, lengths, values):
        """The model's scores of one batch: forward, or for a tiered model forward_with_rows
        with the batch's rows read through the cache and the store. Requests and the load-time
        batch probe both score here."""
        with torch.inference_mode():
            # No record is applied while the pass runs: it sees each one wholly or not at all,
            # and a row read from the store cannot overwrite a fresher one the log cached.
            tables = self.tables
            with tables.lock if tables is not None else contextlib.nullcontext():
                if self.store is None:
                    return self.model(dense, lengths, values)
                try:
                    rows = self.store.rows(lengths, values)
                finally:
                    self.store_metrics.update(self.store.reader)
                return self.model.forward_with_rows(dense, lengths, values, rows)
