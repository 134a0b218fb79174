#include "model/request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

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
      {"nan dense", [](InferRequest* r) { r->inputs[1].MutableAs<float>()[3] = std::nanf(""); },
       "'dense_features': value nan at [1, 1]: every value must be a finite number"},
      {"infinite dense", [](InferRequest* r) { r->inputs[1].MutableAs<float>()[4] = -INFINITY; },
       "'dense_features': value -inf at [2, 0]"},
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
         r->outputs.push_back({"nope", true, std::nullopt});
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

// MakeRequest's request with its ids sent as text in `sparse_strings`: hex for feature y (its
// encoding in the feature spec), decimal for x and z. *ids gets the ids it must map to.
InferRequest StringsRequest(int64_t rows, float base, std::vector<int64_t>* ids) {
  InferRequest r = MakeRequest(rows, base);
  const Tensor& values = r.inputs[0];
  const int32_t* lengths = r.inputs[2].As<int32_t>();
  std::vector<std::string> tokens;
  int64_t k = 0;
  for (int64_t i = 0; i < rows * 3; ++i) {
    for (int32_t j = 0; j < lengths[i]; ++j, ++k) {
      int64_t id = values.As<int64_t>()[k];
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(id));
      tokens.push_back(i % 3 == 1 ? hex : std::to_string(id));
    }
  }
  ids->assign(values.As<int64_t>(), values.As<int64_t>() + k);
  r.inputs[0] = testing::MakeBytesTensor("sparse_strings", {k}, tokens);
  return r;
}

std::vector<int64_t> Ids(const Tensor& t) {
  return std::vector<int64_t>(t.As<int64_t>(), t.As<int64_t>() + ElementCount(t.shape));
}

TEST(Strings, BecomeTheValuesBeforeBatching) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  std::vector<int64_t> ids;
  InferRequest a = StringsRequest(3, 1, &ids);
  Status st = ValidateRequest(spec, &a);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(a.batch_size, 3);
  ASSERT_EQ(a.inputs.size(), 3u);
  EXPECT_EQ(a.inputs[2].name, "sparse_values");
  EXPECT_EQ(a.inputs[2].dtype, DataType::kInt64);
  EXPECT_EQ(Ids(a.inputs[2]), ids);
  // The batcher sees ordinary ids: a strings request batches with an ids request.
  InferRequest b = MakeRequest(2, 5), a_ids = MakeRequest(3, 1), b2 = MakeRequest(2, 5);
  ASSERT_TRUE(ValidateRequest(spec, &b).ok());
  ASSERT_TRUE(ValidateRequest(spec, &a_ids).ok());
  ASSERT_TRUE(ValidateRequest(spec, &b2).ok());
  std::vector<Tensor> got = ConcatenateInputs(spec, {&a, &b});
  std::vector<Tensor> want = ConcatenateInputs(spec, {&a_ids, &b2});
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape, want[i].shape);
    EXPECT_EQ(got[i].data, want[i].data);
  }
}

TEST(Strings, AcceptLeadingOneShape) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  std::vector<int64_t> ids;
  InferRequest r = StringsRequest(2, 3, &ids);
  r.inputs[0].shape = {1, r.inputs[0].shape[0]};
  ASSERT_TRUE(ValidateRequest(spec, &r).ok());
  EXPECT_EQ(Ids(r.inputs[2]), ids);
}

TEST(Strings, ExactlyOneOfValuesAndStrings) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  std::vector<int64_t> ids;
  InferRequest both = StringsRequest(2, 1, &ids);
  both.inputs.push_back(MakeRequest(2, 1).inputs[0]);
  Status st = ValidateRequest(spec, &both);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "a request carries either 'sparse_values' (INT64 ids) or 'sparse_strings' (BYTES "
            "tokens); this one has both");
  InferRequest neither = MakeRequest(2, 1);
  neither.inputs.erase(neither.inputs.begin());
  st = ValidateRequest(spec, &neither);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("this one has neither"), std::string::npos) << st.message();
  // Without a feature spec, a request without ids is just missing them.
  neither = MakeRequest(2, 1);
  neither.inputs.erase(neither.inputs.begin());
  EXPECT_EQ(ValidateRequest(MakeSpec(), &neither).message(), "input 'sparse_values': missing");
}

TEST(Strings, RefusedWithoutAFeatureSpec) {
  std::vector<int64_t> ids;
  InferRequest r = StringsRequest(2, 1, &ids);
  Status st = ValidateRequest(MakeSpec(), &r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "input 'sparse_strings': model 'm' has no feature spec (its rec.json has no "
            "\"feature_spec\"), so it cannot map strings to ids: send 'sparse_values' as INT64 "
            "ids");
}

TEST(Strings, EachProblemNamesTheInput) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  std::vector<BadCase> cases = {
      {"dtype",
       [](InferRequest* r) {
         r->inputs[0] = MakeTensor<int64_t>("sparse_strings", DataType::kInt64, {3}, {1, 2, 3});
       },
       "input 'sparse_strings': expected datatype BYTES, got INT64"},
      {"shape",
       [](InferRequest* r) {
         r->inputs[0].shape = {2, 2};
       },
       "input 'sparse_strings': expected shape [n], got [2, 2]"},
      {"count",
       [](InferRequest* r) {
         r->inputs[0] = testing::MakeBytesTensor("sparse_strings", {2}, {"1", "2"});
       },
       "input 'sparse_strings': has 2 values but sum of 'sparse_lengths' is 3"},
      {"negative length", [](InferRequest* r) { r->inputs[2].MutableAs<int32_t>()[1] = -1; },
       "input 'sparse_lengths': negative length -1 at flat index 1"},
      {"bad hex",
       [](InferRequest* r) {
         // Row 0's lengths are 0, 1, 2: its one y value is the first token.
         r->inputs[0] = testing::MakeBytesTensor("sparse_strings", {3}, {"xyz", "1", "2"});
       },
       "input 'sparse_strings': feature 'y', value at flat index 0: 'xyz' is not hex"},
      {"bad prefix", [](InferRequest* r) { r->inputs[0].data[0] = '\x7f'; },
       "input 'sparse_strings': BYTES element 0 has length 127"},
      {"duplicate", [](InferRequest* r) { r->inputs.push_back(r->inputs[0]); },
       "input 'sparse_strings': given more than once"},
      {"lengths still checked", [](InferRequest* r) { r->inputs[2].dtype = DataType::kInt64; },
       "input 'sparse_lengths': expected datatype INT32"},
  };
  for (const BadCase& c : cases) {
    std::vector<int64_t> ids;
    InferRequest r = StringsRequest(1, 1, &ids);
    ASSERT_EQ(r.inputs[0].shape, std::vector<int64_t>{3});
    c.mutate(&r);
    Status st = ValidateRequest(spec, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.what << ": " << st.message();
  }
}

TEST(Strings, ListedAsAnInputOnlyWithAFeatureSpec) {
  EXPECT_EQ(RequestInputs(MakeSpec()).size(), 3u);
  std::vector<IoSpec> inputs = RequestInputs(testing::MakeSpecWithFeatureSpec());
  ASSERT_EQ(inputs.size(), 4u);
  EXPECT_EQ(inputs[3].name, "sparse_strings");
  EXPECT_EQ(inputs[3].dtype, DataType::kBytes);
  EXPECT_TRUE(inputs[3].ragged);
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
