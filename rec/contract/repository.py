"""The model repository's layout, in one place: where each file of a model lives, which
version directories it has, and rec.json read and written beside its model.

    <repo>/<model>/config.pbtxt              Triton's model config of the newest version
    <repo>/<model>/rec.json                  rec's manifest of the newest version
    <repo>/<model>/<version>/<file>          the format's model file (rec.contract.formats)
    <repo>/<model>/<version>/rec.json        that version's own copy of its manifest
    <repo>/<model>/<version>/tables.bin      AOTInductor's tables (and tables.json, their index)

Export writes through `ModelDir` (rec.export.repository stages and commits atomically); the
servers, `rec store`, the benchmarks, the scripts and the tests find files through it. No
other module spells these names (tests/core/test_contract.py checks).

Example:
    >>> m = ModelDir.of("model_repository", "rec")
    >>> str(m.manifest), str(m.model_file(3)), str(m.version_manifest(3))
    ('model_repository/rec/rec.json', 'model_repository/rec/3/model.pt', 'model_repository/rec/3/rec.json')
"""  # noqa: E501

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rec.contract.formats import (
    AOTI_TABLES_FILE,
    AOTI_TABLES_INDEX,
    FORMATS,
    MANIFEST_FILE,
    TRITON_CONFIG_FILE,
)
from rec.contract.manifest import Manifest, read_manifest, write_manifest

PathLike = str | os.PathLike


def versions(model_dir: PathLike, holding: Iterable[str] = ()) -> list[int]:
    """The version directories of `model_dir` (numeric names), ascending; with `holding`,
    only those holding one of those files. [] when `model_dir` is not a directory."""
    model_dir, holding = Path(model_dir), tuple(holding)
    if not model_dir.is_dir():
        return []
    return sorted(
        int(p.name)
        for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit()
        and (not holding or any((p / n).is_file() for n in holding))
    )  # fmt: skip


def manifest_in(version_dir: PathLike) -> Path:
    """The copy of rec.json in a version directory."""
    return Path(version_dir) / MANIFEST_FILE


def model_file_in(version_dir: PathLike, fmt: str = "torchscript") -> Path:
    """The model file of format `fmt` in a version directory."""
    return Path(version_dir) / FORMATS[fmt].file


def aoti_tables_in(version_dir: PathLike) -> tuple[Path, Path]:
    """An AOTInductor version's tables file and its index."""
    return Path(version_dir) / AOTI_TABLES_FILE, Path(version_dir) / AOTI_TABLES_INDEX


def read_version_manifest(version_dir: PathLike) -> Manifest | None:
    """The checked rec.json of a version directory, None when it has none."""
    path = manifest_in(version_dir)
    return read_manifest(path) if path.is_file() else None


@dataclass(frozen=True)
class ModelDir:
    """`<repo>/<model>`: one model of a repository, and the paths of its files."""

    path: Path

    @classmethod
    def of(cls, repo: PathLike, model: str) -> ModelDir:
        return cls(Path(repo) / model)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        """config.pbtxt: Triton's config of the newest version."""
        return self.path / TRITON_CONFIG_FILE

    @property
    def manifest(self) -> Path:
        """The model's rec.json: the newest version's manifest."""
        return self.path / MANIFEST_FILE

    def version(self, version: int | str) -> Path:
        return self.path / str(version)

    def version_manifest(self, version: int | str) -> Path:
        return manifest_in(self.version(version))

    def model_file(self, version: int | str, fmt: str = "torchscript") -> Path:
        return model_file_in(self.version(version), fmt)

    def versions(self, holding: Iterable[str] = ()) -> list[int]:
        return versions(self.path, holding)

    def read_manifest(self, version: int | str | None = None) -> Manifest:
        """The model's rec.json, or with `version` that version's copy, checked."""
        return read_manifest(self.manifest if version is None else self.version_manifest(version))

    def write_manifest(self, version: int | str, data: dict[str, Any]) -> None:
        """rec.json of `version`, in its version directory and beside it as the model's: what
        export writes into a staged model directory before committing it."""
        write_manifest(self.manifest, data)
        write_manifest(self.version_manifest(version), data)

    def write_config(self, text: str) -> None:
        self.config.write_text(text)
