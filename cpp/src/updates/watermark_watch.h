// Names the partition holding a replica's watermark back (#60; rec.update_log.WatermarkWatch is
// the Python twin). Rank r publishes into partition r mod P, so a silent rank (stopped, slow, or
// its partition's master away) is a silent partition. Check() returns a line to log, or "":
// "held" once the holding rank (EmbeddingTables::HeldBy) has not been heard from for after_ms,
// and "spoke again" when the watermark moves on after that. Times are the caller's clock (ms).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace rec {

class WatermarkWatch {
 public:
  // after_ms: max(5 s, 4 x publish.every_seconds) where that is known.
  WatermarkWatch(int64_t after_ms, int64_t now_ms) : after_ms_(after_ms), since_ms_(now_ms) {}

  // After each record read: its rank, and the partition it was read from (0: one stream).
  void Heard(int64_t rank, int64_t partition, int64_t now_ms);
  // held_rank: HeldBy() (-1: none); (gen, step): the watermark; partitions: P (0: one stream,
  // the line names the rank only).
  std::string Check(int64_t held_rank, int64_t gen, int64_t step, int64_t partitions,
                    int64_t now_ms);
  // For rec_update_partition_silent_ms: how long since each partition of `partitions` was read
  // a record from.
  std::map<int64_t, int64_t> SilentMs(int64_t partitions, int64_t now_ms) const;

 private:
  static std::string Name(int64_t rank, int64_t partitions);

  const int64_t after_ms_;
  const int64_t since_ms_;
  std::map<int64_t, int64_t> rank_heard_ms_, partition_heard_ms_;
  bool held_ = false;  // reported: (held_rank_, held_mark_)
  int64_t held_rank_ = -1;
  std::pair<int64_t, int64_t> held_mark_;
};

}  // namespace rec
