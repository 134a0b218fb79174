// One line per event (start, load, swap, shutdown, error) on stderr or the log file; per request
// or per batch only at a verbose level a client asks for. The settings are Triton's logging
// extension (GET/POST /v2/logging, the LogSettings RPC) and change on a running server.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace rec {

// A setting's value as both protocols carry it: a bool, an unsigned integer or a string.
using LogSettingValue = std::variant<bool, uint32_t, std::string>;
using LogSettings = std::vector<std::pair<std::string, LogSettingValue>>;

// Every setting, in Triton's names: log_file ("" is stderr), log_info, log_warning, log_error,
// log_verbose_level, log_format ("default" or "ISO8601").
LogSettings CurrentLogSettings();
// Checks every update (names, types, the format, that the file opens) before applying any:
// a bad one is InvalidArgument naming it and changes nothing. A network client may not move
// the log to a file (`from_network`): it would choose a path the server appends to, so as in
// Triton only the command line (--log-file) sets it.
Status UpdateLogSettings(const LogSettings& updates, bool from_network);

void LogInfo(const std::string& message);
void LogWarning(const std::string& message);
void LogError(const std::string& message);
// Written when the verbose level is at least `level` (1: a line per executed batch).
bool LogVerboseOn(uint32_t level);
void LogVerbose(uint32_t level, const std::string& message);

}  // namespace rec
