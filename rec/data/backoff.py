"""The broker clients' retry delay: its own module so that `rec stream replay`, a producer,
imports no stream reader (which loads torchrec to build batches)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Backoff:
    """retry_s, doubling up to max_retry_s; reset() after a success."""

    def __init__(self, first: float, most: float, sleep: Callable[[float], None] = time.sleep):
        self.first, self.most, self.sleep = first, max(most, first), sleep
        self.delay = first

    def wait(self, budget: float = math.inf) -> None:
        self.sleep(max(0.0, min(self.delay, budget)))
        self.delay = min(self.delay * 2, self.most)

    def reset(self) -> None:
        self.delay = self.first
