"""Contract 2: the model repository, in Triton's layout (rec.contract.repository), written
atomically.

    <repo>/<model>/config.pbtxt       Triton model config of the newest version
    <repo>/<model>/rec.json           manifest of the newest version (features, tables, checks)
    <repo>/<model>/<version>/model.pt (model.onnx, model.pt2: each format's own file, from
                                      rec.export.formats) and a copy of that version's rec.json

Everything is built in a staging directory inside <repo> (same filesystem) and moved into place
with renames: a new model directory in one rename; a new version directory in one rename, then
config.pbtxt and rec.json each replaced with os.replace. A crash leaves the old state or the new
one plus a `.staging-<pid>-*` directory that the next export removes; never a half-written
version.

## Batching and Triton (the trade-off)

Triton batches a libtorch model only when `max_batch_size > 0`, and then every input gets an
implicit batch dimension. `sparse_values` is ragged (N ids for B samples): Triton can merge it
across requests only with `allow_ragged_batch`, and then only requests of batch size 1. A
ranking request carries many candidates (B in the hundreds) in one call. Two forms, chosen by
`export.triton_batching`:

* `none` (default): `max_batch_size: 0`, explicit `-1` batch dimensions, no dynamic batching.
  Stock Triton accepts requests of any size and runs each as its own batch (no merging), which
  is right for ranking traffic whose requests are already batches of candidates. rec-server
  reads its batching from rec.json's "serving" instead (max_batch_size, max_queue_delay_us,
  preferred_batch_sizes; cpp/src/model/model_spec.cpp) and merges concurrent requests by
  concatenation (docs/architecture.md#batching-by-concatenation), which is valid for this I/O
  whatever Triton's rule; rec.json's presence vouches for that I/O (a foreign
  `max_batch_size: 0` model without one is served one request per forward). So one repository
  serves multi-sample requests from both servers.
* `ragged`: `max_batch_size: export.max_batch_size`, dims without the batch dimension,
  `allow_ragged_batch: true` on `sparse_values`, `dynamic_batching` from the config. rec-server
  batches it from the config; stock Triton with the libtorch backend serves it only with
  single-sample requests (and merges those).

`rec serve --backend triton` stages its own copy of the config for Triton's Python backend in
the `none` form whatever the exported form. The serving settings are written to rec.json
("serving") whatever the form.

Input names are the TorchScript forward() argument names, which Triton's libtorch backend maps by
name (its FORWARD_ARGUMENT convention); the single output `scores` is mapped by position (the
backend's rule for outputs without a `__<index>` suffix). ONNX keeps names in the graph.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rec import contract
from rec.config import ExportConfig
from rec.contract import FORMATS, ModelDir
from rec.contract.context import ContextSplit
from rec.contract.io import (
    CANDIDATE_LENGTHS,
    CANDIDATE_OFFSETS,
    CONTEXT_DENSE,
    CONTEXT_LENGTHS,
    SCORES,
    context_io_manifest,
)

_STAGING_PREFIX = ".staging-"


class VersionExistsError(FileExistsError):
    """The target version directory is already there and --force was not given."""


class RepositoryError(FileExistsError):
    """The repository path cannot hold models (e.g. it is a file)."""


@dataclass
class Target:
    """Where one format's model goes."""

    fmt: str
    model_dir: Path
    version: int
    replace: bool
    """The version exists and --force was given."""

    @property
    def version_dir(self) -> Path:
        return ModelDir(self.model_dir).version(self.version)


def plan_targets(
    repo: Path, model_name: str, names: list[str], version: int | None, force: bool
) -> list[Target]:
    """Decides the version of every format's model before any work, so errors come first.

    Without `version` each model gets its next version (1 for a new model). With it, an existing
    version directory is an error unless `force`.
    """
    if repo.exists() and not repo.is_dir():
        raise RepositoryError(f"model repository {str(repo)!r} exists and is not a directory")
    targets = []
    for fmt in names:
        # The contract's table, not export's plug-ins: those call this module's triton_config.
        model = ModelDir.of(repo, FORMATS[fmt].model_dir_name(model_name))
        have = model.versions()
        v = version if version is not None else (have[-1] + 1 if have else 1)
        exists = model.version(v).exists()
        if exists and not force:
            raise VersionExistsError(
                f"{str(model.version(v))!r} already exists; pass --force to replace it, or "
                "leave out --version to write the next version"
            )
        targets.append(Target(fmt, model.path, v, replace=exists))
    return targets


def _dims(values: list[int]) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"


