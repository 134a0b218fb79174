// rec.json's "updates" section (and the stored tables of its "store" section) as the server
// holds them: where each table's rows lie in the model's storage, so that an update record's
// rows can be written into it. Python's side is rec/contract/manifest.py.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rec {

struct TablePlace {
  std::string buffer;  // the storage buffer's name in the model ("lookup.weights_host")
  int64_t offset = 0;  // bytes from the buffer's start to row 0
  int64_t row_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  std::string dtype;
  bool scale_bias_first = false;  // FBGEMM's int-N-bit rows: fp16 scale and bias, then codes
};

// A table in the embedding store (rec.json "store"): its records are checked and advance the
// watermark like the others, and their rows go to the StoredRowsSink instead of a buffer.
struct StoredPlace {
  int64_t index = 0;  // its index in the store's table order (a store key's table)
  int64_t rows = 0;
  int64_t dim = 0;
  std::string dtype;
  // Keyed by raw id (a ZCH table, rec.store/2): it has no map in the model, and takes only
  // records that say which id each row's slot holds (rec.updates/3's `held`).
  bool raw_id = false;
};

// A ZCH table's id map in the model (rec.json "zch.tables.<t>", layout rec.zch.map/2): keys
// int64 [slots] and used bool [slots], one pair per lookup that reads the table, which a record's
// map changes write in place with its rows.
struct MapPlace {
  int64_t slots = 0;
  int64_t probes = 0;
  std::vector<std::pair<std::string, std::string>> buffers;  // (keys, used) buffer names
};

// rec.json's "updates" section.
struct UpdatesSpec {
  bool present = false;
  std::string url;   // the run's publish.url at export, or empty
  std::string run;   // the publisher's run id, or empty (a run that never published)
  int64_t step = 0;  // the checkpoint step the export holds
  int64_t gen = 0;   // the publisher's generation that trained up to it (0: none)
  std::map<std::string, TablePlace> tables;
  std::map<std::string, StoredPlace> stored;  // from rec.json "store", not "updates"
  std::map<std::string, MapPlace> maps;       // from rec.json "zch", not "updates"
};

}  // namespace rec
