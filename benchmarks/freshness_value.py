"""The value of freshness: how much better three servers score the next events of a drifting
stream when their model is fresh, with every part real and on one machine.

    .venv/bin/python benchmarks/freshness_value.py                    # default model, ~6 min
    .venv/bin/python benchmarks/freshness_value.py --live-s 900 --dense-every-s 180 --label long
    .venv/bin/python benchmarks/freshness_value.py --throughput       # stream vs file, 10-17 min

Freshness (the default):
1. Our own redis-server (rec.broker). The synthetic generator with drift (data.synthetic
   teacher_drift and popularity_drift `--drift` times, churn `--churn`, per `--horizon`
   events): its first `--warm` events go to the stream and `rec train --stream URL --publish
   URL` trains them, then stops (idle_exit_s) with a checkpoint. `rec export` writes it to three
   repositories.
2. Three rec-servers over copies of that export: frozen (`--updates none`: rec.json names the
   run's log, which a server follows by default), rows (`--updates`: the rows training
   publishes), rows+dense (`--updates` and `rec export --follow` into its repository, which it
   swaps to; checkpoints every `--dense-every-s` s, standing in for "every few minutes" at this
   run's length). `--busy-poll-us 0`: three servers polling would take training's cores.
3. `rec train --resume` goes on training from the stream (publishing). The benchmark is the
   producer: every chunk of events (`--chunk`) is first scored by the three servers (HTTP, one
   request of the whole chunk each, as a production replica scores the request before its
   click arrives), then XADDed to the stream; at most `--rate` events/s for `--live-s` s, held
   back while more than `--max-behind` events wait for training (so that training keeps up
   whatever else the machine runs).
4. Per window of the live events (`--windows`, equal counts): each server's AUC and log loss,
   and training's own progressive validation (scores before each step) for reference.

Throughput (`--throughput`): N synthetic events written to the stream before training, then
`rec train --stream` for S steps, against `rec train` on the same synthetic source for the same
S steps; same batch, same ranks, interleaved pairs; samples/s from metrics.jsonl.

Writes benchmarks/results/freshness_value[_<label>].json and .png (or stream_vs_file.json);
the CPU and the load average are in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
REC = str(ROOT / ".venv" / "bin" / "rec")
RESULTS = ROOT / "benchmarks" / "results"
SERVERS = ("frozen", "rows", "rows+dense")
PER_ENTRY = 64


def log(msg: str) -> None:
    print(f"[freshness_value] {msg}", flush=True)


def machine() -> dict:
    from rec.cpu import cpu_info, describe

    info = cpu_info()
    return {
        "cpu": describe(info),
        "cpu_flags": [f for f in info["flags"] if f.startswith(("avx512f", "amx"))],
        "cores": os.cpu_count(),
    }


def write_config(
    work: Path, base: str | None, data_over: dict, over: dict, table_wise: bool = False
) -> Path:
    """The base config (None: the embedded default) with `over` merged per section; with
    `table_wise` every table whole on one rank."""
    from rec.config import load_config
    from rec.train.sharding import PUBLISHABLE_SHARDING_TYPES

    data = yaml.safe_load(load_config(base).to_yaml())
    data["data"]["synthetic"].update(data_over)
    for section, values in over.items():
        data.setdefault(section, {})
        data[section].update(values)
    # Publishing needs whole rows per rank (as benchmarks/freshness.py does for Kaggle's config).
    for c in (data.get("sharding", {}).get("constraints") or {}).values():
        kept = [s for s in c.get("sharding_types") or [] if s in PUBLISHABLE_SHARDING_TYPES]
        if c.get("sharding_types") and not kept:
            c["sharding_types"] = ["table_wise"]
    # A live stream gives ranks batches of different sizes (a rank reads what has arrived), and
    # the backward of TorchRec's row-wise reduce-scatter all-gathers equal sizes only on gloo:
    # Kaggle's row-wise tables stopped the run at the first uneven step.
    if table_wise:
        data["sharding"] = {**data.get("sharding", {}), "constraints": {
            t["name"]: {"sharding_types": ["table_wise"]} for t in data["tables"]}}  # fmt: skip
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_rec(*args: str, log_path: Path) -> None:
    with open(log_path, "a") as out:
        proc = subprocess.Popen([REC, *args], stdout=out, stderr=subprocess.STDOUT)
        try:
            code = proc.wait()
        finally:  # a stopped benchmark stops its child (whose ranks stop with it)
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    if code:
        sys.exit(f"rec {' '.join(args)} failed ({code}):\n{log_path.read_text()[-3000:]}")


class Producer:
    """Generates the live events, has the three servers score each chunk, then XADDs it."""

    def __init__(self, cfg, url: str, clients: dict, start: int) -> None:
        import redis

        from rec.contract.events import parse_url
        from rec.data.synthetic import SyntheticSource
        from rec.features import feature_spec

        spec = feature_spec(cfg)
        self.columns = (list(spec.labels), [d.column for d in spec.dense],
                        [s.column for s in spec.sparse])  # fmt: skip
        self.src = SyntheticSource(cfg, "train", raw_dense=True)
        where = parse_url(url)
        self.stream, self.redis = where.stream, redis.Redis(host=where.host, port=where.port)
        self.clients, self.pos = clients, start
        self.scores: dict[str, list[np.ndarray]] = {s: [] for s in clients}
        self.versions: dict[str, list[tuple[int, int]]] = {s: [] for s in clients}
        self.labels: list[np.ndarray] = []
        self.times: list[float] = []
        self.held_s = 0.0

    def behind(self) -> int:
        """Events in the stream no rank has read yet (the group's lag, in entries)."""
        for g in self.redis.xinfo_groups(self.stream):
            if g["name"] in (b"rec", "rec"):
                return int(g.get("lag") or 0) * PER_ENTRY
        return 0

    def chunk(self, n: int) -> None:
        from rec.contract.events import encode
        from rec.data.replay import _rows_to_events

        rows = self.src.take(self.pos, self.pos + n).rows
        self.pos += n
        request = {"dense_features": rows.dense.astype(np.float32),
                   "sparse_lengths": rows.lengths.astype(np.int32),
                   "sparse_values": rows.values.astype(np.int64)}  # fmt: skip
        for name, client in self.clients.items():
            scores, version = client(request)
            self.scores[name].append(scores[:, 0])
            self.versions[name].append(version)
        self.labels.append(rows.labels[:, 0].astype(np.float32))
        self.times.append(time.time())
        events = _rows_to_events(rows, *self.columns)
        pipe = self.redis.pipeline(transaction=False)
        for lo in range(0, n, PER_ENTRY):
            pipe.xadd(self.stream, encode(events[lo : lo + PER_ENTRY]))
        pipe.execute()


def http_scorer(endpoint: str, model: str):
    """A function: request -> (scores [B, tasks], (the version that answered, the step of the
    newest rows it applied from the update log: -1 for none))."""
    import tritonclient.http as httpclient

    from rec.contract import DTYPES

    client = httpclient.InferenceServerClient(endpoint, network_timeout=60)

    def score(request: dict) -> tuple[np.ndarray, int]:
        inputs = []
        for name, arr in request.items():
            i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
            i.set_data_from_numpy(arr)
            inputs.append(i)
        result = client.infer(model, inputs)
        response = result.get_response()
        step = response.get("parameters", {}).get("embedding_watermark_step", -1)
        return result.as_numpy("scores"), (int(response["model_version"]), step)

    return score


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.2)


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s while the live part runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.values: list[float] = [os.getloadavg()[0]]
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.wait(5):
            self.values.append(os.getloadavg()[0])


