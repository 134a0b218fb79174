// A gtest fixture for tests that read a file they write: kept apart from test_util.h, which the
// fuzz targets include and which must not need gtest.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace rec::testing {

// A test that writes one file (a manifest) into the temp directory, named after the test, and
// removes it afterwards.
class TempFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const ::testing::UnitTest* unit = ::testing::UnitTest::GetInstance();
    path_ = std::filesystem::temp_directory_path() /
            ("rec_" + std::to_string(unit->random_seed()) + "_" +
             unit->current_test_info()->test_suite_name() + "_" +
             unit->current_test_info()->name() + ".json");
    std::ofstream(path_) << text;
    return path_.string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

}  // namespace rec::testing
