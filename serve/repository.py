"""Reading a model repository (docs/architecture.md#model-repository) the way both servers
will read it.

    <repo>/<model>/config.pbtxt           Triton ModelConfig (platform pytorch_libtorch)
    <repo>/<model>/<version>/model.pt     TorchScript: (dense f32 [B, D], lengths i32 [B, F],
                                          values i64 [N]) -> scores f32 [B, T]
    <repo>/<model>/rec.json               manifest: features {dense: [..], sparse: [..]}, num_tasks,
                                          serving {max_batch_size, ...} (optional)

`config.pbtxt` is parsed with the `model_config_pb2` that tritonclient ships, i.e. Triton's real
schema, so a repository that loads here has a config Triton itself accepts. Errors say which file
and what is wrong; nothing here starts a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from rec.contract import (  # noqa: F401  (serve's names)
    DENSE,
    FORMATS,
    LENGTHS,
    MANIFEST_FILE,
    SCORES,
    STRINGS,
    TRITON_CONFIG_FILE,
    VALUES,
    Manifest,
    ManifestError,
    ModelDir,
    read_manifest,
    served_files,
    triton_dtype,
)


class ServeError(Exception):
    """A user-facing serving error (bad repository, port in use, server not built...)."""


@dataclass(frozen=True)
class ServedModel:
    """One model of a repository, resolved to the version a server will load."""

    name: str
    dir: Path
    """<repo>/<model>"""
    version: int
    """Newest numeric version directory holding model.pt (Triton's default version policy)."""
    config: model_config_pb2.ModelConfig
    dense_names: tuple[str, ...]
    sparse_names: tuple[str, ...]
    num_tasks: int
    serving_max_batch_size: int = 0
    """rec.json's serving.max_batch_size (0 when absent): the limit of a max_batch_size 0 config."""
    feature_spec: dict | None = None
    """rec.json's feature_spec (rec.features), None for a model exported before it existed."""
    task_names: tuple[str, ...] = ()
    """rec.json's tasks: one name per score column (model.task_names); () for a model
    exported before rec.json named them."""

    @property
    def model_path(self) -> Path:
        """The version's model.pt (TorchScript) or model.pt2 (AOTInductor): the config's own
        format first, so one model can move between the two by a new version."""
        return _model_file(ModelDir(self.dir).version(self.version), self.config.platform)

    @property
    def max_batch_size(self) -> int:
        """Largest request in samples, as rec-server enforces it: the config's max_batch_size;
        for the `none` form (max_batch_size 0) rec.json's serving.max_batch_size, and 0 (no
        limit) when the manifest has none."""
        if self.config.max_batch_size > 0:
            return int(self.config.max_batch_size)
        return self.serving_max_batch_size


def parse_config(text: str, source: str = TRITON_CONFIG_FILE) -> model_config_pb2.ModelConfig:
    """Parses Triton's text-format ModelConfig; the error names `source` and the bad line."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise ServeError(f"{source} is not a valid Triton ModelConfig: {e}") from e


def config_text(config: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(config)


def list_models(repo: Path) -> list[str]:
    """Names of the model directories (those with a config.pbtxt) in `repo`, sorted."""
    repo = Path(repo)
    if not repo.is_dir():
        raise ServeError(f"model repository {str(repo)!r} does not exist or is not a directory")
    return sorted(p.name for p in repo.iterdir() if ModelDir(p).config.is_file())


def load_model(repo: Path, model: str | None = None) -> ServedModel:
    """Resolves `model` to a ServedModel, checking its files.

    Without `model`: the repository's only TorchScript (pytorch_libtorch) model, so the ONNX
    model export may write beside it (`rec_onnx`) does not make the choice ambiguous.

    Example:
        >>> m = load_model(Path("model_repository"))  # doctest: +SKIP
        >>> m.name, m.model_path, m.sparse_names[:2]  # doctest: +SKIP
        ('rec', PosixPath('model_repository/rec/1/model.pt'), ('cat_0', 'cat_1'))
    """
    repo = Path(repo)
    names = list_models(repo)
    if model is None:
        torchscript = [n for n in names if _maybe_torchscript(repo / n)]
        if len(torchscript) != 1:
            found = ", ".join(names) if names else "none"
            raise ServeError(
                f"model repository {str(repo)!r} must hold exactly one pytorch_libtorch model "
                f"when --model is not given (models with a config.pbtxt: {found})"
            )
        model = torchscript[0]
    model_dir = ModelDir.of(repo, model).path
    if model not in names:
        raise ServeError(
            f"no model {model!r} in {str(repo)!r}: {ModelDir(model_dir).config} is missing"
        )
    config_path = ModelDir(model_dir).config
    config = parse_config(config_path.read_text(), str(config_path))
    version = _newest_version(model_dir)
    m = _read_manifest(model_dir)
    _check_io(config, model_dir, len(m.dense_names), len(m.sparse_names), m.num_tasks)
    # The `none` form (max_batch_size 0): rec.json's "serving" says how rec-server batches it.
    serving_max = m.serving_max_batch_size if config.max_batch_size == 0 else 0
    return ServedModel(model, model_dir, version, config, m.dense_names, m.sparse_names,
                       m.num_tasks, serving_max, m.feature_spec, _task_names(m))  # fmt: skip


def _maybe_torchscript(model_dir: Path) -> bool:
    try:
        config = parse_config(ModelDir(model_dir).config.read_text())
    except ServeError:
        return True  # chosen, so that its parse error is what the user sees
    return config.platform == "pytorch_libtorch" or config.backend == "pytorch"


def model_files() -> dict[str, str]:
    """Triton platform -> model file, of the formats rec's servers load (rec.contract)."""
    return served_files()


def _model_file(version_dir: Path, platform: str) -> Path:
    files = model_files()
    default = FORMATS["torchscript"].file
    names = [files.get(platform, default), *files.values()]
    return next(
        (version_dir / n for n in names if (version_dir / n).is_file()), version_dir / names[0]
    )


def _newest_version(model_dir: Path) -> int:
    files = model_files().values()
    versions = ModelDir(model_dir).versions(holding=files)
    if not versions:
        raise ServeError(
            f"{model_dir} has no version directory with a {' or a '.join(files)} "
            "(<version>/model.pt)"
        )
    return max(versions)


def _task_names(m: Manifest) -> tuple[str, ...]:
    """rec.json's "tasks" when it names every score column, else ()."""
    tasks = m.data.get("tasks")
    if (
        isinstance(tasks, list)
        and len(tasks) == m.num_tasks
        and all(isinstance(t, str) and t for t in tasks)
    ):
        return tuple(tasks)
    return ()


def _read_manifest(model_dir: Path) -> Manifest:
    path = ModelDir(model_dir).manifest
    if not path.is_file():
        raise ServeError(f"{path} is missing (rec's manifest: feature names, num_tasks)")
    try:
        return read_manifest(path)
    except ManifestError as e:
        raise ServeError(str(e)) from e


def _check_io(config, model_dir: Path, num_dense: int, num_sparse: int, num_tasks: int) -> None:
    """The config must declare the I/O (docs/architecture.md#model-io), sized like rec.json says.

    Two forms are accepted (export.triton_batching): `ragged` (max_batch_size > 0, dims without
    the batch dimension, sparse_values allow_ragged_batch) and `none` (max_batch_size 0, the
    batch dimension spelled out as -1).
    """
    where = str(ModelDir(model_dir).config)
    batch = [] if config.max_batch_size > 0 else [-1]
    expected = {
        DENSE: (triton_dtype(DENSE), [*batch, num_dense]),
        LENGTHS: (triton_dtype(LENGTHS), [*batch, num_sparse]),
        VALUES: (triton_dtype(VALUES), [-1]),
    }
    inputs = {i.name: i for i in config.input}
    outputs = {o.name: o for o in config.output}
    scores = (SCORES, (triton_dtype(SCORES), [*batch, num_tasks]))
    for name, (dtype, dims) in [*expected.items(), scores]:
        io = outputs.get(name) if name == SCORES else inputs.get(name)
        if io is None:
            raise ServeError(f"{where} does not declare {name!r}")
        got = (model_config_pb2.DataType.Name(io.data_type), list(io.dims))
        if got != (dtype, dims):
            raise ServeError(
                f"{where}: {name!r} is {got[0]} dims {got[1]}, expected {dtype} {dims}"
            )
    if config.max_batch_size > 0 and not inputs[VALUES].allow_ragged_batch:
        raise ServeError(f"{where}: {VALUES!r} needs allow_ragged_batch: true")
