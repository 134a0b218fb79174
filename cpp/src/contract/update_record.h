// The update log's record (rec.contract.updates, formats "rec.updates/1", "/2" and "/3"):
// decoding one Redis stream entry and checking it, with the same refusal sentences as the Python
// reader. Version 2 adds a ZCH table's id map changes (evicted and admitted (slot, raw id) pairs),
// each admitted slot's row in the same record; version 3 adds the raw id each row's slot holds
// after the record (`held`), so a reader keeping the table by raw id needs no map.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "contract/row_bytes.h"

namespace rec {

inline constexpr const char* kUpdateFormat = "rec.updates/3";
inline constexpr const char* kUpdateFormatV2 = "rec.updates/2";  // map changes, no `held`
inline constexpr const char* kUpdateFormatV1 = "rec.updates/1";  // rows only: still read
inline constexpr const char* kDefaultUpdateStream = "rec:updates";
// Bounds of one record (rec.contract.updates MAX_ROWS, MAX_DIM): a reader refuses more before
// it allocates anything for it.
inline constexpr int64_t kMaxUpdateRows = 1 << 20;
inline constexpr int64_t kMaxUpdateDim = 1 << 16;

struct UpdateRecord {
  std::string run;
  int64_t gen = 0;
  int64_t rank = 0;
  int64_t world = 0;
  int64_t step = 0;
  int64_t wall_ns = 0;
  bool last = false;
  std::string table;  // empty on a record that only advances the rank's watermark
  std::string dtype;
  int64_t dim = 0;
  std::vector<int64_t> ids;  // strictly increasing
  std::string rows;          // ids.size() rows of RowBytes(dim, dtype): codes, then scale, bias
  // Version 2: the id map changes of a ZCH table, slots strictly increasing in each; every
  // admitted slot is one of `ids`. A replica writes rows, evictions, admissions, in that order.
  struct SlotId {
    int64_t slot = 0;
    int64_t id = 0;  // the raw id (any int64)
    bool operator==(const SlotId& o) const { return slot == o.slot && id == o.id; }
  };
  std::vector<SlotId> evicted;
  std::vector<SlotId> admitted;
  // Version 3 (has_held): the id each row's slot holds after the record, slots strictly
  // increasing, each one of `ids`; a row not in it is of a slot holding no id (the default row,
  // or a free slot).
  bool has_held = false;
  std::vector<SlotId> held;
  bool changes_map() const { return !evicted.empty() || !admitted.empty(); }
};

using StreamFields = std::vector<std::pair<std::string, std::string>>;

// One entry's fields -> the checked record; InvalidArgument naming the field otherwise.
Status DecodeUpdateRecord(const StreamFields& fields, UpdateRecord* out);

// A stream URL's parts (rec/contract/urls.py StreamUrl): the nodes, one or any of a Redis
// Cluster's, as the store's URL lists them; host and port are the first node's, so a reader that
// dials one node reads a one-node URL as before.
struct UpdateUrl {
  std::string host;
  int port = 0;
  std::string stream;
  std::vector<std::pair<std::string, int>> nodes;
};

// redis://HOST:PORT[,HOST:PORT...][/STREAM] (the path names the stream; a number is refused as a
// database), refused with rec/contract/urls.py's words (tests/data/url_golden.json for one node,
// stream_url_golden.json for node lists).
Status ParseUpdateUrl(const std::string& url, UpdateUrl* out);

}  // namespace rec
