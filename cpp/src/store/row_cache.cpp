#include "store/row_cache.h"

namespace rec {

bool RowCache::Get(int64_t key, std::string* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  out->append(it->second->second);
  return true;
}

void RowCache::Put(int64_t key, const std::string& row) {
  const int64_t cost = static_cast<int64_t>(row.size()) + kEntryOverhead;
  if (cost > capacity_) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    bytes_ -= static_cast<int64_t>(it->second->second.size()) + kEntryOverhead;
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, row);
  index_[key] = lru_.begin();
  bytes_ += cost;
  EvictLocked();
}

void RowCache::Erase(int64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= static_cast<int64_t>(it->second->second.size()) + kEntryOverhead;
  lru_.erase(it->second);
  index_.erase(it);
}

void RowCache::EvictLocked() {
  while (bytes_ > capacity_ && !lru_.empty()) {
    const Entry& last = lru_.back();
    bytes_ -= static_cast<int64_t>(last.second.size()) + kEntryOverhead;
    index_.erase(last.first);
    lru_.pop_back();
  }
}

int64_t RowCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int64_t RowCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(index_.size());
}

}  // namespace rec