def triton_config(
    name: str,
    platform: str,
    num_dense: int,
    num_sparse: int,
    num_tasks: int,
    export: ExportConfig,
    context: ContextSplit | None = None,
) -> str:
    """config.pbtxt text for a model on Triton's `platform` (see the module docstring for
    batching); each format's `Format.triton_config` calls it with its own. `context`: a
    context model's columns (features.context), whose config lists both forms' inputs."""
    ragged = export.triton_batching == "ragged"
    io = contract.io_manifest(num_dense, num_sparse, num_tasks)
    inputs = io["inputs"]
    if context is not None:
        inputs = _context_inputs(io["inputs"], context, num_tasks, ragged)

    def tensor(spec: dict, last: bool) -> list[str]:
        # rec.json's shapes have the batch dimension (-1) first; a ragged config leaves it out,
        # but for the ids, whose [-1] is N, merged across requests.
        ids = spec["name"] == contract.VALUES
        dims = spec.get("dims") or (spec["shape"][1:] if ragged and not ids else spec["shape"])
        extra = ["    allow_ragged_batch: true"] if spec.get("ragged", ragged and ids) else []
        if spec.get("optional"):
            extra.append("    optional: true")
        return ["  {", f'    name: "{spec["name"]}"', f"    data_type: TYPE_{spec['dtype']}",
                f"    dims: {_dims(dims)}", *extra, "  }" if last else "  },"]  # fmt: skip

    lines = [
        "# Written by `rec export`; rec.json beside it describes features, tables and checks.",
        f'name: "{name}"',
        f'platform: "{platform}"',
        f"max_batch_size: {export.max_batch_size if ragged else 0}",
        "input [",
        *[line for i, s in enumerate(inputs) for line in tensor(s, i == len(inputs) - 1)],
        "]",
        "output [",
        *tensor(io["outputs"][0], True),
        "]",
        f"instance_group [ {{ count: {export.instances} kind: KIND_CPU }} ]",
        "version_policy: { latest: { num_versions: 1 } }",
    ]
    if context is not None and ragged:
        lines += _ragged_context_batching()
    if ragged:
        lines.append("dynamic_batching {")
        if export.preferred_batch_sizes:
            lines.append(f"  preferred_batch_size: {_dims(export.preferred_batch_sizes)}")
        lines.append(f"  max_queue_delay_microseconds: {export.max_queue_delay_us}")
        lines.append("}")
    return "\n".join(lines) + "\n"


def _context_inputs(
    flat: list[dict], split: ContextSplit, num_tasks: int, ragged: bool
) -> list[dict]:
    """A context model's config.pbtxt inputs. `none` form: the flat inputs and the context
    model's, each optional (a request carries one form; stock libtorch clients send
    candidate_offsets [0, N * Fn] themselves). `ragged` form (one request = one context,
    merged across requests by Triton's batcher): the context's dims without the batch
    dimension, the candidates' ragged, candidate_offsets made by Triton (`batch_input`); the
    flat inputs are left out (the server splits nothing there)."""
    model = context_io_manifest(split, num_tasks)["inputs"]
    if not ragged:
        return [{**spec, "optional": True} for spec in [*flat, *model]]
    out = []
    for spec in model:
        if spec["name"] == CANDIDATE_OFFSETS:
            continue  # a batch_input
        if spec["name"] in (CONTEXT_DENSE, CONTEXT_LENGTHS):  # one row per request: batched
            out.append({**spec, "dims": spec["shape"][1:], "ragged": False})
        else:  # the ids, and the candidates' N rows: merged across requests
            out.append({**spec, "dims": spec["shape"], "ragged": True})
    return out


def _ragged_context_batching() -> list[str]:
    """The `ragged` context form's batch input and output: candidate_offsets [requests + 1]
    is each request's candidate_lengths elements summed up (Fn * (0, N1, ...)), and the scores
    [B, T] go back to each request by its candidate count."""
    return [
        "batch_input [",
        "  {",
        "    kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
        f'    target_name: "{CANDIDATE_OFFSETS}"',
        "    data_type: TYPE_INT32",
        f'    source_input: "{CANDIDATE_LENGTHS}"',
        "  }",
        "]",
        "batch_output [",
        "  {",
        f'    target_name: "{SCORES}"',
        "    kind: BATCH_SCATTER_WITH_INPUT_SHAPE",
        f'    source_input: "{CANDIDATE_LENGTHS}"',
        "  }",
        "]",
    ]


def staging_dir(repo: Path) -> Path:
    """A fresh staging directory inside `repo`, named after this process. Staging directories
    of processes that no longer run (crashed exports) are removed; live ones are left alone."""
    repo.mkdir(parents=True, exist_ok=True)
    for old in repo.glob(_STAGING_PREFIX + "*"):
        pid = old.name[len(_STAGING_PREFIX) :].split("-")[0]
        if old.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{os.getpid()}-", dir=repo))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def commit(staged_model_dir: Path, target: Target) -> None:
    """Moves a staged `<model>/` (config.pbtxt, rec.json, <version>/) into the repository."""
    if not target.model_dir.exists():
        os.rename(staged_model_dir, target.model_dir)
        return
    staged, model = ModelDir(staged_model_dir), ModelDir(target.model_dir)
    if target.replace:
        old = staged.path / ".replaced"
        os.rename(target.version_dir, old)  # staging is removed afterwards, with `old` in it
    os.rename(staged.version(target.version), target.version_dir)
    if target.version < max(model.versions()):
        return  # an older version was replaced: the model-level files describe the newest
    os.replace(staged.config, model.config)
    os.replace(staged.manifest, model.manifest)
