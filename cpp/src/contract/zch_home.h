// The first slot of a raw id's window in a ZCH table's id map: rec/zch.py's `home`, version 1
// of the map layout (rec.contract.sections.ZCH_MAP_LAYOUT, kZchMapLayout). A replica applying
// the update log's map changes reads an admitted id's window from it (EmbeddingTables). Every
// operand is non-negative and no product overflows int64 (rec/zch.py says why), so C++'s / and %
// are Python's floor ones; tests/data/update_record_golden.json's "zch_home" pins the values.
#pragma once

#include <cstdint>
#include <limits>

namespace rec {

inline int64_t ZchHome(int64_t id, int64_t slots) {
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kLo = int64_t{1} << 31;
  constexpr int64_t kMix = int64_t{1} << 29;
  constexpr int64_t kCLo = 1640531527, kCHi = 1013904223, kCMix = 2654435761;
  const int64_t x = id >= 0 ? id : (id + kInt64Max) + 1;
  const int64_t h = (x % kLo) * kCLo + (x / kLo) * kCHi;
  return (h / kMix + (h % kMix) * kCMix) % slots;
}

}  // namespace rec
