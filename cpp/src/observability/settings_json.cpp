#include "observability/settings_json.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <variant>

namespace rec {

using json = nlohmann::json;

Status LogUpdatesFromJson(const std::string& body, LogSettings* updates) {
  json in = json::parse(body, nullptr, false);
  if (in.is_discarded() || !in.is_object()) {
    return InvalidArgument("log settings must be a JSON object");
  }
  for (auto& [name, v] : in.items()) {
    if (v.is_boolean()) {
      updates->emplace_back(name, v.get<bool>());
    } else if (v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX) {
      updates->emplace_back(name, static_cast<uint32_t>(v.get<uint64_t>()));
    } else if (v.is_string()) {
      updates->emplace_back(name, v.get<std::string>());
    } else {
      return InvalidArgument("log setting '" + name.substr(0, 60) +
                             "' must be a bool, an unsigned 32-bit integer or a string, got " +
                             v.dump().substr(0, 80));
    }
  }
  return Status::Ok();
}

std::string LogSettingsToJson(const LogSettings& settings) {
  json out = json::object();
  for (const auto& [name, value] : settings) {
    std::visit([&out, &name = name](const auto& x) { out[name] = x; }, value);
  }
  return out.dump();
}

Status TraceUpdatesFromJson(const std::string& body, TraceUpdates* updates) {
  json in = json::parse(body, nullptr, false);
  if (in.is_discarded() || !in.is_object()) {
    return InvalidArgument("trace settings must be a JSON object");
  }
  for (auto& [name, v] : in.items()) {
    std::vector<std::string> values;
    bool ok = v.is_null() || v.is_string() || v.is_array();
    if (v.is_string()) values.push_back(v.get<std::string>());
    for (const json& x : v.is_array() ? v : json::array()) {
      ok = ok && x.is_string();
      if (x.is_string()) values.push_back(x.get<std::string>());
    }
    if (!ok) {
      return InvalidArgument("trace setting '" + name.substr(0, 60) +
                             "' must be a string, an array of strings or null, got " +
                             v.dump().substr(0, 80));
    }
    updates->emplace_back(name, v.is_null() ? std::nullopt : std::optional(std::move(values)));
  }
  return Status::Ok();
}

std::string TraceSettingsToJson(const TraceSettings& settings) {
  json out = json::object();
  for (const auto& [name, values] : settings) {
    out[name] = name == "trace_level" ? json(values) : json(values.empty() ? "" : values[0]);
  }
  return out.dump();
}

}  // namespace rec
