"""Where a training step's time goes, and how many bytes its collectives send: one window of
steps under torch.profiler, on every rank.

Phases come from the record_function ranges TorchRec's train pipelines put around each part of
a step (`## forward N ##`, `## backward N ##`, `## optimizer N ##`, `## next_batch ##`, ...).
Communication is the wall time during which a collective was running: the union of the
`gloo:*` / `nccl:*` events, which the process group records on its own thread for the time the
collective takes, waiting for peers included. It overlaps the main thread's phases (a rank
blocked in forward's all-to-all is in both), so each phase here is its own time minus the
overlap with communication: data + forward + backward + optimizer + communication + other is
the step, exactly.

Bytes are each rank's send buffers per step, from the collectives' recorded tensor shapes and
dtypes: an all-to-all's input (the slice a rank keeps for itself included), a reduce-scatter's
input, an all-gather's input, an all-reduce's tensors (DDP's dense gradient buckets). An
all-to-all of integers moves ids (with their lengths and split sizes: `ids_all_to_all`), one of
floats moves pooled embeddings or their gradients (`all_to_all`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from torch.profiler import ProfilerActivity, profile

from rec import malloc

# While the window records, tensors from 1 MiB up are mapped and unmapped on their own. The
# profiler's many small records, made between a step's allocations, otherwise split the large
# blocks glibc's heap keeps for reuse, so every step takes fresh heap: on the Kaggle-size model
# 1.0-1.4 GiB more per rank over 10 steps, never returned (benchmarks/README.md, plan accuracy).
# After the window the threshold is glibc's largest, which its own adjustment reaches anyway
# once a run has freed blocks that large.
WINDOW_MMAP_THRESHOLD = 1 << 20

PHASES = ("data", "forward", "backward", "optimizer", "communication", "other")
COLLECTIVES = ("ids_all_to_all", "all_to_all", "reduce_scatter", "all_gather", "all_reduce")

# TorchRec's pipeline range names (their first word) -> phase; the sparse data dist is the
# input all-to-all, counted as communication through its gloo events like every other.
_RANGES = {
    "next_batch": "data",
    "load_batch": "data",
    "wait_for_batch": "data",
    "copy_batch_to_gpu": "data",
    "inplace_copy_batch_to_gpu": "data",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "zero_grad": "optimizer",
}
# c10d ops -> (collective, index of the send buffer among the op's inputs).
_OPS = {
    "c10d::alltoall_base_": ("all_to_all", 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d::_allgather_base_": ("all_gather", 1),
}
_FLOATS = ("float", "double", "c10::Half", "c10::BFloat16")
_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
}  # fmt: skip


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(span: tuple[float, float], merged: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(span[1], e) - max(span[0], s)) for s, e in merged)


def _input_bytes(event, i: int) -> int:
    """Bytes of an op's i-th input, from the shapes and dtypes record_shapes recorded."""
    shapes, dtypes = event.input_shapes or [], getattr(event, "input_dtypes", None) or []
    if i >= len(shapes) or not shapes[i] or i >= len(dtypes):
        return 0
    n = 1
    for d in shapes[i]:
        n *= int(d)
    return n * _DTYPE_BYTES.get(dtypes[i], 4)


def _is_float(event, i: int) -> bool:
    dtypes = getattr(event, "input_dtypes", None) or []
    return i < len(dtypes) and dtypes[i] in _FLOATS


