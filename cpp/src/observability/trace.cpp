#include "observability/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "observability/metrics.h"

namespace rec {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// One integer in [min, max] from a setting's single string, or InvalidArgument naming it.
Status ParseInteger(const std::string& name, const std::vector<std::string>& value, long long min,
                    long long* out) {
  std::string what = name + " must be one integer >= " + std::to_string(min) + " (as a string)";
  if (value.size() != 1) {
    return InvalidArgument(what + ", got " + std::to_string(value.size()) + " values");
  }
  const std::string& v = value[0];
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < min) {
    return InvalidArgument(what + ", got \"" + v.substr(0, 40) + "\"");
  }
  *out = n;
  return Status::Ok();
}

bool WriteFile(const std::string& path, const std::string& body) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  bool ok = std::fwrite(body.data(), 1, body.size(), f) == body.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace

void Trace::Stamp(const char* name, uint64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  stamps_.emplace_back(name, ns);
}

void Trace::Stamp(const char* name) { Stamp(name, NowNs()); }

void Trace::SetVersion(const std::string& version) {
  std::lock_guard<std::mutex> lock(mu_);
  version_ = version;
}

void Trace::AppendJson(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = std::to_string(id_);
  // Triton writes the version as a number; rec's version directories are numbers.
  bool numeric = !version_.empty() && version_.find_first_not_of("0123456789") == std::string::npos;
  *out += "{\"id\":" + id + ",\"model_name\":" + JsonString(model_) +
          ",\"model_version\":" + (numeric ? version_ : JsonString(version_)) + "}";
  for (const auto& [name, ns] : stamps_) {
    *out += ",{\"id\":" + id + ",\"timestamps\":[{\"name\":\"" + name +
            "\",\"ns\":" + std::to_string(ns) + "}]}";
  }
}

Tracer& Tracer::Get() {
  static Tracer* tracer = new Tracer();  // never destroyed: executors may finish traces at exit
  return *tracer;
}

void Tracer::Configure(const std::string& file) {
  std::lock_guard<std::mutex> lock(mu_);
  file_ = file;
}

TraceSettings Tracer::Settings(const std::string& model) {
  std::lock_guard<std::mutex> lock(mu_);
  Config c = global_;
  auto it = models_.find(model);
  if (!model.empty() && it != models_.end()) {
    const Config& m = it->second;
    if (m.on) c.on = m.on;
    if (m.rate) c.rate = m.rate;
    if (m.count) c.count = m.count;
    if (m.log_frequency) c.log_frequency = m.log_frequency;
  }
  return {{"trace_level", {*c.on ? "TIMESTAMPS" : "OFF"}},
          {"trace_rate", {std::to_string(*c.rate)}},
          {"trace_count", {std::to_string(*c.count)}},
          {"log_frequency", {std::to_string(*c.log_frequency)}},
          {"trace_file", {file_}},
          {"trace_mode", {"triton"}}};
}

Status Tracer::Update(const std::string& model, const TraceUpdates& updates) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool global = model.empty();
  Config c = global ? global_ : models_[model];
  const Config defaults = Defaults();
  for (const auto& [name, value] : updates) {
    // An absent or empty value clears: a model follows the global setting again, the global
    // setting goes back to its default.
    bool clear = !value || value->empty();
    long long n = 0;
    if (name == "trace_level") {
      bool on = false;
      for (const std::string& level : clear ? std::vector<std::string>{} : *value) {
        if (level == "TIMESTAMPS") {
          on = true;
        } else if (level == "TENSORS") {
          return InvalidArgument(
              "trace_level TENSORS is not supported by rec-server; use "
              "TIMESTAMPS (or OFF)");
        } else if (level != "OFF") {
          return InvalidArgument("trace_level must be OFF or TIMESTAMPS, got \"" +
                                 level.substr(0, 40) + "\"");
        }
      }
      c.on = clear ? (global ? defaults.on : std::nullopt) : std::optional<bool>(on);
    } else if (name == "trace_rate") {
      if (!clear) REC_RETURN_IF_ERROR(ParseInteger(name, *value, 1, &n));
      c.rate = clear ? (global ? defaults.rate : std::nullopt) : std::optional<uint64_t>(n);
      c.seen = 0;
    } else if (name == "trace_count") {
      if (!clear) REC_RETURN_IF_ERROR(ParseInteger(name, *value, -1, &n));
      c.count = clear ? (global ? defaults.count : std::nullopt) : std::optional<int64_t>(n);
    } else if (name == "log_frequency") {
      if (!clear) REC_RETURN_IF_ERROR(ParseInteger(name, *value, 0, &n));
      c.log_frequency =
          clear ? (global ? defaults.log_frequency : std::nullopt) : std::optional<uint64_t>(n);
    } else if (name == "trace_file") {
      return InvalidArgument(
          "trace_file cannot be changed over the network (it names a file the server would "
          "write); start rec-server with --trace-file PATH");
    } else if (name == "trace_mode") {
      if (!clear && (value->size() != 1 || (*value)[0] != "triton")) {
        return InvalidArgument("trace_mode must be \"triton\" (Triton's JSON trace format)");
      }
    } else {
      return InvalidArgument("unknown trace setting '" + name.substr(0, 60) +
                             "'; the settings are trace_level, trace_rate, trace_count, "
                             "log_frequency, trace_file, trace_mode");
    }
  }
  if (c.on.value_or(false) && file_.empty()) {
    return InvalidArgument("tracing needs a trace file: start rec-server with --trace-file PATH");
  }
  if (global) {
    global_ = c;
  } else {
    models_[model] = c;
  }
  bool on = *global_.on;
  for (const auto& [name, m] : models_) on = on || m.on.value_or(false);
  any_on_.store(on, std::memory_order_relaxed);
  return Status::Ok();
}

Tracer::Config* Tracer::CountOwner(const std::string& model) {
  auto it = models_.find(model);
  return it != models_.end() && it->second.count ? &it->second : &global_;
}

std::shared_ptr<Trace> Tracer::Start(const std::string& model) {
  if (!any_on_.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  Config* m = it != models_.end() ? &it->second : nullptr;
  if (!(m && m->on ? *m->on : *global_.on)) return nullptr;
  Config* rate = m && m->rate ? m : &global_;
  Config* count = CountOwner(model);
  if (*count->count == 0) return nullptr;
  if (++rate->seen % *rate->rate != 0) return nullptr;
  if (*count->count > 0) --*count->count;
  return std::make_shared<Trace>(next_id_.fetch_add(1), model);
}

void Tracer::Finish(const std::shared_ptr<Trace>& trace) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t frequency = *global_.log_frequency;
  if (frequency == 0) {
    if (!all_json_.empty()) all_json_ += ",";
    trace->AppendJson(&all_json_);
  } else {
    kept_.push_back(trace);
    if (kept_.size() < frequency) return;
  }
  // Every `frequency` traces, or (frequency 0) once the count is used up.
  if (frequency > 0 || *CountOwner(trace->model())->count == 0) WriteLocked();
}

void Tracer::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  WriteLocked();
}

void Tracer::WriteLocked() {
  if (file_.empty()) return;
  std::string path = file_, body;
  if (!kept_.empty()) {
    path += "." + std::to_string(file_index_++);
    for (const auto& t : kept_) {
      if (!body.empty()) body += ",";
      t->AppendJson(&body);
    }
    kept_.clear();
  } else if (!all_json_.empty()) {
    body = all_json_;
  } else {
    return;
  }
  if (!WriteFile(path, "[" + body + "]")) {
    LogError("trace file '" + path + "' could not be written: " + std::strerror(errno));
  }
}

}  // namespace rec
