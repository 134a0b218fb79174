"""glibc's allocator, set for serving: freed memory stays in the process.

A forward pass allocates and frees the same large tensors on every call (a layer's codes,
int32 products and outputs: 1-4 MB each at B = 512 on the Kaggle model). With glibc's defaults
the freed top of the heap is returned to the kernel whenever it passes the trim threshold,
and each next call faults those pages back in, zeroed: on an Intel Xeon (one thread, Kaggle
model, int8 dense, B = 512) page faults were about a third of the forward pass, 13.1 ms
against 8.6 ms with the settings below, and rec-server's gRPC latency at B = 512 went from
14.0-14.6 ms to 10.5-10.8 ms with the same peak RSS (+6 MB). Allocations up to 32 MB (glibc's
largest mmap threshold) come from the heap, and the heap is trimmed only past 1 GB of free
top: the process keeps what its largest batch needed, as jemalloc and tcmalloc do.

rec-server and rec-bench make the same two mallopt calls at startup
(cpp/src/common/malloc_settings.h); Triton's Python model and the benchmarks' in-process timings
(export_bench, arch_bench) call `keep_freed_memory`.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's maximum (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Sets both thresholds for this process; False where the C library has no mallopt or
    refuses (not glibc), which leaves its own defaults."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
