#include "updates/update_subscriber.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "common/log.h"
#include "observability/metrics.h"

namespace rec {
namespace {

constexpr int kBlockMs = 300;  // how long one XREAD waits for news; bounds the stop latency
constexpr int kBatchEntries = 256;

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const {
    if (c) redisFree(c);
  }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

std::string Str(const redisReply* r) {
  return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
             ? std::string(r->str, r->len)
             : std::string();
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
  const std::string where =
      "redis://" + url_.host + ":" + std::to_string(url_.port) + "/" + url_.stream;
  std::string cursor = "0";
  Context ctx;
  int64_t down_since = static_cast<int64_t>(WallMs());  // not caught up before a first read
  bool reported_down = false;
  uint64_t malformed = 0, refused = 0;
  while (Sleep(0)) {
    if (!ctx) {
      timeval connect_timeout{1, 0};
      ctx.reset(redisConnectWithTimeout(url_.host.c_str(), url_.port, connect_timeout));
      if (!ctx || ctx->err) {
        std::string err = ctx ? ctx->errstr : "out of memory";
        ctx.reset();
        stats_->connected.store(0);
        SetBehind(static_cast<int64_t>(WallMs()) - down_since);
        if (!reported_down) {
          LogWarning("model '" + model_ + "': update log " + where + " unreachable (" + err +
                     "); retrying");
          reported_down = true;
        }
        if (!Sleep(200)) break;
        continue;
      }
      timeval io_timeout{5, 0};  // longer than one BLOCK
      redisSetTimeout(ctx.get(), io_timeout);
      stats_->connected.store(1);
      LogInfo("model '" + model_ + "': reading update log " + where + " from entry " + cursor);
      reported_down = false;
    }
    const auto read_start = std::chrono::steady_clock::now();
    Reply reply(static_cast<redisReply*>(
        redisCommand(ctx.get(), "XREAD COUNT %d BLOCK %d STREAMS %s %s", kBatchEntries, kBlockMs,
                     url_.stream.c_str(), cursor.c_str())));
    if (!reply) {  // the connection broke: reconnect, from the same cursor
      ctx.reset();
      stats_->connected.store(0);
      down_since = static_cast<int64_t>(WallMs());
      continue;
    }
    if (reply->type == REDIS_REPLY_NIL) {  // nothing new: caught up
      SetBehind(0);
      continue;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      LogWarning("model '" + model_ + "': update log " + where + ": " + Str(reply.get()));
      if (!Sleep(500)) break;
      continue;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) continue;
    const redisReply* stream = reply->element[0];
    if (stream->type != REDIS_REPLY_ARRAY || stream->elements < 2) continue;
    const redisReply* entries = stream->element[1];
    struct Busy {  // counts this batch's read and apply time, however the loop leaves it
      std::chrono::steady_clock::time_point start;
      UpdateStats* stats;
      ~Busy() {
        stats->busy_ns.fetch_add(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now() - start)
                                      .count()));
      }
    } busy{read_start, stats_};
    for (size_t i = 0; i < entries->elements; ++i) {
      // A stop between records, not after the batch: 256 map-moving records take seconds
      // under a sanitizer, and the server's shutdown waits for this thread.
      if (Stopping()) break;
      const redisReply* entry = entries->element[i];
      if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 2) continue;
      cursor = Str(entry->element[0]);
      const redisReply* kv = entry->element[1];
      StreamFields fields;
      for (size_t k = 0; kv->type == REDIS_REPLY_ARRAY && k + 1 < kv->elements; k += 2) {
        fields.emplace_back(Str(kv->element[k]), Str(kv->element[k + 1]));
      }
      UpdateRecord record;
      Status st;
      try {
        st = DecodeUpdateRecord(fields, &record);
      } catch (
          const std::exception& e) {  // out of memory: the entry is refused, the reader goes on
        st = InvalidArgument(std::string("update record: ") + e.what());
      }
      if (!st.ok()) {
        stats_->Count(UpdateOutcome::kMalformed);
        if (Worth(++malformed)) {
          LogWarning("model '" + model_ + "': refused update log entry " + cursor + ": " +
                     st.message());
        }
        continue;
      }
      std::string why;
      UpdateOutcome outcome = tables_->Apply(record, &why);
      stats_->Count(outcome);
      if (outcome == UpdateOutcome::kApplied) {
        stats_->rows_applied.fetch_add(record.ids.size());
        Watermark w = tables_->CurrentWatermark();
        stats_->watermark_step.store(w.step);
        stats_->watermark_wall_ms.store(w.wall_ns / 1000000);
      } else if (outcome != UpdateOutcome::kSkipped && Worth(++refused)) {
        LogWarning("model '" + model_ + "': refused update log entry " + cursor + " (" +
                   OutcomeName(outcome) + "): " + why);
      }
    }
    // A full batch: more is likely waiting, and the newest entry applied is this old (an entry
    // id starts with the broker's clock in ms). A short one: caught up.
    const int64_t entry_ms = std::atoll(cursor.substr(0, cursor.find('-')).c_str());
    SetBehind(entries->elements < static_cast<size_t>(kBatchEntries)
                  ? 0
                  : std::max<int64_t>(0, static_cast<int64_t>(WallMs()) - entry_ms));
    down_since = static_cast<int64_t>(WallMs());
  }
  // No store of connected = 0 here: a new version's reader, started before this one stopped,
  // owns the gauges now.
}

}  // namespace rec
