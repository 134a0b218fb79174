"""ZCH tables in the exported model (docs/zch.md): the id maps out of the checkpoint, the remap
inside the served module, the float reference's rows and rec.json's `zch` section.

A ZCH table's rows are its slots and, last, its default row. Training checkpoints each ZCH
table's map (rec.zch.IdMap) as `zch.<table>.keys` (int64 [slots]) and `zch.<table>.used` (bool
[slots]). The served module holds them as buffers of `IdMaps` and maps a ZCH feature's raw ids
with rec.zch.lookup: the slot that holds each id, or the default row. The other features keep
the modulo. So the artifact takes raw ids, and no request reads another id's row.

The maps ride with the tables: TorchScript keeps them as attributes of model.pt (preserved when
frozen, so a server can find them by name); AOTInductor passes them as trailing inputs from
tables.bin, like the tables (rec.export.aoti_builder), which is why `IdMap.forward` reads its
buffers through `view`: a loader hands it raw bytes.

Example:
    >>> from rec.config import config_from_dict  # doctest: +SKIP
    >>> maps = IdMaps(cfg, ["a", "b"])  # doctest: +SKIP
    >>> fill(module, {"t0": (keys, used)})  # doctest: +SKIP
"""

from typing import NamedTuple

import torch
from torch import nn

import rec.ops  # noqa: F401  (rec::zch_remap_counted, which the served module calls)
from rec import run_dir, zch
from rec.config import ConfigError, RecConfig
from rec.contract.sections import ZCH_MAP_LAYOUT, ZchSection, ZchTable

# No `from __future__ import annotations` here: TorchScript reads the annotations at runtime.

CHECKPOINT_KEY = "zch.{table}.{part}"
"""The checkpoint's key of a ZCH table's map tensor (part: keys or used): training saves
state["zch"][table][part], which DCP flattens to this."""


class IdMapError(ConfigError):
    """A checkpoint's id map does not fit its table (missing, wrong size or dtype)."""


class TableMap(NamedTuple):
    keys: torch.Tensor
    """int64 [slots]: the raw id each slot holds."""
    used: torch.Tensor
    """bool [slots]: whether the slot holds one."""


def zch_tables(cfg: RecConfig) -> dict[str, zch.ZchConfig]:
    """The ZCH tables of `cfg` and their settings, in table order."""
    return {t.name: t.zch for t in cfg.tables if t.zch is not None}


def read_maps(reader, cfg: RecConfig) -> dict[str, TableMap]:
    """Every ZCH table's map out of the checkpoint (a rec.export.dcp_reader.CheckpointReader),
    checked against its table: present, int64 / bool, [slots] each, and placed by this rec's
    home() (rec.zch.check_checkpoint_layout)."""
    out: dict[str, TableMap] = {}
    if zch_tables(cfg):
        zch.check_checkpoint_layout(run_dir.read_meta(reader.step_dir), reader.step_dir)
    for name, z in zch_tables(cfg).items():
        parts = {}
        for part, dtype in (("keys", torch.int64), ("used", torch.bool)):
            key = CHECKPOINT_KEY.format(table=name, part=part)
            try:
                tensor = reader.read_tensor(key)
            except KeyError:
                raise IdMapError(
                    f"checkpoint {str(reader.step_dir)!r} holds no id map for ZCH table {name!r} "
                    f"({key!r} is missing): was it trained with tables[{name}].ids: zch?"
                ) from None
            if tensor.dtype != dtype or tuple(tensor.shape) != (z.slots,):
                raise IdMapError(
                    f"checkpoint {str(reader.step_dir)!r}: {key!r} is {tensor.dtype} "
                    f"{list(tensor.shape)}, but ZCH table {name!r} has {z.slots} slots (rows "
                    f"{z.slots + 1}, the last the default row): its map must be {dtype} "
                    f"[{z.slots}]. Was the checkpoint trained with another tables[{name}].rows?"
                )
            parts[part] = tensor
        out[name] = TableMap(**parts)
    return out


