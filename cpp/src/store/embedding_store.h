// EmbeddingStore: the rows of a version's stored tables (rec.json "store"), read through a
// bounded in-process cache from the Redis Cluster the export wrote them to. Per batch: the
// cache first, then one HMGET per partition of the missing rows, every node in parallel
// (ClusterClient). A row the store does not have is an error naming it, never a zero row;
// except in a table keyed by raw id (rec.store/2, a ZCH table), where an id the store lacks
// reads the table's default row (read once, at Open). A missing partition is an error there
// too: each HMGET of such a table also asks for its partition's marker field.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "contract/store_spec.h"
#include "contract/update_record.h"
#include "observability/store_stats.h"
#include "store/cluster_client.h"
#include "store/row_cache.h"

namespace rec {

struct StoreOptions {
  int64_t cache_bytes = int64_t{256} << 20;
  std::chrono::milliseconds timeout{1000};    // connect and read, per node
  std::chrono::milliseconds retry_for{3000};  // a failover takes about the cluster's node timeout
};

class EmbeddingStore {
 public:
  // Connects, reads the slot map and checks that the export finished (its meta hash exists);
  // Unavailable with the reason otherwise.
  static Status Open(const StoreSpec& spec, const StoreOptions& options, StoreStats* stats,
                     std::shared_ptr<EmbeddingStore>* out);

  // The rows of `keys` (sorted, distinct; `columns` 1: each table << 40 | row; 2: rec.store/2's
  // (table, id) pairs, the id a raw-keyed table's raw id) concatenated in key order, each as
  // the store keeps it, into *rows. `defaulted` (if given) gets the index of each key that read
  // its table's default row (a raw id the store lacks).
  Status Fetch(const int64_t* keys, int64_t n, int columns, std::string* rows,
               std::vector<int64_t>* defaulted = nullptr);

  // An update log record of stored table `table` (its index in spec().tables), checked: its
  // rows written into the cache, present or not, so this replica serves them at once, before
  // (or without) the store's follower writing them to the store (rec.store.follow). A
  // raw-keyed (ZCH) table's record goes in by raw id (rec.updates/3's `held`): its evicted ids
  // first, as entries that read the default row (a miss must not read an evicted id's old row
  // back from the store before the follower deletes it), then each held row under its id, and
  // its default row (the table's last) replaces the one unknown ids read. A free slot's row is
  // not kept (no id reads it). The caller keeps Fetch from running meanwhile (the tables' writer
  // lock), so a fetch that read an older row from the store cannot put it back after.
  void Refresh(int64_t table, const UpdateRecord& r);

  const StoreSpec& spec() const { return spec_; }

 private:
  EmbeddingStore(const StoreSpec& spec, const StoreOptions& options, StoreStats* stats);
  int64_t CacheBytes() const;  // every cache's bytes
  // Each raw-keyed table's default row, checked; Internal naming it otherwise.
  Status ReadDefaultRows();
  // The rows missing from the caches (`missed`, indices into tables/fields/offsets), from the
  // store, copied into *rows and the caches.
  Status FetchMissed(const std::vector<int64_t>& tables, const std::vector<int64_t>& fields,
                     const std::vector<int64_t>& offsets, const std::vector<int64_t>& missed,
                     std::string* rows, std::vector<int64_t>* defaulted);

  const StoreSpec spec_;
  StoreStats* stats_;
  // The row-keyed tables' rows by store key, and one cache per raw-keyed table by raw id (a
  // table index and a raw id do not fit in one int64): --store-cache-bytes split evenly.
  RowCache cache_;
  std::vector<std::unique_ptr<RowCache>> raw_caches_;  // by table index; null: row-keyed
  std::vector<std::string> default_rows_;              // by table index; raw-keyed tables only
  ClusterClient client_;
};

}  // namespace rec
