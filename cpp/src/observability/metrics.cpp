#include "observability/metrics.h"

#include <chrono>
#include <sstream>

namespace rec {
namespace {

std::vector<double> LatencyBoundsUs() {
  return {50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 500000, 1000000};
}

std::vector<double> LagBoundsMs() {
  return {50, 100, 250, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000};
}

std::vector<double> BatchBounds() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}; }

std::string FormatDouble(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(static_cast<uint64_t>(value), std::memory_order_relaxed);
}

void Histogram::AppendPrometheus(const std::string& name, const std::string& labels,
                                 std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    std::string le = i < bounds_.size() ? FormatDouble(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum{" + labels + "} " + std::to_string(sum_.load()) + "\n";
  *out += name + "_count{" + labels + "} " + std::to_string(count_.load()) + "\n";
}

ModelStats::ModelStats()
    : request_latency_us(LatencyBoundsUs()),
      batch_size(BatchBounds()),
      update_lag_ms(LagBoundsMs()) {}

void ModelStats::RecordSuccess(uint64_t request_ns) {
  success_count.fetch_add(1, std::memory_order_relaxed);
  success_ns.fetch_add(request_ns, std::memory_order_relaxed);
  request_latency_us.Observe(static_cast<double>(request_ns) / 1000.0);
}

void ModelStats::RecordFailure(uint64_t request_ns) {
  fail_count.fetch_add(1, std::memory_order_relaxed);
  fail_ns.fetch_add(request_ns, std::memory_order_relaxed);
}

ModelStats* Metrics::ForModel(const std::string& model) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = models_[model];
  if (!slot) slot = std::make_unique<ModelStats>();
  return slot.get();
}

void Metrics::SetVersion(const std::string& model, const std::string& version) {
  std::lock_guard<std::mutex> lock(mu_);
  versions_[model] = version;
}

std::string Metrics::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, s] : models_) {
    if (!out.empty()) out += "; ";
    out += name + ": " + std::to_string(s->success_count.load()) + " succeeded, " +
           std::to_string(s->fail_count.load()) + " failed, " + std::to_string(s->pending.load()) +
           " pending";
  }
  return out;
}

