"""A ZCH model exported with an empty id map for t0, and update records (format rec.updates/2)
that admit ids into its slots and evict them, for the servers' map tests (tests/serve_cpp,
tests/serve_triton). No training: rec.update_log's rules and the servers' writes are the subject.

t0 (feature "a", sparse column 1) has T0_SLOTS slots and the default row. Ids X[s] and Y[s]
both have slot s as their home (rec.zch.home), so either may take it. The reference is model.pt
in this process with the same records written into it: rows by rec.update_log.write_rows, map
changes by rec.update_log.ServedMap (what Triton's model does, checked against rec-server's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from rec.broker import RedisBroker
from rec.contract.repository import ModelDir
from rec.contract.updates import UpdateRecord
from rec.quantize import fused_rows
from rec.update_log import ServedMap, write_rows
from rec.zch import home
from tests.export.zch_run import admitted_ids, hand_made_map, write_zch_run, zch_dict
from tests.helpers import rec_in_process

T0_SLOTS = 20000
"""Large enough that rewriting every slot takes about a forward pass: a pass that were not held
off would see a record half applied."""
RUN, EXPORTED = "zch-run", 10
FEATURES = 5  # e, a, c, b, d: tiny_dict's request columns
A = 1  # feature a's column: t0


def _ids_by_home(slots: int, per_slot: int = 2) -> np.ndarray:
    """int64 [per_slot, slots]: ids whose home slot is each slot."""
    out = np.zeros((per_slot, slots), dtype=np.int64)
    found = np.zeros(slots, dtype=np.int64)
    start = 1
    while found.min() < per_slot:
        ids = torch.arange(start, start + 4 * slots, dtype=torch.int64)
        for raw, slot in zip(ids.tolist(), home(ids, slots).tolist(), strict=True):
            if found[slot] < per_slot:
                out[found[slot], slot] = raw
                found[slot] += 1
        start += 4 * slots
    return out


class ZchLog:
    """The broker, the export (TorchScript; AOTInductor too with `aoti`) and the ids."""

    def __init__(self, tmp: Path, aoti: bool = False) -> None:
        self.broker = RedisBroker(tmp / "redis")
        data = zch_dict()
        data["tables"][0]["rows"] = T0_SLOTS + 1
        probes = data["tables"][0]["ids"]["zch"]["probes"]
        empty = (torch.zeros(T0_SLOTS, dtype=torch.int64), torch.zeros(T0_SLOTS, dtype=torch.bool))
        t1 = hand_made_map(119, probes, admitted_ids(120, 1))
        run = write_zch_run(tmp / "run", data, maps={"t0": empty, "t1": t1})
        self.repos = {"torchscript": tmp / "repo"}
        if aoti:
            self.repos["aoti"] = tmp / "repo_aoti"
        for fmt, repo in self.repos.items():
            rec_in_process("export", str(run), "--repo", str(repo), "--format", fmt, check=True)
        self.probes = probes
        self.model_pt = ModelDir.of(self.repos["torchscript"], "rec").model_file(1)
        manifest = json.loads(ModelDir.of(self.repos["torchscript"], "rec").manifest.read_text())
        self.place = manifest["updates"]["tables"]["t0"]
        self.map_buffers = manifest["zch"]["tables"]["t0"]["buffers"]
        self.x, self.y = _ids_by_home(T0_SLOTS)

    def stop(self) -> None:
        self.broker.stop()

    def url(self, stream: str) -> str:
        return self.broker.url(stream)

    def reference(self, records: list[UpdateRecord]) -> torch.jit.ScriptModule:
        """model.pt with `records` applied: rows, then evictions, then admissions."""
        module = torch.jit.load(str(self.model_pt))
        buffers = dict(module.named_buffers())
        keys, used = (buffers[b] for b in self.map_buffers)
        served = ServedMap(self.probes, [(keys, used)])
        for r in records:
            if r.count:
                write_rows(buffers[self.place["buffer"]], self.place, r.ids, r.rows)
            served.write(r)
        return module


def rows(values: torch.Tensor | float, n: int) -> bytes:
    """n int8 rows of dim 8 (codes, scale, bias): each all `values` (a float or [n])."""
    v = torch.as_tensor(values, dtype=torch.float32).reshape(-1, 1).expand(n, 8)
    return fused_rows(v.contiguous(), "int8").numpy().tobytes()


def record(step: int, ids=(), data: bytes = b"", evicted=(), admitted=(), **kw) -> UpdateRecord:
    """A record of t0 from rank 0 of 1 (every record completes a publish)."""
    base = dict(run=RUN, gen=1, rank=0, world=1, step=step, wall_ns=time.time_ns(), last=True,
                table="t0", dtype="int8", dim=8, ids=tuple(ids), rows=data,
                evicted=tuple(evicted), admitted=tuple(admitted))  # fmt: skip
    base.update(kw)
    return UpdateRecord(**base)


def admit(step: int, slots, ids, values, evict_ids=None) -> UpdateRecord:
    """`ids` take `slots` (sorted) with rows of `values`; `evict_ids`: who held them before."""
    slots = [int(s) for s in slots]
    admitted = list(zip(slots, (int(i) for i in ids), strict=True))
    evicted = [] if evict_ids is None else list(zip(slots, (int(i) for i in evict_ids),
                                                    strict=True))  # fmt: skip
    return record(step, slots, rows(values, len(slots)), evicted, admitted)


def request(a_ids: list[list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """One sample per bag of feature a's ids, the other features one small id each."""
    rng = np.random.default_rng(seed)
    batch = len(a_ids)
    lengths = np.ones((batch, FEATURES), dtype=np.int32)
    values = []
    for b, bag in enumerate(a_ids):
        lengths[b, A] = len(bag)
        for f in range(FEATURES):
            values.extend(bag if f == A else rng.integers(0, 40, size=1).tolist())
    dense = rng.standard_normal((batch, 4)).astype(np.float32)
    sparse = np.asarray(values, dtype=np.int64)
    return {"dense_features": dense, "sparse_lengths": lengths, "sparse_values": sparse}


def scores(module, req: dict[str, np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return module(*(torch.from_numpy(req[n]) for n in ("dense_features", "sparse_lengths",
                                                            "sparse_values"))).numpy()  # fmt: skip
