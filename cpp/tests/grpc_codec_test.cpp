#include <gtest/gtest.h>

#include "common/feature_encoding.h"
#include "grpc/grpc_api.h"
#include "test_util.h"

namespace rec {
namespace {

TEST(GrpcCodec, AcceptsTypedContents) {
  inference::ModelInferRequest in;
  in.set_model_name("m");
  auto* dense = in.add_inputs();
  dense->set_name("dense_features");
  dense->set_datatype("FP32");
  dense->add_shape(1);
  dense->add_shape(2);
  dense->mutable_contents()->add_fp32_contents(0.5f);
  dense->mutable_contents()->add_fp32_contents(2.0f);
  auto* lengths = in.add_inputs();
  lengths->set_name("sparse_lengths");
  lengths->set_datatype("INT32");
  lengths->add_shape(1);
  lengths->add_shape(3);
  for (int v : {1, 0, 1}) lengths->mutable_contents()->add_int_contents(v);
  auto* values = in.add_inputs();
  values->set_name("sparse_values");
  values->set_datatype("INT64");
  values->add_shape(2);
  for (int64_t v : {-7LL, 1LL << 40}) values->mutable_contents()->add_int64_contents(v);
  InferRequest r;
  ASSERT_TRUE(DecodeGrpcRequest(in, &r).ok());
  ASSERT_TRUE(ValidateRequest(testing::MakeSpec(), &r).ok());
  EXPECT_EQ(r.inputs[0].As<float>()[1], 2.0f);
  EXPECT_EQ(r.inputs[2].As<int64_t>()[1], 1LL << 40);
}

TEST(GrpcCodec, RawContentsMustMatchInputs) {
  inference::ModelInferRequest in;
  in.add_inputs()->set_name("a");
  in.mutable_inputs(0)->set_datatype("FP32");
  in.add_inputs()->set_name("b");
  in.mutable_inputs(1)->set_datatype("FP32");
  in.add_raw_input_contents("xxxx");
  InferRequest r;
  EXPECT_EQ(DecodeGrpcRequest(in, &r).code(), StatusCode::kInvalidArgument);
}

TEST(GrpcCodec, TakesRawContentsWithoutCopying) {
  inference::ModelInferRequest in;
  auto* t = in.add_inputs();
  t->set_name("dense_features");
  t->set_datatype("FP32");
  t->add_shape(32);  // past the small-string buffer, so a move keeps the heap buffer
  t->add_shape(2);
  std::vector<float> values(64, 0.5f);
  values[1] = 2.0f;
  in.add_raw_input_contents(std::string(reinterpret_cast<const char*>(values.data()), 256));
  const char* bytes = in.raw_input_contents(0).data();
  InferRequest r;
  ASSERT_TRUE(DecodeGrpcRequest(in, &r, in.mutable_raw_input_contents()).ok());
  EXPECT_EQ(r.inputs[0].data.data(), bytes);  // the same buffer, moved
  EXPECT_EQ(r.inputs[0].As<float>()[1], 2.0f);
  EXPECT_TRUE(in.raw_input_contents(0).empty());
}

// The stock client sends BYTES as raw_input_contents (length-prefixed elements); typed
// contents carry them as bytes_contents. Both reach validation as the same tensor.
TEST(GrpcCodec, AcceptsBytesAsRawOrTypedContents) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  const std::vector<std::string> tokens = {"12", "0A", "apple\xff"};
  std::string results[2];
  for (bool raw : {true, false}) {
    inference::ModelInferRequest in;
    auto add = [&](const char* name, const char* dtype, std::vector<int64_t> shape) {
      auto* t = in.add_inputs();
      t->set_name(name);
      t->set_datatype(dtype);
      for (int64_t d : shape) t->add_shape(d);
      return t;
    };
    auto* dense = add("dense_features", "FP32", {1, 2});
    auto* lengths = add("sparse_lengths", "INT32", {1, 3});
    auto* strings = add("sparse_strings", "BYTES", {1, 3});  // [1, n], as batching clients do
    if (raw) {
      float d[2] = {1, 2};
      int32_t l[3] = {1, 1, 1};
      in.add_raw_input_contents(std::string(reinterpret_cast<char*>(d), sizeof(d)));
      in.add_raw_input_contents(std::string(reinterpret_cast<char*>(l), sizeof(l)));
      in.add_raw_input_contents(testing::MakeBytesTensor("s", {3}, tokens).data);
    } else {
      for (float v : {1.0f, 2.0f}) dense->mutable_contents()->add_fp32_contents(v);
      for (int v : {1, 1, 1}) lengths->mutable_contents()->add_int_contents(v);
      for (const std::string& t : tokens) strings->mutable_contents()->add_bytes_contents(t);
    }
    InferRequest r;
    ASSERT_TRUE(DecodeGrpcRequest(in, &r, in.mutable_raw_input_contents()).ok());
    Status st = ValidateRequest(spec, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    const int64_t* ids = r.inputs[2].As<int64_t>();
    EXPECT_EQ(ids[0], 12);
    EXPECT_EQ(ids[1], 10);
    EXPECT_EQ(ids[2], HashId("apple\xff"));
    results[raw] = r.inputs[2].data;
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(GrpcCodec, MalformedRawBytesNameTheInput) {
  inference::ModelInferRequest in;
  auto* t = in.add_inputs();
  t->set_name("sparse_strings");
  t->set_datatype("BYTES");
  t->add_shape(1);
  in.add_raw_input_contents(
      std::string("\x05\x00\x00\x00"
                  "ab",
                  6));
  InferRequest r;
  ASSERT_TRUE(DecodeGrpcRequest(in, &r).ok());
  r.inputs.push_back(
      testing::MakeTensor<float>("dense_features", DataType::kFp32, {1, 2}, {1.0f, 2.0f}));
  r.inputs.push_back(
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {1, 0, 0}));
  Status st = ValidateRequest(testing::MakeSpecWithFeatureSpec(), &r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "input 'sparse_strings': BYTES element 0 has length 5 but only 2 bytes of data "
            "follow its prefix");
}

TEST(GrpcCodec, EncodesRawOutputsOfRequestedNames) {
  InferRequest meta;
  meta.model_name = "m";
  meta.id = "x";
  std::vector<Tensor> outputs = {
      testing::MakeTensor<float>("scores", DataType::kFp32, {2, 1}, {0.5f, 0.25f})};
  inference::ModelInferResponse out;
  EncodeGrpcResponse(meta, "4", outputs, &out);
  ASSERT_EQ(out.outputs_size(), 1);
  EXPECT_EQ(out.model_version(), "4");
  EXPECT_EQ(out.raw_output_contents(0).size(), 8u);
  EXPECT_EQ(out.outputs(0).shape_size(), 2);
}

TEST(ModelSpec, InstanceCountFromConfig) {
  ModelSpec spec;
  std::string text = std::string(testing::kConfig) +
                     "instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]";
  ASSERT_TRUE(ParseModelSpec(text, "m", &spec).ok());
  EXPECT_EQ(spec.instance_count, 3);
}

}  // namespace
}  // namespace rec
