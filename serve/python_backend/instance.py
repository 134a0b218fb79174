"""One instance of rec's Triton model: rec's exported model.pt (or model.pt2) loaded, checked
and scoring batches of requests, as rec-server does.

Like the recommended Triton backend: the requests that Triton hands over together are checked
one by one (an error goes to its own request), concatenated into one batch (valid because the
input is batch-major jagged), run once, and the scores sliced back per request. A context
model's requests (context_inputs.py) join the same way, each keeping its one context: their
candidate_offsets continue from one another, so the context's part still runs once per request.
A forward pass and the applying of an update log record exclude each other, so a batch never
sees a half-written row, nor a ZCH slot's new id with its old row.
"""

from __future__ import annotations

import contextlib
import logging
import os

import fbgemm_gpu  # noqa: F401  (registers the torch.ops.fbgemm kernels model.pt calls)
import numpy as np
import torch

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, the dense layers model.pt calls)
from rec import batch_probe
from rec.contract.io import CANDIDATE_LENGTHS, DTYPES, NUMPY_DTYPES
from rec.contract.repository import read_version_manifest
from rec.contract.store import StoreError
from rec.cpu import cpu_info, describe
from rec.features import FeatureSpec
from rec.malloc import keep_freed_memory

from .config import STORE_RETRY_NOTE, InstanceConfig, LoadError
from .context_inputs import ContextModel
from .inputs import INTERNAL, UNAVAILABLE, Failure, Feed, Inputs, concatenate, decode
from .metrics import MemoryMetrics, NegativeIds, Sink, StoreMetrics, batch_variant
from .store import StoreRows, StoreUnavailable, raw_columns
from .updates import open_updates

