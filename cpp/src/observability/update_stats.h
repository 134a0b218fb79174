// What the update log did to one model's tables, counted (rec-server's /metrics). Plain counters
// that the updates unit updates and the metrics unit prints, so it lives here, below both.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

namespace rec {

enum class UpdateOutcome : int {
  kApplied = 0,
  kSkipped,  // rows older than the export: already in the tables
  kOtherRun,
  kUnknownTable,
  kRowFormat,
  kIdRange,
  kBackwards,
  kMalformed,
  // A ZCH table's id map changes (format version 2) that do not fit the served map:
  kSlotRange,    // a slot outside the table's slots or the admitted id's window, or no map
  kIdHeld,       // an admitted id another slot holds, or admitted twice
  kMapMismatch,  // an eviction of an id the slot does not hold, an admission into a held slot
  kCount
};
const char* OutcomeName(UpdateOutcome outcome);

// Counters of one model's update stream (rec-server's /metrics).
struct UpdateStats {
  std::array<std::atomic<uint64_t>, static_cast<int>(UpdateOutcome::kCount)> records{};
  std::atomic<uint64_t> rows_applied{0};
  std::atomic<int64_t> connected{0};
  std::atomic<int64_t> watermark_step{-1};
  std::atomic<int64_t> watermark_wall_ms{0};
  // Time the reader spent on reads that returned entries and on applying them (not waiting for
  // news): rows_applied over it is the rate one replica applies at.
  std::atomic<uint64_t> busy_ns{0};
  // How far the reader is behind the log: 0 once it has read everything there is; while it
  // catches up, the age of the newest entry it applied; while the broker is unreachable (or
  // before the first read), the time since.
  std::atomic<int64_t> behind_ms{0};
  // The partition (one stream: the rank) holding the watermark back; -1: none (#60).
  std::atomic<int64_t> held_by{-1};
  // How long since each partition (one stream: 0) was read a record from, as last looked.
  mutable std::mutex silent_mu;
  std::map<int64_t, int64_t> partition_silent_ms;
  void Count(UpdateOutcome o) { records[static_cast<int>(o)].fetch_add(1); }
};

}  // namespace rec
