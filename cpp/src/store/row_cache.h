// RowCache: the embedding store's rows kept in this process, bounded in bytes, evicted by CLOCK
// (second chance): a row read since the hand last passed it gets another round. CLOCK was chosen
// by measurement (benchmarks/cache_policy.py): its hit rate is at or above LRU's on every Zipf
// trace tried, stationary or drifting, default model and Kaggle size. And a hit only sets the
// row's bit, so reads share the lock instead of reordering a list under an exclusive one.
// Everything an entry costs (its row, its key, the queue and map nodes) counts against the bound,
// so the cache holds under any ids a client sends.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace rec {

class RowCache {
 public:
  // Bytes one entry costs beyond its row: the key in the queue and the map, a hash node and
  // bucket, the std::string and the bits (measured with glibc malloc's chunk sizes; an estimate,
  // on the high side, so the bound holds).
  static constexpr int64_t kEntryOverhead = 128;

  explicit RowCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Appends the row of `key` to *out and returns true, or returns false.
  bool Get(int64_t key, std::string* out);
  // Keeps `row` for `key` (replacing an older copy), evicting rows until the bound holds; a row
  // larger than the whole cache is not kept.
  void Put(int64_t key, const std::string& row);
  // Drops `key`.
  void Erase(int64_t key);

  int64_t bytes() const;
  int64_t entries() const;
  int64_t capacity() const { return capacity_; }

 private:
  struct Slot {
    std::string row;
    uint64_t stamp = 0;                     // which queue entry is this row's
    mutable std::atomic<bool> used{false};  // read since the hand last passed
  };
  void EraseLocked(std::unordered_map<int64_t, Slot>::iterator it);
  void EvictLocked();

  const int64_t capacity_;
  mutable std::shared_mutex mu_;
  // The clock's ring, oldest first: (key, stamp). An entry whose stamp is not its slot's is a
  // leftover of an erased or replaced row, skipped when the hand reaches it.
  std::deque<std::pair<int64_t, uint64_t>> ring_;
  std::unordered_map<int64_t, Slot> slots_;
  uint64_t next_stamp_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace rec
