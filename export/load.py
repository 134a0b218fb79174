"""Step 1 of export: a run directory's checkpoint into the float model, in one process.

The checkpoint is a torch.distributed.checkpoint directory written by N ranks with any mix of
sharding types (Contract 1). DCP reshards on load, so the unsharded float model of the run's
own config takes it whole, without a process group. Before loading, every tensor the model
needs is checked against the checkpoint's metadata, so a config that does not match names the
table (or layer) and both shapes instead of failing deep inside DCP.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from rec import run_dir
from rec.config import ConfigError, RecConfig, load_config
from rec.model import TrainModel, build_model, embedding_modules, replace_submodule

# The checkpoint's top-level key holding the TrainModel state dict (rec.run_dir docstring).
_STATE_KEY = "model"
_TABLE_KEY = re.compile(r".*\.(?:embedding_bags|embeddings)\.(\w+)\.weight")


class CheckpointMismatchError(ConfigError):
    """The run's config describes a model whose tensors are not the checkpoint's."""


@dataclass
class LoadedRun:
    """What export needs from a run directory."""

    cfg: RecConfig
    model: nn.Module
    """The float DLRM (eval mode, no gradients) holding the checkpoint's weights."""
    step_dir: Path
    meta: dict


def _describe(key: str) -> str:
    """`model.sparse_arch...embedding_bags.t3.weight` -> `table 't3'`; other keys as they are."""
    table = _TABLE_KEY.fullmatch(key)
    return f"table {table.group(1)!r}" if table else f"tensor {key!r}"


def check_matches(state: dict[str, torch.Tensor], step_dir: Path) -> None:
    """Raises CheckpointMismatchError naming the first tensor missing or shaped differently."""
    saved = dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    for key, tensor in state.items():
        name = f"{_STATE_KEY}.{key}"
        if name not in saved:
            raise CheckpointMismatchError(
                f"checkpoint {str(step_dir)!r} has no {_describe(key)} ({name}); "
                "was it written for another config?"
            )
        size = getattr(saved[name], "size", None)
        if size is not None and tuple(size) != tuple(tensor.shape):
            raise CheckpointMismatchError(
                f"{_describe(key)}: the config gives shape {tuple(tensor.shape)} but checkpoint "
                f"{str(step_dir)!r} holds {tuple(size)} (rows and dim must match the run)"
            )


def load_dense(
    run: str | Path, checkpoint: str | None = None, cfg: RecConfig | None = None
) -> LoadedRun:
    """Like `load_run`, but the tables stay on the meta device: only the dense layers (a few
    MB even for a model with GBs of tables) are read. The tables are streamed later
    (rec.export.stream); their shapes are checked against the checkpoint here all the same."""
    return _load(run, checkpoint, cfg, with_tables=False)


def load_run(
    run: str | Path, checkpoint: str | None = None, cfg: RecConfig | None = None
) -> LoadedRun:
    """Loads the run's LATEST committed checkpoint (or `checkpoint`) into the float model.

    Args:
        run: the run directory (Contract 1).
        checkpoint: a step dir name (`step_200`) or path; default the latest committed one.
        cfg: the config to build the model from; default the run's own config.yaml.
    Raises:
        rec.run_dir.RunDirError: missing run dir, no committed checkpoint, torn step dir.
        CheckpointMismatchError: the config's tables or layers differ from the checkpoint's.
    """
    return _load(run, checkpoint, cfg, with_tables=True)


def _load(run, checkpoint: str | None, cfg: RecConfig | None, with_tables: bool) -> LoadedRun:
    step_dir = run_dir.resolve_checkpoint(run, checkpoint)
    run_dir.verify_checkpoint(step_dir)
    cfg = cfg if cfg is not None else load_config(Path(run) / run_dir.CONFIG_FILE)
    torch.manual_seed(0)  # only fixes the init that the checkpoint then overwrites
    wrapper = TrainModel(build_model(cfg, "cpu" if with_tables else "meta"))
    state = wrapper.state_dict()
    check_matches(state, step_dir)
    # DCP fills the tensors in place; they are the model's own (state_dict shares storage).
    wanted = state if with_tables else {k: v for k, v in state.items() if not v.is_meta}
    dcp.load({_STATE_KEY: wanted}, checkpoint_id=str(step_dir))
    model = wrapper.model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    meta_path = step_dir / run_dir.META_FILE
    meta = run_dir.read_meta(step_dir) if meta_path.is_file() else {}
    return LoadedRun(cfg=cfg, model=model, step_dir=step_dir, meta=meta)


def dense_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` without its embedding tables, which are never copied (they may be
    8 GB, or on the meta device): in the copy, its EBC (and EC) are empty modules."""
    tables = embedding_modules(model)
    for path in tables:
        replace_submodule(model, path, nn.Module())
    try:
        return copy.deepcopy(model)
    finally:
        for path, module in tables.items():
            replace_submodule(model, path, module)
