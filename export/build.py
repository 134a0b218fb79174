"""What every format's builder shares (rec.export.formats): its input (`Source`: the dense
layers, the checkpoint's tables to stream, the verification batches), its output (`Built`: the
staged model's scores and what rec.json records of it) and the checks every builder runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from rec import batch_probe, run_dir
from rec import ops as rec_ops
from rec.batch import RecBatch
from rec.config import RecConfig
from rec.contract.sections import BatchProbe, DenseSection, UpdatesSection
from rec.contract.updates import FORMAT as UPDATES_FORMAT
from rec.cpu import cpu_info
from rec.export import id_maps, stream, verify, zch_checks
from rec.export import reference as reference_lib
from rec.export.dcp_reader import CheckpointReader
from rec.export.dense import DENSE_DTYPES, Int8Linear, InvariantLinear, PackedLinear
from rec.export.load import LoadedRun
from rec.export.module import sample_batch
from rec.model import table_keys

Log = Callable[[str], None]


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
    maps: dict[str, Any] = field(default_factory=dict)
    """The ZCH tables' id maps out of the checkpoint (rec.export.id_maps.read_maps), which
    every format's model holds; {} without ZCH tables."""
    zch_probe: Any = None
    """rec.export.zch_checks.ZchProbe: the requests every format scores for the ZCH checks."""
    store: Any = None
    """rec.json's `store` section when export.store puts tables in the embedding store (their
    rows go there on the first streaming pass; rec.export.tiered), else None."""

    def zch_sections(self, module: torch.nn.Module) -> dict[str, Any]:
        """Fills the ZCH tables' maps into a format's `module`; rec.json's `zch` section of it
        ({} without ZCH tables)."""
        if not self.maps:
            return {}
        id_maps.fill(module, self.maps)
        return {"zch": id_maps.section(self.cfg, self.maps, module)}

    def score_zch(self, scorer: verify.Scorer) -> dict[str, Any]:
        """Built.checks' "zch_probe": the reloaded model's scores of the ZCH probe."""
        return {"zch_probe": zch_checks.score_probe(scorer, self.zch_probe)} if self.maps else {}

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
    """rec.json's per-table storage facts (stored_dtype, bytes_stored, ...)."""
    sections: dict[str, Any] = field(default_factory=dict)
    """rec.json sections of this format's own ("dense", "batch_probe", "aoti", ...)."""
    checks: dict[str, Any] = field(default_factory=dict)
    """Results measured while building (e.g. the raw-row round trip), for its verifier."""


def table_dtypes(cfg: RecConfig) -> dict[str, str]:
    return {t.name: cfg.export.table_dtypes.get(t.name, cfg.export.quantize) for t in cfg.tables}


def score(scorer: verify.Scorer, batches: Iterable[RecBatch]) -> torch.Tensor:
    with torch.no_grad():
        scores = [scorer(b.dense, b.lengths, b.values).float() for b in batches]
    if not scores:
        raise verify.VerificationError("the held-out split yielded no batches to verify with")
    return torch.cat(scores)


def batching_request(cfg: RecConfig):
    # 37 samples: past the sizes where CPU kernels switch paths (GEMM at 16, SIMD tails).
    return sample_batch(cfg.features.dense, len(cfg.features.sparse), 37, seed=7)


def updates_section(src: Source, layout: dict[str, dict]) -> dict[str, Any]:
    """rec.json's "updates": where a server applying the update log (rec.contract.updates)
    listens by default (the run's publish.url, or null), the publisher's run id and the step this
    export holds (a server applies only that run's records, of later steps), and the tables'
    places in the model's storage (rec.export.served.update_layout)."""
    run = src.loaded.step_dir.parent.parent
    publish = run / run_dir.PUBLISH_FILE
    run_id = json.loads(publish.read_text()).get("run") if publish.is_file() else None
    return UpdatesSection(
        format=UPDATES_FORMAT,
        url=src.cfg.publish.url or None,
        run=run_id,
        step=int(src.loaded.meta.get("step", 0)),
        # The publisher's generation that trained up to that step (0: none published): the
        # server applies the log's records after (gen, step).
        gen=int(src.loaded.meta.get("publish_gen") or 0),
        tables=layout,
    ).to_dict()


def dense_sections(cfg: RecConfig, layers: dict[str, int], request) -> dict[str, Any]:
    """rec.json's "dense" and "batch_probe" sections of a format with rec's dense layers."""
    dense = DenseSection(
        dtype=cfg.export.dense_dtype,
        batch_invariant=cfg.export.batch_invariant,
        layers=layers,
        # Where the batching check passed; servers re-run it on their own CPU at load.
        verified_on={**cpu_info(), "rec_linear_isa": rec_ops.linear_isa()},
    )
    return {
        "dense": dense.to_dict(),
        # The same request for the servers' load-time probe on their own CPU (rec.batch_probe).
        "batch_probe": BatchProbe(batch_probe.to_manifest(request)).to_dict(),
    }


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


def check_context_batching(
    name: str, model, request: dict[str, torch.Tensor], split, exact: bool, hint: str = ""
) -> float:
    """check_batching of a context model: the probe's contexts as one batch vs each request
    alone and each candidate alone (rec.batch_probe.context_variance)."""
    diff = batch_probe.context_variance(model, request, len(split.cand_sparse))
    if exact and diff != 0:
        contexts = request["candidate_offsets"].numel() - 1
        raise verify.VerificationError(
            f"{name}: {contexts} contexts scored as one batch score differently from each "
            f"request alone or each candidate alone (max diff {diff:g}), but the export is "
            f"batch invariant{hint}"
        )
    return diff
