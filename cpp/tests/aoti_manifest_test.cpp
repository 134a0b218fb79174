// rec.json's "aoti" section as rec-server reads it, and the refusal of a package whose ISA this
// CPU lacks (checked before the package's compiled code could run and die with SIGILL).
#include "model/aoti_manifest.h"

#include <gtest/gtest.h>

#include <string>

#include "temp_file_test.h"
#include "test_util.h"

namespace rec {
namespace {

const char* kSection = R"({"aoti": {"cpu_isa": "avx512", "march": "x86-64-v4",
  "required_cpu_flags": ["avx2", "avx512f"], "tables_file": "tables.bin",
  "tables": [{"name": "lookup.weights_host", "offset": 0, "bytes": 96},
             {"name": "lookup.sequences.weights_host", "offset": 128, "bytes": 32}]}})";

using ManifestFile = testing::TempFileTest;

TEST_F(ManifestFile, ReadsTheTargetAndTheTables) {
  AotiManifest m;
  ASSERT_TRUE(ReadAotiManifest(Write(kSection), &m).ok());
  EXPECT_EQ(m.cpu_isa, "avx512");
  EXPECT_EQ(m.march, "x86-64-v4");
  EXPECT_EQ(m.required_cpu_flags, (std::vector<std::string>{"avx2", "avx512f"}));
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[1].offset, 128);
  EXPECT_EQ(m.tables[1].bytes, 32);
}

TEST_F(ManifestFile, RefusesWhatCannotDescribeAPackage) {
  AotiManifest m;
  const std::pair<std::string, std::string> cases[] = {
      {R"({"format": "torchscript"})", "section is missing"},
      {R"({"aoti": {"cpu_isa": "avx2"}})", "malformed"},
      {R"({"aoti": {"cpu_isa": "avx2", "march": "x86-64-v3", "required_cpu_flags": [],
          "tables_file": "../etc/passwd", "tables": []}})",
       "file name beside model.pt2"},
      {R"({"aoti": {"cpu_isa": "avx2", "march": "x86-64-v3", "required_cpu_flags": [],
          "tables_file": "t.bin", "tables": [{"name": "x", "offset": -1, "bytes": 3}]}})",
       "negative span"},
      {"not json", "malformed"},
  };
  for (const auto& [text, expected] : cases) {
    Status st = ReadAotiManifest(Write(text), &m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
  }
  Status missing = ReadAotiManifest("/nonexistent/rec.json", &m);
  EXPECT_NE(missing.message().find("is missing"), std::string::npos) << missing.message();
}

TEST(AotiCpu, NamesTheIsaAndWhatThisCpuLacks) {
  AotiManifest m;
  m.cpu_isa = "avx512";
  m.march = "x86-64-v4";
  m.required_cpu_flags = {"avx2", "avx512f", "avx512bw"};
  EXPECT_TRUE(CheckAotiCpu(m, {"fma", "avx2", "avx512f", "avx512bw"}, "p/model.pt2").ok());
  Status st = CheckAotiCpu(m, {"fma", "avx2"}, "p/model.pt2");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("p/model.pt2 was compiled for avx512 (x86-64-v4)"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("lacks avx512f, avx512bw"), std::string::npos) << st.message();
  EXPECT_EQ(MissingCpuFlags({"a", "b"}, {"b"}), std::vector<std::string>{"a"});
  EXPECT_FALSE(CpuFlags().empty());  // this machine's /proc/cpuinfo
}

TEST(AotiCpu, IsaCapHidesWhatIsAboveIt) {
  EXPECT_FALSE(HiddenByIsaCap("avx512f", ""));
  EXPECT_TRUE(HiddenByIsaCap("amx_tile", "avx512"));
  EXPECT_FALSE(HiddenByIsaCap("avx512_vnni", "avx512"));
  EXPECT_TRUE(HiddenByIsaCap("avx512bw", "avx2"));
  EXPECT_FALSE(HiddenByIsaCap("avx2", "avx2"));
  EXPECT_FALSE(HiddenByIsaCap("fma", "avx2"));
  EXPECT_TRUE(HiddenByIsaCap("avx2", "scalar"));
  EXPECT_TRUE(HiddenByIsaCap("fma", "scalar"));
  EXPECT_FALSE(HiddenByIsaCap("sse4_2", "scalar"));
}

}  // namespace
}  // namespace rec
