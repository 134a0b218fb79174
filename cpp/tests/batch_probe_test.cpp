// The load-time batch probe: rec.json's request read and checked, split into single rows, and
// a runner whose batch differs from its rows caught.
#include "model/batch_probe.h"

#include <gtest/gtest.h>

#include <string>

#include "model/context_request.h"
#include "temp_file_test.h"
#include "test_util.h"

namespace rec {
namespace {

// Two rows: dense [2], lengths [3] (row 0: 1, 0, 2 ids; row 1: 0, 1, 0), five ids.
const char* kProbe = R"("batch_probe": {
  "dense_features": [[0.5, -1.0], [2.0, 3.0]],
  "sparse_lengths": [[1, 0, 2], [0, 1, 0]],
  "sparse_values": [7, -9223372036854775807, 42, 5]})";

using ProbeFile = testing::TempFileTest;

std::string Manifest(const std::string& probe, bool invariant = true) {
  return std::string(R"({"dense": {"batch_invariant": )") + (invariant ? "true" : "false") +
         R"(, "verified_on": {"model": "CPU X"}}, )" + probe + "}";
}

TEST_F(ProbeFile, ReadsTheRequestAndSlicesRows) {
  ModelSpec spec = testing::MakeSpec();
  BatchProbe probe;
  ASSERT_TRUE(ReadBatchProbe(Write(Manifest(kProbe)), spec, &probe).ok());
  ASSERT_TRUE(probe.present);
  EXPECT_EQ(probe.rows, 2);
  EXPECT_EQ(probe.verified_on, "CPU X");
  EXPECT_EQ(probe.batch[2].As<int64_t>()[1], -9223372036854775807LL);  // not through a double
  std::vector<Tensor> row1 = SliceRow(spec, probe.batch, 1);
  EXPECT_EQ(row1[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(row1[0].As<float>()[1], 3.0f);
  ASSERT_EQ(row1[2].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(row1[2].As<int64_t>()[0], 5);  // row 1's one id: after row 0's three
}

TEST_F(ProbeFile, AbsentWhenNotClaimedOrMissing) {
  ModelSpec spec = testing::MakeSpec();
  BatchProbe probe;
  ASSERT_TRUE(ReadBatchProbe(Write(Manifest(kProbe, false)), spec, &probe).ok());
  EXPECT_FALSE(probe.present);
  ASSERT_TRUE(ReadBatchProbe(Write(R"({"dense": {"batch_invariant": true}})"), spec, &probe).ok());
  EXPECT_FALSE(probe.present);
  ASSERT_TRUE(ReadBatchProbe("/nonexistent/rec.json", spec, &probe).ok());
  EXPECT_FALSE(probe.present);
}

TEST_F(ProbeFile, RefusesAProbeThatDisagreesWithItself) {
  ModelSpec spec = testing::MakeSpec();
  BatchProbe probe;
  const std::pair<std::string, std::string> bad[] = {
      {R"("batch_probe": {"dense_features": [[1, 2]], "sparse_lengths": [[1, 0, 0]],
          "sparse_values": [1, 2]})",
       "ids but its lengths count"},
      {R"("batch_probe": {"dense_features": [], "sparse_lengths": [[0, 0, 0]],
          "sparse_values": []})",
       "must be a non-empty array"},
      {R"("batch_probe": {"dense_features": [[1, 2], [3, 4]], "sparse_lengths": [[0, 0, 0]],
          "sparse_values": [1]})",
       "different numbers of rows"},
      {R"("batch_probe": {"dense_features": [[1, 2, 3]], "sparse_lengths": [[0, 0, 1]],
          "sparse_values": [1]})",
       "the model takes 2"},
      {R"("batch_probe": {"dense_features": [[1, 2]], "sparse_lengths": [[-1, 0, 2]],
          "sparse_values": [1]})",
       "whole counts"},
      {R"("batch_probe": {"dense_features": [[1, 2]], "sparse_lengths": [[0, 0, 1]]})",
       "has no input 'sparse_values'"},
  };
  for (const auto& [text, expected] : bad) {
    Status st = ReadBatchProbe(Write(Manifest(text)), spec, &probe);
    EXPECT_FALSE(st.ok()) << text;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
    EXPECT_FALSE(probe.present);
  }
  Status st = ReadBatchProbe(Write(R"({"dense": {"batch_invariant": "yes"}})"), spec, &probe);
  EXPECT_FALSE(st.ok());  // a key of the wrong type is an error, not a crash
}

// Scores each row by its first dense value, plus the batch's row count when `variant`.
class FakeRunner : public Runner {
 public:
  explicit FakeRunner(bool variant) : variant_(variant) {}
  const std::string& version() const override { return version_; }
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const int64_t rows = inputs[0].shape[0];
    std::vector<float> scores;
    for (int64_t r = 0; r < rows; ++r) {
      scores.push_back(inputs[0].As<float>()[r * 2] + (variant_ ? 1e-6f * rows : 0.0f));
    }
    outputs->assign(1, testing::MakeTensor<float>("scores", DataType::kFp32, {rows, 1}, scores));
    return Status::Ok();
  }

 private:
  bool variant_;
  std::string version_ = "1";
};

