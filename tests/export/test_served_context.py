"""The context form of the served module (rec.export.served_context): R contexts of N_r
candidates each score bit for bit as the flat module scores the same pairs with each context
repeated (rec.contract.context.repeat), for every architecture, fp32 and int8 dense layers, ZCH
tables, one context of one candidate and empty context bags; scripted as eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rec.config import config_from_dict
from rec.contract.context import ContextSplit, offsets, repeat, split_flat
from rec.contract.io import CANDIDATE_OFFSETS, context_io_manifest
from rec.export import id_maps, served_context
from rec.export.module import sample_batch
from rec.export.served import TbeLookup
from tests.export.test_served import _config, _served
from tests.export.zch_run import admitted_ids, hand_made_map, zch_dict
from tests.helpers import needs_bf16_cpu


def _split(cfg, dense: list[int], sparse: list[str]) -> ContextSplit:
    names = list(cfg.features.sparse)
    cols = tuple(sorted(names.index(f) for f in sparse))
    return ContextSplit(tuple(dense), cols, cfg.features.dense, len(names))


def _context_request(cfg, split: ContextSplit, counts: list[int], seed: int, ids=None):
    """R = len(counts) contexts (from one random flat batch) and their candidates (from
    another), as the context model's inputs by name; `ids` replace some random ids."""
    num_dense, num_sparse = cfg.features.dense, len(cfg.features.sparse)
    batches = [sample_batch(num_dense, num_sparse, n, seed=seed + i)
               for i, n in enumerate((len(counts), sum(counts)))]  # fmt: skip
    if ids is not None:
        for _, _, values in batches:
            pick = torch.arange(0, values.shape[0], 2)
            values[pick] = torch.tensor(ids)[pick % len(ids)]
    ctx = split_flat(split, *(t.numpy() for t in batches[0]))
    cand = split_flat(split, *(t.numpy() for t in batches[1]))
    inputs = {k: v for k, v in ctx.items() if k.startswith("context_")}
    inputs.update({k: v for k, v in cand.items() if k.startswith("candidate_")})
    inputs[CANDIDATE_OFFSETS] = offsets(counts, len(split.cand_sparse))
    return inputs


def _check(cfg, split, module, inputs, maps=None) -> torch.Tensor:
    """The context module's scores of `inputs`, asserted equal to the flat module's; `maps`:
    the ZCH tables' id maps, filled into both."""
    context = served_context.context_module(module, cfg, split)
    if maps is not None:
        id_maps.fill(module, maps)
        id_maps.fill(context, maps)
    names = [i["name"] for i in context_io_manifest(split, cfg.model.num_tasks)["inputs"]]
    args = [torch.from_numpy(inputs[n]) for n in names]
    flat = [torch.from_numpy(a) for a in repeat(split, inputs)]
    with torch.no_grad():
        got, want = context(*args), module(*flat)
    assert got.shape == want.shape
    assert np.array_equal(got.numpy(), want.numpy())
    return got


SPLITS = {  # arch -> (context dense columns, context sparse features)
    "dlrm": ([0, 2], ["a", "c", "d"]),  # c shares table t1 with the candidates' b; d is mean
    "dlrm_dcn": ([0, 1, 2, 3], ["e", "d"]),  # every dense feature: the bottom MLP once
    "dcn_v2": ([1], ["a", "c", "d"]),
    "mmoe": ([0, 1, 2, 3], ["a", "b"]),
    "din": ([0, 3], ["hist", "a", "d"]),  # the history once per context
}


@pytest.mark.parametrize(
    ("arch", "dense_dtype"),
    [(arch, dtype) for arch in SPLITS for dtype in ("fp32", "int8")]
    + [pytest.param(arch, "bf16", marks=needs_bf16_cpu) for arch in ("dlrm_dcn", "din")],
)
def test_context_scores_are_the_flat_scores_bit_for_bit(arch, dense_dtype):
    """Three contexts of 1, 4 and 7 candidates, then one of one (bf16: fewer rows than
    oneDNN's minimum, padded on both sides)."""
    cfg = _config(arch, dense_dtype)
    module, _ = _served(cfg)
    split = _split(cfg, *SPLITS[arch])
    _check(cfg, split, module, _context_request(cfg, split, [1, 4, 7], seed=11))
    _check(cfg, split, module, _context_request(cfg, split, [1], seed=12))


