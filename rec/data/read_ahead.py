"""Reading a stream ahead of training, in one thread per rank (rec.data.stream_redis uses it; a
Kafka reader would wrap its poll the same way).

The thread only fetches and decodes: it calls `fetch(need)`, which returns the next entries
(decoded) or None, and holds them in order. Everything that decides what is trained (cutting
batches, the position, acknowledgements, counts) stays on the trainer's thread, which takes the
entries with `get` one at a time. So an entry read ahead and not yet taken is, to the broker,
delivered and unacknowledged: at a checkpoint it is beyond the position, and after a crash the
resumed rank gets it again, exactly as an entry read in the step that stopped the run.

Why a thread helps while Python holds a GIL: the broker's round trip is a socket wait, which
releases it, and the training step spends most of its time in torch's kernels and collectives,
which release it too; the thread's decoding (JSON parsing, numpy) fills those gaps.

The bound: the thread fetches only while it holds `depth - chunk` events or fewer (an entry
without a good event counts as one), asking for what fills it to `depth`, so it holds at most
`depth` plus one fetch's overshoot (the caller sizes a fetch to `need`, rounded up to whole
entries). Waiting for `chunk` events of room keeps each fetch as large as the reader's own
(a batch): refilling after every entry taken made one round trip per entry, and in one process
reading 102,400 events cost 32 µs per event against 12 without the thread.

`get` waits up to its timeout for an entry, and past it while the thread's last fetch brought
entries (more may be in the stream): so, as a reader without the thread, it returns what the
stream holds now, and waits for more only up to its deadline. It overruns the deadline by one
fetch at most, after a fetch that brought entries.

`finish` (a clean stop) ends the fetching but keeps what was fetched, the fetch under way's too:
`get` hands it all out, then returns None at once, so a stop can train every entry delivered.

`notify` (optional) is called after each fetch that brought items, outside the lock: a reader
of several streams (rec.data.stream.PartitionedReader) waits on one condition for any of them.

An exception in `fetch` ends the thread; `get` raises that same exception on the trainer's
thread once the entries before it are taken. `close` stops the thread and waits for it a bounded
time; it never hangs the trainer (the thread is a daemon).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """A daemon thread calling fetch(need) while it holds at most `depth - chunk` events
    (size(item) per item); `get` takes the oldest item (module docstring)."""

    def __init__(
        self,
        fetch: Callable[[int], list[T] | None],
        size: Callable[[T], int],
        depth: int,
        chunk: int,
        name: str,
        notify: Callable[[], None] | None = None,
    ) -> None:
        self.fetch, self.size, self.notify = fetch, size, notify
        self.depth, self.chunk = max(1, depth), min(max(1, chunk), max(1, depth))
        self.items: deque[T] = deque()
        self.held = 0
        """size() summed over items."""
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.dry = False
        """The last fetch brought nothing (none yet: False)."""
        self.stopping = False
        self.finishing = False
        """finish(): no fetch after the one under way, whose items are kept."""
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while (self.held > self.depth - self.chunk and not self.stopping
                           and not self.finishing):  # fmt: skip
                        self.cond.wait()
                    if self.stopping or self.finishing:
                        return
                    need = self.depth - self.held
                items = self.fetch(need)  # outside the lock: the trainer takes meanwhile
                with self.cond:
                    if self.stopping:  # delivered, never taken: pending for a resume
                        return
                    for item in items or ():
                        self.items.append(item)
                        self.held += self.size(item)
                    self.dry = not items
                    self.cond.notify_all()
                if items and self.notify is not None:
                    self.notify()
        except BaseException as e:  # noqa: BLE001 (raised again on the trainer's thread)
            with self.cond:
                if not self.stopping:
                    self.error = e
                self.cond.notify_all()
            if self.notify is not None:
                self.notify()

    def get(self, timeout: float) -> T | None:
        """The oldest item, waiting up to `timeout` s for one, and past it while the last fetch
        brought items; None if none came. Raises the thread's exception once the items before
        it are taken."""
        end = time.monotonic() + timeout
        with self.cond:
            while not self.items:
                if self.error is not None:
                    raise self.error
                if not self.thread.is_alive():
                    return None
                left = end - time.monotonic()
                if left <= 0:
                    if self.dry:
                        return None
                    left = 0.05  # a fetch under way may bring what the stream holds now
                self.cond.wait(left)
            item = self.items.popleft()
            self.held -= self.size(item)
            self.cond.notify_all()
            return item

    def poll(self) -> T | None:
        """The oldest item if one is held, else None at once (raises as `get` does)."""
        with self.cond:
            if not self.items:
                if self.error is not None:
                    raise self.error
                return None
            item = self.items.popleft()
            self.held -= self.size(item)
            self.cond.notify_all()
            return item

    @property
    def done(self) -> bool:
        """The thread ended (finish, close, an error) and every item was taken."""
        with self.cond:
            return not self.items and self.error is None and not self.thread.is_alive()

    def finish(self, timeout: float) -> None:
        """Stops fetching, keeping every item fetched (the fetch under way's when it ends
        within `timeout` s); `get` then hands them out and returns None once they are taken."""
        with self.cond:
            self.finishing = True
            self.cond.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def close(self, timeout: float) -> None:
        """Stops the thread: it takes nothing more, and is waited for up to `timeout` s."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