std::string Metrics::Prometheus() const {
  struct Counter {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*get)(const ModelStats&);
  };
  static const Counter kCounters[] = {
      {"nv_inference_request_success", "counter", "Number of successful inference requests",
       [](const ModelStats& s) { return s.success_count.load(); }},
      {"nv_inference_request_failure", "counter", "Number of failed inference requests",
       [](const ModelStats& s) { return s.fail_count.load(); }},
      {"nv_inference_count", "counter", "Number of inferences (samples) performed",
       [](const ModelStats& s) { return s.inference_count.load(); }},
      {"nv_inference_exec_count", "counter", "Number of model executions (batches)",
       [](const ModelStats& s) { return s.execution_count.load(); }},
      {"nv_inference_request_duration_us", "counter", "Cumulative request duration in us",
       [](const ModelStats& s) { return (s.success_ns.load() + s.fail_ns.load()) / 1000; }},
      {"nv_inference_queue_duration_us", "counter", "Cumulative queue duration in us",
       [](const ModelStats& s) { return s.queue_ns.load() / 1000; }},
      {"nv_inference_compute_input_duration_us", "counter", "Cumulative input time in us",
       [](const ModelStats& s) { return s.compute_input_ns.load() / 1000; }},
      {"nv_inference_compute_infer_duration_us", "counter", "Cumulative forward time in us",
       [](const ModelStats& s) { return s.compute_infer_ns.load() / 1000; }},
      {"nv_inference_compute_output_duration_us", "counter", "Cumulative output time in us",
       [](const ModelStats& s) { return s.compute_output_ns.load() / 1000; }},
      {"nv_inference_pending_request_count", "gauge", "Requests queued or executing",
       [](const ModelStats& s) { return static_cast<uint64_t>(s.pending.load()); }},
      {"rec_model_batch_variant", "gauge",
       "1 when the served version scores a batch differently from its samples one by one on "
       "this CPU (load-time probe; served only with --allow-batch-variant)",
       [](const ModelStats& s) { return static_cast<uint64_t>(s.batch_variant.load()); }},
      {"rec_batch_window_us", "gauge",
       "How long the dynamic batcher now waits for a batch to fill: max_queue_delay_us "
       "(--batch-window fixed), or with adaptive at most the recent mean forward pass, halved "
       "after each batch of one request",
       [](const ModelStats& s) { return static_cast<uint64_t>(s.batch_window_us.load()); }},
  };
  std::lock_guard<std::mutex> lock(mu_);
  auto labels = [this](const std::string& model) {
    auto v = versions_.find(model);
    return "model=\"" + model + "\",version=\"" + (v == versions_.end() ? "" : v->second) + "\"";
  };
  std::string out;
  for (const Counter& c : kCounters) {
    out +=
        std::string("# HELP ") + c.name + " " + c.help + "\n# TYPE " + c.name + " " + c.type + "\n";
    for (const auto& [model, stats] : models_) {
      out +=
          std::string(c.name) + "{" + labels(model) + "} " + std::to_string(c.get(*stats)) + "\n";
    }
  }
  out += "# HELP rec_request_latency_us End-to-end request latency in the server\n";
  out += "# TYPE rec_request_latency_us histogram\n";
  for (const auto& [model, stats] : models_) {
    stats->request_latency_us.AppendPrometheus("rec_request_latency_us", labels(model), &out);
  }
  out += "# HELP rec_batch_size Rows per model execution\n# TYPE rec_batch_size histogram\n";
  for (const auto& [model, stats] : models_) {
    stats->batch_size.AppendPrometheus("rec_batch_size", labels(model), &out);
  }
  AppendUpdates(labels, &out);
  AppendStore(labels, &out);
  AppendQuestionableIds(labels, &out);
  out +=
      "# HELP rec_http_connections_closed_total HTTP connections closed by the server: idle, "
      "request not received in time, over the connection limit\n"
      "# TYPE rec_http_connections_closed_total counter\n";
  const std::pair<const char*, const std::atomic<uint64_t>*> closes[] = {
      {"idle_timeout", &http_closes_.idle_timeout},
      {"request_timeout", &http_closes_.request_timeout},
      {"connection_limit", &http_closes_.connection_limit},
  };
  for (const auto& [reason, count] : closes) {
    out += std::string("rec_http_connections_closed_total{reason=\"") + reason + "\"} " +
           std::to_string(count->load()) + "\n";
  }
  return out;
}

void ModelStats::CountNegativeIds(const std::string& feature, uint64_t n) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  negative_ids_[feature] += n;
}

void ModelStats::CountUnknownIds(const std::vector<std::string>& names,
                                 const std::vector<int64_t>& per_column) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  if (unknown_by_column_.size() < per_column.size()) unknown_by_column_.resize(per_column.size());
  for (size_t c = 0; c < per_column.size() && c < names.size(); ++c) {
    if (per_column[c] < 0) continue;
    // The entry, found once (a model's columns are its config's): a batch pays an add per
    // feature, not a string lookup.
    if (unknown_by_column_[c] == nullptr) unknown_by_column_[c] = &unknown_ids_[names[c]];
    *unknown_by_column_[c] += static_cast<uint64_t>(per_column[c]);
  }
}

void Metrics::AppendQuestionableIds(const std::function<std::string(const std::string&)>& labels,
                                    std::string* out) const {
  std::string lines;
  for (const auto& [model, stats] : models_) {
    std::lock_guard<std::mutex> lock(stats->ids_mu_);
    for (const auto& [reason, counts] : {std::pair{"negative", &stats->negative_ids_},
                                         std::pair{"unknown", &stats->unknown_ids_}}) {
      for (const auto& [feature, count] : *counts) {
        lines += "rec_questionable_ids_total{" + labels(model) + ",feature=\"" + feature +
                 "\",reason=\"" + reason + "\"} " + std::to_string(count) + "\n";
      }
    }
  }
  if (lines.empty()) return;
  *out +=
      "# HELP rec_questionable_ids_total Sparse values the model maps but may not expect, by "
      "feature and reason (negative: a negative integer token of sparse_strings, mapped by "
      "modulo; unknown: an id of a ZCH table that its map does not hold, read as the default "
      "row; a modulo table has no id memory, so its unseen ids are not counted: use ids: zch)\n"
      "# TYPE rec_questionable_ids_total counter\n" +
      lines;
}

