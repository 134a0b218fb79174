#include "store/embedding_store.h"

#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace rec {
namespace {

// --store-cache-bytes split evenly over the caches: the row-keyed tables' one (if there is a
// row-keyed table) and one per raw-keyed table.
int64_t CacheShare(const StoreSpec& spec, int64_t bytes) {
  int64_t raw = 0;
  for (const StoreTable& t : spec.tables) raw += t.raw_id ? 1 : 0;
  const int64_t caches = raw + (raw < static_cast<int64_t>(spec.tables.size()) ? 1 : 0);
  return bytes / (caches > 0 ? caches : 1);
}

}  // namespace

EmbeddingStore::EmbeddingStore(const StoreSpec& spec, const StoreOptions& options,
                               StoreStats* stats)
    : spec_(spec),
      stats_(stats),
      cache_(CacheShare(spec, options.cache_bytes)),
      client_(spec.url, spec.nodes, options.timeout, options.retry_for) {
  raw_caches_.resize(spec.tables.size());
  default_rows_.resize(spec.tables.size());
  for (size_t t = 0; t < spec.tables.size(); ++t) {
    if (spec.tables[t].raw_id) {
      raw_caches_[t] = std::make_unique<RowCache>(CacheShare(spec, options.cache_bytes));
    }
  }
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
  REC_RETURN_IF_ERROR(store->ReadDefaultRows());
  *out = std::move(store);
  return Status::Ok();
}

Status EmbeddingStore::ReadDefaultRows() {
  std::vector<HashGet> gets;
  std::vector<size_t> which;
  for (size_t t = 0; t < spec_.tables.size(); ++t) {
    if (!spec_.tables[t].raw_id) continue;
    gets.push_back({PartitionKey(spec_.prefix, spec_.tables[t].name, 0), {kDefaultField}});
    which.push_back(t);
  }
  if (gets.empty()) return Status::Ok();
  std::vector<std::vector<FieldValue>> values;
  std::map<std::string, uint64_t> per_node;
  REC_RETURN_IF_ERROR(client_.HashGets(gets, &values, &per_node));
  for (size_t g = 0; g < gets.size(); ++g) {
    const StoreTable& table = spec_.tables[which[g]];
    const FieldValue& v = values[g][0];
    if (!v.found || static_cast<int64_t>(v.value.size()) != table.row_bytes) {
      return Internal("embedding store " + spec_.url + ": the default row of table '" + table.name +
                      "' (field '" + kDefaultField + "' of '" + gets[g].key + "') is " +
                      (v.found ? std::to_string(v.value.size()) + " bytes, want " +
                                     std::to_string(table.row_bytes)
                               : std::string("missing")));
    }
    default_rows_[which[g]] = v.value;
  }
  return Status::Ok();
}

Status EmbeddingStore::Fetch(const int64_t* keys, int64_t n, int columns, std::string* rows,
                             std::vector<int64_t>* defaulted) {
  const int64_t num_tables = static_cast<int64_t>(spec_.tables.size());
  // Each row's place in *rows: the rows are fixed-size per table, so the whole batch is laid
  // out before anything is read, and cached and fetched rows are copied straight into place.
  std::vector<int64_t> tables(n), fields(n), offsets(n + 1);
  offsets[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    tables[i] = columns == 2 ? keys[2 * i] : StoreKeyTable(keys[i]);
    fields[i] = columns == 2 ? keys[2 * i + 1] : StoreKeyRow(keys[i]);
    const int64_t t = tables[i];
    if (t < 0 || t >= num_tables ||
        (!spec_.tables[t].raw_id && (fields[i] < 0 || fields[i] >= spec_.tables[t].rows))) {
      return Internal("embedding store: the model asked for table " + std::to_string(t) + " row " +
                      std::to_string(fields[i]) + ", outside its stored tables");
    }
    offsets[i + 1] = offsets[i] + spec_.tables[t].row_bytes;
  }
  rows->resize(static_cast<size_t>(offsets[n]));
  std::vector<int64_t> missed;
  // The keys are sorted, so each table's are adjacent: one GetMany per table, from its cache.
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && tables[j] == tables[i]) ++j;
    const bool raw = spec_.tables[tables[i]].raw_id;
    RowCache* cache = raw ? raw_caches_[tables[i]].get() : &cache_;
    std::vector<int64_t> cache_keys(fields.begin() + i, fields.begin() + j);
    if (!raw) {
      for (int64_t& k : cache_keys) k = StoreKey(tables[i], k);
    }
    std::vector<int64_t> local, evicted;
    cache->GetMany(cache_keys.data(), j - i, offsets.data() + i, rows->data(), &local,
                   raw ? &evicted : nullptr);
    for (int64_t k : local) missed.push_back(i + k);
    for (int64_t k : evicted) {  // an id the update log evicted: the default row
      const std::string& row = default_rows_[tables[i]];
      std::memcpy(rows->data() + offsets[i + k], row.data(), row.size());
      if (defaulted != nullptr) defaulted->push_back(i + k);
    }
    i = j;
  }
  stats_->cache_hits.fetch_add(static_cast<uint64_t>(n) - missed.size());
  stats_->cache_misses.fetch_add(missed.size());
  if (missed.empty()) return Status::Ok();
  return FetchMissed(tables, fields, offsets, missed, rows, defaulted);
}

