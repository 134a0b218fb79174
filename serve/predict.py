"""`rec predict`: score the rows of a file (or synthetic rows) on a running server.

The file is read as the model was trained on it, through the feature spec in its rec.json
(rec.features, rec.data.raw): CSV and Parquet by the run's column mapping, Criteo TSV day files
(no header, hex ids, empty fields; with or without the label column), tab-separated files with
a header, and JSON lines (one object per row, keyed by column). Dense values are sent raw (the
model applies its transforms); sparse values are sent as ids mapped here with the spec
(`--send ids`, INT64 sparse_values) or as the file's text (`--send strings`, BYTES
sparse_strings, mapped by the server). When the file has the label column(s), AUC and log loss
are printed too, computed as export's verification computes them. A stderr line names, per
feature, negative values in categorical columns, and with `--repo`, ids the model's ZCH maps do
not hold (rec.serve.unknown_ids: counted here, as the server returns only scores).

With `--group-by COLUMN` (a context model, features.context), rows sharing that column's value
make one request of one context and its candidates (rec.serve.groups), sent in the context form
(`--form context`) or as the flat rows (`--form flat`); scores are written in file order.

The spec comes from `--repo` (its rec.json) or else from the server, when its model config
publishes it (Triton started by `rec serve` does); synthetic rows need only the input sizes.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from rec.contract import ManifestError, ModelDir, read_manifest
from rec.contract.context import ContextSplit
from rec.contract.io import CONTEXT_INPUT_NAMES
from rec.data.errors import DataError
from rec.data.raw import FORMATS, RawRows, read_raw
from rec.features import FeatureSpec, TokenError
from rec.serve import groups
from rec.serve.client import ContextRows, Rows, ScoreClient, synthetic_rows
from rec.serve.groups import InputError
from rec.serve.repository import ServeError, load_model
from rec.serve.unknown_ids import artifact_maps, format_unknown, unknown_counts

SEND = ("ids", "strings")
FORMS = ("context", "flat")


@dataclass(frozen=True)
class PredictConfig:
    url: str
    """host:port of the server (HTTP or gRPC port, matching `protocol`)."""
    protocol: str = "http"
    model: str = "rec"
    input: Path | None = None
    """File of rows; None means `synthetic` random rows."""
    synthetic: int = 0
    repo: Path | None = None
    """Repository to read the feature spec from (rec.json) instead of asking the server."""
    output: Path | None = None
    """Write scores as CSV here; None prints them."""
    batch_size: int = 64
    """Rows per request."""
    seed: int = 0
    input_format: str | None = None
    """One of rec.data.raw.FORMATS; None guesses from the file's suffix."""
    send: str = "ids"
    """ids: sparse_values mapped here; strings: sparse_strings mapped by the server."""
    group_by: str | None = None
    """A column of request ids: rows sharing one make one request (a context model's)."""
    form: str = "context"
    """With group_by: send each request in the context form, or as its flat rows."""


@dataclass
class Prediction:
    scores: np.ndarray
    """[n, T]"""
    columns: list[str]
    """The score columns' names (score_columns)."""
    quality: dict[str, float] | None
    """AUC and log loss when the file has labels."""
    negative: dict[str, int] | None = None
    """Negative integer values per sparse feature in the file (features.negative); None for
    synthetic rows."""
    unknown: dict[str, int] | None = None
    """Ids per ZCH feature that the model's id maps do not hold (rec.serve.unknown_ids); None
    without --repo, for synthetic rows and for a model without ZCH tables."""


def resolve_spec(client: ScoreClient, repo: Path | None) -> FeatureSpec:
    if repo is not None:
        spec = load_model(repo, client.model).feature_spec
        where = f"{repo}/{client.model}'s rec.json"
    else:
        features = client.features()
        if features is None:
            raise ServeError(
                f"the server at {client.url} does not publish model {client.model!r}'s feature "
                "spec; pass --repo <model repository> to read it from its rec.json"
            )
        spec, where = features.spec, f"the server's config of {client.model!r}"
    if spec is None:
        raise ServeError(
            f"{where} has no feature_spec (exported by an older rec): export the run again"
        )
    return FeatureSpec.from_dict(spec)


