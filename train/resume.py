"""`rec train --resume RUN`: what a resumed run trains with, settled before any rank starts.

A resume trains the run's own config.yaml. On top of it:

- `--steps N` trains N steps past the last committed checkpoint (training.steps becomes its
  step + N); `--epochs N` trains N more epochs, the one the checkpoint is in counting as the
  first unless the run had finished it (training.epochs becomes that epoch's number + N,
  training.steps 0). Both extend a finished run as well as an unfinished one.
- `-c FILE` is laid over config.yaml (a file holding only `training: {steps: 0, epochs: 3}` is
  enough; epochs alone, where training.steps decides the length, is refused). Only the
  settings a checkpoint does not depend on may change (RESUMABLE: training length,
  evaluation, logging and checkpoint intervals, publishing, features.context); any other
  change (model, tables, features, data, optimizer, sharding, export) is refused naming each
  field, since the checkpoint holds the model, the optimizer's state and the data position
  they made.
- `--publish URL` turns publishing on and `--no-publish` off, for this start and the ones
  after it (publish.url); without either a resume publishes as the run did. Publishing from a
  checkpoint trained without it first re-sends every row (rec.train.publish.republish_all).

What changes is written back to config.yaml, so the run directory keeps describing its run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rec import run_dir
from rec.config import ConfigError, RecConfig, config_from_dict, load_config

RESUMABLE = (
    "training.steps",
    "training.epochs",
    "training.eval_every",
    "training.eval_batches",
    "training.log_every",
    "training.profile_steps",
    "training.pg_timeout_s",
    "checkpoint.",
    "publish.",
    "features.context",  # export's concern only: the model trains the same either way
)
"""Fields (a trailing dot: every field of that section) that `-c` may change on a resume."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"training.steps": 40, "tables": ["t0", ...], "tables.t0.rows": 300, ...}: mappings
    flattened, a list of named mappings (the tables) by name, other lists kept whole."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) and "name" in x for x in v):
            out[f"{prefix}{k}"] = [x["name"] for x in v]
            for x in v:
                out.update(_flat(x, f"{prefix}{k}.{x['name']}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed_fields(before: RecConfig, after: RecConfig) -> dict[str, tuple[Any, Any]]:
    """Every field whose value differs: name -> (before, after)."""
    old, new = _flat(before.to_dict()), _flat(after.to_dict())
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def _resumable(field: str) -> bool:
    return any(field == r or (r.endswith(".") and field.startswith(r)) for r in RESUMABLE)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_yaml(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def apply_config_file(run: Path, saved: RecConfig, path: Path) -> RecConfig:
    """`-c FILE` on a resume: FILE over the run's config.yaml, refused if it changes anything
    outside RESUMABLE. A file that does not validate over config.yaml is first checked for a
    changed fixed field, so that a changed model is named as such rather than as whatever it
    no longer agrees with in config.yaml."""
    data = _read_yaml(path)
    try:
        cfg = config_from_dict(data, base=saved.to_dict())
    except ConfigError:
        _refuse_fixed(run, path, _given_changes(saved, data))
        raise
    _refuse_fixed(run, path, changed_fields(saved, cfg))
    if "epochs" in (data.get("training") or {}) and cfg.training.steps:
        raise ConfigError(
            f"{str(path)!r} sets training.epochs, but training.steps={cfg.training.steps} decides "
            f"the length of run {str(run)!r}; add training.steps: 0 for epochs, or use --steps N"
        )
    return cfg


def _given_changes(saved: RecConfig, data: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The file's values that differ from config.yaml's, as written (unwritten keys of a table
    are its defaults, which only validation fills in)."""
    before = _flat(saved.to_dict())
    return {k: (before[k], v) for k, v in _flat(data).items() if k in before and before[k] != v}


def _refuse_fixed(run: Path, path: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    refused = {k: v for k, v in changes.items() if not _resumable(k)}
    if refused:
        fields = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in refused.items())
        raise ConfigError(
            f"{str(path)!r} changes what run {str(run)!r} was trained with ({fields}); its "
            "checkpoints hold that model, optimizer state and data position. A resume may change "
            f"only {', '.join(r.rstrip('.') for r in RESUMABLE)}: start a new run (--run-dir) for "
            "the rest"
        )


def extend(run: Path, cfg: RecConfig, steps: int | None, epochs: int | None) -> RecConfig:
    """`--steps N` / `--epochs N`: the length that trains N more from the last checkpoint."""
    if steps is not None and epochs is not None:
        raise ConfigError("give --steps or --epochs, not both")
    if steps is None and epochs is None:
        return cfg
    latest = run_dir.latest_checkpoint(run)
    meta = run_dir.read_meta(latest) if latest is not None else {}
    data = cfg.to_dict()
    if steps is not None:
        data["training"]["steps"] = int(meta.get("step", 0)) + steps
    else:
        # The checkpoint's epoch is the one its next sample falls in, except at the end of a run
        # of whole epochs: that one is done (its position is the epoch's last batch).
        epoch = int(meta.get("epoch", 0))
        length = meta.get("length") or {}
        if meta.get("complete") and not length.get("steps"):
            epoch = int(length.get("epochs", epoch + 1))
        data["training"].update(steps=0, epochs=epoch + epochs)
    return config_from_dict(data, base={})


def resume_config(
    run: Path,
    config: Path | None,
    steps: int | None = None,
    epochs: int | None = None,
    publish: str | None = None,
) -> RecConfig:
    """What the resumed run trains with and config.yaml is to say: the saved config with `-c`,
    --steps/--epochs and --publish URL (or --no-publish: "") applied. Publishing is the run's
    setting, not one start's: a run that published goes on publishing until --no-publish."""
    saved_path = run / run_dir.CONFIG_FILE
    if not saved_path.is_file():
        raise run_dir.RunDirError(f"cannot resume: {str(saved_path)!r} does not exist")

    saved = load_config(saved_path)
    cfg = apply_config_file(run, saved, config) if config is not None else saved
    cfg = extend(run, cfg, steps, epochs)
    if publish is not None:
        cfg = config_from_dict({"publish": {"url": publish}}, base=cfg.to_dict())
    if cfg.publish.url:
        _check_publishable(run, cfg)
        _check_gap_closable(run, cfg)
    return cfg


def _check_publishable(run: Path, cfg: RecConfig) -> None:
    """Publishing needs every table in whole-row shards (rec.train.sharding). A table the run's
    sharding.constraints keep from all of them cannot publish, and a resume keeps its
    constraints; every other table is re-planned, its rows loaded under the new plan."""
    from rec.train.sharding import make_constraints

    try:
        make_constraints(cfg, "cpu")
    except ConfigError as e:
        raise ConfigError(
            f"run {str(run)!r} cannot publish: {e}. A resume keeps the run's "
            "sharding.constraints; publish from a new run whose constraints allow those types"
        ) from None


def _check_gap_closable(run: Path, cfg: RecConfig) -> None:
    """A checkpoint trained without publishing is resumed with publishing by re-sending every
    row first (rec.train.publish.republish_all). In a run that published before, a ZCH
    table's cannot be: its replicas hold the id map of the last published step (the export's
    and the log's changes), the map changes since are not in the log, and a replica refuses
    rows whose ids disagree with its map."""
    from rec.train.publish import last_gen, log_holds

    latest = run_dir.latest_checkpoint(run)
    zch = [t.name for t in cfg.tables if t.ids.zch is not None]
    if not zch or latest is None or last_gen(run) is None:
        return
    if log_holds(run_dir.read_meta(latest)):
        return
    raise ConfigError(
        f"run {str(run)!r} cannot publish from {latest.name}: it was trained without publishing "
        f"since it last published, and the id map changes of ZCH table(s) {', '.join(zch)} "
        "since are not in the update log. Export it (rec export) for the replicas and train "
        "on with --no-publish, or start a new run"
    )


def write_changes(run: Path, cfg: RecConfig) -> None:
    """config.yaml rewritten when the resume changed it, and each change said once."""

    path = run / run_dir.CONFIG_FILE
    changes = changed_fields(load_config(path), cfg)
    if not changes:
        return
    run_dir.atomic_write(path, cfg.to_yaml())
    said = ", ".join(f"{k} {_short(a)} -> {_short(b)}" for k, (a, b) in changes.items())
    print(f"[rec train] {path}: {said}", flush=True)
