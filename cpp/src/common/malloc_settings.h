// glibc's allocator set for serving: freed memory stays in the process.
#pragma once

#include <malloc.h>

namespace rec {

// A forward pass frees and allocates the same MB-sized tensors on every call, and glibc's
// default trimming returned them to the kernel and faulted them back in each time: about a
// quarter of rec-server's latency on the Kaggle model at B = 512 (rec/malloc.py has the
// measurement and the Python side). Allocations up to 32 MB (glibc's largest mmap threshold)
// come from the heap; the heap is trimmed only past 1 GB of free top.
inline void KeepFreedMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace rec
