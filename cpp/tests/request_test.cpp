#include "model/request.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "model/context_request.h"
#include "test_util.h"

namespace rec {
namespace {

using testing::MakeContextRequest;
using testing::MakeContextSpec;
using testing::MakeRequest;
using testing::MakeSpec;
using testing::MakeTensor;

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.As<T>(), t.As<T>() + t.data.size() / sizeof(T));
}

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

// The context form (#61): one context and N candidates; a flat request split into B contexts.

TEST(ContextSpec, ReadsRolesColumnsAndEachSidesEncodings) {
  ModelSpec spec = MakeContextSpec();
  const ContextSpec& c = spec.context;
  ASSERT_TRUE(c.present);
  EXPECT_EQ(spec.inputs.size(), 7u);
  EXPECT_EQ(c.context_dense, 0);
  EXPECT_EQ(c.candidate_lengths, 4);
  EXPECT_EQ(c.candidate_offsets, 6);
  EXPECT_TRUE(spec.inputs[c.candidate_offsets].ragged);
  EXPECT_EQ(spec.lengths_input, -1);  // no flat jagged pair in the model
  EXPECT_EQ(spec.max_batch_size, 8);
  EXPECT_EQ(c.cand_dense, std::vector<int64_t>{1});
  EXPECT_EQ(c.cand_sparse, (std::vector<int64_t>{1, 3}));
  ASSERT_EQ(c.candidate_encodings.size(), 2u);
  EXPECT_EQ(c.candidate_encodings[0].feature, "item");
  EXPECT_EQ(c.candidate_encodings[0].encoding, Encoding::kHex);
  EXPECT_EQ(c.context_encodings[1].feature, "history");
  ASSERT_TRUE(c.flat);
  EXPECT_EQ(c.flat->inputs[1].dims, std::vector<int64_t>{4});
  std::vector<std::string> names;
  for (const IoSpec& io : RequestInputs(spec)) names.push_back(io.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"context_dense", "context_lengths", "context_values",
                                      "candidate_dense", "candidate_lengths", "candidate_values",
                                      "context_strings", "candidate_strings", "dense_features",
                                      "sparse_lengths", "sparse_values", "sparse_strings"}));
}

TEST(ContextSpec, RefusesAManifestThatDisagrees) {
  const std::string good = testing::kContextManifest;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string m = good;
    m.replace(m.find(from), from.size(), to);
    return m;
  };
  const std::pair<std::string, std::string> bad[] = {
      {with(R"("sparse": [0, 2], "num_dense")", R"("sparse": [0, 1, 2, 3], "num_dense")"),
       "\"context.sparse\" must be fewer than num_sparse=4 columns (a candidate needs a sparse "
       "feature)"},
      {with(R"("num_dense": 3)", R"("num_dense": 4)"),
       "\"context.num_dense\" must be 3, the number of features.dense, got 4"},
      {with(R"("sparse": [0, 2], "num_dense")", R"("sparse": [2, 0], "num_dense")"),
       "\"context.sparse\" must be ascending distinct column indices in [0, num_sparse=4), "
       "got [2,0]"},
      {with(R"("version": 1)", R"("version": 2)"), "\"context.version\" must be 1"},
      {with(R"("dense": [0, 2])", R"("dense": [0])"), "(context_dense) must be FP32 [1]"},
      {with(R"(, "role": "candidate_offsets")", ""), "needs a context role"},
      {with(R"("name": "context_values", "role")", R"("name": "nope", "role")"),
       "input 'nope' is not an input of config.pbtxt"},
  };
  for (const auto& [manifest, expected] : bad) {
    ModelSpec spec;
    ASSERT_TRUE(ParseModelSpec(testing::kContextConfig, "c", &spec).ok());
    Status st = ApplyManifestText(manifest, "rec.json", &spec);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << manifest;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
  }
}

TEST(ContextRequest, AcceptedWithItsOffsetsAndCountedInCandidates) {
  ModelSpec spec = MakeContextSpec();
  InferRequest r = MakeContextRequest(3, 2);
  std::swap(r.inputs[0], r.inputs[5]);            // any order
  r.inputs[0].shape = {1, r.inputs[0].shape[0]};  // candidate_values as [1, n]
  ASSERT_TRUE(ValidateRequest(spec, &r).ok());
  EXPECT_EQ(r.batch_size, 3);  // candidates, not contexts
  ASSERT_EQ(r.inputs.size(), 7u);
  EXPECT_EQ(r.inputs[0].name, "context_dense");
  EXPECT_EQ(r.inputs[5].shape, std::vector<int64_t>{4});
  EXPECT_EQ(r.inputs[6].name, "candidate_offsets");
  EXPECT_EQ(Values<int32_t>(r.inputs[6]), (std::vector<int32_t>{0, 6}));  // Fn * (0, N)
}

