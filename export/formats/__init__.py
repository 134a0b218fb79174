"""Export formats as plug-ins: each module in this package is one format.

A format module defines `FORMAT`, a `Format`: its builder (checkpoint tables streamed into its
model, one file written into a staged version directory, scored in memory and reloaded from
disk), its verifier (the checks rec.json's "verification" records for it) and what its
repository entry looks like (file name, Triton platform, config.pbtxt). Everything else in
`rec export` (config validation, the CLI's choices, the repository layout, the memory estimate,
rec.json, the commit) asks this registry, so adding a format is adding one module here and its
test. The registry finds the modules by listing the package (`pkgutil`), so there is no list
to edit.

Format modules import torch, FBGEMM and the like inside their functions: the config loader
reads this registry to validate `export.format`, and must stay light.

    >>> from rec.export import formats
    >>> formats.names()
    ['torchscript', 'onnx', 'aoti']
    >>> formats.resolve("both")
    ['torchscript', 'onnx']
    >>> formats.get("aoti").file
    'model.pt2'
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rec.contract import formats as contract_formats
from rec.contract.context import ContextSplit
from rec.contract.formats import FormatSpec
from rec.export import repository

if TYPE_CHECKING:
    from pathlib import Path

    from rec.config import RecConfig
    from rec.export.build import Built, Source

ALIASES = contract_formats.ALIASES


@dataclass(frozen=True)
class Format:
    """A format's plug-in: its entry of the contract's table (rec.contract.formats: file,
    platform, folder) and how export builds and verifies it."""

    spec: FormatSpec
    load_requires: str
    """rec.json's "load_requires": what a process must load before it can run the file."""
    build: Callable[[Source, Path], Built]
    """Streams the tables into this format's model, writes `out`, scores it in memory and
    reloaded from disk (rec.export.build)."""
    verify: Callable[[dict[str, Built], dict[str, Any]], None]
    """Adds this format's checks to `checks` (rec.json's "verification") from every built
    format (it may compare with another); raises VerificationError on a failed one."""

    # The contract's facts, read through the plug-in where export has one in hand.
    name = property(lambda self: self.spec.name)
    title = property(lambda self: self.spec.title)
    file = property(lambda self: self.spec.file)
    platform = property(lambda self: self.spec.platform)
    order = property(lambda self: self.spec.order)
    default_name = property(lambda self: self.spec.default_name)
    ram_copies = property(lambda self: self.spec.ram_copies)
    keyed_jagged = property(lambda self: self.spec.keyed_jagged)
    rec_dense = property(lambda self: self.spec.rec_dense)
    rec_serves = property(lambda self: self.spec.rec_serves)

    def model_dir_name(self, model_name: str) -> str:
        return self.spec.model_dir_name(model_name)

    def triton_config(self, cfg: RecConfig, model_dir_name: str) -> str:
        """config.pbtxt for this format's model; a format with other needs overrides it."""
        context = ContextSplit.from_config(cfg) if cfg.features.context else None
        return repository.triton_config(
            model_dir_name, self.platform, cfg.features.dense, len(cfg.features.sparse),
            cfg.model.num_tasks, cfg.export, context,
        )  # fmt: skip


def _discover() -> dict[str, Format]:
    found: list[Format] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):  # a private helper shared by formats, not a format
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        fmt = getattr(module, "FORMAT", None)
        if not isinstance(fmt, Format):
            raise TypeError(f"{module.__name__} defines no FORMAT (a rec.export.formats.Format)")
        found.append(fmt)
    found.sort(key=lambda f: (f.order, f.name))
    registry = {f.name: f for f in found}
    if len(registry) != len(found):
        raise TypeError(f"two format modules share a name: {[f.name for f in found]}")
    if sorted(registry) != sorted(contract_formats.FORMATS):
        raise TypeError(
            f"format plug-ins {sorted(registry)} do not match the contract's table "
            f"{sorted(contract_formats.FORMATS)} (rec.contract.formats): one of each per format"
        )
    return registry


def registry() -> dict[str, Format]:
    """Every format, in build order. Listed afresh on each call (cheap: the modules are
    imported once), so a module added to the package's path is found."""
    return _discover()


names = contract_formats.names
choices = contract_formats.choices
resolve = contract_formats.resolve


def get(name: str) -> Format:
    return registry()[name]
