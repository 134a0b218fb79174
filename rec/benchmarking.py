"""What the scripts in benchmarks/ share: importable as `rec.benchmarking` however a script is
started (`.venv/bin/python benchmarks/<script>.py` puts only benchmarks/ on sys.path, and no script
imports another).

- memory: the peak RSS of a command's process tree (`run_watched`, `TreeWatch`), and each
  process's shared and private pages while a run goes on (`MemWatch`);
- CPU: a process's CPU seconds so far, all its threads (`process_cpu_s`);
- rec-server: a server with the benchmarks' threads (`Server`), a copy of a model with batching
  on or off (`batching_repo`), a run of the C++ load generator rec-bench (`bench`,
  `median_run`);
- models: the default and the Kaggle-size model trained briefly and exported
  (`trained_repositories`), a config trained once and exported plain and with a context
  (`train_export_both`);
- timing: several scorers timed in turns (`measure`);
- results: a run's JSON file under benchmarks/results (`results_file`, `write_results`) and
  its table again (`print_results`, a script's --report).

The benchmarks run from a checkout (an editable install): the build, the examples and the
results folder are found beside this package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rec.contract import ModelDir
from rec.serve.cpp import launch_cpp
from rec.serve.process import child_pids

ROOT = Path(__file__).resolve().parent.parent  # the checkout
BUILD = ROOT / "build" / "cpp"
RESULTS = ROOT / "benchmarks" / "results"
REC = str(Path(sys.executable).parent / "rec")
BATCHES = (1, 64, 512)  # the batch sizes the latency benchmarks time


def results_file(name: str, label: str | None) -> Path:
    """A benchmark's results: benchmarks/results/<name>.json, <name>_<label>.json if labelled."""
    return RESULTS / f"{name}{'_' + label if label else ''}.json"


def write_results(path: Path, doc: dict) -> None:
    """A run's results, as JSON (the folder made if this checkout has none yet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def print_results(path: Path, table: Callable[[dict], str]) -> None:
    """A script's --report: the table of its results file again, nothing run."""
    print(table(json.loads(path.read_text())))


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


_ROLLUP = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")


def smaps_rollup(pid: int) -> dict[str, int] | None:
    """Bytes of /proc/<pid>/smaps_rollup's Rss, Pss, Shared_* and Private_*: Pss splits each
    shared page among the processes mapping it, so summed over processes it is their real use."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in _ROLLUP:
            out[key] = int(rest.split()[0]) * 1024
    return out or None


def mem_available() -> int:
    """The machine's MemAvailable, bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used so far, from
    /proc/<pid>/stat: the difference over a window is the CPU it spent there, busy polling
    included (a server's threads spin for work before they sleep)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command, which is in parentheses and may hold spaces: state is field 3,
    # utime and stime fields 14 and 15 (proc(5)).
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class MemWatch:
    """Every `interval` s: each process under `pid` (its smaps_rollup and VmHWM, keyed by
    `role(cmdline)`), the sum of their Pss, and MemAvailable; calls `on_floor` once if
    MemAvailable falls below `floor` bytes (the caller stops its run before others' jobs are
    killed). `summary()`: per role, the peaks over its processes."""

    pid: int
    role: Callable[[str], str]
    interval: float = 2.0
    floor: int = 0
    on_floor: Callable[[], None] | None = None
    per_pid: dict[int, dict] = field(default_factory=dict)
    total_pss_peak: int = 0
    available_min: int = 0

    def __post_init__(self) -> None:
        self.available_min = mem_available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, pid: int) -> int:
        st, roll = _status(pid), smaps_rollup(pid)
        if st is None or roll is None:
            return 0
        rec = self.per_pid.setdefault(pid, {"hwm": 0, "samples": 0})
        # Each time: a child seen between its fork and its exec has its parent's command line.
        rec["role"] = self.role(st[0])
        rec["hwm"] = max(rec["hwm"], st[1])
        rec["samples"] += 1
        if roll["Pss"] >= rec.get("Pss", -1):  # the sample at its largest Pss, whole
            rec.update(roll)
        return roll["Pss"]

    def _run(self) -> None:
        fired = False
        while not self._stop.is_set():
            total, todo = 0, [self.pid]
            while todo:
                p = todo.pop()
                total += self._sample(p)
                todo += child_pids(p)
            self.total_pss_peak = max(self.total_pss_peak, total)
            avail = mem_available()
            self.available_min = min(self.available_min, avail)
            if avail < self.floor and not fired and self.on_floor is not None:
                fired = True
                self.on_floor()
            self._stop.wait(self.interval)

    def summary(self) -> dict:
        """Per role (GB): peak VmHWM over its processes, and the largest-Pss sample's Rss, Pss,
        shared and private pages; the processes seen; the total Pss peak and MemAvailable's low."""
        self._stop.set()
        self._thread.join()
        gb = 1e9
        roles: dict[str, dict] = {}
        for rec in self.per_pid.values():
            r = roles.setdefault(rec["role"], {"processes": 0, "peak_rss_gb": 0.0})
            r["processes"] += 1
            r["peak_rss_gb"] = max(r["peak_rss_gb"], round(rec["hwm"] / gb, 3))
            if rec.get("Pss", 0) / gb >= r.get("pss_gb", -1):
                r["pss_gb"] = round(rec["Pss"] / gb, 3)
                r["at_peak_pss_gb"] = {k: round(rec[k] / gb, 3) for k in _ROLLUP}
        return {"roles": dict(sorted(roles.items())),
                "total_pss_peak_gb": round(self.total_pss_peak / gb, 3),
                "mem_available_min_gb": round(self.available_min / gb, 3)}  # fmt: skip


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


