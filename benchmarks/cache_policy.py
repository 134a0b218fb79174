"""Which eviction policy for the row cache in front of the embedding store: the hit rates of
LRU, FIFO, CLOCK and LFU over the same id traces, for the default model and Criteo Kaggle's
cardinalities in one run.

    .venv/bin/python benchmarks/cache_policy.py            # about 5 min on 2 cores

A trace is what rec-server's cache sees: requests of B = 512 samples, one id per sparse feature
per sample (store_bench's requests), deduplicated per batch, every table in the store. Ids are
Zipf-like over each table's rows (alpha 1.05 and 1.2). Two kinds of trace:
- stationary: the same popularity throughout;
- drifting: every quarter of the trace, each table's hot rows move to other ids. Training keeps
  changing which rows matter, and fresh rows (the update log) enter the cache as they are
  published.

The cache holds a fraction (10 % and 30 %) of the distinct rows the trace touches, so every
policy must evict. A byte-bounded cache as large as rec-server's default (256 MiB, about a
million Kaggle rows) would not fill in a trace this short (it is pure Python), and every policy
would score the same. The first half of each trace warms the cache; the hit rate is counted over
the second.

LFU is the policy Redis calls approximated LFU: evict the least-counted of 5 sampled entries.
Its counts are never aged, so they stand for a frequency-only policy. CLOCK is second chance.

Writes benchmarks/results/cache_policy.json and a table on stdout; the CPU is in the file.
"""

from __future__ import annotations

import json
import random
import time
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np

from rec.store.reader import FrequencySketch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BATCH, REQUESTS = 512, 400
FRACTIONS = (0.1, 0.3)


class LRU:
    def __init__(self, capacity: int) -> None:
        self.cap, self.d = capacity, OrderedDict()

    def access(self, key: int) -> bool:
        if key in self.d:
            self.d.move_to_end(key)
            return True
        self.d[key] = None
        if len(self.d) > self.cap:
            self.d.popitem(last=False)
        return False


class FIFO:
    def __init__(self, capacity: int) -> None:
        self.cap, self.s, self.q = capacity, set(), deque()

    def access(self, key: int) -> bool:
        if key in self.s:
            return True
        self.s.add(key)
        self.q.append(key)
        if len(self.q) > self.cap:
            self.s.discard(self.q.popleft())
        return False


class Clock:
    def __init__(self, capacity: int) -> None:
        self.cap, self.ref, self.q = capacity, {}, deque()

    def access(self, key: int) -> bool:
        if key in self.ref:
            self.ref[key] = True
            return True
        while len(self.q) >= self.cap:
            old = self.q.popleft()
            if self.ref[old]:
                self.ref[old] = False
                self.q.append(old)
            else:
                del self.ref[old]
        self.ref[key] = False
        self.q.append(key)
        return False


class SampledLFU:
    def __init__(self, capacity: int, samples: int = 5) -> None:
        self.cap, self.samples = capacity, samples
        self.count: dict[int, int] = {}
        self.keys: list[int] = []
        self.where: dict[int, int] = {}
        self.rng = random.Random(0)

    def access(self, key: int) -> bool:
        if key in self.count:
            self.count[key] += 1
            return True
        if len(self.keys) >= self.cap:
            picks = [self.rng.randrange(len(self.keys)) for _ in range(self.samples)]
            victim_at = min(picks, key=lambda i: self.count[self.keys[i]])
            victim = self.keys[victim_at]
            last = self.keys.pop()
            if victim_at < len(self.keys):
                self.keys[victim_at] = last
                self.where[last] = victim_at
            del self.count[victim], self.where[victim]
        self.count[key] = 1
        self.where[key] = len(self.keys)
        self.keys.append(key)
        return False


