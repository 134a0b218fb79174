// Triton's trace extension: per-request timestamps of sampled inference requests, written to the
// trace file in Triton's JSON trace format, and the settings that pick which requests
// (GET/POST /v2[/models/<m>]/trace/setting, the TraceSetting RPC).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace rec {

// One sampled request: its model and the named steady-clock timestamps it passed.
class Trace {
 public:
  Trace(uint64_t id, std::string model) : id_(id), model_(std::move(model)) {}
  void Stamp(const char* name, uint64_t ns);
  void Stamp(const char* name);  // now
  void SetVersion(const std::string& version);
  const std::string& model() const { return model_; }
  // {"id":..,"model_name":..,"model_version":..} then one {"id":..,"timestamps":[..]} per stamp.
  void AppendJson(std::string* out) const;

 private:
  const uint64_t id_;
  const std::string model_;
  mutable std::mutex mu_;  // stamps come from the protocol's and the executor's threads
  std::string version_;
  std::vector<std::pair<const char*, uint64_t>> stamps_;
};

// A setting as both protocols carry it: a list of strings (one, except trace_level).
using TraceSettings = std::vector<std::pair<std::string, std::vector<std::string>>>;
// An update: a value, or nullopt to clear a model's own setting (it follows the global one).
using TraceUpdates = std::vector<std::pair<std::string, std::optional<std::vector<std::string>>>>;

class Tracer {
 public:
  // The process's tracer; `Configure` once at start with --trace-file (empty: no file, and
  // tracing cannot be turned on).
  static Tracer& Get();
  void Configure(const std::string& file);

  // trace_level, trace_rate, trace_count, log_frequency, trace_file, trace_mode of `model`
  // ("" for the global settings), in Triton's names and string forms.
  TraceSettings Settings(const std::string& model);
  // Checks the whole update, then applies it; a bad one is InvalidArgument naming the setting
  // and changes nothing.
  Status Update(const std::string& model, const TraceUpdates& updates);

  // A trace for this request to `model`, or nullptr: tracing off (one relaxed load), not this
  // request's turn (trace_rate), or trace_count used up.
  std::shared_ptr<Trace> Start(const std::string& model);
  // Keeps a finished trace; every log_frequency traces they go to `<file>.<n>`.
  void Finish(const std::shared_ptr<Trace>& trace);
  // Writes what is kept: at shutdown, and when trace_count reaches 0. With log_frequency 0 the
  // file holds every trace since the start (rewritten whole, so it is always one JSON array).
  void Flush();

 private:
  struct Config {  // a model's own settings are the ones it has; the rest are the global ones
    std::optional<bool> on;
    std::optional<uint64_t> rate, log_frequency;
    std::optional<int64_t> count;
    uint64_t seen = 0;  // requests counted against `rate`, where `rate` is set
  };
  static Config Defaults() { return {false, 1000, 0, -1, 0}; }
  Config* CountOwner(const std::string& model);  // mu_ held
  void WriteLocked();                            // mu_ held

  std::mutex mu_;
  std::string file_;
  Config global_ = Defaults();
  std::map<std::string, Config> models_;
  std::atomic<bool> any_on_{false};
  std::atomic<uint64_t> next_id_{1};
  std::vector<std::shared_ptr<Trace>> kept_;  // log_frequency > 0: not yet in a .N file
  std::string all_json_;                      // log_frequency 0: every trace so far
  uint64_t file_index_ = 0;
};

}  // namespace rec