def request_rows(raw: RawRows, spec: FeatureSpec, send: str, path: Path | None = None) -> Rows:
    if send == "strings":
        return Rows(raw.dense, raw.lengths, None, raw.tokens)
    try:
        return Rows(raw.dense, raw.lengths, spec.encode_values(raw.lengths, raw.tokens))
    except TokenError as e:
        column = spec.sparse[e.feature].column
        where = f"{path}: {raw.unit} {raw.numbers[e.sample]}, column {column}"
        raise InputError(f"{where}: {str(e).split(': ', 1)[1]}") from None


def check_options(cfg: PredictConfig) -> None:
    if (cfg.input is None) == (cfg.synthetic <= 0):
        raise ServeError("give exactly one of --input FILE or --synthetic N")
    if cfg.send not in SEND:
        raise ServeError(f"--send {cfg.send!r} is not one of {SEND}")
    if cfg.form not in FORMS:
        raise ServeError(f"--form {cfg.form!r} is not one of {FORMS}")
    if cfg.group_by is not None and cfg.input is None:
        raise ServeError("--group-by reads a column of --input FILE (not --synthetic rows)")


def predict(cfg: PredictConfig) -> Prediction:
    """Scores the rows of cfg.input (or cfg.synthetic random rows); writes or prints them."""
    check_options(cfg)
    client = ScoreClient(cfg.url, cfg.protocol, cfg.model)
    labels, negative, unknown, tasks = None, None, None, ()
    try:
        if cfg.input is not None:
            spec = resolve_spec(client, cfg.repo)
            split = context_split(client, cfg.repo) if cfg.group_by is not None else None
            extra = (cfg.group_by,) if cfg.group_by is not None else ()
            try:
                raw = read_raw(cfg.input, spec, cfg.input_format, extra_columns=extra)
            except DataError as e:
                raise InputError(str(e)) from None
            rows, labels = request_rows(raw, spec, cfg.send, cfg.input), raw.labels
            negative = spec.negative_counts(raw.lengths, raw.tokens)
            unknown = count_unknown(cfg, client.model, spec, raw, rows)
        else:
            rows = synthetic_rows(*client.input_sizes(), batch=cfg.synthetic, seed=cfg.seed)
        if cfg.group_by is not None:
            scores = score_groups(client, cfg, spec, split, raw, rows)
        else:
            scores = np.concatenate([client.score(chunk) for chunk in rows.split(cfg.batch_size)])
        tasks = task_names(client, cfg.repo) if scores.shape[1] > 1 else ()
    except (InferenceServerException, OSError) as e:
        raise ServeError(f"request to {cfg.url} ({cfg.protocol}) failed: {e}") from e
    finally:
        client.close()
    columns = score_columns(tasks, scores.shape[1])
    text = format_scores(scores, columns)
    if cfg.output is None:
        sys.stdout.write(text)
    else:
        Path(cfg.output).write_text(text)
    quality = None
    if labels is not None:
        import torch

        from rec import metrics

        quality = metrics.quality(torch.from_numpy(scores), torch.from_numpy(labels), spec.labels)
        print(
            f"{len(scores)} rows: AUC {quality[metrics.AUC]:.6f}, "
            f"log loss {quality[metrics.LOG_LOSS]:.6f}",
            file=sys.stderr,
        )
        for task, value in quality.get(metrics.AUC_PER_TASK, {}).items():
            print(f"  {task}: AUC {value:.6f}", file=sys.stderr)
    if negative and any(negative.values()):
        print(format_negative(negative), file=sys.stderr)
    if unknown and any(unknown.values()):
        print(format_unknown(unknown), file=sys.stderr)
    return Prediction(scores, columns, quality, negative, unknown)


def repo_context(repo: Path, model: str | None) -> tuple[ContextSplit | None, str]:
    """The context columns of `model` in `repo` (None for a model without them), and where
    they were read, for messages."""
    served = load_model(repo, model)
    try:
        split = read_manifest(ModelDir(served.dir).manifest).context
    except ManifestError as e:
        raise ServeError(str(e)) from None
    return split, f"{repo}/{served.name}'s rec.json"


