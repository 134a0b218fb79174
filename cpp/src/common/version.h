#pragma once

namespace rec {
inline constexpr const char* kServerName = "rec-server";
inline constexpr const char* kServerVersion = "0.1.0";
// The KServe / Triton protocol extensions both endpoints answer (server metadata lists them).
inline constexpr const char* kServerExtensions[] = {
    "binary_tensor_data",  "statistics", "model_repository", "logging", "trace",
    "system_shared_memory"};
}  // namespace rec