class TinyLFU:
    """W-TinyLFU (Einziger, Friedman, Manes 2017; Caffeine's policy): a 1 % LRU window in front
    of a segmented LRU (20 % probation, 80 % protected). A key leaving the window enters the
    main cache only if the sketch counts it more often than the main cache's victim."""

    def __init__(self, capacity: int) -> None:
        self.window_cap = max(1, capacity // 100)
        self.main_cap = max(1, capacity - self.window_cap)
        self.protected_cap = max(1, int(self.main_cap * 0.8))
        self.window: OrderedDict = OrderedDict()
        self.probation: OrderedDict = OrderedDict()
        self.protected: OrderedDict = OrderedDict()
        self.sketch = FrequencySketch(capacity)

    def access(self, key: int) -> bool:
        self.sketch.add(key)
        if key in self.window:
            self.window.move_to_end(key)
            return True
        if key in self.protected:
            self.protected.move_to_end(key)
            return True
        if key in self.probation:
            del self.probation[key]
            self.protected[key] = None
            if len(self.protected) > self.protected_cap:
                demoted, _ = self.protected.popitem(last=False)
                self.probation[demoted] = None
            return True
        self.window[key] = None
        if len(self.window) > self.window_cap:
            candidate, _ = self.window.popitem(last=False)
            if len(self.probation) + len(self.protected) < self.main_cap:
                self.probation[candidate] = None
            else:
                victims = self.probation or self.protected
                victim = next(iter(victims))
                if self.sketch.count(candidate) > self.sketch.count(victim):
                    del victims[victim]
                    self.probation[candidate] = None
        return False


class ClockAdmit(Clock):
    """CLOCK with TinyLFU's admission and no window: a missed key replaces CLOCK's victim only
    if the sketch counts it more often. A hit still only sets a bit (a shared lock in
    rec-server); the sketch's counters would be relaxed atomics."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.sketch = FrequencySketch(capacity)

    def access(self, key: int) -> bool:
        self.sketch.add(key)
        if key in self.ref:
            self.ref[key] = True
            return True
        if len(self.q) < self.cap:
            self.ref[key] = False
            self.q.append(key)
            return False
        while self.ref[self.q[0]]:  # the hand: second chances
            old = self.q.popleft()
            self.ref[old] = False
            self.q.append(old)
        victim = self.q[0]
        if self.sketch.count(key) > self.sketch.count(victim):
            self.q.popleft()
            del self.ref[victim]
            self.ref[key] = False
            self.q.append(key)
        return False


POLICIES = {"lru": LRU, "fifo": FIFO, "clock": Clock, "lfu": SampledLFU, "tinylfu": TinyLFU,
            "clock_admit": ClockAdmit}  # fmt: skip


def tables(config: Path | None) -> list[tuple[int, int]]:
    """(rows, stored row bytes) of every table, int8 (rec export --quantize int8)."""
    from rec.config import load_config
    from rec.contract.store import row_bytes

    cfg = load_config(config) if config else load_config(None)
    return [(t.rows, row_bytes(t.dim, "int8")) for t in cfg.tables]


def trace(shape: list[tuple[int, int]], alpha: float, drift: bool, seed: int) -> list[np.ndarray]:
    """Per request, its distinct keys (table << 40 | row) in first-seen order."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(shape), dtype=np.int64)
    out = []
    for r in range(REQUESTS):
        if drift and r and r % (REQUESTS // 4) == 0:
            offsets = rng.integers(0, [n for n, _ in shape])  # every table's hot set moves
        keys = np.empty((BATCH, len(shape)), dtype=np.int64)
        for t, (n, _) in enumerate(shape):
            ranks = (rng.zipf(alpha, size=BATCH) - 1) % n
            keys[:, t] = (t << 40) | ((ranks + offsets[t]) % n)
        flat = keys.ravel()
        _, first = np.unique(flat, return_index=True)
        out.append(flat[np.sort(first)])
    return out


def hit_rate(policy, requests: list[np.ndarray]) -> float:
    hits = total = 0
    for i, keys in enumerate(requests):
        counted = i >= len(requests) // 2
        for k in keys.tolist():
            hit = policy.access(k)
            if counted:
                hits += hit
                total += 1
    return hits / total


def main() -> None:
    from rec.cpu import cpu_info, describe

    models = {"default": tables(None), "kaggle": tables(ROOT / "examples" / "criteo_kaggle.yaml")}
    results: dict = {"cpu": describe(cpu_info()), "batch": BATCH, "requests": REQUESTS,
                     "fractions": list(FRACTIONS), "models": {}}  # fmt: skip
    print(f"[cache] {results['cpu']}", flush=True)
    for name, shape in models.items():
        model = results["models"][name] = {}
        for alpha in (1.05, 1.2):
            for drift in (False, True):
                label = f"zipf{alpha} {'drifting' if drift else 'stationary'}"
                requests = trace(shape, alpha, drift, seed=int(alpha * 100) + drift)
                distinct = len(np.unique(np.concatenate(requests)))
                for fraction in FRACTIONS:
                    t0 = time.time()
                    capacity = max(1, int(fraction * distinct))
                    rates = {p: hit_rate(cls(capacity), requests) for p, cls in POLICIES.items()}
                    model[f"{label} cache {fraction:.0%}"] = {"entries": capacity, **rates}
                    shown = "  ".join(f"{p} {r:.3f}" for p, r in rates.items())
                    print(f"[cache] {name:7s} {label:22s} {fraction:4.0%} of {distinct:>9,} rows: "
                          f"{shown}  ({time.time() - t0:.0f} s)", flush=True)  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cache_policy.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"[cache] wrote {RESULTS / 'cache_policy.json'}")


if __name__ == "__main__":
    main()