void Metrics::AppendUpdates(const std::function<std::string(const std::string&)>& labels,
                            std::string* out) const {
  bool any = false;
  for (const auto& [model, stats] : models_) any = any || stats->has_updates.load();
  if (!any) return;
  *out +=
      "# HELP rec_update_records_total Update log records, by what became of them: applied, "
      "skipped (older than the export), or refused (other_run, unknown_table, row_format, "
      "id_range, backwards, malformed; a ZCH table's map changes: slot_range, id_held, "
      "map_mismatch)\n# TYPE rec_update_records_total counter\n";
  for (const auto& [model, stats] : models_) {
    if (!stats->has_updates.load()) continue;
    for (int o = 0; o < static_cast<int>(UpdateOutcome::kCount); ++o) {
      *out += "rec_update_records_total{" + labels(model) + ",outcome=\"" +
              OutcomeName(static_cast<UpdateOutcome>(o)) + "\"} " +
              std::to_string(stats->updates.records[o].load()) + "\n";
    }
  }
  struct Line {
    const char* name;
    const char* type;
    const char* help;
    int64_t (*get)(const ModelStats&);
  };
  static const Line kLines[] = {
      {"rec_update_rows_applied_total", "counter", "Embedding rows written from the update log",
       [](const ModelStats& s) { return static_cast<int64_t>(s.updates.rows_applied.load()); }},
      {"rec_update_busy_us_total", "counter",
       "Time the update log's reader spent reading and applying entries (not waiting)",
       [](const ModelStats& s) { return static_cast<int64_t>(s.updates.busy_ns.load() / 1000); }},
      {"rec_update_behind_ms", "gauge",
       "How far the update log's reader is behind the log (0: it has read everything there is)",
       [](const ModelStats& s) { return s.updates.behind_ms.load(); }},
      {"rec_update_log_connected", "gauge", "1 while the update log's broker answers",
       [](const ModelStats& s) { return s.updates.connected.load(); }},
      {"rec_update_watermark_step", "gauge",
       "Training step up to which every trained row is in the served tables",
       [](const ModelStats& s) { return s.updates.watermark_step.load(); }},
      {"rec_update_watermark_wall_ms", "gauge", "When that step ended (Unix ms; 0: unknown)",
       [](const ModelStats& s) { return s.updates.watermark_wall_ms.load(); }},
      {"rec_update_watermark_held_by", "gauge",
       "The update log partition (one stream: the rank) whose publisher holds the watermark "
       "back, -1 when none",
       [](const ModelStats& s) { return s.updates.held_by.load(); }},
  };
  for (const Line& l : kLines) {
    *out +=
        std::string("# HELP ") + l.name + " " + l.help + "\n# TYPE " + l.name + " " + l.type + "\n";
    for (const auto& [model, stats] : models_) {
      if (!stats->has_updates.load()) continue;
      *out +=
          std::string(l.name) + "{" + labels(model) + "} " + std::to_string(l.get(*stats)) + "\n";
    }
  }
  *out +=
      "# HELP rec_update_partition_silent_ms Time since the reader last read a record from each "
      "update log partition (one stream: 0)\n# TYPE rec_update_partition_silent_ms gauge\n";
  for (const auto& [model, stats] : models_) {
    if (!stats->has_updates.load()) continue;
    std::lock_guard<std::mutex> lock(stats->updates.silent_mu);
    for (const auto& [k, ms] : stats->updates.partition_silent_ms) {
      *out += "rec_update_partition_silent_ms{" + labels(model) + ",partition=\"" +
              std::to_string(k) + "\"} " + std::to_string(ms) + "\n";
    }
  }
  *out +=
      "# HELP rec_update_lag_ms Per batch: now minus the wall time of the training step its "
      "embedding watermark is at\n# TYPE rec_update_lag_ms histogram\n";
  for (const auto& [model, stats] : models_) {
    if (stats->has_updates.load())
      stats->update_lag_ms.AppendPrometheus("rec_update_lag_ms", labels(model), out);
  }
}

