"""The two tiers of the suite: `make check` (the edit loop: lint and the tests that train
nothing and start no server, under 3 minutes) and `make test` (everything; CI runs it).

A test is in the integration tier when it trains with torchrun, starts a server or a broker
(rec-server, tritonserver, redis-server), compiles an AOTInductor package, or otherwise takes
more than a few seconds. INTEGRATION names them by file, or by file and test name where a file
mixes both kinds. Under `make check` (REC_TEST_TIER=check) starting one of those processes is an
error that names this file, so a test that belongs here cannot hide in the fast tier.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

TIER_ENV = "REC_TEST_TIER"

# A path relative to tests/ (a folder or a file), or "file::test" (a test's name without its
# parameters). Measured with `pytest --durations=0`: each entry trains, serves, compiles or
# takes seconds.
INTEGRATION = frozenset({
    # Every test here starts rec-server, tritonserver, redis-server or a Docker stack.
    "serve_cpp", "serve_triton", "serve_cli", "reliability", "store", "deploy",
    "data/test_replay.py", "data/test_stream.py", "data/test_partitions.py",
    "data/test_stream_failover.py", "data/test_replay_wait.py",
    "logs/test_keyslot.py", "logs/test_route.py", "logs/test_update_layout.py",
    "logs/test_update_reader.py", "logs/test_update_watermark.py", "logs/test_update_trim.py",
    # Real torchrun training.
    "train/test_default_run.py", "train/test_din.py", "train/test_eval_split.py",
    "train/test_faults.py", "train/test_multihost.py", "train/test_plain_pipeline.py",
    "train/test_publish.py", "train/test_publish_order.py", "train/test_rank_threads.py",
    "train/test_publish_partitions.py",
    "train/test_step_profile_memory.py",
    "train/test_stream_stops.py", "train/test_stream_train.py", "train/test_stream_partitions.py",
    "train/test_stream_trim.py",
    "train/test_train_distributed.py",
    "train/test_zch.py",
    "export/test_trained.py", "export/test_zch_trained.py", "export/test_follow.py",
    # AOTInductor compiles, every format of every architecture, every batch size scanned, a
    # fresh interpreter per kernel path (each file 20 s or more).
    "export/test_aoti.py", "export/test_streamed.py", "export/test_dense_kernel.py",
    "export/test_int8_kernel.py", "export/test_kernel_paths.py", "export/test_id_maps.py",
    "export/test_context_export.py::test_aoti_package_scores_as_torchscript",
    "train/test_dlrm_v2_example.py::"
    "test_a_small_variant_trains_and_exports_int8_with_the_context_form",
})  # fmt: skip

# Executables whose start means training, serving or a broker.
HEAVY = ("torchrun", "rec-server", "tritonserver", "redis-server", "rec-bench")
HEAVY_REC = ("train", "serve", "bench", "predict", "store", "stream")


def in_integration(rel: str, name: str) -> bool:
    """Whether the test `name` of the file `rel` (relative to tests/) is integration."""
    parts = Path(rel).parts
    prefixes = {str(Path(*parts[:i])) for i in range(1, len(parts) + 1)}
    return bool(prefixes & INTEGRATION) or f"{rel}::{name.split('[')[0]}" in INTEGRATION


def mark(items, root: Path) -> None:
    """Marks each collected item of the integration tier `integration`."""
    for item in items:
        rel = str(Path(item.fspath).relative_to(root))
        if in_integration(rel, item.name):
            item.add_marker(pytest.mark.integration)


def _heavy(args) -> str | None:
    argv = [args] if isinstance(args, (str, os.PathLike)) else list(args)
    if not argv:
        return None
    words = str(argv[0]).split() if isinstance(args, str) else [str(a) for a in argv]
    exe = Path(words[0]).name
    if "torch.distributed.run" in words:
        return "torchrun"
    if exe in HEAVY:
        return exe
    if exe == "rec" and len(words) > 1 and words[1] in HEAVY_REC:
        return f"rec {words[1]}"
    return None


def guard_check_tier() -> None:
    """Under REC_TEST_TIER=check, refuses to start a training, serving or broker process."""
    if os.environ.get(TIER_ENV) != "check":
        return
    original = subprocess.Popen.__init__

    def refusing(self, args, *a, **kw):
        what = _heavy(args)
        if what:
            raise RuntimeError(
                f"make check runs no training and no servers, but this test starts {what}: "
                "add it to INTEGRATION in tests/tiers.py"
            )
        original(self, args, *a, **kw)

    subprocess.Popen.__init__ = refusing
