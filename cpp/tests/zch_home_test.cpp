// ZchHome (cpp/src/contract/zch_home.h) spreads every id family as random ids spread: n ids in m
// slots take about m(1 - e^(-n/m)) distinct homes. The same families and bound as
// tests/core/test_zch_home.py; the golden file pins the values themselves.
#include "contract/zch_home.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace rec {
namespace {

constexpr double kBound = 0.93;  // the new hash's worst case is 0.952; the old one's was 0.08

using Family = std::function<int64_t(int64_t i)>;  // the i-th id, i = 1..n

double Spread(const Family& id, int64_t n, int64_t slots) {
  std::unordered_set<int64_t> homes;
  for (int64_t i = 1; i <= n; ++i) homes.insert(ZchHome(id(i), slots));
  const double expected = slots * (1.0 - std::exp(-static_cast<double>(n) / slots));
  return homes.size() / expected;
}

void ExpectSpread(const std::string& name, const Family& id) {
  for (int64_t slots : {999, 1000, 1024, 1699, 4096}) {
    for (double load : {0.25, 1.0, 4.0}) {
      const auto n = static_cast<int64_t>(load * slots);
      EXPECT_GE(Spread(id, n, slots), kBound) << name << ": " << slots << " slots, n = " << n;
    }
  }
}

TEST(ZchHome, ConsecutiveNegativeAndTimestampIdsSpread) {
  ExpectSpread("consecutive", [](int64_t i) { return i; });
  ExpectSpread("negative", [](int64_t i) { return -i; });
  ExpectSpread("timestamps", [](int64_t i) { return int64_t{1700000000} + i * 60; });
}

TEST(ZchHome, StridedIdsSpread) {
  ExpectSpread("multiples of 1000", [](int64_t i) { return i * 1000; });
  for (int k = 1; k <= 20; ++k) {
    ExpectSpread("multiples of 2^" + std::to_string(k), [k](int64_t i) { return i << k; });
  }
}

TEST(ZchHome, RandomIdsSpread) {
  std::mt19937_64 gen(7);
  std::vector<int64_t> ids(4 * 4096);
  for (int64_t& x : ids) x = static_cast<int64_t>(gen());
  ExpectSpread("random64", [&ids](int64_t i) { return ids[i - 1]; });
}

TEST(ZchHome, InRangeAtInt64Extremes) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  for (int64_t slots : {int64_t{1}, int64_t{7}, int64_t{2147483647}, int64_t{1} << 62}) {
    for (int64_t id : {lo, lo + 1, int64_t{-1}, int64_t{0}, int64_t{1}, hi}) {
      const int64_t h = ZchHome(id, slots);
      EXPECT_TRUE(h >= 0 && h < slots) << id << " " << slots << " -> " << h;
    }
  }
}

}  // namespace
}  // namespace rec
