// The max_batch_size 0 form (export.triton_batching: none): batched from rec.json "serving".
#include "model/model_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace rec {
namespace {

// The `none` form `rec export` writes: the batch dimension spelled out, no dynamic_batching.
const char* kUnbatchedConfig = R"pb(
  name: "m"
  platform: "pytorch_libtorch"
  max_batch_size: 0 input
  [ {
    name: "dense_features"
    data_type: TYPE_FP32
    dims: [ -1, 2 ]
  }
    , {
      name: "sparse_lengths"
      data_type: TYPE_INT32
      dims: [ -1, 3 ]
    }
    , {
      name: "sparse_values"
      data_type: TYPE_INT64
      dims: [ -1 ]
    }] output
  [ {
    name: "scores"
    data_type: TYPE_FP32
    dims: [ -1, 1 ]
  }]
)pb";

const char* kFeatures = R"("features": {"dense": ["a", "b"], "sparse": ["x", "y", "z"]},
                           "num_tasks": 1)";

ModelSpec Unbatched() {
  ModelSpec spec;
  Status st = ParseModelSpec(kUnbatchedConfig, "m", &spec);
  if (!st.ok()) throw std::runtime_error(st.message());
  return spec;
}

std::string Manifest(const std::string& serving) {
  std::string text = std::string("{") + kFeatures;
  if (!serving.empty()) text += R"(, "serving": )" + serving;
  return text + "}";
}

TEST(ModelSpecServing, UnbatchedConfigAloneIsOneRequestPerForward) {
  ModelSpec spec = Unbatched();
  EXPECT_EQ(spec.max_batch_size, int64_t{1} << 30);
  EXPECT_FALSE(spec.dynamic_batching);
  EXPECT_EQ(spec.inputs[0].dims, std::vector<int64_t>{2});
  EXPECT_TRUE(spec.inputs[2].ragged);
  EXPECT_EQ(spec.values_input, 2);
  EXPECT_EQ(spec.lengths_input, 1);
  // A manifest without "serving" (an older export) keeps that.
  ASSERT_TRUE(ApplyManifestText(Manifest(""), "/r/m/rec.json", &spec).ok());
  EXPECT_EQ(spec.max_batch_size, int64_t{1} << 30);
  EXPECT_FALSE(spec.dynamic_batching);
}

TEST(ModelSpecServing, UnbatchedConfigTakesTheManifestsBatching) {
  ModelSpec spec = Unbatched();
  Status st = ApplyManifestText(Manifest(R"({"max_batch_size": 256, "max_queue_delay_us": 700,
      "preferred_batch_sizes": [64, 128], "instances": 2, "triton_batching": "none"})"),
                                "/r/m/rec.json", &spec);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(spec.max_batch_size, 256);
  EXPECT_TRUE(spec.dynamic_batching);
  EXPECT_EQ(spec.max_queue_delay_us, 700);
  EXPECT_EQ(spec.preferred_batch_sizes, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(spec.dense_feature_names.size(), 2u);
}

TEST(ModelSpecServing, RaggedConfigKeepsItsOwnBatching) {
  ModelSpec spec = testing::MakeSpec();
  Status st = ApplyManifestText(
      Manifest(R"({"max_batch_size": 256, "max_queue_delay_us": 7, "triton_batching": "ragged"})"),
      "/r/m/rec.json", &spec);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(spec.max_batch_size, 8);
  EXPECT_EQ(spec.max_queue_delay_us, 1000);
}

TEST(ModelSpecServing, MalformedServingNamesTheFileAndKey) {
  struct Case {
    const char* serving;
    const char* expected;
  };
  const Case cases[] = {
      {R"("big")", "\"serving\" must be an object"},
      {R"({})", "\"serving.max_batch_size\" must be an integer in [1, 2^30], got none"},
      {R"({"max_batch_size": 0})", "\"serving.max_batch_size\""},
      {R"({"max_batch_size": "512"})", "\"serving.max_batch_size\""},
      {R"({"max_batch_size": 1.5})", "\"serving.max_batch_size\""},
      {R"({"max_batch_size": 99999999999})", "\"serving.max_batch_size\""},
      {R"({"max_batch_size": 8, "max_queue_delay_us": -1})", "\"serving.max_queue_delay_us\""},
      {R"({"max_batch_size": 8, "preferred_batch_sizes": 4})", "\"serving.preferred_batch_sizes\""},
      {R"({"max_batch_size": 8, "preferred_batch_sizes": [4, 9]})",
       "\"serving.preferred_batch_sizes\" must be a list of integers in [1, max_batch_size=8]"},
  };
  for (const Case& c : cases) {
    ModelSpec spec = Unbatched();
    Status st = ApplyManifestText(Manifest(c.serving), "/r/m/rec.json", &spec);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.serving;
    EXPECT_NE(st.message().find("/r/m/rec.json"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << st.message();
  }
}

TEST(ModelSpecServing, BadJsonNamesTheFile) {
  ModelSpec spec = Unbatched();
  Status st = ApplyManifestText("{ nope", "/r/m/rec.json", &spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("/r/m/rec.json is not a JSON object"), std::string::npos);
}

// rec.json's feature_spec, with `hash` and `sparse` replaceable.
std::string FeatureSpecManifest(const std::string& hash, const std::string& sparse) {
  return std::string("{") + kFeatures + R"(, "feature_spec": {"format": "csv", "labels": ["y"],
      "dense": [], "sparse": )" +
         sparse + R"(, "hash": )" + hash + "}}";
}

const char* kHash = R"({"algorithm": "blake2b", "digest_bytes": 8, "byte_order": "little",
                        "signed": true, "input": "utf-8 bytes of the token", "version": 1})";
