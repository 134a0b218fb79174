"""TorchScript: the served module (FBGEMM TBE tables, rec's dense layers) scripted into model.pt.
Served by rec-server, rec's Triton Python model and Triton's `pytorch_libtorch` backend."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from rec.contract import FORMATS
from rec.export.formats import Format

if TYPE_CHECKING:  # the registry is read at config load: heavy imports wait for a build
    from pathlib import Path

    from rec.export import build as b


def build(src: b.Source, out: Path) -> b.Built:
    """The served module's TBE storage filled from the streamed tables -> script -> model.pt;
    scored in memory, released, reloaded from disk and scored again."""
    import torch

    from rec.contract.context import ContextSplit
    from rec.contract.store import is_raw_keyed, store_order
    from rec.export import build as b
    from rec.export import context_checks, raw_rows, served, torchscript_builder

    cfg = src.cfg
    stored = store_order(src.store) if src.store else []
    if stored:  # the head and the other tables here; the stored tables' rows come per batch
        from rec.export import tiered
        from rec.export.tiered import TieredScorer
        from rec.store.reader import StoreReader

        raw_keyed = [n for n in stored if is_raw_keyed(src.store["tables"][n])]
        module, tbe = tiered.tiered_served_module(src.loaded.model, cfg, b.table_dtypes(cfg),
                                                  stored, raw_keyed)  # fmt: skip
    else:
        module, tbe = torchscript_builder.served_module(src.loaded.model, cfg, b.table_dtypes(cfg))
    zch = src.zch_sections(module)
    layers = b.dense_layer_dtypes(module)
    if cfg.export.dense_dtype != "fp32" and not layers.get(cfg.export.dense_dtype):
        src.log(
            f"warning: export.dense_dtype {cfg.export.dense_dtype} applies to no layer: each is "
            "too small to gain from it and stays fp32 (rec.export.dense.invariant_linear)"
        )
    what = f"the model of model.factory {cfg.model.factory!r}" if cfg.model.factory else "the model"
    if cfg.model.factory:  # refuse what TorchScript cannot compile before streaming the tables
        torchscript_builder.script(module, what)
    if tbe is None:  # every table in the store: nothing of the tables in model.pt
        src.stream_into()
        tables: dict = {}
    else:
        src.stream_into(served.TbeSink(tbe, skip=frozenset(stored)))
        tables = served.table_storage(tbe)
    for name in stored:  # in the embedding store, not in model.pt
        spec = src.store["tables"][name]
        tables[name] = {"stored_dtype": spec["dtype"], "bytes_stored": 0, "bytes_unpadded": 0,
                        "in_store": spec["rows"] * spec["row_bytes"]}  # fmt: skip
    updates = b.updates_section(src, served.update_layout(module, tbe) if tbe is not None else {})
    if stored:
        reader = StoreReader(src.store)
        scripted = tiered.to_torchscript(module, src.sample, reader)

        def scorer(model):
            return TieredScorer(model, reader)
    elif cfg.features.context:  # flat batches as B contexts of one candidate, as servers do
        split = ContextSplit.from_config(cfg)
        sample = context_checks.context_sample(split, src.sample)
        scripted = torchscript_builder.to_torchscript(module, sample, what)

        def scorer(model):
            return context_checks.FlatScorer(model, split)
    else:
        scripted = torchscript_builder.to_torchscript(module, src.sample, what)

        def scorer(model):
            return model

    torch.jit.save(scripted, str(out))
    scores = b.score(scorer(scripted), src.batches)
    del scripted, module, tbe  # the TBE storage: make room for the reloaded copy
    gc.collect()
    loaded = torch.jit.load(str(out))
    reloaded = scorer(loaded)
    hint = b.BF16_NOT_INVARIANT if cfg.export.dense_dtype == "bf16" else ""
    checks = {"raw_rows": raw_rows.round_trip(cfg, reloaded), **src.score_zch(reloaded)}
    if cfg.features.context:
        request = context_checks.probe_request(split)
        batching = b.check_context_batching("torchscript", loaded, request, split,
                                            cfg.export.batch_invariant, hint)  # fmt: skip
        checks["context_vs_flat"] = context_checks.context_vs_flat(loaded, split, src.batches)
        request = context_checks.probe_section(request, split)
    else:
        request = b.batching_request(cfg)
        batching = b.check_batching("torchscript", reloaded, request, cfg.export.batch_invariant,
                                    hint)  # fmt: skip
    return b.Built(
        scores, b.score(reloaded, src.batches), batching, tables,
        sections={**b.dense_sections(cfg, layers, request), "updates": updates, **zch},
        checks=checks,
    )  # fmt: skip


def verify(built: dict[str, b.Built], checks: dict[str, Any]) -> None:
    from rec.export import verify as v

    mine = built["torchscript"]
    v.check_identical("TorchScript reloaded from disk", mine.reloaded, mine.scores)
    checks["torchscript_reload_identical"] = True
    checks["raw_rows"] = mine.checks["raw_rows"]


FORMAT = Format(
    spec=FORMATS["torchscript"],
    load_requires="FBGEMM's ops and classes and rec's ops (rec::linear, rec::linear_int8, "
    "rec::zch_remap_counted) registered before torch.jit.load: `import fbgemm_gpu` and `import "
    "rec.ops` in Python; in C++ dlopen the fbgemm_gpu package's .so files and rec's rec/_ops.so "
    "with RTLD_GLOBAL",
    build=build,
    verify=verify,
)
