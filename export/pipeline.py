"""`rec export` as one straight line: load, wrap, quantize, trace, script, save, verify, commit.

At any model size: the dense layers are loaded, the tables stream out of the checkpoint a row
chunk at a time straight into each format's quantized storage (rec.export.stream), and each
format's model is scored, released, reloaded from disk and scored again before the next one is
built, so memory holds one quantized model at a time. Verification's float scores come from
the rows the verification batches touch (rec.export.reference).

Each format (TorchScript now; ONNX; a torch.export / AOTInductor format later) is one `build_*`
function that streams the tables into its model, writes one file into a staged version
directory and returns its scores; adding a format means adding one of those.

Example:
    >>> result = export_run("runs/demo", "model_repository")  # doctest: +SKIP
    >>> result.models["torchscript"]  # doctest: +SKIP
    PosixPath('model_repository/rec/1')
"""

from __future__ import annotations

import gc
import importlib.metadata
import itertools
import json
import platform
import resource
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from rec import batch_probe, resources, run_dir
from rec import ops as rec_ops
from rec import versions as rec_versions
from rec.batch import RecBatch
from rec.config import ConfigError, RecConfig, load_config
from rec.contract import EMBEDDING_DTYPES, io_manifest
from rec.cpu import cpu_info
from rec.export import raw_rows, stream, verify
from rec.export import reference as reference_lib
from rec.export import repository as repo_lib
from rec.export.dcp_reader import CheckpointReader
from rec.export.dense import DENSE_DTYPES, Int8Linear, InvariantLinear, PackedLinear
from rec.export.load import LoadedRun, load_dense
from rec.export.module import sample_batch
from rec.features import feature_spec
from rec.model import table_keys

Log = Callable[[str], None]
_LOAD_REQUIRES = {
    "torchscript": "FBGEMM's ops and classes and rec's dense-layer ops (rec::linear, "
    "rec::linear_int8) registered before torch.jit.load: `import fbgemm_gpu` and `import rec.ops` "
    "in Python; in C++ dlopen the fbgemm_gpu package's .so files and rec's rec/_ops.so with "
    "RTLD_GLOBAL",
    "onnx": "onnxruntime (standard ONNX ops only)",
    "aoti": "torch's AOTInductor package loader (torch._inductor.aoti_load_package in Python, "
    "torch::inductor::AOTIModelPackageLoader in C++) with FBGEMM's and rec's op libraries "
    "loaded as for torchscript, a CPU with the package's ISA (the `aoti` section), and "
    "tables.bin memory-mapped and passed after the three inputs (rec.export.aoti)",
}
FORMAT_SETS = {"both": ["torchscript", "onnx"], "all": ["torchscript", "onnx", "aoti"]}


@dataclass
class Source:
    """What every format's builder reads: the dense layers, the checkpoint's tables (streamed),
    and the batches it is verified on."""

    cfg: RecConfig
    loaded: LoadedRun
    """The float model with its dense weights; its tables stay on the meta device."""
    reader: CheckpointReader
    sample: tuple[torch.Tensor, ...]
    batches: Iterable[RecBatch]
    """The verification batches (held-out, or random requests when there is no held-out data),
    re-iterable: every scoring pass reads them again."""
    log: Log
    reference: reference_lib.ReferenceSink
    """Gathers the rows verification's float reference needs, on the first streaming pass."""
    extra_sinks: list[stream.TableSink] = field(default_factory=list)
    """Also fed by the next streaming pass (the reference rows, on the first one)."""

    def stream_into(self, *sinks: stream.TableSink) -> None:
        extra, self.extra_sinks = self.extra_sinks, []
        stream.stream_tables(self.reader, self.cfg, [*sinks, *extra], self.cfg.export.chunk_rows,
                             self.log, keys=table_keys(self.loaded.model))  # fmt: skip


