"""Helpers shared by tests: running the real `rec` CLI (and through it, real torchrun processes)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rec import run_dir
from rec.cpu import bf16_inner_product

REPO = Path(__file__).resolve().parent.parent

# bf16 dense layers are oneDNN's bf16 inner product, which needs AVX-512 (BW, VL, DQ) or
# AVX-NE-CONVERT; on other CPUs (an AVX2-only AMD EPYC) export refuses bf16. The refusal is
# tested on every CPU through the REC_MAX_CPU_ISA seam (rec/cpu.py); the bf16 kernels themselves
# run only where oneDNN has them.
BF16_CPU = bf16_inner_product()
needs_bf16_cpu = pytest.mark.skipif(
    not BF16_CPU,
    reason="needs oneDNN's real bf16 kernel (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), which this CPU "
    "lacks; the refusal on such a CPU runs everywhere (test_bf16_on_a_cpu_without_it_is_refused)",
)
REC = str(Path(sys.executable).parent / "rec")


def run_rec(*args: str, check: bool = True, timeout: float = 600, cwd: Path | None = None):
    """Runs `rec ARGS...` in a subprocess; returns the CompletedProcess (stdout+stderr merged)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [REC, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"rec {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}")
    return proc


def rec_in_process(
    *args: str, check: bool = False, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`rec ARGS...` through the same click command, inside this process: for commands that
    start no other process (plan, export) and for refusals that come before any work. A fresh
    interpreter spends about 4 CPU-s importing torch, torchrec and fbgemm_gpu, which this process
    has already paid. Exit status and the merged output as run_rec returns them (check: a
    nonzero status fails with the output); an exception the command does not turn into a clean
    exit propagates (a traceback is not a clear error)."""
    from click.testing import CliRunner

    from rec.cli import main

    with contextlib.chdir(cwd or Path.cwd()):
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    if check and result.exit_code != 0:
        raise AssertionError(f"rec {' '.join(args)} exited {result.exit_code}:\n{result.output}")
    return subprocess.CompletedProcess(["rec", *args], result.exit_code, result.output)


# A warning in a command's output: Python's (`lib.py:12: FutureWarning: ...`, a C++ TORCH_WARN's
# `[W1128 ...] Warning: ...`), a logging record's default format (`WARNING:torchrec...:`) or
# torch's own log format (`W1128 23:10:37.876000 ...`, `[rank0]:W1128 ...`). rec's own lines
# say `warning:` in lower case.
_WARNING_LINE = re.compile(r"Warning: |^WARNING:|^(\[rank\d+\]:)?W\d{4} \d\d:\d\d")


def warning_lines(output: str) -> list[str]:
    """The third-party warning lines in a command's output: a default `rec train`, `rec export`
    or `rec serve` has none (rec.warnings_filter hides the known harmless ones)."""
    return [line for line in output.splitlines() if _WARNING_LINE.search(line)]


def lose_checkpoint(run: Path, lost: int, latest: int, steps: int) -> None:
    """`run` as if it died before its step-`lost` checkpoint: that checkpoint gone, LATEST back
    at step `latest`, and the saved config's training.steps `steps` for `rec train --resume`."""
    shutil.rmtree(run_dir.checkpoints_dir(run) / run_dir.step_dir_name(lost))
    (run_dir.checkpoints_dir(run) / run_dir.LATEST_FILE).write_text(f"step_{latest}\n")
    saved = yaml.safe_load((run / run_dir.CONFIG_FILE).read_text())
    saved["training"]["steps"] = steps
    (run / run_dir.CONFIG_FILE).write_text(yaml.safe_dump(saved))


def worker_pids(run: Path) -> list[int]:
    """The pids of `run`'s training workers (rec.train.worker with `run` on its command line):
    what a test kills to stand for a rank that dies."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rec.train.worker" in cmd and str(run).encode() in cmd:
            pids.append(int(proc.name))
    return pids


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# A config small enough that a 2-rank run of 40 steps takes seconds.
TINY = {
    "tables": [
        {"name": f"t{i}", "rows": r, "dim": 8, "features": [f"cat_{i}"]}
        for i, r in enumerate([300, 500, 200, 400, 600, 250, 350, 450])
    ],
    "features": {"dense": 4},
    "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
    "data": {"synthetic": {"train_samples": 40_000, "eval_samples": 2048}},
    "training": {"batch_size": 64, "steps": 40, "eval_every": 20, "log_every": 10},
    "checkpoint": {"every_steps": 20, "keep_last": 3},
}


def questionable_ids(
    address: str, reason: str = "negative", model: str = "rec"
) -> dict[str, float]:
    """rec_questionable_ids_total{reason=...} of `model`, by feature, from a server's /metrics
    at `address` (labels in any order: Triton sorts them, rec-server does not)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    counts = {}
    for line in text.splitlines():
        m = re.match(r"^rec_questionable_ids_total\{(.*)\} (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels["model"] == model and labels["reason"] == reason:
                counts[labels["feature"]] = float(m.group(2))
    return counts


def scores_under_writes(write, infer, states: dict, readers: int, seconds: float = 4.0):
    """The torn-update check's load: `write()` in a loop on one thread while `readers` threads
    score for `seconds` with `infer(grpc)` (every other one over gRPC). Returns the names of
    `states` the responses matched, and the responses that matched none (a torn update)."""
    import threading
    import time

    import numpy as np

    stop = threading.Event()
    seen: list = []
    bad: list = []

    def writer() -> None:
        while not stop.is_set():
            write()

    def reader(i: int) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = infer(bool(i % 2))
            match = [k for k, s in states.items() if np.array_equal(got, s)]
            (seen.extend(match) if match else bad.append(got))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    feeder = threading.Thread(target=writer)
    feeder.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    feeder.join()
    return seen, bad
