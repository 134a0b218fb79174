// The server's two clocks: steady nanoseconds for durations, and wall milliseconds for the
// timestamps a client reads (last_inference). Below every unit that measures time.
#pragma once

#include <cstdint>

namespace rec {

uint64_t NowNs();   // steady clock
uint64_t WallMs();  // system clock, for last_inference

}  // namespace rec