class IdMap(nn.Module):
    """One ZCH table's map and the TBE features that read it: their raw ids -> rows."""

    def __init__(self, slots: int, probes: int, features: list[int], num_features: int) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(slots, dtype=torch.int64))
        self.register_buffer("used", torch.zeros(slots, dtype=torch.bool))
        self.probes = probes
        self.features = features
        reads = torch.zeros(num_features, dtype=torch.bool)
        reads[features] = True
        self.register_buffer("reads", reads)
        # rec.zch's constants, as attributes: TorchScript cannot read a module's global ints.
        self.mix = zch.HOME_CONSTANTS

    def forward(
        self, ids: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, batch: int
    ) -> torch.Tensor:
        """indices with the rows of this map's features' ids replaced (feature k's ids are
        ids[offsets[k * batch] : offsets[(k + 1) * batch]], feature-major)."""
        keys, used = self.typed()
        for k in self.features:
            if torch.jit.is_scripting():
                start, stop = int(offsets[k * batch]), int(offsets[(k + 1) * batch])
            else:  # torch.export: counts read from the data, which lie within the ids
                start, stop = offsets[k * batch].item(), offsets[(k + 1) * batch].item()
                torch._check(start >= 0)
                torch._check(start <= stop)
                torch._check(stop <= ids.shape[0])
            indices[start:stop] = self.rows(ids[start:stop], keys, used)
        return indices

    def typed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys int64, used as bool or its bytes): an AOTInductor loader hands the buffers as
        raw bytes (tables.bin), TorchScript has them typed."""
        if torch.jit.is_scripting():
            return self.keys, self.used
        # Not view(torch.bool): Inductor's vectorized uint8 -> bool bitcast does not compile
        # (torch 2.13); rec::zch_remap reads either, the plain ops compare with 0.
        return self.keys.view(torch.int64), self.used.view(torch.uint8)

    def masked(self, ids: torch.Tensor, feature: torch.Tensor, indices: torch.Tensor):
        """`indices` with the rows of the ids whose feature (`feature`, per id) reads this map:
        every id looked up, no data-dependent sizes (ONNX's GatherLookup)."""
        mine = self.reads[feature]
        rows = _plain_lookup(ids, self.keys, self.used, self.probes, self.mix)
        return torch.where(mine, rows, indices)

    def rows(self, ids: torch.Tensor, keys: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
        """rec.zch.lookup itself (the float reference's, eager) or its copy (scripted)."""
        if not torch.jit.is_scripting():
            return zch.lookup(ids, keys, used != 0, self.probes)
        return _plain_lookup(ids, keys, used != 0, self.probes, self.mix)


Mix = tuple[int, int, int, int, int, int, int, int]
"""rec.zch.HOME_CONSTANTS: int64's max, the word (2^32) and home's multipliers M0..M5."""


def _plain_lookup(
    ids: torch.Tensor, keys: torch.Tensor, used: torch.Tensor, probes: int, mix: Mix
) -> torch.Tensor:
    """rec.zch.lookup, op for op, for TorchScript and ONNX (tests/export/test_id_maps.py holds
    the two equal on extreme ids). Its constants come in as an argument: TorchScript cannot read
    rec.zch's module-level ints."""
    slots = keys.shape[0]
    home = _plain_home(ids, slots, mix)
    steps = torch.arange(probes, dtype=torch.int64, device=ids.device)
    win = torch.remainder(home.unsqueeze(1) + steps.unsqueeze(0), slots)
    hit = (keys[win] == ids.unsqueeze(1)) & used[win]
    first = torch.argmax(hit.to(torch.int64), dim=1, keepdim=True)
    return torch.where(hit.any(dim=1), win.gather(1, first).squeeze(1), slots)


def _plain_home(ids: torch.Tensor, slots: int, mix: Mix) -> torch.Tensor:
    """rec.zch.home, op for op (its docstring has the formula)."""
    int64_max, word, m0, m1, m2, m3, m4, m5 = mix
    x = torch.where(ids >= 0, ids, (ids + int64_max) + 1)
    lo = torch.remainder(x, word)
    a = _plain_mix(lo, word, m0, m1)
    b = _plain_mix(torch.remainder(_shifted(x, word) * m2 + a, word), word, m3, m4)
    a = _plain_mix(torch.remainder(a * m5 + b, word), word, m0, m1)
    return torch.remainder(torch.remainder(b, 2147483648) * word + a, slots)


def _plain_mix(h: torch.Tensor, word: int, c: int, d: int) -> torch.Tensor:
    h = torch.remainder(h + _shifted(h, 65536), word)
    h = torch.remainder(h * c, word)
    h = torch.remainder(h + _shifted(h, 32768), word)
    h = torch.remainder(h * d, word)
    return torch.remainder(h + _shifted(h, 65536), word)


def _shifted(h: torch.Tensor, power: int) -> torch.Tensor:
    """h div power (a power of two, h >= 0), exact in float64: ONNX's exporter turns an integer
    division (floor or trunc) into a float32 one, wrong past 2^24. The dividend is first made a
    multiple of `power`, a value of at most 31 significant bits here (x < 2^63 over 2^32, or a
    word), which float64 holds exactly, and so the quotient too."""
    low = torch.remainder(h, power)
    return ((h - low).to(torch.float64) / float(power)).to(torch.int64)


class IdMaps(nn.Module):
    """The maps of the ZCH tables that features `feature_order` (a TBE's, in its order) read,
    empty for a model without ZCH tables (then forward is the identity).

    fused: the served module's, one rec::zch_remap_counted call (cpp/ops/zch.cpp) for every ZCH
    feature: up to `probes` compares per id in one loop, where rec.zch.lookup's ops make a dozen
    [ids, probes] tensors (benchmarks/zch_serve_bench.py, the default model at B = 512 with 16
    probes: 48 us fused against 1625 us in plain ops). It also counts each feature's unknown
    ids (read as the default row) for the server, which takes them after the forward with
    rec::zch_take_unknowns (docs/zch.md, "Unknown ids"). Not fused: rec.zch.lookup per
    feature, what the float reference runs."""

    # Typed here: TorchScript cannot type an empty list attribute (a model without ZCH tables).
    probes: list[int]
    table_of: list[int]
    columns: list[int]

    def __init__(self, cfg: RecConfig, feature_order: list[str], fused: bool = True) -> None:
        super().__init__()
        owner = cfg.feature_to_table()
        self.num_features = len(feature_order)
        self.fused = fused
        self.maps = nn.ModuleDict()
        for name, z in zch_tables(cfg).items():
            features = [k for k, f in enumerate(feature_order) if owner[f] == name]
            if features:
                self.maps[name] = IdMap(z.slots, z.probes, features, len(feature_order))
        self.any_maps = len(self.maps) > 0
        self.probes = [m.probes for m in self.maps.values()]
        index = {name: i for i, name in enumerate(self.maps)}
        self.table_of = [index.get(owner[f], -1) for f in feature_order]
        # Each feature's request column (features.sparse), under which rec::zch_remap_counted
        # counts its unknown ids for the server (rec_questionable_ids_total{reason="unknown"}).
        sparse = list(cfg.features.sparse)
        self.columns = [sparse.index(f) for f in feature_order]

    def forward(
        self, ids: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, batch: int
    ) -> torch.Tensor:
        if not self.any_maps:
            return indices
        if self.fused:
            keys: list[torch.Tensor] = []
            used: list[torch.Tensor] = []
            for m in self.maps.values():
                k, u = m.typed()
                keys.append(k)
                used.append(u)
            return torch.ops.rec.zch_remap_counted(ids, indices, offsets, keys, used, self.probes,
                                                   self.table_of, self.columns)  # fmt: skip
        for m in self.maps.values():
            indices = m(ids, indices, offsets, batch)
        return indices

    def masked(self, ids: torch.Tensor, feature: torch.Tensor, indices: torch.Tensor):
        """As forward, for ids in any order with each one's feature given (IdMap.masked)."""
        for m in self.maps.values():
            indices = m.masked(ids, feature, indices)
        return indices


def fill(module: nn.Module, maps: dict[str, TableMap]) -> None:
    """Copies each table's map into every IdMaps of `module` that reads it."""
    for holder in module.modules():
        if isinstance(holder, IdMaps):
            for name, m in holder.maps.items():
                m.keys.copy_(maps[name].keys)
                m.used.copy_(maps[name].used)


def map_buffers(module: nn.Module) -> list[str]:
    """The names of the served module's map buffers (keys, used of each IdMap), in a fixed
    order: AOTInductor takes them as inputs after the tables."""
    return [name for name, _ in module.named_buffers()
            if name.endswith((".keys", ".used")) and ".maps." in name]  # fmt: skip


def reference_maps(cfg: RecConfig, maps: dict[str, TableMap]) -> IdMaps | None:
    """IdMaps over features.sparse (the request's column order), filled: what the float
    reference maps ids with; None without ZCH tables."""
    if not maps:
        return None
    holder = IdMaps(cfg, list(cfg.features.sparse), fused=False)
    fill(holder, maps)
    return holder


def remap(
    id_maps: IdMaps | None,
    lengths_fm: torch.Tensor,
    values_fm: torch.Tensor,
    indices: torch.Tensor,
) -> torch.Tensor:
    """`indices` (rec.batch.map_ids' modulo of the feature-major `values_fm`) with the ZCH
    features' rows taken from their maps, as the served module computes them."""
    if id_maps is None or len(id_maps.maps) == 0:
        return indices
    lengths = lengths_fm.to(torch.int64)
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    batch = lengths.numel() // id_maps.num_features
    with torch.no_grad():
        return id_maps(values_fm, indices.clone(), offsets, batch)


def section(cfg: RecConfig, maps: dict[str, TableMap], module: nn.Module | None) -> dict | None:
    """rec.json's `zch` section (None without ZCH tables): per table its slots, default row,
    policy and the map's buffers in the model."""
    if not maps:
        return None
    buffers = map_buffers(module) if module is not None else []
    tables = {}
    for name, z in zch_tables(cfg).items():
        mine = [b for b in buffers if f".maps.{name}." in b]
        tables[name] = ZchTable(
            slots=z.slots, default_row=z.slots, eviction=z.eviction, probes=z.probes,
            admit_after=z.admit_after, live=int(maps[name].used.sum()),
            buffers=mine,
        )  # fmt: skip
    return ZchSection(layout=ZCH_MAP_LAYOUT, tables=tables).to_dict()
