"""rec.json, the model repository's manifest: its keys, the one reader that checks them and the
writer.

Export assembles it (rec.export.pipeline) and writes it with `write_manifest` (through
rec.contract.repository.ModelDir); `rec serve`, rec's Triton model, the batch probe, `rec store`,
the benchmarks and the tests read it here. rec-server reads the same fields in C++
(cpp/src/model/model_spec.cpp) and words each refusal the same way, naming the field:
`<file>: "serving.max_batch_size" must be an integer in [1, 2^30], got "lots"`. A shared test
(tests/serve_cpp/test_manifest_contract.py) feeds both readers the same malformed files.

The fields a server needs (the rest, such as "source", "tables" and "verification", describe the
export and are not checked here):

    features.dense, features.sparse   names, in the column order of dense_features / sparse_lengths
    num_tasks                         columns of `scores`
    inputs                            [{name, role, dtype, shape}]; role: dense, lengths or values,
                                      or a context model's context_* / candidate_* (io.py)
    serving                           max_batch_size, max_queue_delay_us, preferred_batch_sizes
    feature_spec                      rec.features' spec (sparse encodings, hash), or null

and the sections a format or an option adds, each a typed view checked when first read (a
server that never reads one is not refused for it):

    dense        dtype, batch_invariant, layers, verified_on            (DenseSection)
    batch_probe  the load-time probe request, by input name             (BatchProbe)
    updates      format, url, run, step, gen, tables (rec.contract.updates)  (UpdatesSection)
    store        format, url, prefix, tables (rec.contract.store)       (StoreSection)
    aoti         the package's CPU target, its tables file and index    (AotiSection)
    zch          the id map layout and each ZCH table's slots, policy   (ZchSection)
    context      the context form's flat columns (rec.contract.context) (ContextSplit)

Example:
    >>> m = parse_manifest({"features": {"dense": ["d0"], "sparse": ["s0"]}, "num_tasks": 1})
    >>> m.sparse_names, m.serving_max_batch_size
    (('s0',), 0)
    >>> try:
    ...     parse_manifest({"features": {"dense": [], "sparse": []}, "num_tasks": 0}, "rec.json")
    ... except ManifestError as e:
    ...     print(e)
    rec.json: "num_tasks" must be an integer in [1, 2^30], got 0
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rec.contract import sections
from rec.contract.context import ContextSplit
from rec.contract.io import CONTEXT_ROLES, ROLES
from rec.contract.sections import (
    AotiSection,
    BatchProbe,
    DenseSection,
    ManifestError,
    StoreSection,
    UpdatesSection,
    ZchSection,
)

ROLE_NAMES = (*ROLES.values(), *CONTEXT_ROLES.values())
# Roles that come in pairs: a model takes a lengths input with its values.
_PAIRED = (("lengths", "values"), ("context_lengths", "context_values"),
           ("candidate_lengths", "candidate_values"))  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    """The fields of rec.json a server needs, checked."""

    dense_names: tuple[str, ...]
    sparse_names: tuple[str, ...]
    num_tasks: int
    roles: dict[str, str] = field(default_factory=dict)
    """role (dense, lengths, values; a context model's CONTEXT_ROLES) -> input name; {} for a
    manifest written before roles."""
    serving: dict[str, Any] = field(default_factory=dict)
    """max_batch_size, max_queue_delay_us, preferred_batch_sizes; {} when absent."""
    feature_spec: dict | None = None
    data: dict = field(default_factory=dict, repr=False)
    """The whole manifest, for the fields that describe the export."""
    source: str = "rec.json"
    """Where it was read, for the sections' errors."""

    @property
    def serving_max_batch_size(self) -> int:
        """serving.max_batch_size, 0 when rec.json has no "serving"."""
        return int(self.serving.get("max_batch_size", 0))

    # The sections, None when rec.json has none; each is checked when first read.
    @cached_property
    def dense(self) -> DenseSection | None:
        return self._section("dense", DenseSection)

    @cached_property
    def batch_probe(self) -> BatchProbe | None:
        return self._section("batch_probe", BatchProbe)

    @cached_property
    def updates(self) -> UpdatesSection | None:
        return self._section("updates", UpdatesSection)

    @cached_property
    def store(self) -> StoreSection | None:
        """Checked by rec.contract.store.check_section: a bad one raises its StoreError."""
        return self._section("store", StoreSection)

    @cached_property
    def aoti(self) -> AotiSection | None:
        return self._section("aoti", AotiSection)

    @cached_property
    def zch(self) -> ZchSection | None:
        return self._section("zch", ZchSection)

    @cached_property
    def context(self) -> ContextSplit | None:
        """The context form's columns, None for a flat-only model; its widths are the
        features'."""
        split = self._section("context", ContextSplit)
        if split is not None:
            for key, names in (("num_dense", self.dense_names), ("num_sparse", self.sparse_names)):
                if getattr(split, key) != len(names):
                    want = f"{len(names)}, the number of features.{key[4:]}"
                    raise ManifestError(self.source, f"context.{key}", want, getattr(split, key))
        return split

    def has(self, section: str) -> bool:
        """rec.json has `section` (not null), before it is checked."""
        return self.data.get(section) is not None

    def _section(self, key: str, kind: type) -> Any:
        value = self.data.get(key)
        return None if value is None else kind.from_dict(value, self.source)


_MISSING, _get, _integer = sections.MISSING, sections.get, sections.integer


def _names(data: dict, source: str, key: str) -> tuple[str, ...]:
    value = _get(_get(data, "features"), key)
    if not (isinstance(value, list) and all(isinstance(n, str) for n in value)):
        raise ManifestError(source, f"features.{key}", "a list of strings", value)
    return tuple(value)


def _roles(data: dict, source: str) -> dict[str, str]:
    inputs = _get(data, "inputs")
    if inputs is _MISSING:
        return {}
    if not isinstance(inputs, list):
        raise ManifestError(source, "inputs", "a list of {name, role} objects", inputs)
    roles: dict[str, str] = {}
    for i, entry in enumerate(inputs):
        name, role = _get(entry, "name"), _get(entry, "role")
        if not isinstance(name, str):
            raise ManifestError(source, f"inputs[{i}].name", "a string", name)
        if role is _MISSING:
            continue
        if role not in ROLE_NAMES or role in roles:
            want = f"one of {', '.join(ROLE_NAMES)}, each once"
            raise ManifestError(source, f"inputs[{i}].role", want, role)
        roles[role] = name
    for lengths, values in _PAIRED:
        if (lengths in roles) != (values in roles):
            want = f"roles with both {lengths} and {values}"
            raise ManifestError(source, "inputs", want, inputs)
    return roles


def _serving(data: dict, source: str) -> dict[str, Any]:
    serving = _get(data, "serving")
    if serving is _MISSING:
        return {}
    if not isinstance(serving, dict):
        raise ManifestError(source, "serving", "an object", serving)
    limit = _get(serving, "max_batch_size")
    if not _integer(limit, 1):
        raise ManifestError(source, "serving.max_batch_size", "an integer in [1, 2^30]", limit)
    delay = serving.get("max_queue_delay_us", 0)
    if not _integer(delay, 0):
        raise ManifestError(source, "serving.max_queue_delay_us", "an integer in [0, 2^30]", delay)
    sizes = serving.get("preferred_batch_sizes", [])
    if not (isinstance(sizes, list) and all(_integer(s, 1, limit) for s in sizes)):
        want = f"a list of integers in [1, max_batch_size={limit}]"
        raise ManifestError(source, "serving.preferred_batch_sizes", want, sizes)
    return {"max_batch_size": limit, "max_queue_delay_us": delay, "preferred_batch_sizes": sizes}


def parse_manifest(data: Any, source: str = "rec.json") -> Manifest:
    """Checks a loaded rec.json; ManifestError names the first bad field."""
    if not isinstance(data, dict):
        raise ManifestError(source, "(top level)", "a JSON object", data)
    dense, sparse = _names(data, source, "dense"), _names(data, source, "sparse")
    num_tasks = _get(data, "num_tasks")
    if not _integer(num_tasks, 1):
        raise ManifestError(source, "num_tasks", "an integer in [1, 2^30]", num_tasks)
    spec = data.get("feature_spec")
    if spec is not None and not isinstance(spec, dict):
        raise ManifestError(source, "feature_spec", "an object or null", spec)
    return Manifest(dense, sparse, num_tasks, _roles(data, source), _serving(data, source),
                    spec, data, source)  # fmt: skip


def read_manifest(path: str | Path) -> Manifest:
    """Reads and checks the rec.json at `path`; ManifestError when it is not JSON or a field is
    malformed, FileNotFoundError when it is missing."""
    path = Path(path)
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(str(path), "(top level)", f"JSON ({e})", text[:40]) from None
    return parse_manifest(data, str(path))


SECTIONS = ("dense", "batch_probe", "updates", "store", "aoti", "zch", "context")


def write_manifest(path: str | Path, data: dict[str, Any]) -> None:
    """Writes rec.json (indented, keys in the order given) once every field a reader checks,
    sections included, reads back: a writer never leaves a file its readers refuse."""
    m = parse_manifest(data, str(path))
    for name in SECTIONS:
        getattr(m, name)
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
