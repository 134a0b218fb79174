"""Library versions recorded in every artifact (checkpoint meta, model repository manifest)."""

from __future__ import annotations

from importlib import metadata

_PACKAGES = ("rec", "torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy")


def library_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out
