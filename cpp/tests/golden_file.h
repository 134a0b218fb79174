// Reading the golden files that Python's tests load too (tests/data/*_golden.json, REC_TEST_DATA).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/status.h"

namespace rec::testing {

// The file's JSON object; a test failure (and an empty object) when it cannot be read.
inline nlohmann::json Golden(const std::string& name) {
  const std::string path = std::string(REC_TEST_DATA) + "/" + name;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  // Integers parse exactly (int64 / uint64), never through double.
  nlohmann::json golden = nlohmann::json::parse(ss.str(), nullptr, false);
  EXPECT_TRUE(golden.is_object()) << "cannot read " << path;
  return golden.is_object() ? golden : nlohmann::json::object();
}

// A list of cases, failing the test when the file has none (a renamed key would pass vacuously).
inline const nlohmann::json& Cases(const nlohmann::json& parent, const char* key) {
  static const nlohmann::json kNone = nlohmann::json::array();
  const bool listed = parent.contains(key) && parent[key].is_array() && !parent[key].empty();
  EXPECT_TRUE(listed) << "no cases under '" << key << "'";
  return listed ? parent[key] : kNone;
}

inline bool Contains(const Status& st, const std::string& error) {
  return st.message().find(error) != std::string::npos;
}

}  // namespace rec::testing
