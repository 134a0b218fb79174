"""rec.json's sections, typed: `dense`, `batch_probe`, `updates`, `store`, `aoti` and `zch`.

Each is a frozen dataclass with `from_dict` (check a loaded section; ManifestError names the
field at fault, as rec.contract.manifest's reader does, and a store section is checked by
rec.contract.store.check_section) and `to_dict` (the JSON export writes). Readers get them from
`Manifest.<section>`; export builds `updates`, `dense` and `batch_probe` from them, and
rec.contract.manifest.write_manifest checks every section before it writes a rec.json.

Example:
    >>> s = UpdatesSection.from_dict({"format": "rec.updates/1", "url": None, "tables": {}})
    >>> s.step, s.gen, s.to_dict()["run"]
    (0, 0, None)
    >>> try:
    ...     DenseSection.from_dict({"dtype": "fp32", "batch_invariant": "yes"}, "rec.json")
    ... except ManifestError as e:
    ...     print(e)
    rec.json: "dense.batch_invariant" must be true or false, got "yes"
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rec.contract.io import INPUT_NAMES
from rec.contract.store import check_section

MAX = 1 << 30  # rec-server's bound on batch sizes and delays
MISSING = object()


class ManifestError(ValueError):
    """rec.json is malformed; `field` is the dotted key at fault ("serving.max_batch_size")."""

    def __init__(self, source: str, key: str, want: str, got: Any) -> None:
        self.field = key
        # JSON as rec-server prints it (nlohmann's dump: keys sorted, no spaces), so both
        # readers give the same sentence for the same file.
        shown = "none" if got is MISSING else json.dumps(got, sort_keys=True, separators=(",", ":"))
        super().__init__(f'{source}: "{key}" must be {want}, got {shown}')


def get(obj: Any, key: str) -> Any:
    return obj.get(key, MISSING) if isinstance(obj, dict) else MISSING


def integer(value: Any, low: int, high: int = MAX) -> bool:
    return type(value) is int and low <= value <= high


def _object(data: Any, source: str, key: str) -> dict:
    if not isinstance(data, dict):
        raise ManifestError(source, key, "an object", data)
    return data


def _optional(data: dict, source: str, key: str, check, want: str, default: Any) -> Any:
    """data[key] (the last part of a dotted `key`) when present and not null, else `default`."""
    value = data.get(key.rsplit(".", 1)[-1])
    if value is None:
        return default
    if not check(value):
        raise ManifestError(source, key, want, value)
    return value


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


@dataclass(frozen=True)
class DenseSection:
    """How the dense layers compute, and whether the model scores a batch as its samples."""

    dtype: str
    """fp32, bf16, fp16 or int8 (export.dense_dtype)."""
    batch_invariant: bool
    layers: dict[str, int] = field(default_factory=dict)
    """How many linear layers compute in each dtype."""
    verified_on: dict[str, Any] = field(default_factory=dict)
    """The CPU the batching check passed on (rec.cpu.cpu_info, rec_linear_isa)."""

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> DenseSection:
        data = _object(data, source, "dense")
        dtype = get(data, "dtype")
        if not isinstance(dtype, str):
            raise ManifestError(source, "dense.dtype", "a string", dtype)
        invariant = get(data, "batch_invariant")
        if not isinstance(invariant, bool):
            raise ManifestError(source, "dense.batch_invariant", "true or false", invariant)
        layers = _optional(data, source, "dense.layers",
                           lambda v: isinstance(v, dict) and all(map(_count, v.values())),
                           "an object of layer counts", {})  # fmt: skip
        verified = _optional(data, source, "dense.verified_on", lambda v: isinstance(v, dict),
                             "an object", {})  # fmt: skip
        return cls(dtype, invariant, dict(layers), dict(verified))

    @property
    def verified_cpu(self) -> str:
        """The CPU model the batching check passed on, as the refusal message names it."""
        return self.verified_on.get("model", "an unrecorded CPU")

    def to_dict(self) -> dict[str, Any]:
        """Without `layers` and `verified_on` when empty (a format without rec's dense layers)."""
        out: dict[str, Any] = {"dtype": self.dtype, "batch_invariant": self.batch_invariant}
        if self.layers:
            out["layers"] = self.layers
        if self.verified_on:
            out["verified_on"] = self.verified_on
        return out


@dataclass(frozen=True)
class BatchProbe:
    """The request a server scores at load, as one batch and one by one (rec.batch_probe)."""

    inputs: dict[str, list]
    """Input name -> its values as lists: the flat inputs (dense_features, sparse_lengths,
    sparse_values) always; a context model's own inputs (context_*, candidate_*) beside them."""

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> BatchProbe:
        data = _object(data, source, "batch_probe")
        for name in INPUT_NAMES:
            if not isinstance(get(data, name), list):
                raise ManifestError(source, f"batch_probe.{name}", "a list", get(data, name))
        for name, value in data.items():
            if not isinstance(value, list):
                raise ManifestError(source, f"batch_probe.{name}", "a list", value)
        return cls(dict(data))

    def to_dict(self) -> dict[str, list]:
        return dict(self.inputs)


@dataclass(frozen=True)
class UpdatesSection:
    """Where the update log is and which of its records this export already holds
    (rec.contract.updates), and where each table's rows lie in the model's storage."""

    format: str
    url: str | None
    """The run's publish.url: where a server listens by default; None when it did not publish."""
    run: str | None
    """The publisher's run id: a server applies only that run's records."""
    step: int = 0
    """The training step the export holds."""
    gen: int = 0
    """The publisher's generation that trained up to `step` (0: none published)."""
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per table its place in the model (rec.export.served.update_layout): buffer, offset,
    row_stride, rows, dim, dtype, scale_bias."""

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> UpdatesSection:
        data = _object(data, source, "updates")
        fmt = get(data, "format")
        if not isinstance(fmt, str):
            raise ManifestError(source, "updates.format", "a string", fmt)
        url = _optional(data, source, "updates.url", _str, "a string or null", None)
        run = _optional(data, source, "updates.run", _str, "a string or null", None)
        step = _optional(data, source, "updates.step", _count, "an integer >= 0", 0)
        gen = _optional(data, source, "updates.gen", _count, "an integer >= 0", 0)
        tables = get(data, "tables")
        if not (isinstance(tables, dict) and all(isinstance(t, dict) for t in tables.values())):
            raise ManifestError(source, "updates.tables", "an object of table places", tables)
        return cls(fmt, url or None, run or None, step, gen, dict(tables))

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "url": self.url, "run": self.run, "step": self.step,
                "gen": self.gen, "tables": self.tables}  # fmt: skip


@dataclass(frozen=True)
class StoredTable:
    """One table of the embedding store (rec.contract.store)."""

    rows: int
    dim: int
    dtype: str
    row_bytes: int
    partitions: int
    keys: str = "row"
    """"raw_id": a ZCH table keyed by raw id (rec.store/2), whose `slots` are rows - 1."""
    slots: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"rows": self.rows, "dim": self.dim, "dtype": self.dtype,
               "row_bytes": self.row_bytes, "partitions": self.partitions}  # fmt: skip
        if self.keys != "row":
            out.update(keys=self.keys, slots=self.slots)
        return out


@dataclass(frozen=True)
class StoreSection:
    """Which tables live in the embedding store, and where (rec.contract.store)."""

    format: str
    url: str
    prefix: str
    tables: dict[str, StoredTable]

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> StoreSection:
        """rec.contract.store.check_section's StoreError names the first bad field."""
        check_section(data, source)
        tables = {n: StoredTable(**{k: t[k] for k in StoredTable.__dataclass_fields__ if k in t})
                  for n, t in data["tables"].items()}  # fmt: skip
        return cls(data["format"], data["url"], data["prefix"], tables)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "url": self.url, "prefix": self.prefix,
                "tables": {n: t.to_dict() for n, t in self.tables.items()}}  # fmt: skip


