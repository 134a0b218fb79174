"""Trained runs and exported repositories made once per recipe, and shared by the tests that
only read them.

A recipe is what makes an artifact (the config, the `rec` command's arguments); its digest names
a directory under the artifact root. The root is $REC_TEST_ARTIFACTS when set: scripts/test.sh
sets one for a whole `make test`, so the sanitized stage scores the runs the main suite trained
instead of training them again. Otherwise it is this pytest run's (shared by its xdist workers).

A lock makes a second worker wait for the first instead of making the artifact twice, and an
artifact counts as made only once its maker returned, so a failed attempt is made again, never
reused. Whoever gets an artifact must not write into it: copy it first to change it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

DONE = ".made"


def _root(tmp_path_factory) -> Path:
    if os.environ.get("REC_TEST_ARTIFACTS"):
        return Path(os.environ["REC_TEST_ARTIFACTS"])
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is popen-gwN inside the run's own directory.
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "artifacts"


def made(tmp_path_factory, recipe: dict, make: Callable[[Path], None]) -> Path:
    """The directory `make(directory)` fills for `recipe`, made by this call or an earlier one."""
    root = _root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    digest = json.dumps(recipe, sort_keys=True, default=str).encode()
    key = hashlib.sha256(digest).hexdigest()[:16]
    where = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (where / DONE).exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            (where / "recipe.json").write_text(digest.decode())
            make(where)
            (where / DONE).touch()
    return where