def train_records(cfg: dict, nproc: int, work: Path) -> tuple[list[dict], float]:
    """One `rec train` of the config dict on `nproc` ranks (one intra-op thread each) in a
    temporary directory under `work`: its metrics.jsonl records and the wall seconds."""
    import os
    import tempfile

    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        path = Path(tmp) / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run = Path(tmp) / "run"
        rec = str(Path(sys.executable).parent / "rec")
        argv = [rec, "train", "-c", str(path), "--run-dir", str(run), "--nproc", str(nproc)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        wall, _ = run_watched(argv, Path(tmp) / "train.log", env=env)
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return records, wall


def batching_repo(src: Path, model: str, dst: Path, batching: bool, delay_us: int) -> Path:
    """A copy of the model with dynamic batching on (delay_us window) or off."""
    shutil.copytree(src / model, dst / model)
    config = ModelDir.of(dst, model).config
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config.read_text())
    if "max_batch_size: 0" in text:
        # The `none` form: rec-server batches it with rec.json's "serving" settings, and serves
        # it one request per forward without them.
        manifest_path = ModelDir.of(dst, model).manifest
        manifest = json.loads(manifest_path.read_text())
        if batching:
            manifest["serving"]["max_queue_delay_us"] = delay_us
        else:
            manifest.pop("serving", None)
        manifest_path.write_text(json.dumps(manifest, indent=2))
        return dst
    if batching:
        text += f"\ndynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
    config.write_text(text)
    return dst


