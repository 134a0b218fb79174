"""`rec predict`'s count of unknown ids: the ids of a file's ZCH features (docs/zch.md) that the
artifact's id maps do not hold, so that the model reads the table's default row for them.

The servers count these themselves (rec_questionable_ids_total{reason="unknown"}, from the
model's own remap), but `rec predict` only sees scores. So it counts here, on the ids it sends,
with rec.zch.lookup on the maps of the version in `--repo` (rec.json's `zch` section names
them): the same lookup on the same maps as the served model's. A server whose maps moved on
since the export (fresh embeddings admit and evict ids) counts against its own maps; its
/metrics are the live count.

Modulo tables are not counted: they keep no memory of the ids they were trained on, so an id
never seen reads a row like any other (`ids: zch` is the table that knows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rec import zch
from rec.contract.repository import model_file_in, read_version_manifest

Maps = dict[str, tuple[torch.Tensor, torch.Tensor, int]]
"""table -> (keys int64 [slots], used bool [slots], probes)"""


def artifact_maps(version_dir: Path) -> tuple[Maps, dict[str, str]]:
    """The ZCH tables' maps of a TorchScript or AOTInductor version directory, and each sparse
    feature's table; no maps for a model without ZCH tables or of another format (ONNX's maps
    are initializers: not read here)."""
    manifest = read_version_manifest(version_dir)
    section = manifest.zch if manifest is not None else None
    if section is None:
        return {}, {}
    feature_tables = dict(manifest.data.get("features", {}).get("sparse_table", {}))
    wanted = {b for z in section.tables.values() for b in z.buffers[:2]}
    fmt = manifest.data.get("format")
    if fmt == "aoti":
        from rec.aoti_package import map_tables

        index = manifest.data["aoti"]["tables"]
        tables = map_tables(version_dir)
        buffers = {t["name"]: data for t, data in zip(index, tables, strict=True)}
    elif fmt == "torchscript":
        import fbgemm_gpu  # noqa: F401  (the served module's ops, registered before the load)

        import rec.ops  # noqa: F401

        module = torch.jit.load(str(model_file_in(version_dir)), map_location="cpu")
        buffers = {name: b for name, b in module.named_buffers() if name in wanted}
    else:
        return {}, feature_tables
    maps: Maps = {}
    for table, z in section.tables.items():
        keys, used = (buffers[b] for b in z.buffers[:2])
        maps[table] = (keys.view(torch.int64), used.view(torch.bool), z.probes)
    return maps, feature_tables


def unknown_counts(
    maps: Maps, feature_tables: dict[str, str], sparse: list[str], lengths, values
) -> dict[str, int]:
    """Per ZCH feature (by name), the ids among `values` (batch-major, `lengths` [B, F] in
    `sparse`'s order, as sent) that its table's map does not hold."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, len(sparse))
    feature = np.repeat(np.tile(np.arange(len(sparse)), len(lengths)), lengths.ravel())
    ids = torch.from_numpy(np.asarray(values, dtype=np.int64))
    counts = {}
    for f, name in enumerate(sparse):
        table = feature_tables.get(name)
        if table not in maps:
            continue
        keys, used, probes = maps[table]
        mine = ids[torch.from_numpy(feature == f)]
        counts[name] = int((zch.lookup(mine, keys, used, probes) == keys.numel()).sum())
    return counts


def format_unknown(counts: dict[str, int]) -> str:
    """The summary line of unknown ids, per ZCH feature that has any."""
    each = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    return (f"unknown ids (not in the exported ZCH maps of --repo's version, read as the default "
            f"row), by feature: {each}; a server applying fresh embeddings counts against its "
            "live maps (rec_questionable_ids_total{reason=\"unknown\"})")  # fmt: skip
