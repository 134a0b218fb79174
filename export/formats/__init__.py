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

if TYPE_CHECKING:
    from pathlib import Path

    from rec.config import RecConfig
    from rec.export.build import Built, Source

# A name that means several formats; `all` is every registered format.
ALIASES = {"both": ("torchscript", "onnx")}


@dataclass(frozen=True)
class Format:
    name: str
    """`export.format` / `--format` value, and the model directory's suffix (`rec_<name>`)."""
    title: str
    """How messages name it ("TorchScript")."""
    file: str
    """The model file in each version directory."""
    platform: str
    """config.pbtxt's `platform` (Triton's backend for it)."""
    load_requires: str
    """rec.json's "load_requires": what a process must load before it can run the file."""
    build: Callable[[Source, Path], Built]
    """Streams the tables into this format's model, writes `out`, scores it in memory and
    reloaded from disk (rec.export.build)."""
    verify: Callable[[dict[str, Built], dict[str, Any]], None]
    """Adds this format's checks to `checks` (rec.json's "verification") from every built
    format (it may compare with another); raises VerificationError on a failed one."""
    order: int
    """Where it comes in `all` and in the build order."""
    default_name: bool = False
    """Its model directory takes export.model_name itself (the others add `_<name>`)."""
    ram_copies: float = 1.0
    """Copies of the quantized tables export holds at once while building it."""
    keyed_jagged: bool = False
    """Exports every model rec trains: model.factory models (KeyedJaggedTensor input) and din's
    unpooled lookups. Without it config validation refuses those models for this format."""
    rec_dense: bool = False
    """Its dense layers are rec's (export.dense_dtype applies; the reduced-precision bar is
    checked on its scores)."""
    rec_serves: bool = False
    """rec-server and rec's Triton Python model load it (rec.serve.repository)."""

    def model_dir_name(self, model_name: str) -> str:
        return model_name if self.default_name else f"{model_name}_{self.name}"

    def triton_config(self, cfg: RecConfig, model_dir_name: str) -> str:
        """config.pbtxt for this format's model; a format with other needs overrides it."""
        from rec.export.repository import triton_config

        return triton_config(model_dir_name, self.platform, cfg.features.dense,
                             len(cfg.features.sparse), cfg.model.num_tasks, cfg.export)  # fmt: skip


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
    return registry


def registry() -> dict[str, Format]:
    """Every format, in build order. Listed afresh on each call (cheap: the modules are
    imported once), so a module added to the package's path is found."""
    return _discover()


def names() -> list[str]:
    return list(registry())


def choices() -> list[str]:
    """What export.format accepts: each format, `both` and `all`."""
    return [*names(), *ALIASES, "all"]


def resolve(value: str) -> list[str]:
    """export.format -> the formats it means, in build order."""
    if value == "all":
        return names()
    if value in ALIASES:
        return list(ALIASES[value])
    if value not in registry():
        raise ValueError(f"unknown export format {value!r}; choose from {choices()}")
    return [value]


def get(name: str) -> Format:
    return registry()[name]