TEST(ContextRequest, EachRefusalHasTheContractsText) {
  ModelSpec spec = MakeContextSpec();
  auto set_rows = [](int i, int64_t rows) {
    return [=](InferRequest* r) { r->inputs[i].shape[0] = rows; };
  };
  std::vector<BadCase> cases = {
      {"three contexts", set_rows(1, 3),
       "input 'context_lengths': a request carries one context (batch 1), got 3"},
      {"two context dense rows", set_rows(0, 2),
       "input 'context_dense': a request carries one context (batch 1), got 2"},
      {"no candidate", set_rows(4, 0),
       "input 'candidate_lengths': a request needs at least one candidate, got 0"},
      {"offsets sent",
       [](InferRequest* r) {
         r->inputs.push_back(
             MakeTensor<int32_t>("candidate_offsets", DataType::kInt32, {2}, {0, 2}));
       },
       "input 'candidate_offsets': filled by the server, do not send it"},
      {"mixed",
       [](InferRequest* r) {
         r->inputs.push_back(
             MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 4}, {0, 0, 0, 0}));
       },
       "a request carries either the flat inputs (dense_features, sparse_lengths, "
       "sparse_values) or the context form (context_*, candidate_*), not both: got "
       "'sparse_lengths' and 'context_dense'"},
      {"too many", [](InferRequest* r) { *r = MakeContextRequest(9, 1); },
       "request has 9 candidates, above max_batch_size 8"},
      {"candidate rows differ", set_rows(3, 2),
       "input 'candidate_dense': 2 candidates, other inputs have 1"},
      {"wrong width",
       [](InferRequest* r) {
         r->inputs[3] = MakeTensor<float>("candidate_dense", DataType::kFp32, {1, 2}, {0, 0});
       },
       "input 'candidate_dense': expected shape [N, 1], got [1, 2]"},
      {"ids short", [](InferRequest* r) { r->inputs[5].shape[0] -= 1; },
       "input 'candidate_values': shape [0] needs 0 bytes of data"},
      {"missing", [](InferRequest* r) { r->inputs.erase(r->inputs.begin() + 2); },
       "'context_values' (INT64 ids) or 'context_strings' (BYTES tokens); this one has neither"},
      {"nan", [](InferRequest* r) { r->inputs[0].MutableAs<float>()[1] = NAN; },
       "input 'context_dense': value nan at [0, 1]"},
  };
  for (const BadCase& c : cases) {
    InferRequest r = MakeContextRequest(1, 1);
    c.mutate(&r);
    Status st = ValidateRequest(spec, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.what << ": " << st.message();
  }
}

TEST(ContextRequest, StringsUseEachSidesEncodingsAndCountNegativesPerFlatFeature) {
  ModelSpec spec = MakeContextSpec();
  InferRequest r = MakeContextRequest(2, 1);
  r.inputs.erase(r.inputs.begin() + 5);  // candidate_values
  r.inputs.erase(r.inputs.begin() + 2);  // context_values
  r.inputs.push_back(testing::MakeBytesTensor("context_strings", {3}, {"-4", "7", "-1"}));
  // Candidate 0: item ff; candidate 1: item 1a, tags -3 (item is hex: "-3" would not read).
  r.inputs.push_back(testing::MakeBytesTensor("candidate_strings", {3}, {"ff", "1a", "-3"}));
  ASSERT_TRUE(ValidateRequest(spec, &r).ok()) << ValidateRequest(spec, &r).message();
  EXPECT_EQ(Values<int64_t>(r.inputs[2]), (std::vector<int64_t>{-4, 7, -1}));
  EXPECT_EQ(Values<int64_t>(r.inputs[5]), (std::vector<int64_t>{255, 26, -3}));
  // user (flat 0) one, history (flat 2) one, tags (flat 3) one; item (hex) none.
  EXPECT_EQ(r.negative_ids, (std::vector<int64_t>{1, 0, 1, 1}));
  InferRequest bad = MakeContextRequest(1, 1);
  bad.inputs.erase(bad.inputs.begin() + 5);
  bad.inputs.push_back(testing::MakeBytesTensor("candidate_strings", {1}, {"zz"}));
  Status st = ValidateRequest(spec, &bad);
  EXPECT_NE(st.message().find("'item'"), std::string::npos) << st.message();
}

