// The JSON bodies of Triton's logging and trace extensions over HTTP (POST /v2/logging, POST
// /v2[/models/<m>]/trace/setting) to updates, and settings back to JSON. Nothing is applied here.
#pragma once

#include <string>

#include "common/log.h"
#include "common/status.h"
#include "observability/trace.h"

namespace rec {

// An object of bools, unsigned 32-bit integers and strings; InvalidArgument naming what is not.
Status LogUpdatesFromJson(const std::string& body, LogSettings* updates);
std::string LogSettingsToJson(const LogSettings& settings);

// An object of strings, arrays of strings and nulls (null: clear a model's own setting).
Status TraceUpdatesFromJson(const std::string& body, TraceUpdates* updates);
// trace_level as an array, the rest as strings, as Triton answers.
std::string TraceSettingsToJson(const TraceSettings& settings);

}  // namespace rec