@dataclass(frozen=True)
class AotiSection:
    """An AOTInductor package's CPU target (rec.aoti_package checks it at load) and its tables
    file beside it."""

    cpu_isa: str
    """export.cpu_isa: avx2 or avx512."""
    march: str
    required_cpu_flags: tuple[str, ...]
    """The CPU flags (/proc/cpuinfo's names) a CPU needs to run the package."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The rest, as export recorded it: vector_isa, compiled_on, compile_seconds,
    package_bytes, tables_file, tables (the index), max_abs_diff_vs_module, tolerance."""

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> AotiSection:
        data = _object(data, source, "aoti")
        for key in ("cpu_isa", "march"):
            if not isinstance(get(data, key), str):
                raise ManifestError(source, f"aoti.{key}", "a string", get(data, key))
        flags = get(data, "required_cpu_flags")
        if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            raise ManifestError(source, "aoti.required_cpu_flags", "a list of strings", flags)
        mine = ("cpu_isa", "march", "required_cpu_flags")
        extra = {k: v for k, v in data.items() if k not in mine}
        return cls(data["cpu_isa"], data["march"], tuple(flags), extra)

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_isa": self.cpu_isa, "march": self.march,
                "required_cpu_flags": list(self.required_cpu_flags), **self.extra}  # fmt: skip