def stream_trained(run: Path) -> int:
    """Events the run's latest committed checkpoint holds (all ranks)."""
    from rec import run_dir

    latest = run_dir.latest_checkpoint(run)
    if latest is None:
        return 0
    return sum(int(e) for e in run_dir.read_meta(latest).get("stream", {}).get("events", [0]))


def windows(prod: Producer, n_windows: int, t_live: float) -> list[dict]:
    """Each server's AUC and log loss per window of the live events (equal counts)."""
    import torch

    from rec import metrics

    labels = np.concatenate(prod.labels)
    times = np.concatenate([np.full(len(x), t) for x, t in zip(prod.labels, prod.times,
                                                                strict=True)])  # fmt: skip
    scores = {s: np.concatenate(v) for s, v in prod.scores.items()}
    out = []
    for idx in np.array_split(np.arange(len(labels)), n_windows):
        y = torch.from_numpy(labels[idx])
        row = {"events": len(idx), "t_s": round(float(times[idx].mean() - t_live), 1)}
        for name, s in scores.items():
            q = metrics.quality(torch.from_numpy(s[idx]), y)
            row[name] = {"auc": round(q[metrics.AUC], 4), "log_loss": round(q[metrics.LOG_LOSS], 4)}
        out.append(row)
    return out


def first_served(prod: Producer, t_live: float) -> dict[str, float]:
    """rows+dense: each dense version -> when it first scored a chunk (s into the live part)."""
    out: dict[str, float] = {}
    for (version, _), t in zip(prod.versions["rows+dense"], prod.times, strict=True):
        out.setdefault(str(version), round(t - t_live, 1))
    return out


