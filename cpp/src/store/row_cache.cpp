#include "store/row_cache.h"

#include <mutex>

namespace rec {

bool RowCache::Get(int64_t key, std::string* out) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = slots_.find(key);
  if (it == slots_.end()) return false;
  it->second.used.store(true, std::memory_order_relaxed);
  out->append(it->second.row);
  return true;
}

void RowCache::Put(int64_t key, const std::string& row) {
  const int64_t cost = static_cast<int64_t>(row.size()) + kEntryOverhead;
  if (cost > capacity_) return;
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = slots_.find(key);
  if (it != slots_.end()) {  // a newer copy (the update log): same place on the ring
    bytes_ += static_cast<int64_t>(row.size()) - static_cast<int64_t>(it->second.row.size());
    it->second.row = row;
  } else {
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
