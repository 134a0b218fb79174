#include <gtest/gtest.h>

#include "grpc_api.h"
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
