// One line per event (start, load, swap, shutdown, error) on stderr; nothing per request.
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace rec {

inline void LogLine(const char* level, const std::string& message) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::fprintf(stderr, "%s %s rec-server: %s\n", stamp, level, message.c_str());
  std::fflush(stderr);
}

inline void LogInfo(const std::string& message) { LogLine("INFO", message); }
inline void LogWarning(const std::string& message) { LogLine("WARNING", message); }
inline void LogError(const std::string& message) { LogLine("ERROR", message); }

}  // namespace rec
