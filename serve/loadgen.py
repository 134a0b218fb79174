"""The load generator behind `rec bench`: one measurement point in several client processes.

Each worker process runs an asyncio loop with tritonclient's aio client (HTTP or gRPC) and keeps
its share of the point's concurrency in flight. The request tensors are built once and reused,
so the client's per-request cost is tritonclient's serialization, not ours. Several processes
because one Python process saturates its core (the GIL) before a fast server does.

Closed loop (rate 0): each of the `concurrency` slots sends its next request when the previous
one answers; throughput at that concurrency is what the server sustains. Open loop (rate > 0):
requests are sent on a fixed schedule whatever the answers, and latency is measured from the
scheduled time, so a stalled server is charged for the requests it delays (no coordinated
omission); at most `concurrency` are in flight per process.

All processes start warm-up at one agreed CLOCK_MONOTONIC instant (system-wide on Linux) and
record only requests sent inside the measurement window that follows.

A job with `candidates` sends requests of one context and that many candidates: in the context
form, or (`form` flat) as the flat rows with the context repeated, the same pairs either way.
With `queries` it sends several such requests in turn, each of its own N and its own user.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from rec.contract.context import ContextSplit
from rec.serve.client import ContextRows, Rows, infer_inputs, synthetic_request, synthetic_rows


@dataclass(frozen=True)
class Job:
    """One worker's share of a measurement point."""

    url: str
    protocol: str
    model: str
    num_dense: int
    num_sparse: int
    batch: int
    in_flight: int
    rate: float
    """Requests per second this worker offers (open loop); 0 means closed loop."""
    start_at: float
    """time.monotonic() at which warm-up starts."""
    warmup_s: float
    duration_s: float
    max_requests: int
    """Stop after this many measured requests (0: run for duration_s)."""
    seed: int
    candidates: int = 0
    """Candidates per request of one context (0: `batch` independent rows, the flat form)."""
    form: str = "context"
    """With candidates: "context" (the context once) or "flat" (the context repeated)."""
    context: ContextSplit | None = None
    """The model's context columns, with candidates."""
    hotness: tuple[tuple[int, int], ...] | None = None
    """Ids per bag, (low, high) per sparse feature; None: 1 to 3 for each."""
    queries: tuple[int, ...] = ()
    """With a context: the N of each of several requests sent in turn, request k of user
    seed + k (no two share a context, as MLPerf's queries); (): the one of `candidates`."""

    def requests(self) -> list[Rows | ContextRows]:
        """The requests this job sends in turn (built once, sent again and again)."""
        if not self.queries:
            return [self.request()]
        return [synthetic_request(self.context, n, self.form, self.seed + k, self.hotness)
                for k, n in enumerate(self.queries)]  # fmt: skip

    def request(self) -> Rows | ContextRows:
        """The request this job sends (built once, sent again and again)."""
        if not self.candidates:
            return synthetic_rows(
                self.num_dense, self.num_sparse, self.batch, self.seed, self.hotness
            )
        return synthetic_request(self.context, self.candidates, self.form, self.seed, self.hotness)


@dataclass
class Outcome:
    latencies_s: np.ndarray
    errors: dict[str, int] = field(default_factory=dict)
    first_send: float = 0.0
    last_done: float = 0.0
    pairs: int = 0
    """Samples (pairs) of the measured requests that succeeded."""


def run_job(job: Job) -> Outcome:
    """Entry point of a worker process (must be importable for the spawn start method)."""
    return asyncio.run(_run(job))


def _client(job: Job):
    if job.protocol == "http":
        import tritonclient.http.aio as mod

        return mod, mod.InferenceServerClient(job.url, conn_limit=max(job.in_flight, 1))
    import tritonclient.grpc.aio as mod

    return mod, mod.InferenceServerClient(job.url)


async def _run(job: Job) -> Outcome:
    mod, client = _client(job)
    requests = job.requests()
    prepared = [infer_inputs(mod, r) for r in requests]
    sizes = [len(r) for r in requests]
    turn = itertools.count()
    measure_from = job.start_at + job.warmup_s
    measure_to = measure_from + job.duration_s if job.max_requests == 0 else float("inf")
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sends: list[float] = []
    done_at: list[float] = []
    pairs = 0

    async def one(sent: float) -> None:
        # `sent` is the scheduled time in open loop, the actual send time in closed loop.
        nonlocal pairs
        k = next(turn) % len(prepared)
        inputs, outputs = prepared[k]
        try:
            await client.infer(job.model, inputs, outputs=outputs)
            ok = True
        except Exception as e:  # any failure is counted by kind; the run goes on
            ok = False
            key = type(e).__name__ + ": " + str(e).splitlines()[0][:200]
        now = time.monotonic()
        if measure_from <= sent < measure_to:
            if ok:
                latencies.append(now - sent)
                pairs += sizes[k]
            else:
                errors[key] = errors.get(key, 0) + 1
            sends.append(sent)
            done_at.append(now)

    def finished() -> bool:
        return time.monotonic() >= measure_to or (
            job.max_requests > 0 and len(sends) >= job.max_requests
        )

    await asyncio.sleep(max(0.0, job.start_at - time.monotonic()))
    try:
        if job.rate > 0:
            await _open_loop(job, one, finished)
        else:
            await _closed_loop(job, one, finished)
    finally:
        await client.close()
    return Outcome(
        np.asarray(latencies, dtype=np.float64),
        errors,
        min(sends, default=0.0),
        max(done_at, default=0.0),
        pairs,
    )


async def _closed_loop(job: Job, one, finished) -> None:
    async def slot() -> None:
        while not finished():
            await one(time.monotonic())

    await asyncio.gather(*(slot() for _ in range(job.in_flight)))


async def _open_loop(job: Job, one, finished) -> None:
    slots = asyncio.Semaphore(job.in_flight)
    pending: set[asyncio.Task] = set()
    interval = 1.0 / job.rate
    k = 0
    while not finished():
        scheduled = job.start_at + k * interval
        k += 1
        await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
        await (
            slots.acquire()
        )  # a full window delays the send; latency still counts from `scheduled`

        async def guarded(t: float = scheduled) -> None:
            try:
                await one(t)
            finally:
                slots.release()

        task = asyncio.ensure_future(guarded())
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