def context_split(client: ScoreClient, repo: Path | None) -> ContextSplit:
    """The model's context columns: --repo's rec.json, else as the server publishes them; a
    model without them (exported without features.context) is refused."""
    if repo is not None:
        split, where = repo_context(repo, client.model)
    else:
        features = client.features()
        data = features.context if features is not None else None
        where = f"the server's config of {client.model!r}"
        if data is None and set(client.input_dims()) & set(CONTEXT_INPUT_NAMES):
            raise ServeError(
                f"the server at {client.url} does not publish model {client.model!r}'s context "
                "columns; pass --repo <model repository> to read them from its rec.json"
            )
        try:
            split = None if data is None else ContextSplit.from_dict(data, where)
        except ManifestError as e:
            raise ServeError(str(e)) from None
    if split is None:
        raise no_context(where, client.model)
    return split


def no_context(where: str, model: str) -> ServeError:
    return ServeError(
        f"{where} has no context section: model {model!r} was exported without "
        "features.context, so it takes no request of one context and many candidates; export "
        "it with features.context set"
    )


def score_groups(
    client: ScoreClient,
    cfg: PredictConfig,
    spec: FeatureSpec,
    split: ContextSplit,
    raw: RawRows,
    rows: Rows,
) -> np.ndarray:
    """Scores, in file order, of the requests the --group-by column makes (rec.serve.groups):
    each at most the model's max_batch_size candidates, in cfg.form."""
    column = cfg.group_by
    ids = groups.check_ids(raw, column, cfg.input)
    grouped = groups.group_rows(ids)
    groups.check_context(raw, spec, split, grouped, column, cfg.input)
    limit = load_model(cfg.repo, client.model).max_batch_size if cfg.repo else 0
    limit = limit or client.max_batch_size()
    scores: np.ndarray | None = None
    for index in groups.parts(grouped, limit):
        part = rows.take(index)
        got = client.score(ContextRows.from_flat(split, part) if cfg.form == "context" else part)
        if scores is None:
            scores = np.empty((len(rows), got.shape[1]), dtype=got.dtype)
        scores[index] = got
    return scores


def count_unknown(
    cfg: PredictConfig, model: str, spec: FeatureSpec, raw: RawRows, rows: Rows
) -> dict[str, int] | None:
    """The file's unknown ids per ZCH feature, against the maps of --repo's version of the
    model (the server only returns scores); None without --repo or ZCH tables."""
    if cfg.repo is None:
        return None
    served = load_model(cfg.repo, model)
    maps, feature_tables = artifact_maps(ModelDir(served.dir).version(served.version))
    if not maps:
        return None
    values = rows.values
    if values is None:  # --send strings: the server maps the text; the ids are the same
        try:
            values = spec.encode_values(raw.lengths, raw.tokens)
        except TokenError:
            return None  # the server refuses the request with the token's error
    names = [s.name for s in spec.sparse]
    return unknown_counts(maps, feature_tables, names, raw.lengths, values)


def format_negative(counts: dict[str, int]) -> str:
    """The summary line of negative categorical values, per feature that has any."""
    each = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    return (
        f"negative ids in categorical columns, by feature: {each}; the model maps them into "
        "its tables by modulo, as training does unless features.negative is error"
    )


def task_names(client: ScoreClient, repo: Path | None) -> tuple[str, ...]:
    """The model's task names from --repo's rec.json, else as the server publishes them (Triton
    started by `rec serve`); () when neither says."""
    if repo is not None:
        return load_model(repo, client.model).task_names
    features = client.features()
    return features.tasks if features is not None else ()


def score_columns(tasks: tuple[str, ...] | list[str], num_tasks: int) -> list[str]:
    """The score columns: `score` for a single-task model, else `score_<task>` per task (the
    model's task names: model.tasks, or label_0, label_1, ... by default).

    Example:
        >>> score_columns(("click", "purchase"), 2), score_columns(("label",), 1)
        (['score_click', 'score_purchase'], ['score'])
    """
    if num_tasks == 1:
        return ["score"]
    if len(tasks) != num_tasks:
        tasks = [f"label_{t}" for t in range(num_tasks)]  # model.task_names' default
    return [f"score_{task}" for task in tasks]


def format_scores(scores: np.ndarray, columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", *columns])
    for i, row in enumerate(scores):
        writer.writerow([i, *(f"{s:.7g}" for s in row)])
    return out.getvalue()


__all__ = ["FORMATS", "FORMS", "InputError", "PredictConfig", "Prediction", "predict"]
