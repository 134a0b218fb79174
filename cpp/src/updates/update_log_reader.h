// The update log in either layout (#60), as rec-server reads it: one stream (legacy: no layout
// record {S}:layout) or P partitions {S:k:j}, each on the master of its slot (rec/logs/
// update_reader.py is the Python twin, and its docstring the rules).
//
// Publishing rank r writes partition r mod P, so each rank's records keep their order in one
// partition, and within a generation any interleaving is a valid order. Across generations it is
// not: a resume re-sends at checkpoint values the rows the dead generation published past it,
// and a dead rank's record read after them would undo that. So no record of generation g is
// returned while a partition not yet read to its end may hold older ones: that partition's newer
// entries are held back (its cursor stays before them) until the others catch up, and each
// read's entries come in generation order, stable per partition.
//
// A read is one pipelined non-blocking XREAD per node of its partitions' keys; when all are
// empty it blocks kPartitionBlockMs on one partition, a different one each time. One stream
// (legacy, or P = 1) is one XREAD that blocks `block_ms`, as before partitions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "contract/partitions.h"
#include "contract/update_record.h"
#include "store/cluster_client.h"

namespace rec {

inline constexpr int kPartitionBlockMs = 50;

struct LogEntry {
  int64_t partition = 0;  // 0 in the legacy layout
  std::string id;
  Status status;  // why the entry is malformed, else ok
  UpdateRecord record;
};

class UpdateLogReader {
 public:
  // Reads `url` from the start of every stream, `count` entries a stream a read.
  UpdateLogReader(const UpdateUrl& url, int count, int block_ms);

  // One read (class comment). *behind_ms: how old the newest entry taken from a stream that
  // gave a full batch is (more is likely waiting), else 0. Unavailable when a node failed it (a
  // lost node, a moved slot): the next read routes afresh from the same cursors.
  Status Read(std::vector<LogEntry>* out, int64_t* behind_ms);

  // P of a partitioned log; 0 for the legacy layout (or while not known).
  int64_t partitions() const { return layout_ ? layout_->partitions : 0; }
  // "entry 0-0" (legacy) or "partitions 0:<id>, 1:<id>, ...": where the reader is.
  std::string Places() const;
  // The URL as logs name it.
  const std::string& where() const { return where_; }

 private:
  Status LookForLayout();
  Status Fetch(const std::vector<int64_t>& streams,
               std::map<int64_t, std::vector<StreamEntry>>* got);
  std::vector<LogEntry> Take(int64_t k, const std::vector<StreamEntry>& raw) const;
  // The oldest generation a partition not read to its end may still hold (INT64_MAX: none).
  int64_t Low() const;
  std::vector<LogEntry> InGenerationOrder(std::map<int64_t, std::vector<LogEntry>>* taken,
                                          const std::map<int64_t, size_t>& fetched);

  const UpdateUrl url_;
  const std::string where_;
  const int count_, block_ms_;
  std::unique_ptr<ClusterClient> client_;
  std::optional<PartitionLayout> layout_;
  bool settled_ = false;      // the layout is known: a layout record, or a legacy entry read
  std::string cursor_ = "0";  // the legacy stream's
  std::vector<std::string> cursors_;  // partition k's at k
  uint64_t turn_ = 0;
  std::set<int64_t> caught_;             // partitions read to their end by their last read
  std::map<int64_t, int64_t> next_gen_;  // the generation of a partition's next entry, at least
};

}  // namespace rec