TEST(ContextRequest, FlatRequestIsSplitIntoContextsOfOneCandidate) {
  ModelSpec spec = MakeContextSpec();
  InferRequest r;
  // Row 0: user [5], item [6], history [], tags [7, 8]; row 1: user [9], item [10], history
  // [11], tags [].
  r.inputs.push_back(
      MakeTensor<float>("dense_features", DataType::kFp32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  r.inputs.push_back(
      MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {2, 4}, {1, 1, 0, 2, 1, 1, 1, 0}));
  r.inputs.push_back(
      MakeTensor<int64_t>("sparse_values", DataType::kInt64, {7}, {5, 6, 7, 8, 9, 10, 11}));
  ASSERT_TRUE(ValidateRequest(spec, &r).ok());
  EXPECT_EQ(r.batch_size, 2);
  ASSERT_EQ(r.inputs.size(), 7u);
  EXPECT_EQ(Values<float>(r.inputs[0]), (std::vector<float>{1, 3, 4, 6}));
  EXPECT_EQ(r.inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<int32_t>(r.inputs[1]), (std::vector<int32_t>{1, 0, 1, 1}));
  EXPECT_EQ(Values<int64_t>(r.inputs[2]), (std::vector<int64_t>{5, 9, 11}));
  EXPECT_EQ(Values<float>(r.inputs[3]), (std::vector<float>{2, 5}));
  EXPECT_EQ(Values<int32_t>(r.inputs[4]), (std::vector<int32_t>{1, 2, 1, 0}));
  EXPECT_EQ(Values<int64_t>(r.inputs[5]), (std::vector<int64_t>{6, 7, 8, 10}));
  EXPECT_EQ(Values<int32_t>(r.inputs[6]), (std::vector<int32_t>{0, 2, 4}));
  // Flat refusals stay the flat ones.
  InferRequest big;
  big.inputs.push_back(
      MakeTensor("dense_features", DataType::kFp32, {9, 3}, std::vector<float>(27)));
  big.inputs.push_back(
      MakeTensor("sparse_lengths", DataType::kInt32, {9, 4}, std::vector<int32_t>(36)));
  big.inputs.push_back(MakeTensor("sparse_values", DataType::kInt64, {0}, std::vector<int64_t>{}));
  Status st = ValidateRequest(spec, &big);
  EXPECT_NE(st.message().find("batch size 9 exceeds max_batch_size 8"), std::string::npos);
}

TEST(ContextBatch, OffsetsShiftByThePairsBeforeAndSliceBack) {
  ModelSpec spec = MakeContextSpec();
  InferRequest a = MakeContextRequest(2, 1), b = MakeContextRequest(3, 2);
  InferRequest flat;
  flat.inputs.push_back(
      MakeTensor<float>("dense_features", DataType::kFp32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  flat.inputs.push_back(
      MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {2, 4}, {1, 1, 0, 0, 0, 1, 1, 0}));
  flat.inputs.push_back(MakeTensor<int64_t>("sparse_values", DataType::kInt64, {4}, {1, 2, 3, 4}));
  for (InferRequest* r : {&a, &b, &flat}) ASSERT_TRUE(ValidateRequest(spec, r).ok());
  std::vector<Tensor> batch = ConcatenateInputs(spec, {&a, &b, &flat});
  EXPECT_EQ(Values<int32_t>(batch[6]), (std::vector<int32_t>{0, 4, 10, 12, 14}));
  EXPECT_EQ(batch[0].shape, (std::vector<int64_t>{4, 2}));  // contexts
  EXPECT_EQ(batch[4].shape, (std::vector<int64_t>{7, 2}));  // candidates
  EXPECT_EQ(batch[5].data, a.inputs[5].data + b.inputs[5].data + flat.inputs[5].data);
  ASSERT_EQ(ContextCount(spec, batch), 4);
  // Each request comes back out of the batch as it went in.
  const std::vector<std::pair<const InferRequest*, int64_t>> parts = {{&a, 0}, {&b, 1}};
  for (const auto& [request, context] : parts) {
    std::vector<Tensor> alone = SliceContext(spec, batch, context, 0, request->batch_size);
    for (size_t i = 0; i < alone.size(); ++i) {
      EXPECT_EQ(alone[i].shape, request->inputs[i].shape) << i;
      EXPECT_EQ(alone[i].data, request->inputs[i].data) << i;
    }
  }
  std::vector<Tensor> third = SliceContext(spec, batch, 1, 2, 1);  // b's last candidate
  EXPECT_EQ(Values<float>(third[3]), std::vector<float>{4});
  EXPECT_EQ(Values<int64_t>(third[2]), (std::vector<int64_t>{200, 201, 202}));
  EXPECT_EQ(Values<int32_t>(third[6]), (std::vector<int32_t>{0, 2}));
}

}  // namespace
}  // namespace rec
