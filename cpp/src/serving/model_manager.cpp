#include "serving/model_manager.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "contract/repository_layout.h"
#include "model/aoti_model.h"
#include "model/batch_probe.h"
#include "model/torch_model.h"

namespace fs = std::filesystem;

namespace rec {
namespace {

bool IsNumber(const std::string& s) {
  return !s.empty() && s.size() < 18 && s.find_first_not_of("0123456789") == std::string::npos;
}

bool IsAoti(const std::string& platform) { return platform == "torch_aoti"; }

std::string ModelFileName(const ModelSpec& spec) {
  if (!spec.default_model_filename.empty()) return spec.default_model_filename;
  return IsAoti(spec.platform) ? kAotiFile : kTorchScriptFile;
}

// The model file of a version directory: the config's own, else the other format rec-server
// runs, so one model can move between TorchScript and AOTInductor versions by hot swap.
std::string VersionModelFile(const ModelSpec& spec, const fs::path& version_dir) {
  const std::string own = ModelFileName(spec);
  if (fs::exists(version_dir / own)) return own;
  for (const char* other : {kAotiFile, kTorchScriptFile}) {
    if (fs::exists(version_dir / other)) return other;
  }
  return "";
}

}  // namespace

ModelEntry::ModelEntry(ModelSpec spec, std::string dir, ModelStats* stats,
                       const BatcherOptions& options)
    : spec_(std::move(spec)), dir_(std::move(dir)), stats_(stats) {
  for (const SparseEncoding& e : spec_.sparse_encodings) {
    if (e.encoding == Encoding::kIntOrHash) stats_->CountNegativeIds(e.feature, 0);  // declared
  }
  batcher_ = std::make_unique<Batcher>(
      spec_, options, [this] { return Current(); }, stats_);
}

ModelEntry::~ModelEntry() {
  batcher_->Shutdown();
  subscriber_.reset();
}

bool ModelEntry::Ready() const {
  if (!Current()) return false;
  return !(stats_->has_updates && max_behind_ms_ > 0 &&
           stats_->updates.behind_ms.load() > max_behind_ms_);
}

std::string ModelEntry::LoadError() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_error_;
}

void ModelEntry::SetLoadError(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  load_error_ = std::move(why);
}

Status ModelEntry::NotLoaded() const {
  const std::string why = LoadError();
  return Unavailable("model '" + spec_.name + "' is not " +
                     (why.empty() ? std::string("loaded") : "ready: " + why));
}

std::shared_ptr<Runner> ModelEntry::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void ModelEntry::Swap(std::shared_ptr<Runner> runner,
                      std::unique_ptr<UpdateSubscriber> subscriber) {
  const bool reads_log = subscriber != nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_.swap(runner);
    subscriber_.swap(subscriber);
    load_error_.clear();
  }
  // The old reader stops (and joins) here, outside the lock; the old runner is released here or
  // by the last batch still running on it.
  subscriber.reset();
  if (!reads_log) {  // nothing reads a log now: no stale readiness or gauges from the last one
    stats_->has_updates = false;
    stats_->updates.behind_ms = 0;
    stats_->updates.connected = 0;
  }
}

ModelManager::ModelManager(ManagerOptions options, Metrics* metrics)
    : options_(std::move(options)), metrics_(metrics) {}

ModelManager::~ModelManager() { Shutdown(); }

Status ModelManager::LoadAll() {
  if (!fs::is_directory(options_.repository)) {
    return NotFound("model repository '" + options_.repository + "' is not a directory");
  }
  std::vector<std::string> names;
  if (!options_.model_name.empty()) {
    names.push_back(options_.model_name);
  } else {
    for (const auto& e : fs::directory_iterator(options_.repository)) {
      if (!fs::exists(e.path() / kTritonConfigFile)) continue;
      ModelSpec probe;
      // Other formats (ONNX, Python backend) share the repository; serve TorchScript and
      // AOTInductor packages.
      Status st = LoadModelSpec(e.path().string(), e.path().filename().string(), &probe);
      bool torch = probe.platform == "pytorch_libtorch" || probe.backend == "pytorch" ||
                   IsAoti(probe.platform);
      bool other_format = !torch && (!probe.platform.empty() || !probe.backend.empty());
      if (other_format) continue;
      if (!st.ok()) return st;
      names.push_back(e.path().filename().string());
    }
  }
  if (names.empty()) {
    return NotFound("no pytorch_libtorch or torch_aoti model in repository '" +
                    options_.repository + "'");
  }
  for (const std::string& name : names) REC_RETURN_IF_ERROR(LoadModel(name));
  return Status::Ok();
}

