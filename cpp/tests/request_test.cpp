#include "request.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace rec {
namespace {

using testing::MakeRequest;
using testing::MakeSpec;
using testing::MakeTensor;

TEST(ModelSpec, FindsTheJaggedPair) {
  ModelSpec spec = MakeSpec();
  EXPECT_EQ(spec.max_batch_size, 8);
  EXPECT_EQ(spec.lengths_input, 1);
  EXPECT_EQ(spec.values_input, 2);
  EXPECT_TRUE(spec.inputs[2].ragged);
  EXPECT_TRUE(spec.dynamic_batching);
  EXPECT_EQ(spec.max_queue_delay_us, 1000);
}

TEST(ModelSpec, RejectsBadText) {
  ModelSpec spec;
  Status st = ParseModelSpec("input [ { name: ", "m", &spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

TEST(Validate, AcceptsAndReorders) {
  ModelSpec spec = MakeSpec();
  InferRequest r = MakeRequest(3, 1);
  ASSERT_TRUE(ValidateRequest(spec, &r).ok());
  EXPECT_EQ(r.batch_size, 3);
  EXPECT_EQ(r.inputs[0].name, "dense_features");
  EXPECT_EQ(r.inputs[2].name, "sparse_values");
}

TEST(Validate, AcceptsRaggedWithLeadingOne) {
  ModelSpec spec = MakeSpec();
  InferRequest r = MakeRequest(2, 1);
  int64_t n = r.inputs[0].shape[0];
  r.inputs[0].shape = {1, n};
  ASSERT_TRUE(ValidateRequest(spec, &r).ok());
  EXPECT_EQ(r.inputs[2].shape, std::vector<int64_t>{n});
}

struct BadCase {
  const char* what;
  std::function<void(InferRequest*)> mutate;
  const char* expected;
};

TEST(Validate, EachProblemNamesTheTensor) {
  ModelSpec spec = MakeSpec();
  std::vector<BadCase> cases = {
      {"unknown name", [](InferRequest* r) { r->inputs[0].name = "bogus"; }, "'bogus'"},
      {"missing", [](InferRequest* r) { r->inputs.pop_back(); }, "'sparse_lengths': missing"},
      {"dtype", [](InferRequest* r) { r->inputs[1].dtype = DataType::kFp64; },
       "'dense_features': expected datatype FP32"},
      {"shape",
       [](InferRequest* r) {
         r->inputs[1].shape = {2, 5};
       },
       "'dense_features': expected shape [B, 2]"},
      {"bytes", [](InferRequest* r) { r->inputs[1].data.resize(3); }, "bytes of data"},
      {"batch too big", [](InferRequest* r) { *r = MakeRequest(9, 1); },
       "exceeds max_batch_size 8"},
      {"batch mismatch", [](InferRequest* r) { r->inputs[1] = MakeRequest(2, 1).inputs[1]; },
       "differs from other inputs'"},
      {"negative length", [](InferRequest* r) { r->inputs[2].MutableAs<int32_t>()[1] = -1; },
       "negative length"},
      {"sum mismatch",
       [](InferRequest* r) {
         r->inputs[0].data.resize(r->inputs[0].data.size() - 8);
         r->inputs[0].shape[0] -= 1;
       },
       "but sum of 'sparse_lengths'"},
      {"duplicate", [](InferRequest* r) { r->inputs.push_back(r->inputs[1]); },
       "given more than once"},
      {"bad output",
       [](InferRequest* r) {
         r->outputs.push_back({"nope", true});
       },
       "'nope'"},
  };
  for (const BadCase& c : cases) {
    InferRequest r = MakeRequest(3, 1);
    c.mutate(&r);
    Status st = ValidateRequest(spec, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.what << ": " << st.message();
  }
}

TEST(Batch, ConcatenatesAlongRowsAndValuesEndToEnd) {
  ModelSpec spec = MakeSpec();
  InferRequest a = MakeRequest(2, 1), b = MakeRequest(3, 5);
  ASSERT_TRUE(ValidateRequest(spec, &a).ok());
  ASSERT_TRUE(ValidateRequest(spec, &b).ok());
  std::vector<Tensor> batch = ConcatenateInputs(spec, {&a, &b});
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].shape, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(batch[1].shape, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(batch[2].shape[0], a.inputs[2].shape[0] + b.inputs[2].shape[0]);
  EXPECT_EQ(batch[0].data, a.inputs[0].data + b.inputs[0].data);
  EXPECT_EQ(batch[1].data, a.inputs[1].data + b.inputs[1].data);
  EXPECT_EQ(batch[2].data, a.inputs[2].data + b.inputs[2].data);
}

TEST(Batch, SlicesRowsBack) {
  Tensor scores =
      MakeTensor<float>("scores", DataType::kFp32, {5, 2}, {0, 1, 10, 11, 20, 21, 30, 31, 40, 41});
  std::vector<Tensor> part = SliceOutputs({scores}, 1, 3);
  ASSERT_EQ(part.size(), 1u);
  EXPECT_EQ(part[0].shape, (std::vector<int64_t>{3, 2}));
  const float* p = part[0].As<float>();
  EXPECT_EQ(p[0], 10);
  EXPECT_EQ(p[5], 31);
}

TEST(Batch, CheckOutputsCatchesWrongShape) {
  ModelSpec spec = MakeSpec();
  Tensor ok = MakeTensor<float>("scores", DataType::kFp32, {4, 1}, {0, 0, 0, 0});
  EXPECT_TRUE(CheckOutputs(spec, 4, {ok}).ok());
  Tensor wrong = MakeTensor<float>("scores", DataType::kFp32, {4, 2}, std::vector<float>(8));
  EXPECT_EQ(CheckOutputs(spec, 4, {wrong}).code(), StatusCode::kInternal);
  EXPECT_EQ(CheckOutputs(spec, 3, {ok}).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace rec
