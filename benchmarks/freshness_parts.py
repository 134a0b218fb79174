"""The pieces the freshness benchmarks share (freshness.py, freshness_defaults.py,
publish_cost.py): where results go, the `rec` CLI runner, percentiles and the serving client.
A module of its own so that the scripts import it, not one another."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REC = str(ROOT / ".venv" / "bin" / "rec")
RESULTS = ROOT / "benchmarks" / "results"


def log(msg: str) -> None:
    print(f"[freshness] {msg}", flush=True)


def rec(*args: str, timeout: float = 7200) -> str:
    proc = subprocess.run([REC, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"rec {' '.join(args)} failed:\n{proc.stdout[-3000:]}")
    return proc.stdout


def percentiles(values) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"n": 0}
    p50, p99 = (round(float(np.percentile(a, q)), 4) for q in (50, 99))
    return {"n": int(a.size), "p50": p50, "p99": p99, "max": round(float(a.max()), 4)}


class Client(threading.Thread):
    """B = 1 requests back to back; (time, watermark gen, step, latency) per response."""

    def __init__(self, http: str, request: dict) -> None:  # noqa: D107
        super().__init__(daemon=True)
        self.http, self.request = http, request
        self.samples: list[tuple[float, int, int, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import tritonclient.http as httpclient

        from rec.contract import DTYPES

        with httpclient.InferenceServerClient(self.http) as c:
            inputs = []
            for name, arr in self.request.items():
                i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
                i.set_data_from_numpy(arr)
                inputs.append(i)
            while not self.stop.is_set():
                t0 = time.perf_counter()
                result = c.infer("rec", inputs)
                t1 = time.perf_counter()
                p = result.get_response().get("parameters", {})
                self.samples.append((time.time(), p.get("embedding_watermark_gen", -1),
                                     p.get("embedding_watermark_step", -1), t1 - t0))  # fmt: skip

    def window(self, start: float, end: float) -> list[float]:
        return [lat for t, _, _, lat in self.samples if start <= t < end]
