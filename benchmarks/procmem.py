"""Peak RSS of a command and of each process it starts (Linux /proc), for the benchmarks.

Every `interval` seconds the process tree under the command is walked and each process's
VmHWM (the kernel's own high-water mark of its resident set) is recorded, so a short spike
between two polls is still counted, as long as the process is alive at the next poll (a spike
in a process's last 0.2 s before it exits is missed).

    .venv/bin/python benchmarks/procmem.py -- rec train -c examples/criteo_kaggle.yaml
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rec.serve.process import child_pids


def _status(pid: int) -> tuple[str, int] | None:
    """(command line, with `RANK=r ` in front for a torchrun worker; VmHWM bytes)."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)
    if rank is not None:
        cmdline = f"RANK={rank} {cmdline}"
    hwm = fields.get("VmHWM", "0 kB").split()[0]
    return cmdline[:200], int(hwm) * 1024


@dataclass
class TreeWatch:
    """Polls the process tree of `pid` in a thread; `peaks` maps pid -> (cmdline, peak bytes)."""

    pid: int
    interval: float = 0.2
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            todo = [self.pid]
            while todo:
                p = todo.pop()
                st = _status(p)
                if st is not None:
                    cmd, hwm = st
                    old = self.peaks.get(p, (cmd, 0))
                    self.peaks[p] = (cmd or old[0], max(old[1], hwm))
                todo += child_pids(p)
            self._stop.wait(self.interval)

    def stop(self) -> dict[int, tuple[str, int]]:
        self._stop.set()
        self._thread.join()
        return self.peaks

    def largest(self, contains: str = "") -> int:
        return max((b for c, b in self.peaks.values() if contains in c), default=0)

    def ranks(self) -> dict[int, int]:
        """Peak bytes of each torchrun worker, by RANK."""
        out: dict[int, int] = {}
        for cmd, b in self.peaks.values():
            if cmd.startswith("RANK=") and "rec.train.worker" in cmd:
                r = int(cmd.split()[0][5:])
                out[r] = max(out.get(r, 0), b)
        return out


def run_watched(cmd: list[str], log_path: Path | None = None, **kwargs) -> tuple[float, TreeWatch]:
    """Runs `cmd` to completion (output to `log_path`), returns (wall seconds, its TreeWatch).
    Raises CalledProcessError with the log's tail if it fails."""
    out = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    watch = TreeWatch(proc.pid)
    code = proc.wait()
    watch.stop()
    wall = time.perf_counter() - t0
    if log_path:
        out.close()
    if code != 0:
        tail = log_path.read_text()[-3000:] if log_path else ""
        raise subprocess.CalledProcessError(code, cmd, output=tail)
    return wall, watch


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    wall, watch = run_watched(args, Path("procmem.log"))
    peaks = sorted(watch.peaks.values(), key=lambda x: -x[1])
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "peaks_gb": [[c[:80], round(b / 1e9, 3)] for c, b in peaks[:8]],
            },
            indent=1,
        )
    )
