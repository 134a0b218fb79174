#include "store/row_cache.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace rec {
namespace {

constexpr uint64_t kSeeds[] = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                               0x27D4EB2F165667C5ull};
constexpr int64_t kMinRowBytes = 16;

uint64_t PowerOfTwoAtLeast(uint64_t n) {
  uint64_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

FrequencySketch::FrequencySketch(int64_t entries)
    : mask_(PowerOfTwoAtLeast(static_cast<uint64_t>(std::max<int64_t>(entries, 1))) - 1),
      sample_(static_cast<uint64_t>(std::max<int64_t>(entries, 1))),
      counts_(new std::atomic<uint8_t>[kDepth * (mask_ + 1)]) {
  for (uint64_t i = 0; i < kDepth * (mask_ + 1); ++i)
    counts_[i].store(0, std::memory_order_relaxed);
}

size_t FrequencySketch::Slot(int64_t key, int row) const {
  const uint64_t h = static_cast<uint64_t>(key) * kSeeds[row];
  return static_cast<size_t>(row) * (mask_ + 1) + ((h >> 29) & mask_);
}

void FrequencySketch::Add(int64_t key) {
  for (int r = 0; r < kDepth; ++r) {
    std::atomic<uint8_t>& c = counts_[Slot(key, r)];
    const uint8_t v = c.load(std::memory_order_relaxed);
    if (v < 15) c.store(v + 1, std::memory_order_relaxed);
  }
  if (added_.fetch_add(1, std::memory_order_relaxed) + 1 == sample_) {
    // The one add that reaches the sample ages every count; adds meanwhile may be halved or not.
    for (uint64_t i = 0; i < kDepth * (mask_ + 1); ++i) {
      counts_[i].store(counts_[i].load(std::memory_order_relaxed) >> 1, std::memory_order_relaxed);
    }
    added_.fetch_sub(sample_, std::memory_order_relaxed);
  }
}

int FrequencySketch::Count(int64_t key) const {
  int least = 15;
  for (int r = 0; r < kDepth; ++r) {
    least = std::min<int>(least, counts_[Slot(key, r)].load(std::memory_order_relaxed));
  }
  return least;
}

// The sketch has a counter per row the cache could hold at the smallest row, and counts against
// the bound too.
RowCache::RowCache(int64_t capacity_bytes)
    : capacity_(capacity_bytes), sketch_(capacity_bytes / (kEntryOverhead + kMinRowBytes)) {
  bytes_ = capacity_bytes > 0 ? sketch_.bytes() : 0;  // no cache (0): nothing held
}

bool RowCache::Get(int64_t key, std::string* out) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  sketch_.Add(key);
  auto it = slots_.find(key);
  if (it == slots_.end()) return false;
  it->second.used.store(true, std::memory_order_relaxed);
  out->append(it->second.row);
  return true;
}

void RowCache::GetMany(const int64_t* keys, int64_t n, const int64_t* offsets, char* out,
                       std::vector<int64_t>* missed, std::vector<int64_t>* empty) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    sketch_.Add(keys[i]);
    auto it = slots_.find(keys[i]);
    const auto room = static_cast<size_t>(offsets[i + 1] - offsets[i]);
    if (empty != nullptr && it != slots_.end() && it->second.row.empty()) {
      it->second.used.store(true, std::memory_order_relaxed);
      empty->push_back(i);
      continue;
    }
    if (it == slots_.end() || it->second.row.size() != room) {
      missed->push_back(i);
      continue;
    }
    it->second.used.store(true, std::memory_order_relaxed);
    std::memcpy(out + offsets[i], it->second.row.data(), room);
  }
}

void RowCache::Put(int64_t key, const std::string& row, Admit admit) {
  const int64_t cost = static_cast<int64_t>(row.size()) + kEntryOverhead;
  if (cost > capacity_ - sketch_.bytes()) return;
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = slots_.find(key);
  if (it != slots_.end()) {  // a newer copy (the update log): same place on the ring
    bytes_ += static_cast<int64_t>(row.size()) - static_cast<int64_t>(it->second.row.size());
    it->second.row = row;
  } else {
    int64_t victim = 0;
    if (admit == Admit::kIfFrequent && bytes_ + cost > capacity_ && VictimLocked(&victim) &&
        sketch_.Count(key) <= sketch_.Count(victim)) {
      return;  // asked for no more often than what it would push out: not kept
    }
    Slot& slot = slots_[key];
    slot.row = row;
    slot.stamp = ++next_stamp_;
    ring_.emplace_back(key, slot.stamp);
    bytes_ += cost;
  }
  EvictLocked();
}

void RowCache::Erase(int64_t key) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = slots_.find(key);
  if (it != slots_.end()) EraseLocked(it);
}

void RowCache::EraseLocked(std::unordered_map<int64_t, Slot>::iterator it) {
  // Its ring entry stays until the hand reaches it, or until leftovers are as many as live
  // entries: then the ring is rebuilt without them, so it never holds more than twice the live
  // entries (plus a few), whether or not the cache is full enough for the hand to move.
  bytes_ -= static_cast<int64_t>(it->second.row.size()) + kEntryOverhead;
  slots_.erase(it);
  if (ring_.size() <= 2 * slots_.size() + 64) return;
  std::deque<std::pair<int64_t, uint64_t>> live;
  for (const auto& [key, stamp] : ring_) {
    auto s = slots_.find(key);
    if (s != slots_.end() && s->second.stamp == stamp) live.emplace_back(key, stamp);
  }
  ring_.swap(live);
}

bool RowCache::VictimLocked(int64_t* key) {
  while (!ring_.empty()) {
    auto [k, stamp] = ring_.front();
    auto it = slots_.find(k);
    if (it == slots_.end() || it->second.stamp != stamp) {  // a leftover
      ring_.pop_front();
      continue;
    }
    if (it->second.used.exchange(false, std::memory_order_relaxed)) {
      ring_.pop_front();
      ring_.emplace_back(k, stamp);  // read since the last pass: one more round
      continue;
    }
    *key = k;
    return true;
  }
  return false;
}

void RowCache::EvictLocked() {
  while (bytes_ > capacity_ && !ring_.empty()) {
    auto [key, stamp] = ring_.front();
    ring_.pop_front();
    auto it = slots_.find(key);
    if (it == slots_.end() || it->second.stamp != stamp) continue;  // a leftover
    if (it->second.used.exchange(false, std::memory_order_relaxed)) {
      ring_.emplace_back(key, stamp);  // read since the last pass: one more round
      continue;
    }
    EraseLocked(it);
  }
  // Leftovers of erased rows at the front cost memory the bound does not count; drop them.
  while (!ring_.empty()) {
    auto it = slots_.find(ring_.front().first);
    if (it != slots_.end() && it->second.stamp == ring_.front().second) break;
    ring_.pop_front();
  }
}

int64_t RowCache::bytes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return bytes_;
}

int64_t RowCache::entries() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return static_cast<int64_t>(slots_.size());
}

}  // namespace rec
