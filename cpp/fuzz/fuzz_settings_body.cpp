// A logging or trace settings body (POST /v2/logging, /v2[/models/<m>]/trace/setting): the first
// byte picks which, and for traces the global or a model's settings; the rest is the body.
// Parses, applies as a network client would, and reads the settings back as HttpApi does.
#include <cstddef>
#include <cstdint>
#include <string>

#include "observability/settings_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    rec::LogSettings updates;
    if (rec::LogUpdatesFromJson(body, &updates).ok()) {
      (void)rec::UpdateLogSettings(updates, /*from_network=*/true);
    }
    (void)rec::LogSettingsToJson(rec::CurrentLogSettings());
  } else {
    const std::string model = data[0] % 4 == 1 ? "" : "rec";
    rec::TraceUpdates updates;
    if (rec::TraceUpdatesFromJson(body, &updates).ok()) {
      (void)rec::Tracer::Get().Update(model, updates);
    }
    (void)rec::TraceSettingsToJson(rec::Tracer::Get().Settings(model));
  }
  return 0;
}