@pytest.mark.parametrize(
    ("arch", "dense", "sparse"),
    [
        ("dlrm", [], ["a"]),  # no context dense
        ("dlrm", [0, 1], []),  # no context sparse: dense alone
        ("dcn_v2", [0, 1, 2, 3], []),  # every dense feature and no sparse one
        ("din", [], ["e"]),  # din's history the candidates'
    ],
)
def test_every_signature_scores_as_flat(arch, dense, sparse):
    """The forward of each set of present inputs (zero-width ones left out), named as
    rec.contract.io lists them."""
    cfg = _config(arch)
    module, _ = _served(cfg)
    split = _split(cfg, dense, sparse)
    _check(cfg, split, module, _context_request(cfg, split, [2, 3], seed=21))
    context = served_context.context_module(module, cfg, split)
    names = [i["name"] for i in context_io_manifest(split, cfg.model.num_tasks)["inputs"]]
    assert [a.name for a in torch.jit.script(context).forward.schema.arguments][1:] == names


def test_empty_context_bags():
    """Contexts whose bags hold no id (zero vectors, as the flat module pools them)."""
    cfg = _config("dcn_v2")
    module, _ = _served(cfg)
    split = _split(cfg, [0], ["a", "c", "d"])
    inputs = _context_request(cfg, split, [3, 2], seed=31)
    inputs["context_lengths"][:] = 0
    inputs["context_values"] = inputs["context_values"][:0]
    _check(cfg, split, module, inputs)


def test_zch_context_feature():
    """A ZCH table read by context features (a) and by both sides (t1: c context, b
    candidate): admitted ids read their slots, others the default row, as flat."""
    cfg = config_from_dict(zch_dict())
    module, _ = _served(cfg)
    ids = admitted_ids(300)
    maps = {"t0": id_maps.TableMap(*hand_made_map(299, 4, ids)),
            "t1": id_maps.TableMap(*hand_made_map(119, 4, admitted_ids(120, 1)))}  # fmt: skip
    split = _split(cfg, [0, 1], ["a", "c"])
    inputs = _context_request(cfg, split, [2, 5], seed=41, ids=ids + admitted_ids(120, 1))
    got = _check(cfg, split, module, inputs, maps)
    id_maps.fill(module, {n: id_maps.TableMap(*hand_made_map(m.keys.numel(), 4, []))
                          for n, m in maps.items()})  # fmt: skip
    flat = [torch.from_numpy(a) for a in repeat(split, inputs)]
    with torch.no_grad():  # the maps were read: empty ones score otherwise
        assert not torch.equal(module(*flat), got)


def test_subset_shares_the_tables_storage():
    """Both sides read the flat lookup's one storage: model.pt holds the tables once."""
    cfg = _config("dlrm")
    module, _ = _served(cfg)
    split = _split(cfg, [0], ["a", "c"])
    context = served_context.context_module(module, cfg, split)
    lookups = [m for m in context.modules() if isinstance(m, TbeLookup)]
    assert len(lookups) == 2
    assert {m.weights_host.data_ptr() for m in lookups} == {module.lookup.weights_host.data_ptr()}


@pytest.mark.parametrize("arch", ["dlrm_dcn", "din"])
def test_scripted_context_module_scores_as_eager(arch):
    cfg = _config(arch, "int8")
    module, _ = _served(cfg)
    split = _split(cfg, *SPLITS[arch])
    context = served_context.context_module(module, cfg, split)
    scripted = torch.jit.script(context)
    names = [i["name"] for i in context_io_manifest(split, cfg.model.num_tasks)["inputs"]]
    for counts in ([1], [3, 1, 6]):
        inputs = _context_request(cfg, split, counts, seed=len(counts))
        args = [torch.from_numpy(inputs[n]) for n in names]
        with torch.no_grad():
            assert torch.equal(scripted(*args), context(*args))


def test_the_contexts_part_runs_once_per_context():
    """Every dense feature the context's: the bottom MLP sees R rows, not B; the context
    lookup R bags per feature; din's history rows are looked up once per context."""
    cfg = _config("din")
    module, _ = _served(cfg)
    split = _split(cfg, [0, 1, 2, 3], ["hist", "a", "d"])
    context = served_context.context_module(module, cfg, split)
    seen: dict[str, int] = {}

    def rows(name):
        return lambda _m, args: seen.__setitem__(name, args[0].shape[0])

    context.head.dense_arch.register_forward_pre_hook(rows("dense_arch"))
    context.pairs.lookup.pooled.ctx.register_forward_pre_hook(rows("context bags"))
    context.pairs.lookup.ctx_seq.lookup = _counting(context.pairs.lookup.ctx_seq.lookup, seen)
    inputs = _context_request(cfg, split, [4, 9], seed=51)
    _check(cfg, split, module, inputs)
    names = [i["name"] for i in context_io_manifest(split, 1)["inputs"]]
    with torch.no_grad():
        context(*[torch.from_numpy(inputs[n]) for n in names])
    history = int(inputs["context_lengths"][:, 0].sum())  # hist is the first context column
    assert seen == {"dense_arch": 2, "context bags": 2, "history_rows": history}


def _counting(lookup, seen):
    def counted(indices, offsets):
        rows = lookup(indices, offsets)
        seen["history_rows"] = rows.shape[0]
        return rows

    return counted