@dataclass
class Built:
    """One format's staged model, scored on the verification batches, then released."""

    scores: torch.Tensor
    """Of the model as built in memory (for ONNX: the torch module it was exported from)."""
    reloaded: torch.Tensor
    """Of the file read back from disk (ONNX: through ONNX Runtime)."""
    batched_vs_single_max_diff: float
    tables: dict[str, dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExportResult:
    repo: Path
    models: dict[str, Path]
    """Format -> the version directory written."""
    manifests: dict[str, dict[str, Any]]


def resolve_config(
    run: Path, quantize: str | None, fmt: str | None, config: str | Path | None
) -> RecConfig:
    """The run's config.yaml with export settings overridden by `config`'s `export:` section,
    then by the command-line `quantize` and `fmt`."""
    if not (run / run_dir.CONFIG_FILE).is_file():
        run_dir.resolve_checkpoint(run)  # raises the right RunDirError
    export: dict[str, Any] = {}
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"export config {str(path)!r} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict) or not isinstance(data.get("export", {}), dict):
            raise ConfigError(f"export config {str(path)!r} must hold an `export:` mapping")
        export.update(data.get("export", {}))
    if quantize is not None:
        export["quantize"] = quantize
    if fmt is not None:
        export["format"] = fmt
    overrides = {"export": export} if export else None
    return load_config(run / run_dir.CONFIG_FILE, overrides=overrides)


def table_dtypes(cfg: RecConfig) -> dict[str, str]:
    return {t.name: cfg.export.table_dtypes.get(t.name, cfg.export.quantize) for t in cfg.tables}


def stored_bytes(cfg: RecConfig) -> int:
    """The quantized tables' size: values plus the fp16 scale and bias of int8/int4 rows."""
    dtypes = table_dtypes(cfg)
    return sum(int(t.rows * EMBEDDING_DTYPES[dtypes[t.name]].bytes_per_row(t.dim))
               for t in cfg.tables)  # fmt: skip


def _score(scorer: verify.Scorer, batches: Iterable[RecBatch]) -> torch.Tensor:
    with torch.no_grad():
        scores = [scorer(b.dense, b.lengths, b.values).float() for b in batches]
    if not scores:
        raise verify.VerificationError("the held-out split yielded no batches to verify with")
    return torch.cat(scores)


def _batching_request(cfg: RecConfig):
    # 37 samples: past the sizes where CPU kernels switch paths (GEMM at 16, SIMD tails).
    return sample_batch(cfg.features.dense, len(cfg.features.sparse), 37, seed=7)


def build_torchscript(src: Source, out: Path) -> Built:
    """The served module's TBE storage filled from the streamed tables -> script -> model.pt;
    scored in memory, released, reloaded from disk and scored again."""
    from rec.export import served, torchscript

    cfg = src.cfg
    module, tbe = torchscript.served_module(src.loaded.model, cfg, table_dtypes(cfg))
    layers = dense_layer_dtypes(module)
    if cfg.export.dense_dtype != "fp32" and not layers.get(cfg.export.dense_dtype):
        src.log(
            f"warning: export.dense_dtype {cfg.export.dense_dtype} applies to no layer: each is "
            "too small to gain from it and stays fp32 (rec.export.dense.invariant_linear)"
        )
    what = f"the model of model.factory {cfg.model.factory!r}" if cfg.model.factory else "the model"
    if cfg.model.factory:  # refuse what TorchScript cannot compile before streaming the tables
        torchscript.script(module, what)
    src.stream_into(served.TbeSink(tbe))
    tables = served.table_storage(tbe)
    scripted = torchscript.to_torchscript(module, src.sample, what)
    torch.jit.save(scripted, str(out))
    scores = _score(scripted, src.batches)
    del scripted, module, tbe  # the TBE storage: make room for the reloaded copy
    gc.collect()
    reloaded = torch.jit.load(str(out))
    request = _batching_request(cfg)
    invariant = cfg.export.batch_invariant
    hint = BF16_NOT_INVARIANT if cfg.export.dense_dtype == "bf16" else ""
    batching = check_batching("torchscript", reloaded, request, invariant, hint)
    extra = {**_dense_extra(cfg, layers, request), "raw_rows": raw_rows.round_trip(cfg, reloaded)}
    return Built(scores, _score(reloaded, src.batches), batching, tables, extra)


def _dense_extra(cfg: RecConfig, layers: dict[str, int], request) -> dict[str, Any]:
    """rec.json's "dense" and "batch_probe" sections of a format with rec's dense layers."""
    return {
        "dense": {
            "dtype": cfg.export.dense_dtype,
            "batch_invariant": cfg.export.batch_invariant,
            "layers": layers,
            # Where the batching check passed; servers re-run it on their own CPU at load.
            "verified_on": {**cpu_info(), "rec_linear_isa": rec_ops.linear_isa()},
        },
        # The same request for the servers' load-time probe on their own CPU (rec.batch_probe).
        "batch_probe": batch_probe.to_manifest(request),
    }


def build_aoti(src: Source, out: Path) -> Built:
    """The served module (as for TorchScript) -> torch.export -> AOTInductor -> model.pt2, its
    tables in tables.bin beside it; the in-memory module scored and released, then the package
    loaded from disk (tables memory-mapped) and scored."""
    from rec.export import aoti, served, torchscript

    cfg = src.cfg
    module, tbe = torchscript.served_module(src.loaded.model, cfg, table_dtypes(cfg))
    aoti.refuse_unexportable(module, cfg)
    aoti.require_target(cfg.export.cpu_isa)
    layers = dense_layer_dtypes(module)
    src.stream_into(served.TbeSink(tbe))
    tables = served.table_storage(tbe)
    program = aoti.export_program(module, cfg)
    src.log(f"aoti: exported; compiling for {cfg.export.cpu_isa} (AOTInductor, ~1 min)")
    target = aoti.compile_package(program, out, cfg.export.cpu_isa)
    del program
    index = aoti.write_tables(module, out.parent)
    scores = _score(module, src.batches)
    del module, tbe  # the TBE storage: the package reads tables.bin's mapping instead
    gc.collect()
    reloaded = aoti.AotiModel(out.parent, target)
    request = _batching_request(cfg)
    batching = check_batching("aoti", reloaded, request, cfg.export.batch_invariant)
    reloaded_scores = _score(reloaded, src.batches)
    diff = verify.check_close(
        "the AOTInductor package vs the in-memory module",
        reloaded_scores, scores, verify.AOTI_TOLERANCE,
    )  # fmt: skip
    section = {**target, "tables_file": aoti.TABLES_FILE, "tables": index,
               "max_abs_diff_vs_module": diff, "tolerance": verify.AOTI_TOLERANCE}  # fmt: skip
    extra = {**_dense_extra(cfg, layers, request), "aoti": section,
             "raw_rows": raw_rows.round_trip(cfg, reloaded)}  # fmt: skip
    return Built(scores, reloaded_scores, batching, tables, extra)


def build_onnx(src: Source, out: Path) -> Built:
    """Plain-op tables filled from the streamed tables -> ONNX (tables in external data);
    the torch module scored and released, then ONNX Runtime scored."""
    from rec.export import onnx

    cfg = src.cfg
    module = onnx.onnx_module(src.loaded.model, cfg, table_dtypes(cfg))
    src.stream_into(onnx.OnnxSink(module.lookup))
    onnx.export_onnx(module, src.sample, out)
    with torch.no_grad():
        sample_scores = module(*src.sample)
    scores = _score(module, src.batches)
    tables = {
        name: {"stored_dtype": table_dtypes(cfg)[name], "bytes_stored": n, "bytes_unpadded": n}
        for name, n in module.lookup.table_bytes.items()
    }
    del module  # its tables: make room for ONNX Runtime's copy
    gc.collect()
    session = onnx.onnx_session(out)

    def run(*b):
        return onnx.run_onnx(session, *b)

    verify.check_close(
        "ONNX Runtime vs the module it was exported from (sample)",
        run(*src.sample), sample_scores, verify.ONNX_TOLERANCE,
    )  # fmt: skip
    batching = check_batching("onnx", run, _batching_request(cfg), False)
    return Built(scores, _score(run, src.batches), batching, tables)


BUILDERS = {"torchscript": build_torchscript, "onnx": build_onnx, "aoti": build_aoti}


class Reiterable:
    """Batches that can be read again from the start: each pass re-reads the source, so
    verification (several scoring passes) never holds the held-out split in memory."""

    def __init__(self, make: Callable[[], Iterator[RecBatch]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[RecBatch]:
        return self._make()


def eval_batches(cfg: RecConfig, log: Log) -> Reiterable | None:
    """The held-out split (`export.eval_batches` of them), or None where it cannot be read here
    (e.g. a run carried to a machine without its data files): the export then goes on with the
    agreement checks on random requests, and rec.json says the quality checks were skipped."""
    from rec.data import make_source
    from rec.data.errors import DataError

    limit = cfg.export.eval_batches or None

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


def dense_layer_dtypes(module: torch.nn.Module) -> dict[str, int]:
    """How many of the served module's linear layers compute in each dtype: {"fp32": n, ...}."""
    names = {dtype: name for name, dtype in DENSE_DTYPES.items()}
    counts: dict[str, int] = {}
    for m in module.modules():
        if isinstance(m, PackedLinear):
            key = names[m.weight.dtype]
        elif isinstance(m, Int8Linear):
            key = "int8"
        elif isinstance(m, (InvariantLinear, torch.nn.Linear)):
            key = "fp32"
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return counts


# Why a bf16 model can fail the batching check, and what to do (rec.export.dense).
BF16_NOT_INVARIANT = (
    "; bf16 dense layers are batch invariant only where oneDNN runs them on AVX-512 BF16 alone: "
    "on a CPU with AMX it picks kernels by batch size. Export with export.batch_invariant: false "
    "(bf16 at full speed, scores that depend on the batch at bf16 precision), set "
    "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 for the export and every server (invariant, no AMX), "
    "or use export.dense_dtype: int8 (batch invariant on every CPU, and faster)"
)


def check_batching(name: str, scorer: verify.Scorer, sample, exact: bool, hint: str = "") -> float:
    """Single-sample requests vs the same samples as one batch; returns the max difference.
    exact: refuse any difference (VerificationError, ending with `hint`)."""
    diff = batch_probe.batch_variance(scorer, sample)
    if exact and diff != 0:
        raise verify.VerificationError(
            f"{name}: a batch of {len(sample[0])} samples scores them differently from the same "
            f"samples sent one by one (max diff {diff:g}), but the export is batch invariant{hint}"
        )
    return diff


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
    num_sparse, num_tasks = len(cfg.features.sparse), cfg.model.num_tasks
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
        "file": repo_lib.FILES[target.fmt],
        "model_name": target.model_dir.name,
        "version": target.version,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **io_manifest(cfg.features.dense, num_sparse, num_tasks),
        "features": {
            "dense": list(cfg.features.dense_names),
            "sparse": list(cfg.features.sparse),
            "sparse_table": cfg.feature_to_table(),
        },
        "feature_spec": feature_spec(cfg).to_dict(),
        "num_tasks": num_tasks,
        "tasks": cfg.model.task_names,
        "id_mapping": "row = raw_id mod rows (non-negative), inside the model",
        "load_requires": _LOAD_REQUIRES[target.fmt],
        "tables": tables,
        "embedding_bytes": {
            "fp32": fp32_total,
            "stored": stored_total,
            "ratio": round(stored_total / fp32_total, 4),
        },  # fmt: skip
        "dense": built.extra.get("dense", {"dtype": "fp32", "batch_invariant": False}),
        **({"batch_probe": built.extra["batch_probe"]} if "batch_probe" in built.extra else {}),
        **({"aoti": built.extra["aoti"]} if "aoti" in built.extra else {}),
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
    if "torchscript" in built:
        b = built["torchscript"]
        verify.check_identical("TorchScript reloaded from disk", b.reloaded, b.scores)
        checks["torchscript_reload_identical"] = True
        checks["raw_rows"] = b.extra["raw_rows"]
    if "aoti" in built:  # checked against its module in build_aoti
        extra = built["aoti"].extra
        checks["aoti_vs_module_max_abs_diff"] = extra["aoti"]["max_abs_diff_vs_module"]
        checks.setdefault("raw_rows", extra["raw_rows"])
    if "onnx" in built:  # its `scores` are the torch module the file was exported from
        checks["onnx_runtime_vs_source_max_abs_diff"] = verify.check_close(
            "ONNX Runtime vs the module it was exported from",
            built["onnx"].reloaded, built["onnx"].scores, verify.ONNX_TOLERANCE,
        )  # fmt: skip
    if "onnx" in built and "torchscript" in built:
        checks["onnx_vs_torchscript_max_abs_diff"] = verify.check_close(
            "ONNX Runtime vs TorchScript",
            built["onnx"].reloaded, built["torchscript"].scores, verify.ONNX_TOLERANCE,
        )  # fmt: skip
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
    rec_dense = [f for f in ("torchscript", "aoti") if f in built]
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
            formats: list[str], repo: Path, log: Log) -> Source:  # fmt: skip
    """The builders' input; refuses an export this machine cannot hold before any work."""
    batches = labelled if labelled is not None else _synthetic_batches(cfg)
    touched = reference_lib.touched_rows(cfg, batches)
    dim = max(t.dim for t in cfg.tables)
    chunk = stream.chunk_rows_for(dim, cfg.export.chunk_rows) * dim * 4
    ref_rows = sum(r.numel() for r in touched.values())
    resources.check_export(cfg, formats, stored_bytes(cfg), ref_rows, chunk, repo)
    ref_sink = reference_lib.ReferenceSink(cfg, touched)
    sample = sample_batch(cfg.features.dense, len(cfg.features.sparse))
    reader = CheckpointReader(loaded.step_dir)
    return Source(cfg, loaded, reader, sample, batches, log, ref_sink, [ref_sink])


def _stage_manifest(cfg: RecConfig, loaded: LoadedRun, t: repo_lib.Target, built: Built,
                    checks: dict[str, Any], staging: Path) -> dict[str, Any]:  # fmt: skip
    """Writes rec.json (model dir and version dir) and config.pbtxt into the staged model."""
    staged = staging / t.model_dir.name
    m = manifest(cfg, loaded, t, built, checks)
    repo_lib.write_manifest(staged / repo_lib.MANIFEST, m)
    repo_lib.write_manifest(staged / str(t.version) / repo_lib.MANIFEST, m)
    (staged / repo_lib.TRITON_CONFIG).write_text(
        repo_lib.triton_config(t.model_dir.name, t.fmt, cfg.features.dense,
                               len(cfg.features.sparse), cfg.model.num_tasks, cfg.export)
    )  # fmt: skip
    return m


def _already_exported(
    repo: Path, model_name: str, formats: list[str], run: Path, checkpoint: str | None
) -> dict[str, Path] | None:
    """Each format's newest version dir, when every rec.json names this checkpoint as source."""
    step_dir = run_dir.resolve_checkpoint(run, checkpoint).resolve()
    models = {}
    for fmt in formats:
        model_dir = repo / repo_lib.model_dir_name(model_name, fmt)
        versions = repo_lib.existing_versions(model_dir)
        manifest = model_dir / repo_lib.MANIFEST
        if not versions or not manifest.is_file():
            return None
        source = json.loads(manifest.read_text()).get("source", {}).get("checkpoint")
        if source != str(step_dir):
            return None
        models[fmt] = model_dir / str(versions[-1])
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
    eval_data: Iterable[RecBatch] | None = None,
    log: Log = print,
) -> ExportResult:
    """Exports a run's checkpoint into the model repository `repo` (Contract 2).

    Args:
        run: run directory (Contract 1). checkpoint: step dir name; default LATEST.
        quantize, fmt: override export.quantize / export.format of the run's config.
        config: YAML file whose `export:` section overrides the run's export settings.
        version: version directory to write; default the next one. force: replace it.
        skip_exported: write nothing when every format's newest version already holds this
            checkpoint (a deployment that runs export on every start exports each one once).
        eval_data: held-out batches for the quality checks; default rec.data's eval split.
    """
    run, repo = Path(run), Path(repo)
    cfg = resolve_config(run, quantize, fmt, config)
    formats = FORMAT_SETS.get(cfg.export.format, [cfg.export.format])
    if skip_exported and version is None:
        done = _already_exported(repo, cfg.export.model_name, formats, run, checkpoint)
        if done is not None:
            log(f"already exported, kept: {', '.join(map(str, done.values()))}")
            return ExportResult(repo, done, {})
    loaded = load_dense(run, checkpoint, cfg)
    log(f"loaded {loaded.step_dir} ({len(cfg.tables)} tables, dtypes {table_dtypes(cfg)})")
    targets = repo_lib.plan_targets(repo, cfg.export.model_name, formats, version, force)
    labelled = list(eval_data) if eval_data is not None else eval_batches(cfg, log)
    src = _source(cfg, loaded, labelled, formats, repo, log)
    repo_existed = repo.exists()
    staging = repo_lib.staging_dir(repo)
    try:
        built = {}
        for t in targets:
            vdir = staging / t.model_dir.name / str(t.version)
            vdir.mkdir(parents=True)
            built[t.fmt] = BUILDERS[t.fmt](src, vdir / repo_lib.FILES[t.fmt])
            log(f"{t.fmt}: built, scored and reloaded {t.model_dir.name}/{t.version}")
        reference = _score(
            reference_lib.ReferenceModule(loaded.model, cfg, src.reference), src.batches
        )
        labels = (
            torch.cat([b.labels.float() for b in src.batches]) if labelled is not None else None
        )
        checks = run_checks(cfg, reference, labels, built)
        manifests = {t.fmt: _stage_manifest(cfg, loaded, t, built[t.fmt], checks, staging)
                     for t in targets}  # fmt: skip
        _report(checks, manifests, log)
        for t in targets:
            repo_lib.commit(staging / t.model_dir.name, t)
            log(f"wrote {t.version_dir}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not repo_existed and repo.is_dir() and not any(repo.iterdir()):
            repo.rmdir()
    return ExportResult(repo, {t.fmt: t.version_dir for t in targets}, manifests)
