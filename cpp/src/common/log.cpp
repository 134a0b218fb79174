#include "common/log.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace rec {
namespace {

struct LogState {
  std::mutex mu;  // guards file, path, iso_format and each line's write
  std::FILE* file = nullptr;
  std::string path;
  bool iso_format = false;
  std::atomic<bool> info{true}, warning{true}, error{true};
  std::atomic<uint32_t> verbose{0};
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: threads may log during exit
  return *state;
}

void Write(const char* level, char letter, const std::string& message) {
  LogState& s = State();
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::lock_guard<std::mutex> lock(s.mu);
  std::FILE* out = s.file != nullptr ? s.file : stderr;
  if (s.iso_format) {
    std::fprintf(out, "%s %c rec-server] %s\n", stamp, letter, message.c_str());
  } else {
    std::fprintf(out, "%s %s rec-server: %s\n", stamp, level, message.c_str());
  }
  std::fflush(out);
}

const char* const kBoolSettings[] = {"log_info", "log_warning", "log_error"};

std::string TypeName(const LogSettingValue& v) {
  if (std::holds_alternative<bool>(v)) return "a bool";
  if (std::holds_alternative<uint32_t>(v)) return "an unsigned integer";
  return "a string";
}

}  // namespace

LogSettings CurrentLogSettings() {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return {{"log_file", s.path},
          {"log_info", s.info.load()},
          {"log_warning", s.warning.load()},
          {"log_error", s.error.load()},
          {"log_verbose_level", s.verbose.load()},
          {"log_format", std::string(s.iso_format ? "ISO8601" : "default")}};
}

Status UpdateLogSettings(const LogSettings& updates, bool from_network) {
  auto expect = [](const std::string& name, const LogSettingValue& v, const char* want,
                   bool ok) -> Status {
    if (ok) return Status::Ok();
    return InvalidArgument("log setting '" + name + "' must be " + want + ", got " + TypeName(v));
  };
  std::FILE* new_file = nullptr;
  const std::string* new_path = nullptr;
  for (const auto& [name, value] : updates) {
    Status st;
    bool known = name == "log_file" || name == "log_verbose_level" || name == "log_format";
    for (const char* b : kBoolSettings) known = known || name == b;
    if (!known) {
      st = InvalidArgument("unknown log setting '" + name +
                           "'; the settings are log_file, log_info, log_warning, log_error, "
                           "log_verbose_level, log_format");
    } else if (name == "log_verbose_level") {
      st = expect(name, value, "an unsigned integer", std::holds_alternative<uint32_t>(value));
    } else if (name == "log_file" || name == "log_format") {
      st = expect(name, value, "a string", std::holds_alternative<std::string>(value));
      if (st.ok() && name == "log_format") {
        const auto& f = std::get<std::string>(value);
        if (f != "default" && f != "ISO8601") {
          st = InvalidArgument("log_format must be \"default\" or \"ISO8601\", got \"" + f + "\"");
        }
      }
      if (st.ok() && name == "log_file" && from_network) {
        st = InvalidArgument(
            "log_file cannot be changed over the network (it names a file the server would "
            "write); start rec-server with --log-file PATH");
      }
      if (st.ok() && name == "log_file") new_path = &std::get<std::string>(value);
    } else {
      st = expect(name, value, "a bool", std::holds_alternative<bool>(value));
    }
    if (!st.ok()) return st;
  }
  if (new_path != nullptr && !new_path->empty()) {
    new_file = std::fopen(new_path->c_str(), "a");
    if (new_file == nullptr) {
      return InvalidArgument("log_file '" + *new_path +
                             "' cannot be opened for appending: " + std::strerror(errno));
    }
  }
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [name, value] : updates) {
    if (name == "log_info") s.info = std::get<bool>(value);
    if (name == "log_warning") s.warning = std::get<bool>(value);
    if (name == "log_error") s.error = std::get<bool>(value);
    if (name == "log_verbose_level") s.verbose = std::get<uint32_t>(value);
    if (name == "log_format") s.iso_format = std::get<std::string>(value) == "ISO8601";
  }
  if (new_path != nullptr) {
    if (s.file != nullptr) std::fclose(s.file);
    s.file = new_file;
    s.path = *new_path;
  }
  return Status::Ok();
}

void LogInfo(const std::string& message) {
  if (State().info) Write("INFO", 'I', message);
}
void LogWarning(const std::string& message) {
  if (State().warning) Write("WARNING", 'W', message);
}
void LogError(const std::string& message) {
  if (State().error) Write("ERROR", 'E', message);
}
bool LogVerboseOn(uint32_t level) {
  return State().verbose.load(std::memory_order_relaxed) >= level;
}
void LogVerbose(uint32_t level, const std::string& message) {
  if (LogVerboseOn(level)) Write("VERBOSE", 'V', message);
}

}  // namespace rec