def overall(prod: Producer) -> dict:
    import torch

    from rec import metrics

    y = torch.from_numpy(np.concatenate(prod.labels))
    out = {}
    for name, s in prod.scores.items():
        q = metrics.quality(torch.from_numpy(np.concatenate(s)), y)
        out[name] = {"auc": round(q[metrics.AUC], 4), "log_loss": round(q[metrics.LOG_LOSS], 4)}
    return out


def online_records(run: Path, t_live: float) -> list[dict]:
    """Training's progressive validation records of the live part (metrics.jsonl)."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "online" and r["time"] >= t_live and "auc" in r:
            out.append({"t_s": round(r["time"] - t_live, 1), "step": r["step"],
                        "auc": round(r["auc"], 4), "log_loss": round(r["log_loss"], 4),
                        "events_per_s": r["events_per_s"], "lag": r["lag"]})  # fmt: skip
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["windows"]
    t = [r["t_s"] for r in rows]
    for ax, key in zip(axes, ("auc", "log_loss"), strict=True):
        for name in SERVERS:
            ax.plot(t, [r[name][key] for r in rows], marker="o", label=f"served: {name}")
        online = result["training_online"]
        if online:
            ax.plot([r["t_s"] for r in online], [r[key] for r in online], color="grey",
                    alpha=0.5, lw=1, label="training's progressive validation")  # fmt: skip
        for version, t_s in result["dense_version_first_served_s"].items():
            if version != "1":
                ax.axvline(t_s, color="tab:green", ls=":", lw=1)
        ax.set_xlabel("seconds into the live stream (dotted: a new dense version served)")
        ax.set_ylabel(f"served {key.replace('_', ' ')} (window)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['label'] or 'default model'}: {result['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def link_copy(src: Path, dst: Path) -> None:
    """A copy of repository `src` whose files over 1 MB (tables.bin, model files) are hard links:
    AOTInductor's tables.bin is mapped private, so servers over links of one file share its
    pages in the page cache and each holds only the pages its update log wrote. The small files
    are copied, so that `export --follow` rewriting one in place leaves the other repositories."""

    def copy(a: str, b: str) -> None:
        if os.path.getsize(a) > 1 << 20:
            os.link(a, b)
        else:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=copy)


def role(cmdline: str) -> str:
    """The part of the run a process plays, from its command line (for the memory table)."""
    if "rec-server" in cmdline:
        return "rec-server " + next((n for i, n in enumerate(SERVERS) if f"repo_{i}" in cmdline),
                                    "?")  # fmt: skip
    if cmdline.startswith("RANK="):
        return f"training rank {cmdline.split()[0][5:]}"
    for part, name in (("--follow", "export --follow"), ("forkserver", "export --follow's exports"),
                       ("redis-", "redis-server (and its AOF rewrite)"),
                       (" export ", "rec export (warm-up)"), (" train ", "rec train (launcher)"),
                       ("stream replay", "rec stream replay"),
                       ("freshness_value", "benchmark (producer, scoring client)"),
                       ("python3 -", "Python helpers (compile workers and the like)")):  # fmt: skip
        if part in cmdline:
            return name
    if os.path.basename(cmdline.split(" ")[0]) in ("g++", "cc1plus", "as", "ld", "collect2"):
        return "AOTInductor's compiler (g++, cc1plus, as, ld)"
    return "other: " + cmdline[:60]


def start_servers(repos: dict, url: str) -> dict:
    from rec.serve.cpp import launch_cpp

    # busy-poll 0: three idle-spinning servers would take the cores training needs.
    common = ("--busy-poll-us", "0")
    # rec.json names the run's update log, which a server follows unless told "none".
    extra = {"frozen": ("--updates", "none"), "rows": ("--updates", url),
             "rows+dense": ("--updates", url, "--poll-repository-s", "2")}  # fmt: skip
    return {name: launch_cpp(repos[name], *common, *extra[name]) for name in SERVERS}


def live(args, prod: Producer, train: subprocess.Popen) -> float:
    """Chunks for args.live_s seconds, at most args.rate events/s and held back while more than
    args.max_behind events wait for training; progress every ~10 s. Returns the start time."""
    t0 = time.time()
    shown, sent, due = t0, 0, t0
    while time.time() - t0 < args.live_s:
        while prod.behind() > args.max_behind and time.time() - t0 < args.live_s:
            prod.held_s += 0.05
            time.sleep(0.05)
        due = max(due, time.time() - 1.0)  # no burst after a hold
        if due > time.time():
            time.sleep(due - time.time())
        prod.chunk(args.chunk)
        sent += args.chunk
        due += args.chunk / args.rate
        if train.poll() is not None:
            sys.exit(f"rec train exited with {train.returncode} during the live part")
        if time.time() - shown >= 10:
            shown = time.time()
            versions = {n: "v{}, rows of step {}".format(*v[-1]) for n, v in prod.versions.items()}
            log(f"live {shown - t0:5.0f} s: {sent:,} events scored and sent "
                f"({sent / (shown - t0):,.0f}/s; held back {prod.held_s:.0f} s for training); "
                f"{versions}; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    return t0


def freshness(args) -> None:
    from rec.benchmarking import MemWatch, mem_available
    from rec.broker import RedisBroker
    from rec.config import load_config

    avail = mem_available() / 1e9
    if avail < args.min_available_gb:
        sys.exit(f"only {avail:.1f} GB available, below --min-available-gb {args.min_available_gb}")
    work = Path(tempfile.mkdtemp(prefix="rec-fresh-value-"))

    def out_of_memory() -> None:
        log(f"MemAvailable below {args.mem_floor_gb} GB: stopping the run")
        os.kill(os.getpid(), signal.SIGTERM)

    mem = MemWatch(os.getpid(), role, floor=int(args.mem_floor_gb * 1e9), on_floor=out_of_memory)
    broker = RedisBroker(work / "redis")
    events_url, updates_url = broker.url("rec:events"), broker.url("rec:updates")
    # Drift is per data.synthetic.train_samples positions: scaled so that it is args.drift per
    # args.horizon events whatever the run's length.
    total = max(args.horizon, args.warm + int(args.rate * args.live_s * 1.2))
    scale = total / args.horizon
    drift = {"train_samples": total, "teacher_drift": args.drift * scale,
             "popularity_drift": args.drift * scale, "churn": args.churn * scale}  # fmt: skip
    config = write_config(work, args.config, drift, {
        # The profiler off: its 10 steps hold up to 1.4 GiB more per rank at Kaggle size. The
        # default pipeline: with `base` (Kaggle's config) stream training spins without stepping
        # after its first segment ends (TrainPipelineBase's stopped iterator stays stopped).
        "training": {"steps": 0, "eval_every": 0, "lr_schedule": "constant", "profile_steps": 0,
                     "pipeline": "sparse_dist"},
        "checkpoint": {"every_steps": 0, "every_seconds": 0.0, "keep_last": args.keep_last},
        "publish": {"url": updates_url},
        "export": {"eval_batches": 2, **({"format": args.format} if args.format else {})},
        "data": {"stream": {"url": events_url, "idle_exit_s": args.idle_exit_s}},
    }, table_wise=True)  # fmt: skip
    cfg = load_config(str(config))
    from rec.contract.formats import FORMATS, resolve

    model = FORMATS[resolve(cfg.export.format)[0]].model_dir_name(cfg.export.model_name)
    load_before = os.getloadavg()
    log(f"work in {work}; {machine()['cpu']}; load {load_before[0]:.1f}; {avail:.1f} GB "
        f"available; serving {model}")  # fmt: skip
    run, train_log = work / "run", work / "train.log"
    servers: dict = {}
    procs: list[subprocess.Popen] = []
    try:
        log(f"warm-up: {args.warm:,} events to the stream, then rec train --stream until idle")
        run_rec("stream", "replay", "--synthetic", str(args.warm), "--to", events_url, "-c",
                str(config), log_path=work / "replay.log")  # fmt: skip
        t = time.time()
        run_rec("train", "-c", str(config), "--run-dir", str(run), "--nproc", str(args.nproc),
                log_path=train_log)  # fmt: skip
        log(f"warm-up trained {stream_trained(run):,} events in {time.time() - t:.0f} s; export")
        repos = {name: work / f"repo_{i}" for i, name in enumerate(SERVERS)}
        run_rec("export", str(run), "--repo", str(repos["frozen"]), log_path=work / "export.log")
        for name in SERVERS[1:]:
            link_copy(repos["frozen"], repos[name])
        servers = start_servers(repos, updates_url)
        clients = {name: http_scorer(s.endpoints.http, model) for name, s in servers.items()}
        saved = yaml.safe_load((run / "config.yaml").read_text())
        saved["checkpoint"]["every_seconds"] = float(args.dense_every_s)
        # The live part's end stops it; longer than any one step (a step's time counts as idle).
        saved["data"]["stream"]["idle_exit_s"] = max(15.0, 2 * args.idle_exit_s)
        (run / "config.yaml").write_text(yaml.safe_dump(saved))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(train_log, "a") as out:
            procs.append(subprocess.Popen([REC, "train", "--resume", str(run), "--nproc",
                                           str(args.nproc)], stdout=out,
                                          stderr=subprocess.STDOUT, env=env))  # fmt: skip
        with open(work / "follow.log", "w") as out:
            procs.append(subprocess.Popen([REC, "export", "--follow", str(run), "--repo",
                                           str(repos["rows+dense"]), "--keep", str(args.keep)],
                                          stdout=out,
                                          stderr=subprocess.STDOUT, env=env))  # fmt: skip
        prod = Producer(cfg, events_url, clients, args.warm)
        # The live part starts once the resumed run reads the stream (its start-up is not live).
        wait_for(lambda: train_log.read_text().count("training from ") >= 2 or
                 procs[0].poll() is not None, 900, "rec train --resume to start")  # fmt: skip
        log(f"live: {args.rate:,} events/s for {args.live_s} s in chunks of {args.chunk}, each "
            f"scored by {', '.join(SERVERS)} before it is sent; dense versions every "
            f"{args.dense_every_s} s")  # fmt: skip
        loads = LoadSampler()
        t_live = live(args, prod, procs[0])
        t_end = time.time()
        loads.stop.set()
        log("live part done; waiting for training to go idle and stop")
        procs[0].wait(timeout=300)
        procs[1].send_signal(signal.SIGTERM)
        procs[1].wait(timeout=300)
        result = {
            "benchmark": "freshness_value", "label": args.label,
            "config": args.config or "embedded default", **machine(),
            "date": time.strftime("%Y-%m-%d"),
            "command": "benchmarks/freshness_value.py " + " ".join(sys.argv[1:]),
            "export_format": cfg.export.format, "checkpoint_keep_last": args.keep_last,
            "follow_keep": args.keep, "mem_available_before_gb": round(avail, 2),
            "nproc": args.nproc, "warm_events": args.warm, "live_s": args.live_s,
            "rate": args.rate, "chunk": args.chunk, "max_behind": args.max_behind,
            "held_back_s": round(prod.held_s, 1), "dense_every_s": args.dense_every_s,
            "synthetic": drift,
            "live_events": int(sum(len(x) for x in prod.labels)),
            "live_events_per_s": round(sum(len(x) for x in prod.labels) / (t_end - t_live), 1),
            "load_average_1m": {"before": round(load_before[0], 2),
                                "during_mean": round(float(np.mean(loads.values)), 2),
                                "during_max": round(float(np.max(loads.values)), 2)},
            "dense_versions_served": sorted({v for v, _ in prod.versions["rows+dense"]}),
            "dense_version_first_served_s": first_served(prod, t_live),
            "overall": overall(prod),
            "windows": windows(prod, args.windows, t_live),
            "training_online": online_records(run, t_live),
            "follow_lines": (work / "follow.log").read_text().splitlines()[-20:],
        }  # fmt: skip
    finally:
        memory = mem.summary()
        log(f"memory: {json.dumps(memory)}")
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s in servers.values():
            s.stop()
        broker.stop()
    result["memory"] = memory
    finish(result, args, work)


def finish(result: dict, args, work: Path) -> None:
    o = result["overall"]
    result["margin_over_frozen"] = {
        name: {"auc": round(o[name]["auc"] - o["frozen"]["auc"], 4),
               "log_loss": round(o[name]["log_loss"] - o["frozen"]["log_loss"], 4)}
        for name in SERVERS[1:]}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "freshness_value" + (f"_{args.label}" if args.label else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / f"{stem}.png")
    for w in result["windows"]:
        log(f"t {w['t_s']:6.1f} s: " + "  ".join(
            f"{n} auc {w[n]['auc']:.4f} ll {w[n]['log_loss']:.4f}" for n in SERVERS))  # fmt: skip
    log(f"overall {json.dumps(o)}; margin over frozen {json.dumps(result['margin_over_frozen'])}")
    log(f"wrote {RESULTS / stem}.json and .png")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)


def rate_of(run: Path) -> dict:
    """samples/s of a run from metrics.jsonl's train records: the median window (the first two
    left out: start-up) and the steady rate, samples over the time from the 2nd record on."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r.get("kind") == "train"]
    steady = train[2:]
    per_window = [r["samples_per_s"] for r in steady]
    return {"median_window": round(float(np.median(per_window)), 1), "windows": len(per_window)}


