// RowCache: the embedding store's rows kept in this process, bounded in bytes, evicted by CLOCK
// (second chance) with TinyLFU's admission. A row read since the hand last passed it gets another
// round; a missed row replaces the hand's victim only if a frequency sketch has seen it more often
// than the victim. Both were chosen by measurement (benchmarks/cache_policy.py): CLOCK's hit rate
// is at or above LRU's on every Zipf trace tried, and the admission keeps the rows seen once (most
// of a Zipf tail) from pushing out the ones read again, which adds several points on every trace
// (docs/store.md). A hit only sets the row's bit and counts it in the sketch (relaxed atomics), so
// reads share the lock instead of reordering a list under an exclusive one. Everything the cache
// costs (its rows, its keys, the queue and map nodes, the sketch) counts against the bound, so it
// holds under any ids a client sends.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rec {

// TinyLFU's count-min sketch of how often keys were asked for, recently: 4 rows of counters that
// stop at 15, every count halved after `entries` additions (the aging a plain LFU lacks).
// Caffeine halves after 10 x; measured here (benchmarks/cache_policy.py), that remembers the old
// hot rows too long when popularity moves: up to 15 points below plain CLOCK at Kaggle size, where
// 1 x stays within 1.3 points of CLOCK and keeps most of the gain elsewhere.
// Concurrent adds may lose an increment; the counts are estimates anyway.
class FrequencySketch {
 public:
  explicit FrequencySketch(int64_t entries);
  void Add(int64_t key);
  int Count(int64_t key) const;
  int64_t bytes() const { return kDepth * (mask_ + 1); }

 private:
  static constexpr int kDepth = 4;
  size_t Slot(int64_t key, int row) const;
  uint64_t mask_;
  uint64_t sample_;
  std::unique_ptr<std::atomic<uint8_t>[]> counts_;
  std::atomic<uint64_t> added_{0};
};

class RowCache {
 public:
  // Bytes one entry costs beyond its row: the key in the queue and the map, a hash node and
  // bucket, the std::string and the bits (measured with glibc malloc's chunk sizes; an estimate,
  // on the high side, so the bound holds).
  static constexpr int64_t kEntryOverhead = 128;

  // Whether Put keeps a new row that needs room: only if asked for more often than the row it
  // would evict (a row fetched from the store), or always (a fresher row than the store's, from
  // the update log, which must not be read back older from the store).
  enum class Admit { kIfFrequent, kAlways };

  explicit RowCache(int64_t capacity_bytes);

  // Counts the ask in the frequency sketch; appends the row of `key` to *out and returns true,
  // or returns false.
  bool Get(int64_t key, std::string* out);
  // Get for a batch, under one hold of the lock: the row of keys[i] is copied to
  // out + offsets[i], where offsets[i + 1] - offsets[i] bytes are its room; the i of every key
  // not held (or held with another size) are appended to *missed, in order. With `empty`, the
  // i of a key held with an empty row (a raw-keyed table's evicted id: read its default row)
  // go there instead, nothing copied.
  void GetMany(const int64_t* keys, int64_t n, const int64_t* offsets, char* out,
               std::vector<int64_t>* missed, std::vector<int64_t>* empty = nullptr);
  // Keeps `row` for `key` (replacing an older copy in place), evicting rows until the bound
  // holds, unless `admit` turns a new row away; a row larger than the whole cache is not kept.
  void Put(int64_t key, const std::string& row, Admit admit = Admit::kIfFrequent);
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
  // The row the hand evicts next (second chances given on the way); false if none is left.
  bool VictimLocked(int64_t* key);

  const int64_t capacity_;
  FrequencySketch sketch_;
  mutable std::shared_mutex mu_;
  // The clock's ring, oldest first: (key, stamp). An entry whose stamp is not its slot's is a
  // leftover of an erased or replaced row, skipped when the hand reaches it.
  std::deque<std::pair<int64_t, uint64_t>> ring_;
  std::unordered_map<int64_t, Slot> slots_;
  uint64_t next_stamp_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace rec
