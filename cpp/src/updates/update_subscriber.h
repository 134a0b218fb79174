// The update log's reader in rec-server: one thread per served version with an update log,
// reading the log in either layout (UpdateLogReader: one stream, or every partition, routed to
// its node on a Redis Cluster) from its own cursors and applying each record to the version's
// tables. The cursor starts at the log's beginning: records of steps the export holds
// are skipped, so a new version (a restart, a hot swap) replays exactly what it lacks. A broker
// that goes away is retried; nothing is lost, since the cursor stays where it was.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "contract/update_record.h"
#include "updates/embedding_tables.h"
#include "updates/update_log_reader.h"
#include "updates/watermark_watch.h"

namespace rec {

class UpdateSubscriber {
 public:
  // `max_behind_ms` (0: none): the bound past which the model is not ready; the reader logs
  // when it crosses it.
  UpdateSubscriber(std::string model, UpdateUrl url, std::shared_ptr<EmbeddingTables> tables,
                   UpdateStats* stats, int64_t max_behind_ms);
  ~UpdateSubscriber();  // stops the reader and joins it
  UpdateSubscriber(const UpdateSubscriber&) = delete;
  UpdateSubscriber& operator=(const UpdateSubscriber&) = delete;

 private:
  void Loop();
  // Names the partition holding the watermark back, in the log and the metrics.
  void Watch(WatermarkWatch* watch, int64_t partitions);
  // Applies one entry read, counting and logging what is refused.
  void Apply(const LogEntry& entry, uint64_t* malformed, uint64_t* refused);
  bool Stopping();
  bool Sleep(int ms);  // false once stopping
  void SetBehind(int64_t ms);

  std::string model_;
  UpdateUrl url_;
  std::shared_ptr<EmbeddingTables> tables_;
  UpdateStats* stats_;
  int64_t max_behind_ms_;
  bool over_bound_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace rec
