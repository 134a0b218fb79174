// Per-model counters (the statistics extension and Prometheus share them) and the Prometheus
// text exposition, with Triton's metric names where they apply.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "observability/store_stats.h"
#include "observability/update_stats.h"

namespace rec {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends the `_bucket`, `_sum` and `_count` lines.
  void AppendPrometheus(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // one per bound, plus +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_{0};  // integer sum keeps the counters lock-free
};

struct ModelStats {
  ModelStats();
  std::atomic<uint64_t> success_count{0}, success_ns{0};
  std::atomic<uint64_t> fail_count{0}, fail_ns{0};
  std::atomic<uint64_t> queue_count{0}, queue_ns{0};
  std::atomic<uint64_t> compute_input_ns{0}, compute_infer_ns{0}, compute_output_ns{0};
  std::atomic<uint64_t> inference_count{0};  // samples (rows) inferred
  std::atomic<uint64_t> execution_count{0};  // forward passes
  std::atomic<uint64_t> last_inference_ms{0};
  std::atomic<int64_t> pending{0};  // requests queued or executing
  // 1 while the served version failed the load-time batch probe (--allow-batch-variant).
  std::atomic<int64_t> batch_variant{0};
  // The dynamic batcher's window now: max_queue_delay_us, or less when adaptive (batcher.h).
  std::atomic<int64_t> batch_window_us{0};
  Histogram request_latency_us;
  Histogram batch_size;
  // The update log (rec-server --updates): set once a version reads one.
  std::atomic<bool> has_updates{false};
  UpdateStats updates;
  Histogram update_lag_ms;  // per batch: wall time now minus its embedding watermark's
  // The embedding store (rec.json "store"): set once a version reads one.
  std::atomic<bool> has_store{false};
  StoreStats store;

  // Sparse values the model maps but may not expect, per feature: rec_questionable_ids_total
  // {reason="negative"}, negative integer tokens; {reason="unknown"}, ids of a ZCH table's
  // feature that its map does not hold (read as the default row). Counting 0 declares a
  // feature, so that its counter shows from then on.
  void CountNegativeIds(const std::string& feature, uint64_t n);
  // per_column[c]: the unknown ids of feature names[c] (-1: not a ZCH feature); one lock.
  void CountUnknownIds(const std::vector<std::string>& names,
                       const std::vector<int64_t>& per_column);

  void RecordSuccess(uint64_t request_ns);
  void RecordFailure(uint64_t request_ns);

 private:
  friend class Metrics;
  mutable std::mutex ids_mu_;  // requests with negative tokens, batches of a ZCH model
  std::map<std::string, uint64_t> negative_ids_;
  std::map<std::string, uint64_t> unknown_ids_;
  std::vector<uint64_t*> unknown_by_column_;  // entries of unknown_ids_ (stable), per column
};

// HTTP connections the server closed on its own, by reason (HTTP/REST and metrics ports).
struct HttpCloseCounts {
  std::atomic<uint64_t> idle_timeout{0};
  std::atomic<uint64_t> request_timeout{0};
  std::atomic<uint64_t> connection_limit{0};
};

class Metrics {
 public:
  // Creates the stats of `model` on first use; the pointer stays valid for the server's life.
  ModelStats* ForModel(const std::string& model);
  void SetVersion(const std::string& model, const std::string& version);
  HttpCloseCounts* http_closes() { return &http_closes_; }
  std::string Prometheus() const;
  // One line for the log, per model: "rec: 12 succeeded, 0 failed, 0 pending". The shutdown line
  // carries it, so a test can judge the drain by the server's own counts, not the client's clock.
  std::string Summary() const;

 private:
  void AppendUpdates(const std::function<std::string(const std::string&)>& labels,
                     std::string* out) const;
  void AppendStore(const std::function<std::string(const std::string&)>& labels,
                   std::string* out) const;
  void AppendQuestionableIds(const std::function<std::string(const std::string&)>& labels,
                             std::string* out) const;

  HttpCloseCounts http_closes_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<ModelStats>> models_;
  std::map<std::string, std::string> versions_;
};

}  // namespace rec
