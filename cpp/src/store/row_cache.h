// RowCache: the embedding store's rows kept in this process, bounded in bytes, least recently
// used out first. Everything an entry costs (its row, its key, the list and map nodes) counts
// against the bound, so the cache holds under any ids a client sends.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace rec {

class RowCache {
 public:
  // Bytes one entry costs beyond its row: the key twice, a list node, a hash node and bucket,
  // and the std::string (measured with glibc malloc's chunk sizes; an estimate, on the high
  // side, so the bound holds).
  static constexpr int64_t kEntryOverhead = 128;

  explicit RowCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Appends the row of `key` to *out and returns true, or returns false.
  bool Get(int64_t key, std::string* out);
  // Keeps `row` for `key` (replacing an older copy), evicting the least recently used rows
  // until the bound holds; a row larger than the whole cache is not kept.
  void Put(int64_t key, const std::string& row);
  // Drops `key` (an updated row).
  void Erase(int64_t key);

  int64_t bytes() const;
  int64_t entries() const;
  int64_t capacity() const { return capacity_; }

 private:
  using Entry = std::pair<int64_t, std::string>;
  void EvictLocked();

  const int64_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<int64_t, std::list<Entry>::iterator> index_;
  int64_t bytes_ = 0;
};

}  // namespace rec
