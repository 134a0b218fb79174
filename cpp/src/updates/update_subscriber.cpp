#include "updates/update_subscriber.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "common/log.h"
#include "observability/metrics.h"
#include "updates/update_log_reader.h"
#include "updates/watermark_watch.h"

namespace rec {
namespace {

constexpr int kBlockMs = 300;  // how long one XREAD waits for news; bounds the stop latency
constexpr int kBatchEntries = 256;
// How long the rank holding the watermark back may be silent before it is named: 5 s, since
// rec-server does not know publish.every_seconds (4 x it where known, as the Python readers).
constexpr int64_t kHeldAfterMs = 5000;

// An entry as logs name it: its id, and its partition's number on a partitioned log.
std::string EntryName(const LogEntry& e) {
  return e.partition > 0 ? e.id + " of partition " + std::to_string(e.partition) : e.id;
}

// Logs the first few of a kind, then one in a thousand: a bad publisher must not flood the log.
bool Worth(uint64_t n) { return n <= 5 || n % 1000 == 0; }

}  // namespace

UpdateSubscriber::UpdateSubscriber(std::string model, UpdateUrl url,
                                   std::shared_ptr<EmbeddingTables> tables, UpdateStats* stats,
                                   int64_t max_behind_ms)
    : model_(std::move(model)),
      url_(std::move(url)),
      tables_(std::move(tables)),
      stats_(stats),
      max_behind_ms_(max_behind_ms) {
  thread_ = std::thread([this] { Loop(); });
}

UpdateSubscriber::~UpdateSubscriber() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void UpdateSubscriber::SetBehind(int64_t ms) {
  stats_->behind_ms.store(ms);
  if (max_behind_ms_ <= 0) return;
  bool over = ms > max_behind_ms_;
  if (over && !over_bound_) {
    LogWarning("model '" + model_ + "' is " + std::to_string(ms / 1000) +
               " s behind its update log (bound " + std::to_string(max_behind_ms_ / 1000) +
               " s, --updates-max-behind-s): not ready until it catches up");
  } else if (!over && over_bound_) {
    LogInfo("model '" + model_ + "' caught up with its update log: ready");
  }
  over_bound_ = over;
}

bool UpdateSubscriber::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

bool UpdateSubscriber::Sleep(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

void UpdateSubscriber::Loop() {
  UpdateLogReader reader(url_, kBatchEntries, kBlockMs);
  int64_t down_since = static_cast<int64_t>(WallMs());  // not caught up before a first read
  bool up = false, reported_down = false;
  uint64_t malformed = 0, refused = 0;
  std::vector<LogEntry> entries;
  WatermarkWatch watch(kHeldAfterMs, static_cast<int64_t>(WallMs()));
  while (Sleep(0)) {
    const auto read_start = std::chrono::steady_clock::now();
    int64_t behind_ms = 0;
    Status st = reader.Read(&entries, &behind_ms);
    if (!st.ok()) {  // a lost node or a moved slot: read again, from the same cursors
      stats_->connected.store(0);
      if (up) down_since = static_cast<int64_t>(WallMs());
      up = false;
      SetBehind(static_cast<int64_t>(WallMs()) - down_since);
      if (!reported_down) {
        LogWarning("model '" + model_ + "': " + st.message() + "; retrying");
        reported_down = true;
      }
      if (!Sleep(200)) break;
      continue;
    }
    if (!up) {
      stats_->connected.store(1);
      LogInfo("model '" + model_ + "': reading update log " + reader.where() + " from " +
              reader.Places());
      up = true;
      reported_down = false;
    }
    struct Busy {  // counts this batch's read and apply time, however the loop leaves it
      std::chrono::steady_clock::time_point start;
      UpdateStats* stats;
      ~Busy() {
        stats->busy_ns.fetch_add(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now() - start)
                                      .count()));
      }
    } busy{entries.empty() ? std::chrono::steady_clock::now() : read_start, stats_};
    for (const LogEntry& entry : entries) {
      // A stop between records, not after the batch: 256 map-moving records take seconds
      // under a sanitizer, and the server's shutdown waits for this thread.
      if (Stopping()) break;
      Apply(entry, &malformed, &refused);
      if (entry.status.ok()) {
        watch.Heard(entry.record.rank, entry.partition, static_cast<int64_t>(WallMs()));
      }
    }
    Watch(&watch, reader.partitions());
    SetBehind(behind_ms);
    down_since = static_cast<int64_t>(WallMs());
  }
  // No store of connected = 0 here: a new version's reader, started before this one stopped,
  // owns the gauges now.
}

void UpdateSubscriber::Watch(WatermarkWatch* watch, int64_t partitions) {
  const int64_t now = static_cast<int64_t>(WallMs());
  const int64_t held = tables_->HeldBy();
  const Watermark w = tables_->CurrentWatermark();
  const std::string line = watch->Check(held, w.gen, w.step, partitions, now);
  if (line.rfind("watermark held", 0) == 0) {
    LogWarning("model '" + model_ + "': " + line);
  } else if (!line.empty()) {
    LogInfo("model '" + model_ + "': " + line);
  }
  stats_->held_by.store(held < 0 || partitions <= 0 ? held : held % partitions);
  std::map<int64_t, int64_t> silent = watch->SilentMs(partitions, now);
  std::lock_guard<std::mutex> lock(stats_->silent_mu);
  stats_->partition_silent_ms = std::move(silent);
}

void UpdateSubscriber::Apply(const LogEntry& entry, uint64_t* malformed, uint64_t* refused) {
  const std::string named = EntryName(entry);
  if (!entry.status.ok()) {
    stats_->Count(UpdateOutcome::kMalformed);
    if (Worth(++*malformed)) {
      LogWarning("model '" + model_ + "': refused update log entry " + named + ": " +
                 entry.status.message());
    }
    return;
  }
  std::string why;
  UpdateOutcome outcome = tables_->Apply(entry.record, &why);
  stats_->Count(outcome);
  if (outcome == UpdateOutcome::kApplied) {
    stats_->rows_applied.fetch_add(entry.record.ids.size());
    Watermark w = tables_->CurrentWatermark();
    stats_->watermark_step.store(w.step);
    stats_->watermark_wall_ms.store(w.wall_ns / 1000000);
  } else if (outcome != UpdateOutcome::kSkipped && Worth(++*refused)) {
    LogWarning("model '" + model_ + "': refused update log entry " + named + " (" +
               OutcomeName(outcome) + "): " + why);
  }
}

}  // namespace rec
