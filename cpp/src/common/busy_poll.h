// Busy polling: a thread that expects work within microseconds checks for it in a loop instead of
// sleeping. Waking a sleeping thread costs tens of microseconds on a virtual machine (the idle
// vCPU is halted and must be kicked back in), which is most of what serving a B = 1 request
// costs besides the model; a bounded poll trades that for CPU time while the server is idle.
#pragma once

#include <sched.h>

#include <cstdint>

#include "common/clock.h"

namespace rec {

// Calls `ready` until it returns true or `us` microseconds have passed; returns its last answer.
// Between calls it yields the core: a polling thread must not keep a runnable one (a client on
// the same machine, another executor) off it.
template <typename Ready>
bool PollFor(int64_t us, Ready ready) {
  if (us <= 0) return ready();
  const uint64_t until = NowNs() + static_cast<uint64_t>(us) * 1000;
  while (true) {
    if (ready()) return true;
    if (NowNs() >= until) return false;
    sched_yield();
  }
}

}  // namespace rec