ZCH_MAP_LAYOUT = "rec.zch.map/2"
"""How a ZCH table's id map lies in a model, version 2: `keys` int64 [slots] (the raw id each
slot holds) and `used` bool [slots] (whether it holds one); an id may hold only the `probes`
slots from rec.zch.home(id, slots) on (home version 2), so a lookup reads those. A reader
refuses any other layout: another hash or another encoding would read other rows, silently.
Version 1 placed ids by an earlier home() that spread consecutive and strided ids badly."""
ZCH_MAP_LAYOUT_TEXT = "keys int64 [slots], used bool [slots]; home() version 2"
ZCH_MAP_LAYOUT_V1 = "rec.zch.map/1"
ZCH_REEXPORT = (
    "; this artifact was exported with ZCH map layout 1 and must be re-exported with this rec "
    "(`rec export`)"
)
"""What a reader adds when refusing a layout-1 artifact (cpp/src/contract/manifest.cpp too)."""


@dataclass(frozen=True)
class ZchTable:
    """One ZCH table of the model (rec.zch): its map's size and policy, where the map is."""

    slots: int
    default_row: int
    """The row every id reads that holds no slot: the table's last, `slots`."""
    eviction: str
    probes: int
    admit_after: int
    live: int = 0
    """Slots holding an id at export."""
    buffers: list[str] = field(default_factory=list)
    """The map's buffers in the model (keys, used per lookup that reads the table)."""

    @classmethod
    def from_dict(cls, data: Any, source: str, key: str) -> ZchTable:
        data = _object(data, source, key)
        slots = get(data, "slots")
        if not integer(slots, 1, 1 << 62):
            raise ManifestError(source, f"{key}.slots", "an integer >= 1", slots)
        if get(data, "default_row") != slots:
            want = f"the table's last row, slots={slots}"
            raise ManifestError(source, f"{key}.default_row", want, get(data, "default_row"))
        if not isinstance(get(data, "eviction"), str):
            raise ManifestError(source, f"{key}.eviction", "a string", get(data, "eviction"))
        probes = get(data, "probes")
        if not integer(probes, 1, slots):
            raise ManifestError(source, f"{key}.probes", f"an integer in [1, {slots}]", probes)
        admit = get(data, "admit_after")
        if not integer(admit, 1):
            raise ManifestError(source, f"{key}.admit_after", "an integer >= 1", admit)
        live = _optional(data, source, f"{key}.live", _count, "an integer >= 0", 0)
        buffers = _optional(data, source, f"{key}.buffers",
                            lambda v: isinstance(v, list) and all(map(_str, v)),
                            "a list of strings", [])  # fmt: skip
        return cls(slots, slots, data["eviction"], probes, admit, live, list(buffers))

    def to_dict(self) -> dict[str, Any]:
        return {"slots": self.slots, "default_row": self.default_row, "eviction": self.eviction,
                "probes": self.probes, "admit_after": self.admit_after, "live": self.live,
                "buffers": self.buffers}  # fmt: skip


@dataclass(frozen=True)
class ZchSection:
    """The model's collision-free tables (docs/zch.md): the map layout the model was built
    with (ZCH_MAP_LAYOUT) and each ZCH table. The remap runs inside the model."""

    layout: str
    tables: dict[str, ZchTable]

    @classmethod
    def from_dict(cls, data: Any, source: str = "rec.json") -> ZchSection:
        data = _object(data, source, "zch")
        layout = get(data, "layout")
        if layout != ZCH_MAP_LAYOUT:
            want = f"{ZCH_MAP_LAYOUT} (the id map layout this reader knows: {ZCH_MAP_LAYOUT_TEXT})"
            if layout == ZCH_MAP_LAYOUT_V1:
                want += ZCH_REEXPORT
            raise ManifestError(source, "zch.layout", want, layout)
        tables = get(data, "tables")
        if not isinstance(tables, dict) or not tables:
            raise ManifestError(source, "zch.tables", "an object of ZCH tables", tables)
        parsed = {n: ZchTable.from_dict(t, source, f"zch.tables.{n}") for n, t in tables.items()}
        return cls(layout, parsed)

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "layout_text": ZCH_MAP_LAYOUT_TEXT,
                "tables": {n: t.to_dict() for n, t in self.tables.items()}}  # fmt: skip
