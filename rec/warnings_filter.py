"""The third-party warnings rec's commands hide, in one table, each with why it is harmless here.

A default `rec train`, `rec export` or `rec serve` prints only rec's own lines. The libraries
under it (TorchRec, FBGEMM, torch.distributed, the ONNX exporter) warn about things rec has
already dealt with or that do not apply to it; each such warning is listed below by the start of
its message, its category and the module it is attributed to (or its logger), so that anything
new, or the same words from somewhere else, still shows. A warning that points at a real
problem does not belong here: its cause is fixed instead. The tests that run the commands
(train on every sharding type, resume, export, serve) fail on any warning line
(tests/helpers.py: warning_lines).

`rec --verbose COMMAND` shows them all again. The setting travels to the processes a command
starts (the training ranks torchrun runs) as REC_VERBOSE=1 in their environment, which also
works on its own (e.g. for `torchrun -m rec.train.worker` on several hosts). Every process that
prints one of these calls `install()` first: the `rec` command itself and each training rank.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass

VERBOSE_ENV = "REC_VERBOSE"


@dataclass(frozen=True)
class Known:
    """A third-party message rec hides: a `warnings.warn` (category set) or a logging record
    (category None: `module` is then the logger's name)."""

    message: str
    """The message's first words, exactly (it must start with them)."""
    category: type[Warning] | None
    module: str
    """The module the warning is attributed to (its caller's, with stacklevel), or the logger."""
    why: str


KNOWN: tuple[Known, ...] = (
    # ---- rec train: every rank ------------------------------------------------------------
    Known(
        "Sharding Type is data_parallel, caching params will be ignored",
        None,
        "torchrec.distributed.utils",
        "TorchRec logs this for every data_parallel table whatever its params; rec sets no "
        "cache params (they size a GPU's UVM row cache), so nothing is ignored.",
    ),
    Known(
        "TORCHREC_RESOLVED_POD_SIZE not set, utilizing LOCAL_WORLD_SIZE instead.",
        None,
        "torchrec.distributed.comm",
        "A pod is a host here: LOCAL_WORLD_SIZE is the host size rec's planner used too "
        "(rec.train.sharding; the trainer sets it from sharding.topology).",
    ),
    Known(
        "[Connection] intra_group: ",
        None,
        "torchrec.distributed.comm",
        "TorchRec logs the ranks of the host-local process group it makes for "
        "table_row_wise and grid_shard at WARNING level; they are the plan's hosts.",
    ),
    Known(
        "[Connection] cross_group: ",
        None,
        "torchrec.distributed.comm",
        "The same for the process group across hosts.",
    ),
    Known(
        "`broadcast_buffers` is deprecated.",
        FutureWarning,
        "torchrec.distributed.model_parallel",
        "TorchRec wraps the dense layers in DDP with broadcast_buffers=False, which the "
        "pinned torch still honours; rec's models' buffers are constants (an index, a mask), "
        "equal on every rank, so there is nothing to sync.",
    ),
    Known(
        "`broadcast_buffers` is deprecated.",
        FutureWarning,
        "torchrec.distributed.embeddingbag",
        "The same, for the DDP around data_parallel tables.",
    ),
    Known(
        "`torch.distributed.reduce_scatter_tensor` is deprecated.",
        FutureWarning,
        "torch.distributed.c10d_logger",
        "TorchRec's reduce-scatter of row-sharded tables' pooled embeddings calls the old "
        "name, which works in the pinned torch.",
    ),
    Known(
        "`torch.distributed.all_gather_into_tensor` is deprecated.",
        FutureWarning,
        "torch.distributed.c10d_logger",
        "The same, for that reduce-scatter's backward, an all-gather.",
    ),
    Known(
        "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not "
        "registered to the Autograd key(s) but we are trying to backprop through it.",
        UserWarning,
        "torch.autograd.graph",
        "FBGEMM's kernel for data_parallel tables registers its autograd function under the "
        "CPU key, so torch also attaches its fallback node and warns when backward passes it. "
        "The gradient comes from FBGEMM's own function and is right: "
        "tests/core/test_warnings_filter.py compares it with torch's EmbeddingBag.",
    ),
    Known(
        "is_fx_tracing will return true for both fx.symbolic_trace and torch.export.",
        None,
        "torch.fx._symbolic_trace",
        "TorchRec asks torch whether it is being traced; rec traces with fx only, where the "
        "answer is right. (rec export logs it too.)",
    ),
    # ---- rec train --resume: loading a checkpoint of sharded tables -------------------------
    Known(
        "Please use DTensor instead and we are deprecating ShardedTensor.",
        FutureWarning,
        "torch.distributed.checkpoint.planner_helpers",
        "TorchRec's sharded tables are ShardedTensors, which torch.distributed.checkpoint "
        "loads as it always did; rec cannot choose DTensor for them.",
    ),
    Known(
        "Please use DTensor instead and we are deprecating ShardedTensor.",
        FutureWarning,
        "torch.distributed.checkpoint.default_planner",
        "The same, where the load plan compares the checkpoint's sizes with the model's.",
    ),
    # ---- rec export: one process reads a checkpoint written by many -----------------------
    Known(
        "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is "
        "to load in a single process.",
        UserWarning,
        "torch.distributed.checkpoint.utils",
        "That is the intent: export reads every rank's shards alone, with no process group.",
    ),
    # ---- rec export --follow: a checkpoint training rotated away mid-read ------------------
    Known(
        "Global metadata is not found. Falling back to rank local metadata.",
        None,
        "root",
        "torch.distributed.checkpoint logs this, with a traceback, when a checkpoint's .metadata "
        "cannot be read; the load then fails and rec says why in its own words (export: the "
        "checkpoint it cannot load; --follow: deleted by training while exporting, "
        "checkpoint.keep_last, and it takes the newest).",
    ),
    Known(
        "Rank local metadata is not found.",
        None,
        "root",
        "The second line of the same failed read (above).",
    ),
    # ---- rec export --format onnx: torch's dynamo exporter --------------------------------
    Known(
        "torchvision is not installed. Skipping torchvision::",
        None,
        "torch.onnx._internal.exporter._registration",
        "The exporter looks for torchvision's detection ops; rec's models use none of them.",
    ),
    Known(
        "`isinstance(treespec, LeafSpec)` is deprecated",
        FutureWarning,
        "copyreg",
        "torch.export copies its own pytree specs, old leaf class included; rec's code does "
        "not use it.",
    ),
    Known(
        "Attribute type is ambiguous because it is an empty sequence.",
        None,
        "onnx_ir._convenience",
        "An empty list attribute in the exported graph is taken as INTS, its type; export "
        "then scores the ONNX model against the float one (the AUC and max |diff| it prints).",
    ),
    Known(
        "# The axis name: batch will not be used, since it shares the same shape constraints "
        "with another axis: batch.",
        UserWarning,
        "torch.onnx._internal.exporter._onnx_program",
        "rec names the batch axis of every input `batch` (rec.export.onnx_builder): the inputs "
        "do share it, and it keeps that name.",
    ),
    # ---- rec train: the launcher, when a rank fails or a signal stops the run -------------
    Known(
        "Received ",
        None,
        "torch.distributed.elastic.agent.server.api",
        "`Received 15 death signal, shutting down workers`: the launcher passes SIGTERM or "
        "SIGINT on to the ranks, which is how a run is stopped; rec train then says where the "
        "run stands (a stream run checkpoints first).",
    ),
    Known(
        "Sending process ",
        None,
        "torch.distributed.elastic.multiprocessing.api",
        "`Sending process N closing signal SIGTERM`: the launcher stopping the other ranks after "
        "a signal or a failed rank; rec train names the failed rank and its error.",
    ),
    Known(
        "failed (exitcode: ",
        None,
        "torch.distributed.elastic.multiprocessing.api",
        "The launcher's own line for a failed rank; rec train prints that rank's error instead, "
        "in one line.",
    ),
    # ---- rec export --format aoti: loading the package back to score it -------------------
    Known(
        "Device information mismatch for AOTI_CPU_ISA: ",
        None,
        "torch.export.pt2_archive._package",
        "The package is compiled for export.cpu_isa (avx2 by default, for any x86-64-v3 "
        "server), not for the widest ISA of the CPU that loads it. A CPU without the package's "
        "flags is refused before loading (rec.aoti_package.check_cpu), and export scores the "
        "loaded package against the float model.",
    ),
)


class _KnownRecords(logging.Filter):
    """Drops the logging records KNOWN lists for the logger it is attached to."""

    def __init__(self, patterns: list[re.Pattern]) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(p.match(text) for p in self.patterns)


_record_filters: dict[str, _KnownRecords] = {}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def _warning_filters() -> list[tuple[str, type[Warning], str]]:
    """(message, category, module) as warnings.filterwarnings takes them: the message matched
    from its start (as filterwarnings always does), the module whole."""
    return [(re.escape(k.message), k.category, re.escape(k.module) + r"\Z")
            for k in KNOWN if k.category is not None]  # fmt: skip


def install(show: bool | None = None) -> None:
    """Hides KNOWN in this process, unless `show` (default: REC_VERBOSE is set). Idempotent.
    A process decides once (warnings filters stay), but `show` does drop the logging filters an
    earlier call attached: a logger is the whole process's, tests included."""
    if show if show is not None else verbose():
        for name, record_filter in _record_filters.items():
            logging.getLogger(name).removeFilter(record_filter)
        _record_filters.clear()
        return
    for message, category, module in _warning_filters():
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    loggers: dict[str, list[re.Pattern]] = {}
    for known in KNOWN:
        if known.category is None:
            loggers.setdefault(known.module, []).append(re.compile(re.escape(known.message)))
    for name, patterns in loggers.items():
        if name not in _record_filters:
            _record_filters[name] = _KnownRecords(patterns)
            logging.getLogger(name).addFilter(_record_filters[name])


def set_verbose(show: bool) -> None:
    """`rec --verbose`: this process and those it starts show every warning. Otherwise KNOWN
    is hidden here, and each process it starts hides it for itself (install())."""
    if show:
        os.environ[VERBOSE_ENV] = "1"
    install()