def summarize(events, window: tuple[float, float], steps: int) -> dict[str, Any]:
    """Per step: milliseconds in each of PHASES and send bytes per collective, from the
    profiler's events (times in µs) over the `window` [start, end) of `steps` steps."""
    comm, spans = [], {p: [] for p in PHASES}
    sent = dict.fromkeys(COLLECTIVES, 0)
    reduced, gloo = 0, False
    for e in events:
        name, span = e.name, (e.time_range.start, e.time_range.end)
        if name.startswith(("gloo:", "nccl:")):
            comm.append(span)
            gloo = gloo or name.startswith("gloo:")
            if name.endswith(":all_reduce"):
                reduced += _input_bytes(e, 0)
        elif name.startswith("## ") and name.split()[1] in _RANGES:
            spans[_RANGES[name.split()[1]]].append(span)
        elif name in _OPS:
            kind, i = _OPS[name]
            if kind == "all_to_all" and not _is_float(e, i):
                kind = "ids_all_to_all"
            sent[kind] += _input_bytes(e, i)
    # c10d's allreduce_ takes a tensor list, whose shapes the profiler does not record; the
    # process group's own all_reduce events have them. gloo runs a reduce-scatter as an
    # all-reduce of its whole input, so those are taken out again.
    sent["all_reduce"] = max(0, reduced - (sent["reduce_scatter"] if gloo else 0))
    merged_comm = _union([(max(s, window[0]), min(e, window[1])) for s, e in comm if e > s])
    ms: dict[str, float] = {}
    for phase in ("data", "forward", "backward", "optimizer"):
        own = _union(spans[phase])
        ms[phase] = sum(e - s for s, e in own) - sum(_overlap(x, merged_comm) for x in own)
    ms["communication"] = sum(e - s for s, e in merged_comm)
    total = window[1] - window[0]
    ms["other"] = max(0.0, total - sum(ms.values()))
    per_step = {f"{p}_ms": round(ms[p] / 1000 / steps, 3) for p in PHASES}
    per_step["step_ms"] = round(total / 1000 / steps, 3)
    per_step.update({f"{k}_bytes": sent[k] // steps for k in COLLECTIVES})
    return per_step


class StepProfiler:
    """Profiles steps [start, start + steps) of the run: `before(step)` and `after(step)` go
    around each step; `result` is summarize()'s dict once the window has closed (or None).
    Each call returns the seconds it spent starting or reading the profiler, which the
    progress lines leave out of samples/s."""

    def __init__(self, start: int, steps: int) -> None:
        self.start, self.steps = start, steps
        self.result: dict[str, Any] | None = None
        self._prof: profile | None = None
        self._done = 0

    def before(self, step: int) -> float:
        if not self.steps or self.result is not None or self._prof is not None:
            return 0.0
        if step < self.start:
            return 0.0
        t0 = time.perf_counter()
        malloc.set_mmap_threshold(WINDOW_MMAP_THRESHOLD)
        self._prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        with _without_usdt_lines():
            self._prof.__enter__()
        return time.perf_counter() - t0

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def closes_after(self) -> bool:
        """Whether the next after() ends the window. Reading the profiler then pauses training
        for seconds (2.3 s on the default model), as an evaluation does."""
        return self._prof is not None and self._done + 1 >= self.steps

    def after(self, step: int) -> float:
        if self._prof is None:
            return 0.0
        self._done += 1
        return self.close() if self._done >= self.steps else 0.0

    def close(self) -> float:
        """Ends the window (early when the segment ends: an evaluation or a checkpoint is next;
        a window without a whole step reopens in the next segment)."""
        if self._prof is None:
            return 0.0
        t0 = time.perf_counter()
        with _without_usdt_lines():
            self._prof.__exit__(None, None, None)
        malloc.set_mmap_threshold(malloc.MMAP_THRESHOLD)
        if self._done:
            events = self._prof.events()
            # The window: from the first recorded event to the end of the last, i.e. the steps.
            window = (min(e.time_range.start for e in events),
                      max(e.time_range.end for e in events))  # fmt: skip
            self.result = summarize(events, window, self._done)
            self.result["steps"] = self._done
        self._prof = None
        return time.perf_counter() - t0


@contextlib.contextmanager
def _without_usdt_lines() -> Iterator[None]:
    """Kineto (torch's profiler library) writes a `USDT: ... profiler_start` and a `...
    profiler_stop` line straight to file descriptor 2 at every start and stop, whatever
    KINETO_LOG_LEVEL says: tracing marks for its own tools, noise in a training run's
    terminal. So fd 2 goes to a temporary file for those two calls, and whatever else was
    written there meanwhile (another thread's warning) is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = [line for line in caught if not line.startswith(b"USDT:")]
            if rest:
                os.write(2, b"".join(rest))
