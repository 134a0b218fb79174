// StoreSpec: rec.json's "store" section (rec/contract/store.py, Contract 4): which tables of a
// version live in the embedding store, where, and how their rows are laid out there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace rec {

struct StoreTable {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  std::string dtype;
  int64_t row_bytes = 0;
  int64_t partitions = 0;
  // rec.store/2: a ZCH table keyed by raw id ("keys": "raw_id"): its fields are raw ids, every
  // partition holds kMarkerField, partition 0 the default row (kDefaultField), read for an id
  // the store lacks.
  bool raw_id = false;
  // Its features (rec.json "tables"), whose ids the store lacks a server counts as unknown.
  std::vector<std::string> features;
};

struct StoreSpec {
  bool present = false;
  std::string url;
  std::vector<std::pair<std::string, int>> nodes;  // the URL's host:port list
  std::string prefix;
  // Sorted by name (nlohmann's objects are std::maps): the order a store key's table index
  // counts, as rec.contract.store.store_order.
  std::vector<StoreTable> tables;
};

// Parses `redis://HOST:PORT[,HOST:PORT...]` into nodes; InvalidArgument naming what is wrong.
Status ParseStoreUrl(const std::string& url, std::vector<std::pair<std::string, int>>* nodes);

// The "store" section of one version's rec.json text (absent: *out stays not present).
Status ParseStoreSection(const std::string& manifest_text, const std::string& source,
                         StoreSpec* out);

// The key a model asks the store for: its table's index in the store order, shifted over the
// row (rec.contract.store TABLE_SHIFT; tests/data/store_key_golden.json pins the layout).
inline constexpr int kTableShift = 40;
inline int64_t StoreKey(int64_t table, int64_t row) { return table << kTableShift | row; }
inline int64_t StoreKeyTable(int64_t key) { return key >> kTableShift; }
inline int64_t StoreKeyRow(int64_t key) { return key & ((int64_t{1} << kTableShift) - 1); }

// A raw-keyed table's fields besides its ids (rec.contract.store MARKER_FIELD, DEFAULT_FIELD).
inline constexpr const char* kMarkerField = "_";
inline constexpr const char* kDefaultField = "default";
// The partition of a raw-keyed table's id: id mod partitions, non-negative (Python's %).
inline int64_t RawIdPartition(int64_t id, int64_t partitions) {
  const int64_t p = id % partitions;
  return p < 0 ? p + partitions : p;
}

// "{PREFIX:TABLE:PARTITION}": the hash of one partition; the braces make it the hash tag.
std::string PartitionKey(const std::string& prefix, const std::string& table, int64_t partition);

// "{PREFIX}:meta": the hash an export writes last, so its presence says the export finished.
std::string MetaKey(const std::string& prefix);

// Redis Cluster's hash slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
int KeySlot(const std::string& key);

// CRC16/XMODEM (polynomial 0x1021, no reflection) of `data`, continuing from `crc` (0 to start):
// Crc16(a + b) == Crc16(b, Crc16(a)).
uint16_t Crc16(std::string_view data, uint16_t crc = 0);

}  // namespace rec