class Server:
    """rec-server with one executor, one HTTP and one gRPC thread (rec.serve.cpp.launch_cpp)."""

    def __init__(
        self,
        repo: Path,
        model: str,
        intra_op_threads: int,
        busy_poll_us: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        args = ["--model", model, "--executor-threads", "1"]
        args += ["--intra-op-threads", str(intra_op_threads), "--http-threads", "1"]
        args += ["--grpc-threads", "1"]
        if busy_poll_us is not None:
            args += ["--busy-poll-us", str(busy_poll_us)]
        self.process = launch_cpp(repo, *args, *extra)
        self.proc = self.process.proc  # its pid: grpc_floor.py profiles it
        self.http, self.grpc = self.process.endpoints.http, self.process.endpoints.grpc

    def peak_rss_bytes(self) -> int:
        """The server's VmHWM: the kernel's high-water mark of its resident set."""
        return self.process.peak_rss_bytes()

    def stop(self) -> None:
        self.process.stop(timeout=30)


def bench(mode: str, repo: Path, model: str, batch: int, clients: int, seconds: float, *extra):
    argv = [str(BUILD / "rec-bench"), mode, "--model-repository", str(repo), "--model", model]
    argv += ["--batch", str(batch), "--concurrency", str(clients), "--seconds", str(seconds)]
    extra = tuple(str(x) for x in extra)
    argv += extra
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(
        f"  {mode:8s} B={batch:<4d} clients={clients:<3d} p50={result['p50_us']:9.1f}us "
        f"p99={result['p99_us']:9.1f}us {result['rows_per_s']:10.0f} rows/s {' '.join(extra)}"
    )
    return result


def median_run(runs: list[dict]) -> dict:
    """The run with the median p50 (of an odd number of runs)."""
    return sorted(runs, key=lambda r: r["p50_us"])[len(runs) // 2]


def model_configs(tmp: Path, kaggle_scale: float) -> dict[str, Path]:
    """The default model (rec's embedded config) and examples/criteo_kaggle.yaml, its tables
    scaled by `kaggle_scale` (1.0: Criteo Kaggle's 33.8M rows)."""
    from rec.config import default_config

    default = tmp / "default.yaml"
    default.write_text(default_config().to_yaml())
    kaggle = yaml.safe_load((ROOT / "examples" / "criteo_kaggle.yaml").read_text())
    for t in kaggle["tables"]:
        t["rows"] = max(1, int(t["rows"] * kaggle_scale))
    path = tmp / "kaggle.yaml"
    path.write_text(yaml.safe_dump(kaggle, sort_keys=False))
    return {"default": default, "kaggle": path}


def trained_repositories(tmp: Path, kaggle_scale: float) -> dict[str, Path]:
    """Trains the default and the Kaggle-size model briefly and exports each as its config says
    (int8 tables, TorchScript; fp32 dense layers for the default, int8 for Kaggle's) into a
    repository of its own. The run directory goes once exported (8.9 GB at full size)."""
    repos = {}
    for name, config in model_configs(tmp, kaggle_scale).items():
        run_dir, repos[name] = tmp / f"{name}-run", tmp / f"{name}-repo"
        print(f"[{name}] rec train, rec export", flush=True)
        subprocess.run([REC, "train", "-c", str(config), "--run-dir", str(run_dir)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        subprocess.run([REC, "export", str(run_dir), "--repo", str(repos[name])], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(run_dir)
    return repos


def train_export_both(tmp: Path, name: str, config: Path, context: list[str]) -> dict:
    """Trains `config` once (`rec train`, its default ranks) and exports the run plain and with
    features.context = `context` (`rec export -c`): the repositories, wall seconds, each
    rank's and each export's peak RSS. The run directory goes once exported (8.9 GB at the
    Kaggle size)."""
    run_dir = tmp / f"{name}-run"
    print(f"[{name}] rec train", flush=True)
    train_s, train = run_watched([REC, "train", "-c", str(config), "--run-dir", str(run_dir)],
                             tmp / f"{name}-train.log")  # fmt: skip
    override = tmp / f"{name}-context.yaml"
    override.write_text(yaml.safe_dump({"features": {"context": context}}))
    out: dict = {"train_s": round(train_s, 1), "repos": {}, "export_s": {}}
    out["train_peak_rss_gb"] = {r: round(b / 1e9, 3) for r, b in sorted(train.ranks().items())}
    for kind, extra in (("plain", []), ("context", ["-c", str(override)])):
        repo = tmp / f"{name}-{kind}"
        print(f"[{name}] rec export ({kind})", flush=True)
        wall, watch = run_watched([REC, "export", str(run_dir), "--repo", str(repo), *extra],
                                  tmp / f"{name}-export-{kind}.log")  # fmt: skip
        out["repos"][kind], out["export_s"][kind] = repo, round(wall, 1)
        out.setdefault("export_peak_rss_gb", {})[kind] = round(watch.largest() / 1e9, 3)
    shutil.rmtree(run_dir)
    return out


def measure(fns: dict[str, Callable], requests: dict[int, tuple], rounds: int) -> dict:
    """variant -> B -> the median µs of all timed calls, variants taking turns in short blocks.

    This machine's speed swings by ~1.7x for seconds at a time (the same layer took 31 and 53
    ms in consecutive calls). Three rounds of 0.1 s per variant, keeping each one's best, let
    variants land in different spells: that made one look 1.5x slower in some runs and not in
    others. Blocks of ~20 ms (at least 2 timed calls) taking turns for the whole budget give
    every variant the same spells. Each block first makes one untimed call: timed one call
    apart, every call would find the other models' weights in the caches (a run that did so
    timed the default model's B = 1 at 231 µs, the next run in blocks 140). `rounds` scales the
    time spent (0.1 s, 0.6 s at B = 512, per variant per round)."""
    import torch  # here: the other helpers run without it

    out: dict[str, dict[int, float]] = {v: {} for v in fns}
    names = list(fns)
    with torch.inference_mode():
        for b, request in requests.items():
            for fn in fns.values():
                for _ in range(10):  # warm-up (TorchScript profiles its first runs)
                    fn(*request)
            times: dict[str, list[float]] = {v: [] for v in names}
            budget = rounds * (0.1 if b < 512 else 0.6) * len(names)
            start, cycle = time.perf_counter(), 0
            while time.perf_counter() - start < budget or cycle < 5:
                shift = cycle % len(names)
                for v in names[shift:] + names[:shift]:
                    fns[v](*request)  # caches back to this model
                    block, calls = time.perf_counter(), 0
                    while calls < 2 or time.perf_counter() - block < 0.02:
                        t0 = time.perf_counter()
                        fns[v](*request)
                        times[v].append(time.perf_counter() - t0)
                        calls += 1
                cycle += 1
            for v in names:
                out[v][b] = round(statistics.median(times[v]) * 1e6, 1)
    return out