def reader_costs(cfg, url: str, events: int, batch: int) -> dict:
    """Microseconds per event, one process: the reader's XREADGROUP replies alone (redis-py),
    decoding them (rec.data.stream.decode_entry), the whole reader (next_batch, with and
    without its read-ahead thread), against the
    file path's synthetic generator (SyntheticSource.take) for the same events."""
    import redis

    from rec.contract.events import parse_url
    from rec.data.stream import decode_entry, open_reader
    from rec.data.synthetic import SyntheticSource
    from rec.features import feature_spec

    spec, where = feature_spec(cfg), parse_url(url)
    client = redis.Redis(host=where.host, port=where.port)
    t = time.perf_counter()
    raw = client.xrange(where.stream)
    t_read = time.perf_counter() - t
    t = time.perf_counter()
    for _, fields in raw:
        decode_entry(fields, spec)
    t_decode = time.perf_counter() - t
    from rec.data.stream_redis import RedisEventReader

    def read_all(reader) -> float:
        t, n = time.perf_counter(), 0
        while n < events:
            got = len(reader.next_batch(batch, 0.5).batch)
            if not got:
                break
            n += got
        reader.close()
        return time.perf_counter() - t

    t_reader = read_all(open_reader(cfg.data.stream.__class__(url=url, group="costs"), spec, 0))
    # The same reader without its read-ahead thread: reading inside next_batch, as before it.
    sync = cfg.data.stream.__class__(url=url, group="costs-sync")
    t_sync = read_all(RedisEventReader(sync, spec, 0, read_ahead=0))
    src = SyntheticSource(cfg, "train")
    t = time.perf_counter()
    for lo in range(0, events, batch):
        src.take(lo, min(lo + batch, events)).rows.to_batch()
    t_synth = time.perf_counter() - t
    us = 1e6 / events
    return {"events": events, "xrange_us": round(t_read * us, 2),
            "decode_us": round(t_decode * us, 2), "reader_next_batch_us": round(t_reader * us, 2),
            "reader_no_read_ahead_us": round(t_sync * us, 2),
            "synthetic_take_us": round(t_synth * us, 2)}  # fmt: skip