void Metrics::AppendStore(const std::function<std::string(const std::string&)>& labels,
                          std::string* out) const {
  struct Line {
    const char* name;
    const char* type;
    const char* help;
    int64_t (*get)(const StoreStats&);
  };
  static const Line kLines[] = {
      {"rec_store_cache_hits_total", "counter", "Embedding store rows found in the row cache",
       [](const StoreStats& s) { return static_cast<int64_t>(s.cache_hits.load()); }},
      {"rec_store_cache_misses_total", "counter", "Embedding store rows read from the store",
       [](const StoreStats& s) { return static_cast<int64_t>(s.cache_misses.load()); }},
      {"rec_store_lookups_total", "counter", "Batches that read rows from the store",
       [](const StoreStats& s) { return static_cast<int64_t>(s.lookups.load()); }},
      {"rec_store_lookup_us_total", "counter",
       "Time those batches waited for the store (all nodes, in parallel)",
       [](const StoreStats& s) { return static_cast<int64_t>(s.lookup_ns.load() / 1000); }},
      {"rec_store_failed_lookups_total", "counter",
       "Batches refused for the store: unavailable, or a row missing or malformed",
       [](const StoreStats& s) { return static_cast<int64_t>(s.failed_lookups.load()); }},
      {"rec_store_cache_refreshed_rows_total", "counter",
       "Rows of stored tables the update log wrote into the row cache",
       [](const StoreStats& s) { return static_cast<int64_t>(s.refreshed_rows.load()); }},
      {"rec_store_cache_bytes", "gauge", "Bytes the row cache holds (rows and their overhead)",
       [](const StoreStats& s) { return s.cache_bytes.load(); }},
      {"rec_store_cache_capacity_bytes", "gauge", "The row cache's bound (--store-cache-bytes)",
       [](const StoreStats& s) { return s.cache_capacity.load(); }},
  };
  bool any = false;
  for (const auto& [model, stats] : models_) any = any || stats->has_store.load();
  if (!any) return;
  for (const Line& l : kLines) {
    *out +=
        std::string("# HELP ") + l.name + " " + l.help + "\n# TYPE " + l.name + " " + l.type + "\n";
    for (const auto& [model, stats] : models_) {
      if (!stats->has_store.load()) continue;
      *out += std::string(l.name) + "{" + labels(model) + "} " +
              std::to_string(l.get(stats->store)) + "\n";
    }
  }
  *out +=
      "# HELP rec_store_node_requests_total Partition reads (HMGET) sent to each store node\n"
      "# TYPE rec_store_node_requests_total counter\n";
  for (const auto& [model, stats] : models_) {
    if (!stats->has_store.load()) continue;
    std::lock_guard<std::mutex> lock(stats->store.mu);
    for (const auto& [node, count] : stats->store.node_requests) {
      *out += "rec_store_node_requests_total{" + labels(model) + ",node=\"" + node + "\"} " +
              std::to_string(count) + "\n";
    }
  }
}

const char* OutcomeName(UpdateOutcome outcome) {
  switch (outcome) {
    case UpdateOutcome::kApplied:
      return "applied";
    case UpdateOutcome::kSkipped:
      return "skipped";
    case UpdateOutcome::kOtherRun:
      return "other_run";
    case UpdateOutcome::kUnknownTable:
      return "unknown_table";
    case UpdateOutcome::kRowFormat:
      return "row_format";
    case UpdateOutcome::kIdRange:
      return "id_range";
    case UpdateOutcome::kBackwards:
      return "backwards";
    case UpdateOutcome::kMalformed:
      return "malformed";
    case UpdateOutcome::kSlotRange:
      return "slot_range";
    case UpdateOutcome::kIdHeld:
      return "id_held";
    case UpdateOutcome::kMapMismatch:
      return "map_mismatch";
    default:
      return "?";
  }
}

}  // namespace rec