const char* kSparse = R"([{"name": "x", "column": "x", "encoding": "int_or_hash", "separator": "|"},
                          {"name": "y", "column": "c", "encoding": "hex", "separator": null},
                          {"name": "z", "column": "z", "encoding": "int_or_hash"}])";

TEST(ModelSpecFeatureSpec, ReadsEachSparseFeaturesEncoding) {
  for (ModelSpec spec : {Unbatched(), testing::MakeSpec()}) {
    Status st = ApplyManifestText(FeatureSpecManifest(kHash, kSparse), "/r/m/rec.json", &spec);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_TRUE(spec.has_feature_spec);
    ASSERT_EQ(spec.sparse_encodings.size(), 3u);
    EXPECT_EQ(spec.sparse_encodings[1].feature, "y");
    EXPECT_EQ(spec.sparse_encodings[1].encoding, Encoding::kHex);
    EXPECT_EQ(spec.sparse_encodings[2].encoding, Encoding::kIntOrHash);
  }
}

TEST(ModelSpecFeatureSpec, MissingOrNullMeansNone) {
  for (const std::string& text :
       {Manifest(""), std::string("{") + kFeatures + R"(, "feature_spec": null})"}) {
    ModelSpec spec = testing::MakeSpec();
    ASSERT_TRUE(ApplyManifestText(text, "/r/m/rec.json", &spec).ok()) << text;
    EXPECT_FALSE(spec.has_feature_spec);
    EXPECT_TRUE(spec.sparse_encodings.empty());
  }
}

TEST(ModelSpecFeatureSpec, AnotherHashOrABadSpecFailsTheLoad) {
  struct Case {
    std::string hash, sparse;
    const char* expected;
  };
  const std::string hash2 =
      R"({"algorithm": "blake2b", "digest_bytes": 8, "byte_order": "little", "version": 2})";
  const Case cases[] = {
      {hash2, kSparse,
       "feature_spec.hash.version is 2, not implemented: rec-server implements hash version 1 "
       "(blake2b, 8-byte digest)"},
      {R"({"algorithm": "blake2b", "digest_bytes": 8})", kSparse,
       "feature_spec.hash.version is null, not implemented"},
      {R"({"algorithm": "sha256", "digest_bytes": 8, "version": 1})", kSparse,
       "feature_spec.hash is {\"algorithm\":\"sha256\""},
      {R"({"algorithm": "blake2b", "digest_bytes": 16, "version": 1})", kSparse,
       "not implemented: rec-server implements hash version 1"},
      {R"({"algorithm": "blake2b", "digest_bytes": 8, "byte_order": "big", "version": 1})", kSparse,
       "read as a little-endian signed int64"},
      {"null", kSparse, "feature_spec.hash.version is null"},
      {kHash, R"({"x": "hex"})", "feature_spec.sparse must be a list"},
      {kHash, R"([{"name": "x"}, {"name": "y"}, {"name": "z"}])",
       "feature_spec.sparse[0] needs a string \"name\" and \"encoding\""},
      {kHash,
       R"([{"name": "x", "encoding": "int_or_hash"}, {"name": "y", "encoding": "murmur3"},
           {"name": "z", "encoding": "hex"}])",
       "feature_spec.sparse[1] (feature 'y'): unknown encoding 'murmur3' (rec-server knows "
       "int_or_hash, hex)"},
      {kHash, R"([{"name": "x", "encoding": "hex"}, {"name": "y", "encoding": "hex"}])",
       "feature_spec lists 2 sparse features but config.pbtxt gives input 'sparse_lengths' dims "
       "[3]"},
      {kHash,
       R"([{"name": "x", "encoding": "hex"}, {"name": "z", "encoding": "hex"},
           {"name": "y", "encoding": "hex"}])",
       "feature_spec.sparse[1] is feature 'z' but features.sparse[1] is 'y'"},
  };
  for (const Case& c : cases) {
    ModelSpec spec = Unbatched();
    Status st = ApplyManifestText(FeatureSpecManifest(c.hash, c.sparse), "/r/m/rec.json", &spec);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(st.message().find("model 'm': /r/m/rec.json: "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace rec
