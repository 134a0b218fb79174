// What the embedding store did for one model (rec-server's /metrics). Plain counters that the
// store unit updates and the metrics unit prints, so it lives here, below both.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace rec {

struct StoreStats {
  std::atomic<uint64_t> cache_hits{0}, cache_misses{0};
  std::atomic<uint64_t> lookups{0};         // batches that read rows from the store
  std::atomic<uint64_t> lookup_ns{0};       // time those reads took (the store's round trips)
  std::atomic<uint64_t> failed_lookups{0};  // batches refused: store unavailable, rows missing
  std::atomic<uint64_t> refreshed_rows{0};  // rows the update log wrote into the row cache
  std::atomic<int64_t> cache_bytes{0}, cache_capacity{0};
  std::mutex mu;
  std::map<std::string, uint64_t> node_requests;  // HMGETs per node ("host:port")
};

}  // namespace rec