TEST_F(ProbeFile, RunCatchesABatchDependentModel) {
  ModelSpec spec = testing::MakeSpec();
  BatchProbe probe;
  ASSERT_TRUE(ReadBatchProbe(Write(Manifest(kProbe)), spec, &probe).ok());
  double diff = -1;
  FakeRunner invariant(false), variant(true);
  ASSERT_TRUE(RunBatchProbe(&invariant, spec, probe, &diff).ok());
  EXPECT_EQ(diff, 0.0);
  ASSERT_TRUE(RunBatchProbe(&variant, spec, probe, &diff).ok());
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-5);
}

// A context model's probe: R = 2 contexts of 1 and 2 candidates, keyed by the model's input
// names (candidate_offsets included), checked request by request and candidate by candidate.
const char* kContextProbe = R"("batch_probe": {
  "context_dense": [[1.0, 2.0], [3.0, 4.0]],
  "context_lengths": [[1, 0], [0, 2]],
  "context_values": [11, 21, 22],
  "candidate_dense": [[0.5], [0.25], [0.125]],
  "candidate_lengths": [[1, 1], [1, 0], [1, 2]],
  "candidate_values": [1, 2, 3, 4, 5, 6],
  "candidate_offsets": [0, 2, 6]})";

// Scores candidate b as its context's first dense value plus its own, plus the pass's
// contexts and candidates when `variant`.
class ContextFakeRunner : public Runner {
 public:
  explicit ContextFakeRunner(bool variant) : variant_(variant) {}
  const std::string& version() const override { return version_; }
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const Tensor& offsets = inputs[6];
    const int64_t contexts = offsets.shape[0] - 1, rows = inputs[3].shape[0];
    std::vector<float> scores;
    for (int64_t r = 0; r < contexts; ++r) {
      for (int32_t k = offsets.As<int32_t>()[r] / 2; k < offsets.As<int32_t>()[r + 1] / 2; ++k) {
        scores.push_back(inputs[0].As<float>()[r * 2] + inputs[3].As<float>()[k] +
                         (variant_ ? 1e-6f * static_cast<float>(contexts + rows) : 0.0f));
      }
    }
    outputs->assign(1, testing::MakeTensor<float>("scores", DataType::kFp32, {rows, 1}, scores));
    return Status::Ok();
  }

 private:
  bool variant_;
  std::string version_ = "1";
};

TEST_F(ProbeFile, ContextProbeIsCheckedPerRequestAndPerCandidate) {
  ModelSpec spec = testing::MakeContextSpec();
  BatchProbe probe;
  ASSERT_TRUE(ReadBatchProbe(Write(Manifest(kContextProbe)), spec, &probe).ok());
  ASSERT_TRUE(probe.present);
  EXPECT_EQ(probe.rows, 3);  // candidates
  std::vector<Tensor> second = SliceContext(spec, probe.batch, 1, 0, 2);
  EXPECT_EQ(second[2].shape, std::vector<int64_t>{2});
  EXPECT_EQ(second[2].As<int64_t>()[1], 22);
  EXPECT_EQ(second[5].shape, std::vector<int64_t>{4});  // candidates 1 and 2: 1 + 3 ids
  EXPECT_EQ(second[5].As<int64_t>()[0], 3);
  double diff = -1;
  ContextFakeRunner invariant(false), variant(true);
  ASSERT_TRUE(RunBatchProbe(&invariant, spec, probe, &diff).ok());
  EXPECT_EQ(diff, 0.0);
  ASSERT_TRUE(RunBatchProbe(&variant, spec, probe, &diff).ok());
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-4);
}

TEST_F(ProbeFile, RefusesAContextProbeWhoseOffsetsDisagree) {
  ModelSpec spec = testing::MakeContextSpec();
  BatchProbe probe;
  std::string bad = kContextProbe;
  bad.replace(bad.find("[0, 2, 6]"), 9, "[0, 3, 6]");
  Status st = ReadBatchProbe(Write(Manifest(bad)), spec, &probe);
  EXPECT_NE(st.message().find("candidate_offsets do not split"), std::string::npos) << st.message();
  bad = kContextProbe;
  bad.replace(bad.find("[1, 2, 3, 4, 5, 6]"), 18, "[1, 2, 3]");
  st = ReadBatchProbe(Write(Manifest(bad)), spec, &probe);
  EXPECT_NE(st.message().find("ids in 'candidate_values' but its lengths count 6"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(probe.present);
}

}  // namespace
}  // namespace rec
