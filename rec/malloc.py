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


def _mallopt(param: int, value: int) -> bool:
    """glibc's mallopt; False where the C library has none or refuses (not glibc), which
    leaves its own defaults."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(param, value))


def keep_freed_memory() -> bool:
    """Sets both thresholds for this process (False where it cannot, as _mallopt)."""
    return _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def set_mmap_threshold(nbytes: int) -> bool:
    """Allocations from `nbytes` up get their own mapping, returned to the kernel when freed
    (False where it cannot be set, as _mallopt). Fixing it also ends glibc's own adjustment of
    the threshold, which otherwise rises to the largest block freed so far."""
    return _mallopt(M_MMAP_THRESHOLD, nbytes)
