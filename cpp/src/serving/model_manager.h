// ModelManager: the model repository (Contract 2). Finds each model directory, loads its newest
// (or pinned) version, owns one Batcher per model, and swaps in new versions atomically: a batch
// holds a reference to the version it started on, so in-flight requests finish on it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batching/batcher.h"
#include "common/status.h"
#include "model/model_spec.h"
#include "model/runner.h"
#include "observability/metrics.h"
#include "store/embedding_store.h"
#include "updates/update_subscriber.h"

namespace rec {

struct ManagerOptions {
  std::string repository;
  std::string model_name;      // empty: every model directory with a config.pbtxt
  int64_t pinned_version = 0;  // 0: newest
  // Serve a version that fails the load-time batch probe (with a warning and the
  // rec_model_batch_variant metric) instead of refusing it.
  bool allow_batch_variant = false;
  // The update log every version applies (redis://HOST:PORT[/STREAM]): empty takes each
  // version's rec.json "updates.url", "none" reads no log.
  std::string updates_url;
  // A model whose update log reader is further behind than this (ms; 0: no bound) is not
  // ready: its rows are older than the log says they should be.
  int64_t updates_max_behind_ms = 0;
  // The row cache of a version whose tables are in the embedding store (rec.json "store").
  int64_t store_cache_bytes = int64_t{256} << 20;
  BatcherOptions batcher;
};

class ModelEntry {
 public:
  ModelEntry(ModelSpec spec, std::string dir, ModelStats* stats, const BatcherOptions& options);
  ~ModelEntry();

  const ModelSpec& spec() const { return spec_; }
  const std::string& dir() const { return dir_; }
  ModelStats* stats() const { return stats_; }
  Batcher& batcher() { return *batcher_; }
  std::shared_ptr<Runner> Current() const;
  // A version is served, and its update log reader (if any) is within the bound.
  bool Ready() const;
  void set_max_behind_ms(int64_t ms) { max_behind_ms_ = ms; }
  // Why no version is served (a service it needs was unavailable at load), or empty.
  std::string LoadError() const;
  void SetLoadError(std::string why);
  // The 503 / UNAVAILABLE a request to this model gets while no version is served.
  Status NotLoaded() const;
  // Serves `runner` (with its update log reader, or null) from now on; the old version's reader
  // stops here.
  void Swap(std::shared_ptr<Runner> runner, std::unique_ptr<UpdateSubscriber> subscriber);

 private:
  ModelSpec spec_;
  std::string dir_;
  ModelStats* stats_;
  int64_t max_behind_ms_ = 0;
  mutable std::mutex mu_;
  std::shared_ptr<Runner> current_;
  std::unique_ptr<UpdateSubscriber> subscriber_;  // under mu_
  std::string load_error_;                        // under mu_
  std::unique_ptr<Batcher> batcher_;              // last: it calls Current() from its threads
};

class ModelManager {
 public:
  ModelManager(ManagerOptions options, Metrics* metrics);
  ~ModelManager();

  // Loads every model. A model whose load found a service unavailable (its embedding store) is
  // kept unloaded and not ready, with the reason, and retried every few seconds; any other
  // failure is fatal at startup.
  Status LoadAll();
  ModelEntry* Find(const std::string& name);
  std::vector<ModelEntry*> All();
  // Loads the newest (or pinned) version of `name` if it differs from the served one, warms it
  // up and swaps it in. Safe to call from any thread.
  Status Reload(const std::string& name);
  // Every interval_s (0: never), loads a newer version directory if one appeared; models not
  // loaded yet retry every kRetryLoadS regardless.
  void StartPolling(int interval_s);
  static constexpr int kRetryLoadS = 2;
  // Stops polling and drains every batcher (in-flight requests finish).
  void Shutdown();

 private:
  Status LoadModel(const std::string& name);
  // Runs the version's rec.json batch probe on `runner`: refuses a version whose batch and
  // single-sample scores differ here, or serves it with a warning (allow_batch_variant).
  Status ProbeBatching(ModelEntry* entry, const std::string& version, Runner* runner);
  Status PickVersion(const ModelEntry& entry, std::string* version) const;
  // The embedding store of a version whose rec.json has a "store" section (else null).
  Status OpenStore(ModelEntry* entry, const std::filesystem::path& version_dir,
                   std::shared_ptr<EmbeddingStore>* out);
  // The reader of the update log for a freshly loaded version, or null (no log, or a version
  // that cannot take updates).
  Status StartUpdates(ModelEntry* entry, const std::string& version, Runner* runner,
                      std::unique_ptr<UpdateSubscriber>* out);
  void PollLoop(int interval_s);

  ManagerOptions options_;
  Metrics* metrics_;
  std::map<std::string, std::unique_ptr<ModelEntry>> models_;  // fixed after LoadAll
  std::mutex reload_mu_;
  std::map<std::string, std::string> last_error_;  // per model, under reload_mu_
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  bool stopping_ = false;
  std::thread poll_thread_;
};

}  // namespace rec
