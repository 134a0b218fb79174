#include "store/embedding_store.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace rec {

EmbeddingStore::EmbeddingStore(const StoreSpec& spec, const StoreOptions& options,
                               StoreStats* stats)
    : spec_(spec),
      stats_(stats),
      cache_(options.cache_bytes),
      client_(spec.url, spec.nodes, options.timeout, options.retry_for) {
  stats_->cache_capacity.store(options.cache_bytes);
}

Status EmbeddingStore::Open(const StoreSpec& spec, const StoreOptions& options, StoreStats* stats,
                            std::shared_ptr<EmbeddingStore>* out) {
  std::shared_ptr<EmbeddingStore> store(new EmbeddingStore(spec, options, stats));
  REC_RETURN_IF_ERROR(store->client_.Connect());
  bool finished = false;
  REC_RETURN_IF_ERROR(store->client_.Exists(MetaKey(spec.prefix), &finished));
  if (!finished) {
    return Unavailable("embedding store " + spec.url + ": no finished export under '" +
                       spec.prefix + "' (its meta hash is missing)");
  }
  *out = std::move(store);
  return Status::Ok();
}

Status EmbeddingStore::Fetch(const int64_t* keys, int64_t n, std::string* rows) {
  const int64_t num_tables = static_cast<int64_t>(spec_.tables.size());
  // Each row's place in *rows: the rows are fixed-size per table, so the whole batch is laid
  // out before anything is read, and cached and fetched rows are copied straight into place.
  std::vector<int64_t> offsets(n + 1);
  offsets[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t table = StoreKeyTable(keys[i]);
    if (table < 0 || table >= num_tables || StoreKeyRow(keys[i]) >= spec_.tables[table].rows) {
      return Internal("embedding store: the model asked for key " + std::to_string(keys[i]) +
                      ", outside its stored tables");
    }
    offsets[i + 1] = offsets[i] + spec_.tables[table].row_bytes;
  }
  rows->resize(static_cast<size_t>(offsets[n]));
  std::vector<int64_t> missed;
  cache_.GetMany(keys, n, offsets.data(), rows->data(), &missed);
  stats_->cache_hits.fetch_add(static_cast<uint64_t>(n) - missed.size());
  stats_->cache_misses.fetch_add(missed.size());
  if (missed.empty()) return Status::Ok();
  // The missing rows, one HMGET per (table, partition).
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> groups;
  for (int64_t i : missed) {
    const int64_t table = StoreKeyTable(keys[i]);
    groups[{table, StoreKeyRow(keys[i]) % spec_.tables[table].partitions}].push_back(i);
  }
  std::vector<HashGet> gets;
  gets.reserve(groups.size());
  for (const auto& [where, indices] : groups) {
    HashGet get;
    get.key = PartitionKey(spec_.prefix, spec_.tables[where.first].name, where.second);
    for (int64_t i : indices) get.fields.push_back(std::to_string(StoreKeyRow(keys[i])));
    gets.push_back(std::move(get));
  }
  std::vector<std::vector<FieldValue>> values;
  std::map<std::string, uint64_t> per_node;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = client_.HashGets(gets, &values, &per_node);
  stats_->lookup_ns.fetch_add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count()));
  stats_->lookups.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(stats_->mu);
    for (const auto& [node, count] : per_node) stats_->node_requests[node] += count;
  }
  if (!st.ok()) {
    stats_->failed_lookups.fetch_add(1);
    return st;
  }
  size_t g = 0;
  for (const auto& [where, indices] : groups) {
    const StoreTable& table = spec_.tables[where.first];
    for (size_t j = 0; j < indices.size(); ++j) {
      const int64_t i = indices[j];
      const FieldValue& v = values[g][j];
      if (!v.found || static_cast<int64_t>(v.value.size()) != table.row_bytes) {
        stats_->failed_lookups.fetch_add(1);
        const std::string row = std::to_string(StoreKeyRow(keys[i]));
        if (!v.found) {
          // A whole partition gone (deleted by hand, or a store flushed) is worth telling apart
          // from one row gone; the extra round trip is on the error path only.
          bool partition_exists = true;
          Status ignored = client_.Exists(gets[g].key, &partition_exists);
          (void)ignored;
          return Internal("embedding store " + spec_.url + ": row " + row + " of table '" +
                          table.name + "' is missing: " +
                          (partition_exists
                               ? "not in partition hash '" + gets[g].key + "'"
                               : "partition hash '" + gets[g].key + "' does not exist"));
        }
        return Internal("embedding store " + spec_.url + ": row " + row + " of table '" +
                        table.name + "' in partition hash '" + gets[g].key + "' has " +
                        std::to_string(v.value.size()) + " bytes, want " +
                        std::to_string(table.row_bytes));
      }
      std::memcpy(rows->data() + offsets[i], v.value.data(), v.value.size());
      cache_.Put(keys[i], v.value);
    }
    ++g;
  }
  stats_->cache_bytes.store(cache_.bytes());
  return Status::Ok();
}

void EmbeddingStore::Refresh(int64_t table, const std::vector<int64_t>& ids,
                             const std::string& rows) {
  const size_t width = static_cast<size_t>(spec_.tables[table].row_bytes);
  for (size_t i = 0; i < ids.size(); ++i) {
    // Always kept: the store may still hold the older row (until `rec store follow` writes it).
    cache_.Put(StoreKey(table, ids[i]), rows.substr(i * width, width), RowCache::Admit::kAlways);
  }
  stats_->refreshed_rows.fetch_add(ids.size());
  stats_->cache_bytes.store(cache_.bytes());
}

}  // namespace rec
