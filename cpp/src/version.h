#pragma once

namespace rec {
inline constexpr const char* kServerName = "rec-server";
inline constexpr const char* kServerVersion = "0.1.0";
}  // namespace rec