def throughput(args) -> None:
    from rec.broker import RedisBroker

    work = Path(tempfile.mkdtemp(prefix="rec-stream-vs-file-"))
    broker = RedisBroker(work / "redis")
    pairs = []
    try:
        for i in range(args.pairs):
            config = write_config(work, args.config, {"train_samples": args.events}, {
                "training": {"steps": args.steps, "eval_every": 0, "lr_schedule": "constant",
                             "log_every": max(args.steps // 10, 1)},
                "checkpoint": {"every_steps": 0},
                "data": {"stream": {"idle_exit_s": 10.0}}})  # fmt: skip
            pair = {}
            for kind in ("file", "stream") if i % 2 == 0 else ("stream", "file"):
                run = work / f"{kind}_{i}"
                argv = ["train", "-c", str(config), "--run-dir", str(run), "--nproc",
                        str(args.nproc)]  # fmt: skip
                if kind == "stream":
                    url = broker.url(f"events{i}")
                    t = time.time()
                    run_rec("stream", "replay", "--synthetic", str(args.events), "--to", url,
                            "-c", str(config), log_path=work / "replay.log")  # fmt: skip
                    log(f"pair {i + 1}: {args.events:,} events in the stream in "
                        f"{time.time() - t:.0f} s")  # fmt: skip
                    argv += ["--stream", url]
                load = os.getloadavg()[0]
                t = time.time()
                run_rec(*argv, log_path=work / f"{kind}_{i}.log")
                pair[kind] = {**rate_of(run), "wall_s": round(time.time() - t, 1),
                              "load_1m_before": round(load, 2)}  # fmt: skip
                log(f"pair {i + 1} {kind}: {pair[kind]}")
            pair["stream_over_file"] = round(
                pair["stream"]["median_window"] / pair["file"]["median_window"], 3
            )
            pairs.append(pair)
        from rec.config import load_config

        costs = reader_costs(load_config(str(config)), broker.url("events0"), args.events,
                             load_config(str(config)).training.batch_size)  # fmt: skip
        log(f"per event, one process: {costs}")
    finally:
        broker.stop()
    ratios = [p["stream_over_file"] for p in pairs]
    result = {
        "benchmark": "stream_vs_file", "config": args.config or "embedded default", **machine(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "benchmarks/freshness_value.py " + " ".join(sys.argv[1:]),
        "nproc": args.nproc, "steps": args.steps, "events": args.events, "pairs": pairs,
        "stream_over_file_median": round(float(np.median(ratios)), 3),
        "per_event_costs": costs,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("stream_vs_file" + (f"_{args.label}" if args.label else "") + ".json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    log(f"stream / file samples/s per pair {ratios}, median {result['stream_over_file_median']}")
    log(f"wrote {path}")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="base config (default: the embedded one)")
    p.add_argument("--label", default="")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warm", type=int, default=60_000, help="events trained before the export")
    p.add_argument("--live-s", type=float, default=180.0)
    p.add_argument("--rate", type=int, default=1500, help="live events per second, at most")
    p.add_argument("--chunk", type=int, default=256, help="events scored per request")
    p.add_argument(
        "--max-behind",
        type=int,
        default=2048,
        help="hold the producer while more events than this wait for training",
    )
    p.add_argument("--dense-every-s", type=float, default=45.0,
                   help="checkpoint.every_seconds: a dense version for rows+dense")  # fmt: skip
    p.add_argument(
        "--drift",
        type=float,
        default=2.0,
        help="teacher_drift and popularity_drift: turns per --horizon events",
    )
    p.add_argument("--churn", type=float, default=1.0, help="share of ids replaced per horizon")
    p.add_argument("--horizon", type=int, default=400_000, help="events --drift and --churn span")
    p.add_argument("--windows", type=int, default=9)
    p.add_argument("--format", default="", help="export.format (default: the config's)")
    p.add_argument("--idle-exit-s", type=float, default=4.0,
                   help="the warm-up stops after this long without an event")  # fmt: skip
    p.add_argument("--keep-last", type=int, default=3, help="checkpoint.keep_last")
    p.add_argument("--keep", type=int, default=3, help="export --follow's --keep")
    p.add_argument("--min-available-gb", type=float, default=0.0,
                   help="refuse to start with less memory available than this")  # fmt: skip
    p.add_argument("--mem-floor-gb", type=float, default=1.0,
                   help="stop the run if MemAvailable falls below this (others' jobs)")  # fmt: skip
    p.add_argument("--throughput", action="store_true", help="stream vs file samples/s instead")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="--throughput: steps per run")
    p.add_argument(
        "--events",
        type=int,
        default=0,
        help="--throughput: events (default: exactly the steps' samples)",
    )
    p.add_argument("--keep-work", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the servers, training and redis-server are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    if args.throughput:
        if not args.events:
            from rec.config import load_config

            args.events = args.steps * args.nproc * load_config(args.config).training.batch_size
        throughput(args)
    else:
        freshness(args)


if __name__ == "__main__":
    main()