_LEVELS = {"info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


def python_log(level: str, message: str) -> None:
    """The log outside Triton: Python's logging, logger rec.serve.python_backend."""
    logging.getLogger("rec.serve.python_backend").log(_LEVELS[level], message)


class ModelInstance:
    """Loads `config`'s model (a failure the server should report is a LoadError) and scores
    requests with execute(). `families` is the metric sink (MemoryMetrics by default), `log`
    is log(level, message) with level info, warn or error. close() stops the update log's
    reader and the store's client."""

    def __init__(self, config: InstanceConfig, families: Sink | None = None, log=None) -> None:
        self.config = config
        self.families = families if families is not None else MemoryMetrics()
        self.log = log or python_log
        if config.intra_op_threads > 0:
            torch.set_num_threads(config.intra_op_threads)
        keep_freed_memory()  # as rec-server does (rec/malloc.py: page faults on every request)
        path = config.model_path
        if path.endswith(".pt2"):  # AOTInductor: tables memory-mapped, the CPU's ISA checked
            from rec.aoti_package import AotiModel

            self.model = AotiModel(os.path.dirname(path))
        else:
            self.model = torch.jit.load(path, map_location="cpu").eval()
        manifest = read_version_manifest(os.path.dirname(path))
        spec = config.feature_spec
        self.spec = FeatureSpec.from_dict(spec) if spec else None
        split = manifest.context if manifest is not None else None
        self.context = ContextModel(split, config.max_rows, self.spec) if split else None
        self.tables, self.reader = None, None  # the update log's, after the probe
        self.store, self.store_metrics = None, None
        self._open_store(manifest)
        self._probe_batching(manifest)
        self.negative_ids = (NegativeIds(self.families, config.name, config.version, self.spec)
                             if self.spec else None)  # fmt: skip
        refresh = self._refresh if self.store is not None else None
        self.tables, self.reader = open_updates(config, manifest, self.model, refresh,
                                                self.families, self.log)  # fmt: skip

    def _open_store(self, manifest) -> None:
        """The version's StoreRows when its rec.json has a `store` section. A store that cannot
        serve fails the load, naming it."""
        if manifest is None or not manifest.has("store"):
            return
        where, cache = self.config.where, self.config.store_cache_bytes
        if not hasattr(self.model, "store_ids"):
            raise LoadError(
                f'{where}: rec.json has a "store" section but '
                f"{os.path.basename(self.config.model_path)} has no "
                "store_ids/forward_with_rows (not a tiered TorchScript export)"
            )
        try:
            section = manifest.store
            self.store = StoreRows(self.model, section.to_dict(), cache, raw_columns(manifest))
        except StoreUnavailable as e:  # not the model's fault: rec.serve.triton reloads it
            raise LoadError(f"{where}: {e}; {STORE_RETRY_NOTE}") from None
        except StoreError as e:
            raise LoadError(f"{where}: {e}") from None
        self.store_metrics = StoreMetrics(self.families, self.config.name, self.config.version,
                                          cache)  # fmt: skip
        self.log("info", f"{where}: tables {', '.join(sorted(section.tables))} read from "
                         f"embedding store {section.url} under '{section.prefix}'")  # fmt: skip

    def _refresh(self, rec) -> None:
        """A stored table's record into the cache (a ZCH table's by raw id), and the metrics
        that count them (under the tables' lock, as _score's update of them is)."""
        if rec.table in self.tables.raw_keyed:
            self.store.reader.refresh_raw(rec.table, rec)
        else:
            self.store.reader.refresh(rec.table, rec.ids, rec.rows)
        self.store_metrics.update(self.store.reader)

    def _probe_batching(self, manifest) -> None:
        """rec.json's batch probe on this CPU (rec.batch_probe): a model that scores it
        differently as one batch than one by one fails its load, or with allow_batch_variant is
        served with a warning and rec_model_batch_variant 1, as rec-server does."""
        request = self._probe_request(manifest)
        if request is None:
            return
        name, version = self.config.name, self.config.version
        try:  # the path requests take: a tiered model's rows come from the store
            if self.context is None:
                diff = batch_probe.batch_variance(self._score, request)
            else:
                fn = len(self.context.split.cand_sparse)
                diff = batch_probe.context_variance(self._score, request, fn)
        except StoreError as e:
            raise LoadError(f"{self.config.where}: batch probe: {e}") from None
        self.variant = batch_variant(self.families, name, version, diff != 0)
        if diff == 0:
            return
        here = describe(cpu_info())
        verified = manifest.dense.verified_cpu
        rows = len(request[0] if self.context is None else request[CANDIDATE_LENGTHS])
        message = batch_probe.refusal(name, version, rows, diff, here, verified)
        if not self.config.allow_batch_variant:
            raise LoadError(message + ". Serve it anyway with --allow-batch-variant")
        self.log("warn", message + "; serving it anyway (--allow-batch-variant)")

    def _probe_request(self, manifest):
        """rec.json's probe request (None: none, or not claimed batch invariant): a flat
        model's three tensors, or a context model's inputs by name in forward order."""
        if self.context is None:
            return batch_probe.from_manifest(manifest)
        if manifest.dense is None or not manifest.dense.batch_invariant:
            return None
        stored = manifest.data.get("batch_probe")
        if stored is None:
            return None
        return {name: torch.tensor(stored[name], dtype=getattr(torch, NUMPY_DTYPES[DTYPES[name]]))
                for name in self.context.names}  # fmt: skip

    def close(self) -> None:
        if self.reader is not None:
            self.reader.stop()
        if self.store is not None:
            self.store.close()

    def decode(self, request: Inputs) -> Feed | Failure:
        """The request's model inputs (either form, for a context model), or its Failure."""
        on_tokens = self.negative_ids.count if self.negative_ids is not None else None
        if self.context is not None:
            return self.context.decode(request, on_tokens)
        return decode(request, self.config.max_rows, self.spec, on_tokens)

    def execute(self, requests: list[Inputs]) -> list[np.ndarray | Failure]:
        """Per request, its scores (float32 [B, T], a row per candidate) or its Failure."""
        out: list[np.ndarray | Failure | None] = [None] * len(requests)
        batch: list[tuple[int, Feed]] = []  # (request index, its inputs) of valid requests
        for i, request in enumerate(requests):
            feed = self.decode(request)
            if isinstance(feed, Failure):
                out[i] = feed
            else:
                batch.append((i, feed))
        if not batch:
            return out
        if self.reader is not None and (past := self.reader.trimmed_past):
            # Its rows miss records a trim of the log removed: not ready until a newer export
            # is loaded (rec.logs.update_trim).
            for i, _ in batch:
                out[i] = Failure(f"not ready: {past}", UNAVAILABLE)
            return out
        try:
            scores = self._run([feed for _, feed in batch])
        except StoreError as e:  # the store's failure fails the batch, naming what failed
            code = UNAVAILABLE if isinstance(e, StoreUnavailable) else INTERNAL
            failure = Failure(str(e), code)
        except RuntimeError as e:  # a model failure fails the batch it ran, not the server
            failure = Failure(f"model failed: {e}", INTERNAL)
        else:
            start = 0
            for i, feed in batch:
                out[i] = scores[start : start + feed.rows]
                start += feed.rows
            return out
        for i, *_ in batch:
            out[i] = failure
        return out

    def _run(self, feeds: list[Feed]) -> np.ndarray:
        inputs = [torch.from_numpy(a) for a in concatenate(feeds).values()]
        torch.ops.rec.zch_take_unknowns()  # drops what the load-time probe left (per thread)
        if self.store is not None:
            self.store.take_unknown()
        scores = self._score(*inputs)
        if self.negative_ids is not None:  # the remap's counts, taken on the thread that ran it
            self.negative_ids.count_unknown(torch.ops.rec.zch_take_unknowns().tolist())
            if self.store is not None:  # and the store's: raw ids of stored ZCH tables it lacked
                self.negative_ids.count_unknown(self.store.take_unknown())
        return scores.numpy().astype(np.float32, copy=False)

    def _score(self, *inputs):
        """The model's scores of one batch (its inputs in forward order): forward, or for a
        tiered model (flat only) forward_with_rows with the batch's rows read through the cache
        and the store. Requests and the load-time batch probe both score here."""
        with torch.inference_mode():
            # No record is applied while the pass runs: it sees each one wholly or not at all,
            # and a row read from the store cannot overwrite a fresher one the log cached.
            tables = self.tables
            with tables.lock if tables is not None else contextlib.nullcontext():
                if self.store is None:
                    return self.model(*inputs)
                dense, lengths, values = inputs
                try:
                    rows = self.store.rows(lengths, values)
                finally:
                    self.store_metrics.update(self.store.reader)
                return self.model.forward_with_rows(dense, lengths, values, rows)
