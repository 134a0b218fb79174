"""`rec export` as one straight line: load, wrap, quantize, trace, script, save, verify, commit.

At any model size: the dense layers are loaded, the tables stream out of the checkpoint a row
chunk at a time straight into each format's quantized storage (rec.export.stream), and each
format's model is scored, released, reloaded from disk and scored again before the next one is
built, so memory holds one quantized model at a time. Verification's float scores come from
the rows the verification batches touch (rec.export.reference).

Each format (TorchScript, ONNX, AOTInductor) is a plug-in module of rec.export.formats: its
builder streams the tables into its model, writes one file into a staged version directory and
returns its scores; its verifier records its checks. This module runs them and owns what they
share: rec.json, the float reference and quality checks, the atomic commit.

Example:
    >>> result = export_run("runs/demo", "model_repository")  # doctest: +SKIP
    >>> result.models["torchscript"]  # doctest: +SKIP
    PosixPath('model_repository/rec/1')
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import platform
import resource
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from rec import resources, run_dir
from rec import versions as rec_versions
from rec.batch import RecBatch
from rec.config import ConfigError, RecConfig, load_config
from rec.contract import EMBEDDING_DTYPES, ModelDir, io_manifest
from rec.contract.context import ContextSplit
from rec.contract.io import context_io_manifest
from rec.export import formats, id_maps, stream, verify, zch_checks
from rec.export import reference as reference_lib
from rec.export import repository as repo_lib
from rec.export import store as store_lib
from rec.export.build import Built, Log, Source, score, table_dtypes
from rec.export.dcp_reader import CheckpointReader
from rec.export.load import LoadedRun, load_dense
from rec.export.module import sample_batch
from rec.features import feature_spec
from rec.store.writer import delete_prefix


def cfg_has_zch(cfg: RecConfig) -> bool:
    return any(t.zch is not None for t in cfg.tables)


@dataclass
class ExportResult:
    repo: Path
    models: dict[str, Path]
    """Format -> the version directory written."""
    manifests: dict[str, dict[str, Any]]


def resolve_config(
    run: Path,
    quantize: str | None,
    fmt: str | None,
    config: str | Path | None,
    store: str | None = None,
) -> RecConfig:
    """The run's config.yaml with export settings overridden by `config`'s `export:` section
    and `features.context` (training does not depend on it: one run exports both forms), then
    by the command-line `quantize`, `fmt` and `store` (export.store.url)."""
    if not (run / run_dir.CONFIG_FILE).is_file():
        run_dir.resolve_checkpoint(run)  # raises the right RunDirError
    export: dict[str, Any] = {}
    context: dict[str, Any] = {}
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"export config {str(path)!r} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict) or not isinstance(data.get("export", {}), dict):
            raise ConfigError(f"export config {str(path)!r} must hold an `export:` mapping")
        export.update(data.get("export", {}))
        features = data.get("features")
        if isinstance(features, dict) and "context" in features:
            context = {"context": features["context"]}
    if quantize is not None:
        export["quantize"] = quantize
    if fmt is not None:
        export["format"] = fmt
    if store is not None:
        export["store"] = {**export.get("store", {}), "url": store}
    overrides = {**({"export": export} if export else {}),
                 **({"features": context} if context else {})}  # fmt: skip
    return load_config(run / run_dir.CONFIG_FILE, overrides=overrides or None)


def stored_bytes(cfg: RecConfig) -> int:
    """The quantized tables' size: values plus the fp16 scale and bias of int8/int4 rows."""
    dtypes = table_dtypes(cfg)
    return sum(int(t.rows * EMBEDDING_DTYPES[dtypes[t.name]].bytes_per_row(t.dim))
               for t in cfg.tables)  # fmt: skip