Status ModelManager::LoadModel(const std::string& name) {
  std::string dir = options_.repository + "/" + name;
  if (!fs::is_directory(dir)) {
    return NotFound("model '" + name + "' not found in repository '" + options_.repository + "'");
  }
  ModelSpec spec;
  REC_RETURN_IF_ERROR(LoadModelSpec(dir, name, &spec));
  auto entry = std::make_unique<ModelEntry>(std::move(spec), dir, metrics_->ForModel(name),
                                            options_.batcher);
  ModelEntry* raw = entry.get();
  raw->set_max_behind_ms(options_.updates_max_behind_ms);
  models_[name] = std::move(entry);
  Status st = Reload(raw->spec().name);
  if (st.code() != StatusCode::kUnavailable) return st;
  // A store that is down now may be up in a minute: serve the other models, say why this one
  // is not ready, and retry.
  raw->SetLoadError(st.message());
  LogWarning("model '" + name + "' is not ready: " + st.message() + "; retrying every " +
             std::to_string(kRetryLoadS) + " s");
  return Status::Ok();
}

Status ModelManager::PickVersion(const ModelEntry& entry, std::string* version) const {
  int64_t best = -1;
  const std::string file = ModelFileName(entry.spec());
  for (const auto& e : fs::directory_iterator(entry.dir())) {
    std::string v = e.path().filename().string();
    if (!IsNumber(v) || VersionModelFile(entry.spec(), e.path()).empty()) continue;
    int64_t n = std::stoll(v);
    if (options_.pinned_version > 0 && n != options_.pinned_version) continue;
    best = std::max(best, n);
  }
  if (best < 0) {
    return NotFound("model '" + entry.spec().name + "': no version directory with " + file +
                    (options_.pinned_version > 0
                         ? " for pinned version " + std::to_string(options_.pinned_version)
                         : std::string()));
  }
  *version = std::to_string(best);
  return Status::Ok();
}

Status ModelManager::Reload(const std::string& name) {
  std::lock_guard<std::mutex> lock(reload_mu_);
  ModelEntry* entry = Find(name);
  if (entry == nullptr) return NotFound("unknown model '" + name + "'");
  std::string version;
  REC_RETURN_IF_ERROR(PickVersion(*entry, &version));
  std::shared_ptr<Runner> current = entry->Current();
  if (current && current->version() == version) return Status::Ok();
  const fs::path version_dir = fs::path(entry->dir()) / version;
  const std::string file = VersionModelFile(entry->spec(), version_dir);
  std::string path = (version_dir / file).string();
  std::shared_ptr<Runner> runner;
  UpdatesSpec updates;
  Status st = ReadUpdatesSpec((version_dir / kManifestFile).string(), entry->spec(), &updates);
  if (st.ok() && file == kAotiFile) {
    const int concurrency = options_.batcher.executor_threads > 0
                                ? options_.batcher.executor_threads
                                : entry->spec().instance_count;
    st = LoadAotiModel(path, (version_dir / kManifestFile).string(), entry->spec(), version,
                       concurrency, &runner, updates);
  } else if (st.ok()) {
    std::shared_ptr<EmbeddingStore> store;
    st = OpenStore(entry, version_dir, &store);
    if (st.ok()) st = LoadTorchModel(path, entry->spec(), version, &runner, updates, store);
  }
  if (st.ok()) st = ProbeBatching(entry, version, runner.get());
  std::unique_ptr<UpdateSubscriber> subscriber;
  if (st.ok()) st = StartUpdates(entry, version, runner.get(), &subscriber);
  if (!st.ok()) {
    // Polling retries a broken version every interval; say so once, not every time.
    std::string line =
        "load of model '" + name + "' version " + version + " failed: " + st.message();
    if (last_error_[name] != line) LogError(line);
    last_error_[name] = line;
    return st;
  }
  last_error_.erase(name);
  entry->Swap(runner, std::move(subscriber));
  metrics_->SetVersion(name, version);
  if (current) {
    LogInfo("swapped model '" + name + "' version " + current->version() + " -> " + version);
  } else {
    LogInfo("loaded model '" + name + "' version " + version + " from " + path);
  }
  return Status::Ok();
}

Status ModelManager::OpenStore(ModelEntry* entry, const std::filesystem::path& version_dir,
                               std::shared_ptr<EmbeddingStore>* out) {
  const std::string manifest = (version_dir / kManifestFile).string();
  std::ifstream in(manifest);
  if (!in) return Status::Ok();  // no rec.json of its own: no stored tables
  std::stringstream text;
  text << in.rdbuf();
  StoreSpec spec;
  Status st = ParseStoreSection(text.str(), manifest, &spec);
  if (!st.ok() || !spec.present) return st;
  StoreOptions options;
  options.cache_bytes = options_.store_cache_bytes;
  entry->stats()->has_store.store(true);
  return EmbeddingStore::Open(spec, options, &entry->stats()->store, out);
}

