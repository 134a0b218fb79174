"""Starting a real Triton Inference Server (nvidia-pytriton's tritonserver) on a rec repository.

nvidia-pytriton ships tritonserver 2.51 with only the Python backend, so the repository's
pytorch_libtorch model cannot load in it as is. `start_triton` therefore builds a *staging*
repository in a temporary directory: for the user's model it writes a Python-backend config
(same inputs, outputs, batching and instances; `backend: "python"`, plus a `model_path`
parameter pointing at the user's `<repo>/<model>/<version>/model.pt`) and rec's model.py. The
user's repository, which the C++ server and Triton's containers read, is never modified.

Three things make this tritonserver run from a plain venv
(docs/architecture.md#triton-from-the-pytriton-wheel):
- LD_LIBRARY_PATH at the wheel's `nvidia_pytriton.libs/` (the server's own shared libraries)
  and at this interpreter's libpython, so the stub embeds the same Python build as the venv;
- a backend directory holding `python/libtriton_python.so` with the stub built for this Python
  version beside it. The wheel keeps one stub per Python version elsewhere, so the staging
  directory gets `backends/python/` with links to the backend and a copy of the right stub:
  nothing is written into site-packages, and a fresh venv works with no setup step;
- PATH starting with this venv's bin/: the stub's embedded Python finds its prefix from the
  `python` on PATH, so it gets the venv's site-packages (torch, fbgemm_gpu).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from rec.contract import ModelDir, io_manifest, triton_dtype
from rec.contract.context import ContextSplit
from rec.contract.io import CANDIDATE_STRINGS, CONTEXT_STRINGS, context_io_manifest
from rec.contract.repository import read_version_manifest
from rec.contract.updates import UpdateError, parse_url
from rec.serve.client import FEATURES_PARAMETER
from rec.serve.process import Endpoints, ServerProcess, http_ok, launch, pick_ports, wait_until
from rec.serve.python_backend.config import (
    STORE_CACHE_PARAMETER,
    STORE_RETRY_NOTE,
    UPDATES_PARAMETER,
)
from rec.serve.repository import (
    STRINGS,
    VALUES,
    ServedModel,
    ServeError,
    config_text,
    load_model,
)

_MODEL_PY = Path(__file__).with_name("triton_python_model.py")
STORE_RETRY_S = 2.0
"""How often a load that failed on an unreachable embedding store is retried: model.py ends
such a failure with STORE_RETRY_NOTE; any other failed load stops the start-up."""


@dataclass(frozen=True)
class TritonInstall:
    """Paths inside the installed nvidia-pytriton wheel."""

    server: Path
    libs: Path
    python_backend: Path
    stub: Path

    @staticmethod
    def find() -> TritonInstall:
        spec = importlib.util.find_spec("pytriton")  # locate only: importing pytriton is slow
        if spec is None or not spec.submodule_search_locations:
            raise ServeError("nvidia-pytriton is not installed (run make setup)")
        root = Path(next(iter(spec.submodule_search_locations)))
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = TritonInstall(
            server=root / "tritonserver" / "bin" / "tritonserver",
            libs=root.parent / "nvidia_pytriton.libs",
            python_backend=root / "tritonserver" / "backends" / "python",
            stub=root
            / "tritonserver"
            / "python_backend_stubs"
            / version
            / "triton_python_backend_stub",
        )
        for path in (install.server, install.libs, install.python_backend, install.stub):
            if not path.exists():
                raise ServeError(f"nvidia-pytriton is incomplete: {path} is missing")
        return install


def prepare_backends(install: TritonInstall, dest: Path) -> Path:
    """Writes dest/python/ (backend + this Python's stub) and returns dest (--backend-directory)."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for item in install.python_backend.iterdir():
        if item.is_file():
            (python_dir / item.name).symlink_to(item)
    # Copied, not linked: the backend resolves the stub next to its own directory entry.
    stub = python_dir / "triton_python_backend_stub"
    shutil.copy2(install.stub, stub)
    stub.chmod(0o755)
    return dest


def python_backend_config(
    model: ServedModel,
    intra_op_threads: int = 1,
    allow_batch_variant: bool = False,
    updates: str | None = None,
    store_cache_bytes: int | None = None,
):
    """The user's config, rewritten for rec's Python-backend model and multi-sample requests.

    Triton requires every input of a batching model (max_batch_size > 0) to carry the same
    batch dimension, ragged ones included, so with a `ragged`-form config a request can
    hold only one sample (sparse_values [1, N]); a request with B candidates is rejected
    ("batch size does not match other inputs"). The staged model therefore has the `none`
    form: max_batch_size 0 with the batch dimension spelled out ([-1, D], [-1, F], [-1] ->
    [-1, T]), so any B per request works and model.py enforces the exported max_batch_size
    itself (`model.max_batch_size`: rec.json's serving one for the `none` form). Triton's
    dynamic batcher needs max_batch_size > 0, so each request runs as its own batch. A config
    already in the `none` form (the export's default) is kept as it is.

    A context model (rec.json's "context" section) takes both forms in the `none` form, each
    input optional (model.py says which form a request is and what it lacks); Triton's
    `batch_input` / `batch_output` of a `ragged` context config are dropped, as model.py
    fills candidate_offsets per request and slices the scores itself (_context_inputs).

    `updates` (rec-server's `--updates URL|none`) becomes the `updates_url` parameter: the
    update log model.py applies instead of rec.json's `updates.url`, or `none` for no log;
    None leaves rec.json's.
    """
    config = type(model.config)()
    config.CopyFrom(model.config)
    config.name = model.name
    config.ClearField("platform")
    config.backend = "python"
    if config.max_batch_size > 0:  # the `ragged` form; the `none` form is already like this
        config.max_batch_size = 0
        config.ClearField("dynamic_batching")
        for io in config.input:
            io.allow_ragged_batch = False
        for io in [*config.input, *config.output]:
            if io.name != VALUES:
                io.dims.insert(0, -1)
    split = _context_split(model)
    if split is not None:
        _context_inputs(config, model, split)
    config.parameters["model_path"].string_value = str(model.model_path.resolve())
    config.parameters["max_rows"].string_value = str(model.max_batch_size)
    config.parameters["intra_op_threads"].string_value = str(intra_op_threads)
    config.parameters["allow_batch_variant"].string_value = str(allow_batch_variant).lower()
    if updates is not None:
        config.parameters[UPDATES_PARAMETER].string_value = updates
    if store_cache_bytes is not None:
        config.parameters[STORE_CACHE_PARAMETER].string_value = str(store_cache_bytes)
    # Published so `rec predict --url` can map file columns without the repository at hand.
    features = {
        "dense": list(model.dense_names),
        "sparse": list(model.sparse_names),
        "feature_spec": model.feature_spec,
        "tasks": list(model.task_names),
        "context": split.to_dict() if split is not None else None,  # rec predict --group-by
    }
    config.parameters[FEATURES_PARAMETER].string_value = json.dumps(features)
    if model.feature_spec is not None:
        # The string form: Triton checks every input's type against the config, so the
        # tokens get their own input, and each of the pair becomes optional (model.py
        # requires exactly one).
        for io in config.input:
            if io.name == VALUES:
                io.optional = True
        names = [STRINGS]
        if split is not None:  # each side's strings, encoded with that side's features
            names += [CONTEXT_STRINGS] if split.sparse else []
            names.append(CANDIDATE_STRINGS)
        for name in names:
            strings = config.input.add(name=name, data_type=model_config_pb2.TYPE_STRING)
            strings.dims.append(-1)
            strings.optional = True
        spec = json.dumps(model.feature_spec)
        config.parameters["feature_spec"].string_value = spec
    for group in config.instance_group:
        group.kind = group.KIND_CPU  # this Triton has no GPU support; the model is CPU-only
        group.ClearField("gpus")
    return config


def _context_split(model: ServedModel) -> ContextSplit | None:
    """The version's context columns (rec.json beside the model file, which model.py reads),
    None for a flat-only model."""
    manifest = read_version_manifest(model.model_path.parent)
    return manifest.context if manifest is not None else None


def _context_inputs(config, model: ServedModel, split: ContextSplit) -> None:
    """A context model's inputs in the `none` form: the flat ones and the model's, each
    optional. candidate_offsets stays declared (optional) only so that a client sending it gets
    the refusal both servers give ("filled by the server, do not send it") from model.py,
    not Triton's "unexpected inference input"; model.py fills it for every request."""
    del config.input[:]
    config.ClearField("batch_input")
    config.ClearField("batch_output")
    flat = io_manifest(len(model.dense_names), len(model.sparse_names), model.num_tasks)
    for spec in [*flat["inputs"], *context_io_manifest(split, model.num_tasks)["inputs"]]:
        io = config.input.add(name=spec["name"], optional=True)
        io.data_type = model_config_pb2.DataType.Value(triton_dtype(spec["name"]))
        io.dims.extend(spec["shape"])


def stage_repository(
    model: ServedModel,
    dest: Path,
    intra_op_threads: int = 1,
    allow_batch_variant: bool = False,
    updates: str | None = None,
    store_cache_bytes: int | None = None,
) -> Path:
    """Writes dest/<model>/{config.pbtxt, <version>/model.py}; returns dest."""
    staged = ModelDir.of(dest, model.name)
    staged.version(model.version).mkdir(parents=True)
    config = python_backend_config(model, intra_op_threads, allow_batch_variant, updates,
                                   store_cache_bytes)  # fmt: skip
    staged.write_config(config_text(config))
    shutil.copy2(_MODEL_PY, staged.version(model.version) / "model.py")
    return dest


def triton_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    libdirs = [sysconfig.get_config_var("LIBDIR") or "", str(install.libs)]
    if env.get("LD_LIBRARY_PATH"):
        libdirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(d for d in libdirs if d)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def start_triton(
    repo: Path,
    model: str | None = None,
    host: str = "127.0.0.1",
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    intra_op_threads: int = 1,
    echo: bool = False,
    allow_batch_variant: bool = False,
    ready_timeout: float = 180.0,
    updates: str | None = None,
    store_cache_bytes: int | None = None,
) -> ServerProcess:
    """Starts tritonserver on `repo`'s model and returns once the model is ready.

    Ports of 0 are replaced by free ones. `intra_op_threads` is torch's thread count inside the
    model (1, like rec-server's default: with more, OpenMP threads spin against each other and
    the server's own threads on a busy machine; measured 0.9 ms vs 10 ms per B=1 call here).
    The staging directory (and the server log in it) is removed when the server is stopped.
    `updates`: the update log the model applies while serving, as rec-server's `--updates`: a
    redis:// URL, `none` for none, None for rec.json's `updates.url` (docs/update_log.md).
    `store_cache_bytes`: the row cache of a version with stored tables (None: 256 MiB, as
    rec-server's --store-cache-bytes; 0: none).

    Example:
        >>> with start_triton(Path("model_repository"), http_port=0, grpc_port=0,
        ...                   metrics_port=0) as server:  # doctest: +SKIP
        ...     print(server.endpoints.http)
        127.0.0.1:40125
    """
    served = load_model(repo, model)
    if updates not in (None, "none"):
        try:
            parse_url(updates)
        except UpdateError as e:
            raise ServeError(f"updates: {e}") from None
    install = TritonInstall.find()
    ports = pick_ports(host, [http_port, grpc_port, metrics_port])
    staging = Path(tempfile.mkdtemp(prefix="rec-triton-"))
    try:
        backends = prepare_backends(install, staging / "backends")
        models = stage_repository(
            served, staging / "models", intra_op_threads, allow_batch_variant, updates,
            store_cache_bytes,
        )  # fmt: skip
        argv = _server_argv(install, models, backends, host, ports)
        stored = _has_store(served)
        if stored:
            argv = _retrying_argv(argv, served.name)
        server = launch(
            "tritonserver", argv, staging / "tritonserver.log", triton_env(install), echo
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    server._on_stop.append(lambda: shutil.rmtree(staging, ignore_errors=True))
    server.endpoints = Endpoints(*(f"{host}:{p}" for p in ports))
    ready_url = f"http://{server.endpoints.http}/v2/models/{served.name}/ready"
    # Triton starts its metrics endpoint after HTTP and gRPC: a model can answer ready while
    # /metrics still refuses connections (seen in CI on a busy machine).
    metrics_url = f"http://{server.endpoints.metrics}/metrics"
    if not stored:
        wait_until(server, lambda: http_ok(ready_url) and http_ok(metrics_url), ready_timeout,
                   f"ready to serve {served.name!r}")  # fmt: skip
        return server
    # A version with stored tables: up and ready, or up with the model not ready because its
    # store did not answer (then reloaded every 2 s, as rec-server retries its load).
    failed: list[str] = []

    def settled() -> bool:
        if http_ok(ready_url):
            return True
        entry = _index_entry(server.endpoints.http, served.name)
        if entry is None or entry.get("state") != "UNAVAILABLE":
            return False
        failed.append(entry.get("reason", ""))
        return True

    wait_until(server, lambda: settled() and http_ok(metrics_url), ready_timeout,
               f"ready to serve {served.name!r}")  # fmt: skip
    if failed and STORE_RETRY_NOTE not in failed[0]:
        tail = server.log_tail()
        server.stop()
        raise ServeError(f"tritonserver could not load {served.name!r}: {failed[0]}\n{tail}")
    if failed:
        server.not_ready = failed[0]
        _retry_loads(server, served.name)
    return server


def _has_store(served: ServedModel) -> bool:
    """Whether the version has stored tables: its rec.json (beside the model file, which
    model.py reads) has a `store` section."""
    with contextlib.suppress(OSError, ValueError):
        manifest = read_version_manifest(served.model_path.parent)
        return manifest is not None and manifest.has("store")
    return False


def _retrying_argv(argv: list[str], model: str) -> list[str]:
    """Triton's flags for a model whose load may have to be retried: it stays up when the load
    fails (that model not ready, the reason in its repository index), and loads it on request."""
    argv = [a for a in argv if not a.startswith("--exit-on-error")]
    return [*argv, "--exit-on-error=false", "--model-control-mode=explicit",
            f"--load-model={model}"]  # fmt: skip


def _index_entry(http: str, model: str) -> dict | None:
    """The model's entry in Triton's repository index (name, version, state, reason)."""
    request = urllib.request.Request(f"http://{http}/v2/repository/index", data=b"{}")
    errors = (urllib.error.URLError, OSError, ValueError)
    with contextlib.suppress(*errors), urllib.request.urlopen(request, timeout=5) as r:
        for entry in json.loads(r.read()):
            if entry.get("name") == model:
                return entry
    return None


def _retry_loads(server: ServerProcess, model: str) -> None:
    """Every STORE_RETRY_S, asks Triton to load `model` again while its last load failed on the
    store; the reason of the newest failure is kept in server.not_ready, None once loaded."""
    stop = threading.Event()
    url = f"http://{server.endpoints.http}/v2/repository/models/{model}/load"

    def retry() -> None:
        while not stop.wait(STORE_RETRY_S) and server.alive():
            try:  # synchronous: answers once the load has succeeded (200) or failed (400)
                with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=120):
                    server.not_ready = None
                    return
            except urllib.error.HTTPError as e:
                server.not_ready = json.loads(e.read() or b"{}").get("error", str(e))
            except (urllib.error.URLError, OSError, ValueError):
                pass  # the server is going away, or busy: the next round asks again

    thread = threading.Thread(target=retry, name=f"triton-{model}-load", daemon=True)
    thread.start()
    server._on_stop.insert(0, stop.set)


def _server_argv(install, models: Path, backends: Path, host: str, ports: list[int]) -> list[str]:
    http, grpc, metrics = ports
    # A unique shared-memory prefix: several tritonservers on one host (tests, users) must not
    # share the Python backend's /dev/shm regions.
    shm_prefix = f"rec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
    return [
        str(install.server),
        f"--model-repository={models}",
        f"--backend-directory={backends}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--http-address={host}",
        f"--http-port={http}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics}",
        "--exit-on-error=true",
    ]