class Reiterable:
    """Batches that can be read again from the start: each pass re-reads the source, so
    verification (several scoring passes) never holds the held-out split in memory."""

    def __init__(self, make: Callable[[], Iterator[RecBatch]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[RecBatch]:
        return self._make()


def eval_batches(cfg: RecConfig, log: Log, step_dir: Path | None = None) -> Reiterable | None:
    """The held-out split (`export.eval_batches` of them), or None where it cannot be read here
    (e.g. a run carried to a machine without its data files): the export then goes on with the
    agreement checks on random requests, and rec.json says the quality checks were skipped.
    A stream run's: the events its checkpoint held out of training (rec.data.held_out)."""
    from rec.data import make_source
    from rec.data.errors import DataError

    limit = cfg.export.eval_batches or None
    if cfg.data.stream.url and step_dir is not None:
        from rec.data import held_out

        held = held_out.batches(step_dir, cfg.export.max_batch_size)[:limit]
        if not held:
            log(f"warning: {step_dir} holds no events held out of the stream "
                "(data.stream.hold_out_every_nth); quality checks skipped")  # fmt: skip
            return None
        log(f"quality checks on {sum(len(b) for b in held):,} events the stream run held out of "
            "training")  # fmt: skip
        return Reiterable(lambda: iter(held))

    def read() -> Iterator[RecBatch]:
        # Raw dense values, as a client sends them: the exported model applies the transforms.
        source = make_source(cfg, "eval", raw_dense=True).batches(
            cfg.export.max_batch_size, rank=0, world_size=1, drop_last=False
        )
        return itertools.islice(source, limit)

    try:
        next(read())
    except (DataError, FileNotFoundError, StopIteration) as e:
        log(f"warning: no held-out data ({e or 'empty split'}); quality checks skipped")
        return None
    return Reiterable(read)


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), **rec_versions.library_versions()}
    for name in ("onnx", "onnxruntime"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # optional for TorchScript exports
            continue
    return versions


def manifest(
    cfg: RecConfig, loaded: LoadedRun, target: repo_lib.Target, built: Built, checks: dict
) -> dict[str, Any]:
    """rec.json: what a server needs to feed the model, and where it came from."""
    fmt = formats.get(target.fmt)
    num_tasks = cfg.model.num_tasks
    tables, fp32_total, stored_total = [], 0, 0
    for t in cfg.tables:
        fp32 = t.rows * t.dim * 4
        stored = built.tables[t.name]
        tables.append({"name": t.name, "rows": t.rows, "dim": t.dim, "pooling": t.pooling,
                       "features": t.features, "bytes_fp32": fp32, **stored,
                       "ratio": round(stored["bytes_stored"] / fp32, 4)})  # fmt: skip
        fp32_total += fp32
        stored_total += stored["bytes_stored"]
    return {
        "format": target.fmt,
        "file": fmt.file,
        "model_name": target.model_dir.name,
        "version": target.version,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **model_io(cfg),
        "features": {
            "dense": list(cfg.features.dense_names),
            "sparse": list(cfg.features.sparse),
            "sparse_table": cfg.feature_to_table(),
        },
        "feature_spec": feature_spec(cfg).to_dict(),
        "num_tasks": num_tasks,
        "tasks": cfg.model.task_names,
        "id_mapping": "row = raw_id mod rows (non-negative), inside the model"
        + (
            "; a ZCH table's (the `zch` section): the slot its id map gives, or the default row"
            if cfg_has_zch(cfg)
            else ""
        ),
        "load_requires": fmt.load_requires,
        "tables": tables,
        "embedding_bytes": {
            "fp32": fp32_total,
            "stored": stored_total,
            "ratio": round(stored_total / fp32_total, 4),
        },  # fmt: skip
        "dense": {"dtype": "fp32", "batch_invariant": False},
        **built.sections,  # the format's own ("dense" of rec's layers, "batch_probe", "aoti")
        "serving": {
            "max_batch_size": cfg.export.max_batch_size,
            "max_queue_delay_us": cfg.export.max_queue_delay_us,
            "preferred_batch_sizes": list(cfg.export.preferred_batch_sizes),
            "instances": cfg.export.instances,
            "triton_batching": cfg.export.triton_batching,
        },
        "source": {
            "run_dir": str(loaded.step_dir.parent.parent.resolve()),
            "checkpoint": str(loaded.step_dir.resolve()),
            "step": loaded.meta.get("step"),
            "world_size": loaded.meta.get("world_size"),
            "eval_at_checkpoint": loaded.meta.get("eval"),
        },
        "library_versions": library_versions(),
        "verification": checks,
        "export_process": {
            # Tables streamed from the checkpoint; this is the export's own high-water mark.
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "chunk_rows": cfg.export.chunk_rows or "auto (32 MiB of fp32)",
        },
        "config": cfg.to_dict(),
    }


def model_io(cfg: RecConfig) -> dict[str, Any]:
    """rec.json's "inputs" and "outputs" of the model: the flat ones, or a context model's
    (features.context) with its "context" section."""
    if not cfg.features.context:
        return io_manifest(cfg.features.dense, len(cfg.features.sparse), cfg.model.num_tasks)
    split = ContextSplit.from_config(cfg)
    return {**context_io_manifest(split, cfg.model.num_tasks), "context": split.to_dict()}


def check_context(checks: dict[str, Any], built: dict[str, Built], exact: bool = True) -> None:
    """verification's context_vs_flat_max_diff: a context model must score each held-out batch
    given row 0's context as one context exactly as the flat batch with it repeated
    (rec.export.context_checks); VerificationError otherwise. Not `exact` (export.batch_invariant
    false: layers whose rows depend on their batch), the difference is only recorded."""
    diffs = {
        f: b.checks["context_vs_flat"] for f, b in built.items() if "context_vs_flat" in b.checks
    }
    if not diffs:
        return
    checks["context_vs_flat_max_diff"] = diffs
    for fmt, diff in diffs.items():
        if diff != 0 and exact:
            raise verify.VerificationError(
                f"{fmt}: held-out batches scored as one context of their rows differ from the "
                f"flat batches with that context repeated (max diff {diff:g}); a context "
                "request must score exactly as its flat form"
            )


def _synthetic_batches(cfg: RecConfig, count: int = 4, size: int = 256) -> list[RecBatch]:
    """Random requests for the agreement checks when there is no held-out data (no labels)."""
    out = []
    for seed in range(1, count + 1):
        dense, lengths, values = sample_batch(
            cfg.features.dense, len(cfg.features.sparse), size, seed
        )
        out.append(RecBatch(dense, lengths, values, torch.zeros(size, cfg.model.num_tasks)))
    return out


def run_checks(
    cfg: RecConfig, reference: torch.Tensor, labels: torch.Tensor | None, built: dict[str, Built]
) -> dict[str, Any]:
    """Every verification of the staged models from their scores; raises VerificationError on
    a correctness check. `reference` is the float model's scores on the same batches, `labels`
    their labels (None: random requests, no quality to measure)."""
    checks: dict[str, Any] = {
        "batched_vs_single_max_diff": {
            fmt: b.batched_vs_single_max_diff for fmt, b in built.items()
        }
    }
    check_context(checks, built, cfg.export.batch_invariant)
    for name in built:  # in build order: a verifier may compare with an earlier format
        formats.get(name).verify(built, checks)
    exported = {fmt: b.reloaded for fmt, b in built.items()}
    if labels is not None:
        checks["eval"] = verify.summarize(
            {"float": reference, **exported},
            labels,
            set(table_dtypes(cfg).values()),
            cfg.model.task_names,
        )
    else:
        checks["eval"] = {"skipped": "the held-out split could not be read where export ran"}
        for fmt, s in exported.items():
            checks["eval"][f"{fmt}_max_abs_diff_vs_float"] = verify.max_diff(s, reference)
    rec_dense = [f for f in built if formats.get(f).rec_dense]
    if rec_dense and cfg.export.dense_dtype != "fp32":
        check_reduced_precision(cfg, checks["eval"], rec_dense[0])
    return checks


def check_reduced_precision(cfg: RecConfig, ev: dict[str, Any], fmt: str = "torchscript") -> None:
    """Refuses a model whose dense layers lost precision (dense_dtype) and held-out AUC with
    it, or whose AUC could not be measured, unless export.accept_quality_loss says otherwise."""
    bar = verify.AUC_RATIO_BAR["fp32"]
    q = ev.get(fmt)
    ratios = {} if q is None else {"": q["auc_ratio"], **q.get("auc_ratio_per_task", {})}
    low = {task: r for task, r in ratios.items() if not r >= bar}
    if q is not None and not low:
        return
    if q is None:
        what = "its AUC could not be measured (no held-out data)"
    else:
        parts = [f"{r:.5f}" + (f" on task {task}" if task else "") for task, r in low.items()]
        what = "its held-out AUC ratio is " + ", ".join(parts)
    message = (
        f"dense layers in {cfg.export.dense_dtype}: {what}, against a bar of {bar} of the "
        "float model's; set export.accept_quality_loss: true to write it anyway"
    )
    if not cfg.export.accept_quality_loss:
        raise verify.VerificationError(message)
    ev["accepted_quality_loss"] = message


def _report(checks: dict[str, Any], manifests: dict[str, dict], log: Log) -> None:
    ev = checks["eval"]
    for fmt, m in manifests.items():
        b = m["embedding_bytes"]
        log(f"{fmt}: embeddings {b['fp32']:,} B fp32 -> {b['stored']:,} B ({b['ratio']:.3f}x)")
        if fmt in ev:
            q = ev[fmt]
            log(
                f"{fmt}: AUC {q['auc']:.5f} vs float {ev['float']['auc']:.5f} "
                f"(ratio {q['auc_ratio']:.5f}, bar {ev['auc_ratio_bar']}), log loss "
                f"{q['log_loss']:.5f} vs {ev['float']['log_loss']:.5f}, max |diff| "
                f"{q['max_abs_diff_vs_float']:.2e}"
            )
            for task, ratio in q.get("auc_ratio_per_task", {}).items():
                log(f"{fmt}: task {task}: AUC {q['auc_per_task'][task]:.5f} (ratio {ratio:.5f})")
    if "quality_bar_passed" in ev:
        log("quality bar: " + ("passed" if ev["quality_bar_passed"] else "NOT passed"))
    else:
        log(f"quality: {ev['skipped']}")


def _source(cfg: RecConfig, loaded: LoadedRun, labelled: Iterable[RecBatch] | None,
            names: list[str], repo: Path, log: Log) -> Source:  # fmt: skip
    """The builders' input; refuses an export this machine cannot hold before any work."""
    batches = labelled if labelled is not None else _synthetic_batches(cfg)
    reader = CheckpointReader(loaded.step_dir)
    maps = id_maps.read_maps(reader, cfg)
    probe = zch_checks.make_probe(cfg, maps)
    probed = itertools.chain(batches, probe.batches() if probe else [])
    touched = reference_lib.touched_rows(cfg, probed, id_maps.reference_maps(cfg, maps))
    dim = max(t.dim for t in cfg.tables)
    chunk = stream.chunk_rows_for(dim, cfg.export.chunk_rows) * dim * 4
    ref_rows = sum(r.numel() for r in touched.values())
    resources.check_export(cfg, names, stored_bytes(cfg), ref_rows, chunk, repo)
    ref_sink = reference_lib.ReferenceSink(cfg, touched)
    sample = sample_batch(cfg.features.dense, len(cfg.features.sparse))
    return Source(cfg, loaded, reader, sample, batches, log, ref_sink, [ref_sink], maps, probe)


def _stage_manifest(cfg: RecConfig, loaded: LoadedRun, t: repo_lib.Target, built: Built,
                    checks: dict[str, Any], staging: Path) -> dict[str, Any]:  # fmt: skip
    """Writes rec.json (model dir and version dir) and config.pbtxt into the staged model."""
    staged = ModelDir.of(staging, t.model_dir.name)
    m = manifest(cfg, loaded, t, built, checks)
    staged.write_manifest(t.version, m)
    staged.write_config(formats.get(t.fmt).triton_config(cfg, t.model_dir.name))
    return m


def _already_exported(
    repo: Path, model_name: str, names: list[str], run: Path, checkpoint: str | None
) -> dict[str, Path] | None:
    """Each format's newest version dir, when every rec.json names this checkpoint as source."""
    step_dir = run_dir.resolve_checkpoint(run, checkpoint).resolve()
    models = {}
    for fmt in names:
        model = ModelDir.of(repo, formats.get(fmt).model_dir_name(model_name))
        versions = model.versions()
        if not versions or not model.manifest.is_file():
            return None
        source = json.loads(model.manifest.read_text()).get("source", {}).get("checkpoint")
        if source != str(step_dir):
            return None
        models[fmt] = model.version(versions[-1])
    return models


def export_run(
    run: str | Path,
    repo: str | Path = "model_repository",
    *,
    checkpoint: str | None = None,
    quantize: str | None = None,
    fmt: str | None = None,
    config: str | Path | None = None,
    version: int | None = None,
    force: bool = False,
    skip_exported: bool = False,
    store: str | None = None,
    eval_data: Iterable[RecBatch] | None = None,
    log: Log = print,
) -> ExportResult:
    """Exports a run's checkpoint into the model repository `repo` (Contract 2).

    Args:
        run: run directory (Contract 1). checkpoint: step dir name; default LATEST.
        quantize, fmt: override export.quantize / export.format of the run's config.
        config: YAML file whose `export:` section and `features.context` override the run's.
        version: version directory to write; default the next one. force: replace it.
        skip_exported: write nothing when every format's newest version already holds this
            checkpoint (a deployment that runs export on every start exports each one once).
        store: export.store.url: the chosen tables' rows also go to that Redis Cluster.
        eval_data: held-out batches for the quality checks; default rec.data's eval split.
    """
    run, repo = Path(run), Path(repo)
    cfg = resolve_config(run, quantize, fmt, config, store)
    names = formats.resolve(cfg.export.format)
    if skip_exported and version is None:
        done = _already_exported(repo, cfg.export.model_name, names, run, checkpoint)
        if done is not None:
            log(f"already exported, kept: {', '.join(map(str, done.values()))}")
            return ExportResult(repo, done, {})
    loaded = load_dense(run, checkpoint, cfg)
    log(f"loaded {loaded.step_dir} ({len(cfg.tables)} tables, dtypes {table_dtypes(cfg)})")
    targets = repo_lib.plan_targets(repo, cfg.export.model_name, names, version, force)
    labelled = (list(eval_data) if eval_data is not None
                else eval_batches(cfg, log, loaded.step_dir))  # fmt: skip
    src = _source(cfg, loaded, labelled, names, repo, log)
    store_sink = store_lib.open_sink(cfg, table_dtypes(cfg), targets[0].model_dir.name,
                                     targets[0].version, run, log, src.maps)  # fmt: skip
    if store_sink is not None:
        src.extra_sinks.append(store_sink)
        src.store = store_lib.section(store_sink)
    repo_existed = repo.exists()
    staging = repo_lib.staging_dir(repo)
    committed = False
    try:
        built = {}
        for t in targets:
            staged = ModelDir.of(staging, t.model_dir.name)
            staged.version(t.version).mkdir(parents=True)
            built[t.fmt] = formats.get(t.fmt).build(src, staged.model_file(t.version, t.fmt))
            log(f"{t.fmt}: built, scored and reloaded {t.model_dir.name}/{t.version}")
        float_model = reference_lib.ReferenceModule(
            loaded.model, cfg, src.reference, id_maps.reference_maps(cfg, src.maps)
        )
        reference = score(float_model, src.batches)
        labels = (
            torch.cat([b.labels.float() for b in src.batches]) if labelled is not None else None
        )
        checks = run_checks(cfg, reference, labels, built)
        if src.zch_probe is not None:
            float_probe = zch_checks.score_probe(float_model, src.zch_probe)
            dtypes = set(table_dtypes(cfg).values())
            checks["zch"] = zch_checks.check(src.zch_probe, float_probe, built, dtypes)
        if store_sink is not None:
            store_sink.finish(store_lib.run_tag(run), int(loaded.meta.get("step", 0)))
            log(f"store: {store_sink.rows_written} rows written in {store_sink.seconds:.1f} s")
            for b in built.values():
                b.sections["store"] = src.store
        manifests = {t.fmt: _stage_manifest(cfg, loaded, t, built[t.fmt], checks, staging)
                     for t in targets}  # fmt: skip
        _report(checks, manifests, log)
        for t in targets:
            repo_lib.commit(staging / t.model_dir.name, t)
            log(f"wrote {t.version_dir}")
        committed = True
    finally:
        if store_sink is not None:
            if not committed:  # no repository names these keys: leave none behind
                delete_prefix(store_sink.url, store_sink.prefix, store_sink.tables)
            store_sink.close()
        shutil.rmtree(staging, ignore_errors=True)
        if not repo_existed and repo.is_dir() and not any(repo.iterdir()):
            repo.rmdir()
    return ExportResult(repo, {t.fmt: t.version_dir for t in targets}, manifests)
