"""The image build's failure modes each end in one clear line: no Docker daemon, no root, no
wheelhouse, no network. Runs after the images are built (`make test-deploy`), so the Dockerfile's
apt layer is cached and each failing build stops at the Python stack within seconds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("REC_BASE_IMAGE", "rec-base:bookworm")


def run(argv: list[str], env: dict | None = None, timeout: float = 600):
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_no_docker_daemon():
    out = run(["bash", "scripts/test_deploy.sh", "--preflight"],
              env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})  # fmt: skip
    assert out.returncode == 1
    assert "no Docker daemon answers at DOCKER_HOST=unix:///nonexistent/docker.sock" in out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root")
def test_not_root():
    out = run(["runuser", "-u", "nobody", "--", "bash", "scripts/test_deploy.sh", "--preflight"])
    # 77: the stage cannot run on this machine as this user; .ci/run reports it as SKIPPED.
    assert out.returncode == 77
    assert "cannot run here" in out.stderr and "starting one needs root" in out.stderr
    base = run(["runuser", "-u", "nobody", "--", "bash", "deploy/build_base.sh", "rec-base:nope"])
    assert base.returncode == 1 and "debootstrap needs root" in base.stderr


@pytest.fixture(scope="module")
def context_without_wheels(tmp_path_factory) -> Path:
    """The repository's tracked files: a build context whose deploy/wheelhouse has no wheels."""
    ctx = tmp_path_factory.mktemp("context")
    files = run(["git", "ls-files", "-z", "-co", "--exclude-standard"]).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, ctx / name)
    return ctx


def build(ctx: Path, *args: str):
    argv = [
        "docker",
        "build",
        "--force-rm",
        "--target",
        "build",
        "--build-arg",
        f"BASE={BASE}",
        *args,
        str(ctx),
    ]
    return run(argv)


def test_empty_wheelhouse(context_without_wheels):
    out = build(context_without_wheels, "--build-arg", "PIP_SOURCE=wheelhouse")
    assert out.returncode != 0
    assert "PIP_SOURCE=wheelhouse but deploy/wheelhouse/ holds no wheels" in out.stdout + out.stderr


def test_no_wheelhouse_and_no_network(context_without_wheels):
    out = build(context_without_wheels, "--network", "none")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "no package index reachable from the build" in text
    assert "deploy/wheelhouse.sh" in text