Status ModelManager::StartUpdates(ModelEntry* entry, const std::string& version, Runner* runner,
                                  std::unique_ptr<UpdateSubscriber>* out) {
  std::shared_ptr<EmbeddingTables> tables = runner->tables();
  std::string url =
      options_.updates_url.empty() && tables ? tables->spec().url : options_.updates_url;
  if (url.empty() || url == "none") return Status::Ok();
  const std::string& name = entry->spec().name;
  if (!tables) {
    if (options_.updates_url.empty()) return Status::Ok();
    LogWarning("model '" + name + "' version " + version +
               " cannot take updates (its rec.json has no \"updates\": a TorchScript export "
               "of this rec writes one); serving it without --updates");
    return Status::Ok();
  }
  UpdateUrl where;
  Status st = ParseUpdateUrl(url, &where);
  if (!st.ok()) return InvalidArgument("model '" + name + "': " + st.message());
  entry->stats()->has_updates = true;
  *out = std::make_unique<UpdateSubscriber>(name, where, tables, &entry->stats()->updates,
                                            options_.updates_max_behind_ms);
  return Status::Ok();
}

Status ModelManager::ProbeBatching(ModelEntry* entry, const std::string& version, Runner* runner) {
  BatchProbe probe;
  const std::string manifest = entry->dir() + "/" + version + "/" + kManifestFile;
  REC_RETURN_IF_ERROR(ReadBatchProbe(manifest, entry->spec(), &probe));
  if (!probe.present) return Status::Ok();
  double diff = 0;
  REC_RETURN_IF_ERROR(RunBatchProbe(runner, entry->spec(), probe, &diff));
  if (diff == 0) {
    entry->stats()->batch_variant = 0;
    LogInfo("model '" + entry->spec().name + "' version " + version + ": batch probe passed on " +
            CpuDescription() + " (" + std::to_string(probe.rows) +
            " samples, one batch == one by one)");
    return Status::Ok();
  }
  std::ostringstream what;
  what << "model '" << entry->spec().name << "' version " << version
       << " is not batch invariant on this CPU, " << CpuDescription() << ": its rec.json probe of "
       << probe.rows << " samples scores them differently as one batch than one by one (max diff "
       << diff << "); export verified it on " << probe.verified_on;
  if (!options_.allow_batch_variant) {
    return InvalidArgument(what.str() + ". Serve it anyway with --allow-batch-variant");
  }
  LogWarning(what.str() + "; serving it anyway (--allow-batch-variant)");
  entry->stats()->batch_variant = 1;
  return Status::Ok();
}

ModelEntry* ModelManager::Find(const std::string& name) {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second.get();
}

std::vector<ModelEntry*> ModelManager::All() {
  std::vector<ModelEntry*> all;
  for (auto& [name, entry] : models_) all.push_back(entry.get());
  return all;
}

void ModelManager::StartPolling(int interval_s) {
  bool unloaded = false;
  for (ModelEntry* e : All()) unloaded = unloaded || !e->Current();
  if (interval_s <= 0 && !unloaded) return;
  poll_thread_ = std::thread([this, interval_s] { PollLoop(interval_s); });
}

void ModelManager::PollLoop(int interval_s) {
  using Clock = std::chrono::steady_clock;
  const int tick_s = interval_s > 0 ? std::min(interval_s, kRetryLoadS) : kRetryLoadS;
  Clock::time_point next_scan = Clock::now() + std::chrono::seconds(interval_s);
  std::unique_lock<std::mutex> lock(poll_mu_);
  while (!poll_cv_.wait_for(lock, std::chrono::seconds(tick_s), [this] { return stopping_; })) {
    lock.unlock();
    const bool scan = interval_s > 0 && Clock::now() >= next_scan;
    if (scan) next_scan = Clock::now() + std::chrono::seconds(interval_s);
    for (ModelEntry* e : All()) {
      if (!scan && e->Current()) continue;
      Status st = Reload(e->spec().name);  // failures are logged; a served version stays
      if (!st.ok() && !e->Current()) e->SetLoadError(st.message());
    }
    lock.lock();
  }
}

void ModelManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(poll_mu_);
    stopping_ = true;
  }
  poll_cv_.notify_all();
  if (poll_thread_.joinable()) poll_thread_.join();
  for (ModelEntry* e : All()) e->batcher().Shutdown();
}

}  // namespace rec
