// The first slot of a raw id's window in a ZCH table's id map: rec/zch.py's `home`, version 2
// of the map layout (rec.contract.sections.ZCH_MAP_LAYOUT, kZchMapLayout). A replica applying
// the update log's map changes reads an admitted id's window from it (EmbeddingTables), and the
// op library's lookup (cpp/ops/zch.cpp) includes it, so one C++ copy serves both. Every operand
// is non-negative and no product reaches 2^63 (rec/zch.py says why), so C++'s / and % are
// Python's floor ones; tests/data/update_record_golden.json's "zch_home" pins the values.
#pragma once

#include <cstdint>
#include <limits>

namespace rec {

namespace zch_home_detail {
constexpr int64_t kWord = int64_t{1} << 32;
// home's multipliers M0..M5 (rec.zch._M): odd and below 2^31, so a word times one is < 2^63.
constexpr int64_t kM[6] = {0x045D9F3B, 0x2C1B3C6D, 0x297A2D39, 0x5BD1E995, 0x68E31DA5, 0x1B873593};

// A word [0, 2^32) to a word, every output bit depending on every input bit (rec.zch._mix).
inline int64_t Mix(int64_t h, int64_t c, int64_t d) {
  h = (h + h / (int64_t{1} << 16)) % kWord;
  h = (h * c) % kWord;
  h = (h + h / (int64_t{1} << 15)) % kWord;
  h = (h * d) % kWord;
  return (h + h / (int64_t{1} << 16)) % kWord;
}
}  // namespace zch_home_detail

inline int64_t ZchHome(int64_t id, int64_t slots) {
  using namespace zch_home_detail;
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  const int64_t x = id >= 0 ? id : (id + kInt64Max) + 1;
  int64_t a = Mix(x % kWord, kM[0], kM[1]);
  const int64_t b = Mix(((x / kWord) * kM[2] + a) % kWord, kM[3], kM[4]);
  a = Mix((a * kM[5] + b) % kWord, kM[0], kM[1]);
  return ((b % (int64_t{1} << 31)) * kWord + a) % slots;
}

}  // namespace rec