Status EmbeddingStore::FetchMissed(const std::vector<int64_t>& tables,
                                   const std::vector<int64_t>& fields,
                                   const std::vector<int64_t>& offsets,
                                   const std::vector<int64_t>& missed, std::string* rows,
                                   std::vector<int64_t>* defaulted) {
  // The missing rows, one HMGET per (table, partition).
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> groups;
  for (int64_t i : missed) {
    const StoreTable& table = spec_.tables[tables[i]];
    const int64_t partition =
        table.raw_id ? RawIdPartition(fields[i], table.partitions) : fields[i] % table.partitions;
    groups[{tables[i], partition}].push_back(i);
  }
  std::vector<HashGet> gets;
  gets.reserve(groups.size());
  for (const auto& [where, indices] : groups) {
    HashGet get;
    get.key = PartitionKey(spec_.prefix, spec_.tables[where.first].name, where.second);
    for (int64_t i : indices) get.fields.push_back(std::to_string(fields[i]));
    // A raw-keyed partition's marker tells a missing hash from ids it does not hold.
    if (spec_.tables[where.first].raw_id) get.fields.push_back(kMarkerField);
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
    if (table.raw_id && !values[g].back().found) {
      stats_->failed_lookups.fetch_add(1);
      return Internal("embedding store " + spec_.url + ": partition hash '" + gets[g].key +
                      "' of table '" + table.name + "' does not exist");
    }
    RowCache* cache = table.raw_id ? raw_caches_[where.first].get() : &cache_;
    for (size_t j = 0; j < indices.size(); ++j) {
      const int64_t i = indices[j];
      const FieldValue& v = values[g][j];
      if (!v.found && table.raw_id) {  // an id the store lacks: the default row, not cached
        std::memcpy(rows->data() + offsets[i], default_rows_[where.first].data(),
                    default_rows_[where.first].size());
        if (defaulted != nullptr) defaulted->push_back(i);
        continue;
      }
      if (!v.found || static_cast<int64_t>(v.value.size()) != table.row_bytes) {
        stats_->failed_lookups.fetch_add(1);
        const std::string row = std::to_string(fields[i]);
        const std::string what = table.raw_id ? "raw id " : "row ";
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
        return Internal("embedding store " + spec_.url + ": " + what + row + " of table '" +
                        table.name + "' in partition hash '" + gets[g].key + "' has " +
                        std::to_string(v.value.size()) + " bytes, want " +
                        std::to_string(table.row_bytes));
      }
      std::memcpy(rows->data() + offsets[i], v.value.data(), v.value.size());
      cache->Put(table.raw_id ? fields[i] : StoreKey(where.first, fields[i]), v.value);
    }
    ++g;
  }
  stats_->cache_bytes.store(CacheBytes());
  return Status::Ok();
}

int64_t EmbeddingStore::CacheBytes() const {
  int64_t bytes = cache_.bytes();
  for (const auto& c : raw_caches_) bytes += c ? c->bytes() : 0;
  return bytes;
}

void EmbeddingStore::Refresh(int64_t table, const UpdateRecord& r) {
  const StoreTable& t = spec_.tables[table];
  const size_t width = static_cast<size_t>(t.row_bytes);
  // Always kept: the store may still hold the older row (until `rec store follow` writes it).
  const auto always = RowCache::Admit::kAlways;
  if (!t.raw_id) {
    for (size_t i = 0; i < r.ids.size(); ++i) {
      cache_.Put(StoreKey(table, r.ids[i]), r.rows.substr(i * width, width), always);
    }
  } else {
    RowCache& cache = *raw_caches_[table];
    for (const auto& e : r.evicted) cache.Put(e.id, std::string(), always);  // reads the default
    size_t h = 0;  // held and ids are both sorted by slot
    for (size_t i = 0; i < r.ids.size(); ++i) {
      while (h < r.held.size() && r.held[h].slot < r.ids[i]) ++h;
      if (h < r.held.size() && r.held[h].slot == r.ids[i]) {
        cache.Put(r.held[h].id, r.rows.substr(i * width, width), always);
      } else if (r.ids[i] == t.rows - 1) {
        default_rows_[table] = r.rows.substr(i * width, width);
      }
    }
  }
  stats_->refreshed_rows.fetch_add(r.ids.size());
  stats_->cache_bytes.store(CacheBytes());
}

}  // namespace rec
