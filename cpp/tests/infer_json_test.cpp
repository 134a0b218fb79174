#include "http/infer_json.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include "common/feature_encoding.h"
#include "http/http_server.h"
#include "test_util.h"

namespace rec {
namespace {

TEST(InferJson, DecodesJsonTensors) {
  std::string body = R"({"id":"7","inputs":[
    {"name":"dense_features","datatype":"FP32","shape":[1,2],"data":[[0.5,1.5]]},
    {"name":"sparse_lengths","datatype":"INT32","shape":[1,3],"data":[1,0,2]},
    {"name":"sparse_values","datatype":"INT64","shape":[3],"data":[10,-20,30000000000]}],
    "outputs":[{"name":"scores"}]})";
  InferRequest r;
  ASSERT_TRUE(DecodeInferRequest(body, -1, &r).ok());
  EXPECT_EQ(r.id, "7");
  ASSERT_EQ(r.inputs.size(), 3u);
  EXPECT_EQ(r.inputs[0].As<float>()[1], 1.5f);
  EXPECT_EQ(r.inputs[1].As<int32_t>()[2], 2);
  EXPECT_EQ(r.inputs[2].As<int64_t>()[2], 30000000000LL);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_FALSE(r.outputs[0].binary);
  EXPECT_TRUE(ValidateRequest(testing::MakeSpec(), &r).ok());
}

TEST(InferJson, DecodesBinaryTensors) {
  float dense[2] = {0.25f, -4.0f};
  int32_t lengths[3] = {1, 1, 0};
  int64_t values[2] = {5, 6};
  std::string header = R"({"inputs":[
    {"name":"dense_features","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}},
    {"name":"sparse_lengths","datatype":"INT32","shape":[1,3],"parameters":{"binary_data_size":12}},
    {"name":"sparse_values","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}}],
    "parameters":{"binary_data_output":true}})";
  std::string body = header + std::string(reinterpret_cast<char*>(dense), 8) +
                     std::string(reinterpret_cast<char*>(lengths), 12) +
                     std::string(reinterpret_cast<char*>(values), 16);
  InferRequest r;
  ASSERT_TRUE(DecodeInferRequest(body, static_cast<long long>(header.size()), &r).ok());
  EXPECT_TRUE(r.binary_output_default);
  EXPECT_EQ(r.inputs[0].As<float>()[1], -4.0f);
  EXPECT_EQ(r.inputs[2].As<int64_t>()[1], 6);
  EXPECT_TRUE(ValidateRequest(testing::MakeSpec(), &r).ok());

  InferRequest bad;
  EXPECT_FALSE(DecodeInferRequest(body.substr(0, body.size() - 1),
                                  static_cast<long long>(header.size()), &bad)
                   .ok());
  InferRequest extra;
  Status st = DecodeInferRequest(body + "xx", static_cast<long long>(header.size()), &extra);
  EXPECT_NE(st.message().find("no input claims"), std::string::npos);
}

TEST(InferJson, RejectsMalformed) {
  for (const char* body :
       {"", "{", "[]", R"({"inputs":[{"name":"x"}]})",
        R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1]}]})",
        R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":["a"]}]})",
        R"({"inputs":[{"name":"x","datatype":"BYTES","shape":[1],"data":[1]}]})"}) {
    InferRequest r;
    EXPECT_EQ(DecodeInferRequest(body, -1, &r).code(), StatusCode::kInvalidArgument) << body;
  }
}

// Regression (cpp/fuzz/regressions/fuzz_infer_body/): a JSON value that does not fit the tensor's
// type was converted anyway, which is undefined behaviour for a float beyond the integer range.
TEST(InferJson, RejectsValuesThatDoNotFitTheDatatype) {
  for (const char* data :
       {R"("INT32","shape":[1],"data":[227276876531572103500366])",
        R"("INT32","shape":[1],"data":[1099511627776])",
        R"("INT32","shape":[1],"data":[-3000000000.0])",
        R"("INT64","shape":[1],"data":[10000000000000000000])",
        R"("INT64","shape":[1],"data":[9.3e18])", R"("INT8","shape":[1],"data":[128])",
        R"("UINT8","shape":[1],"data":[-1])", R"("FP32","shape":[1],"data":[1e300])"}) {
    std::string body = std::string(R"({"inputs":[{"name":"x","datatype":)") + data + "}]}";
    InferRequest r;
    Status st = DecodeInferRequest(body, -1, &r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(st.message().find("does not fit"), std::string::npos) << st.message();
  }
  // Values that fit are kept, integral floats included.
  InferRequest r;
  std::string body = R"({"inputs":[{"name":"x","datatype":"INT32","shape":[4],)"
                     R"("data":[2147483647,-2147483648,3.0,true]}]})";
  ASSERT_TRUE(DecodeInferRequest(body, -1, &r).ok());
  EXPECT_EQ(r.inputs[0].As<int32_t>()[0], 2147483647);
  EXPECT_EQ(r.inputs[0].As<int32_t>()[1], -2147483647 - 1);
  EXPECT_EQ(r.inputs[0].As<int32_t>()[2], 3);
  EXPECT_EQ(r.inputs[0].As<int32_t>()[3], 1);
}

TEST(InferJson, DecodesBytesAsJsonStrings) {
  // Escapes, \u escapes (a surrogate pair too), raw UTF-8 and the empty string, in the nested
  // form as well as the flat one tritonclient sends.
  std::string body = R"({"inputs":[
    {"name":"sparse_strings","datatype":"BYTES","shape":[5],
     "data":[["a\"b", "caf\u00e9"], ["\ud83d\ude00", "日本"], [""]]}]})";
  InferRequest r;
  Status st = DecodeInferRequest(body, -1, &r);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].dtype, DataType::kBytes);
  Tensor want = testing::MakeBytesTensor("sparse_strings", {5},
                                         {"a\"b", "caf\xc3\xa9", "\xf0\x9f\x98\x80", "日本", ""});
  EXPECT_EQ(r.inputs[0].data, want.data);
  InferRequest numbers;
  st = DecodeInferRequest(
      R"({"inputs":[{"name":"sparse_strings","datatype":"BYTES","shape":[1],"data":[7]}]})", -1,
      &numbers);
  EXPECT_EQ(st.message(), "input 'sparse_strings': BYTES data must hold strings");
}

TEST(InferJson, BytesThroughValidationInEveryHttpForm) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  const std::string lengths = R"({"name":"sparse_lengths","datatype":"INT32","shape":[1,3],
      "data":[1,1,1]},{"name":"dense_features","datatype":"FP32","shape":[1,2],"data":[1,2]})";
  // JSON strings.
  InferRequest r;
  ASSERT_TRUE(DecodeInferRequest(R"({"inputs":[)" + lengths + R"(,
      {"name":"sparse_strings","datatype":"BYTES","shape":[3],"data":["-5","ff","x"]}]})",
                                 -1, &r)
                  .ok());
  Status st = ValidateRequest(spec, &r);
  ASSERT_TRUE(st.ok()) << st.message();
  const int64_t* ids = r.inputs[2].As<int64_t>();
  EXPECT_EQ(ids[0], -5);
  EXPECT_EQ(ids[1], 255);
  EXPECT_EQ(ids[2], HashId("x"));
  // Binary data: the elements length-prefixed, as tritonclient serializes them.
  Tensor strings = testing::MakeBytesTensor("sparse_strings", {3}, {"-5", "ff", "x"});
  std::string header = R"({"inputs":[)" + lengths +
                       R"(,{"name":"sparse_strings","datatype":"BYTES","shape":[3],
      "parameters":{"binary_data_size":)" +
                       std::to_string(strings.data.size()) + "}}]}";
  InferRequest b;
  ASSERT_TRUE(
      DecodeInferRequest(header + strings.data, static_cast<long long>(header.size()), &b).ok());
  ASSERT_TRUE(ValidateRequest(spec, &b).ok());
  EXPECT_EQ(b.inputs[2].data, r.inputs[2].data);
  // A length prefix running past the end of the binary data.
  InferRequest bad;
  std::string cut = strings.data.substr(0, strings.data.size() - 1);
  header = R"({"inputs":[)" + lengths + R"(,{"name":"sparse_strings","datatype":"BYTES",
      "shape":[3],"parameters":{"binary_data_size":)" +
           std::to_string(cut.size()) + "}}]}";
  ASSERT_TRUE(DecodeInferRequest(header + cut, static_cast<long long>(header.size()), &bad).ok());
  st = ValidateRequest(spec, &bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "input 'sparse_strings': BYTES element 2 has length 1 but only 0 bytes of data "
            "follow its prefix");
}

TEST(InferJson, EncodesBinaryAndJsonOutputs) {
  InferRequest meta;
  meta.model_name = "m";
  meta.outputs = {{"scores", true, std::nullopt}};
  Tensor scores = testing::MakeTensor<float>("scores", DataType::kFp32, {2, 1}, {0.5f, 0.25f});
  std::string body;
  long long header = -1;
  EncodeInferResponse(meta, "3", {scores}, &body, &header);
  ASSERT_GT(header, 0);
  auto j = nlohmann::json::parse(body.substr(0, static_cast<size_t>(header)));
  EXPECT_EQ(j["model_version"], "3");
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_EQ(body.substr(static_cast<size_t>(header)), scores.data);

  meta.outputs = {{"scores", false, std::nullopt}};
  EncodeInferResponse(meta, "3", {scores}, &body, &header);
  EXPECT_EQ(header, -1);
  j = nlohmann::json::parse(body);
  EXPECT_EQ(j["outputs"][0]["data"][1], 0.25);
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json({2, 1}));
}

TEST(InferJson, InflatesGzipAndDeflate) {
  std::string plain(10000, 'a');
  for (int window : {15 + 16, 15}) {  // gzip, zlib ("deflate")
    z_stream zs{};
    deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window, 8, Z_DEFAULT_STRATEGY);
    std::string out(compressBound(plain.size()) + 64, '\0');
    zs.next_in = reinterpret_cast<Bytef*>(plain.data());
    zs.avail_in = static_cast<uInt>(plain.size());
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    std::string body = out;
    ASSERT_TRUE(DecodeContentEncoding(window == 15 ? "deflate" : "gzip", 1 << 20, &body).ok());
    EXPECT_EQ(body, plain);
    body = out;
    EXPECT_EQ(DecodeContentEncoding("gzip", 100, &body).code(), StatusCode::kTooLarge);
  }
  std::string junk = "not compressed";
  EXPECT_EQ(DecodeContentEncoding("gzip", 1 << 20, &junk).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeContentEncoding("br", 1 << 20, &junk).code(), StatusCode::kInvalidArgument);
}

TEST(HttpParse, ParsesPipelinedRequests) {
  std::string wire =
      "POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
      "Inference-Header-Content-Length: 2\r\n\r\nabcGET /v2 HTTP/1.0\r\n\r\n";
  HttpRequest r;
  size_t consumed = 0;
  int code = 0;
  std::string error;
  ASSERT_EQ(ParseHttpRequest(wire.data(), wire.size(), 100, &r, &consumed, &code, &error),
            ParseResult::kComplete);
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v2/models/m/infer");
  EXPECT_EQ(r.query, "x=1");
  EXPECT_EQ(r.body, "abc");
  EXPECT_TRUE(r.keep_alive);
  ASSERT_NE(r.Header("inference-header-content-length"), nullptr);
  std::string rest = wire.substr(consumed);
  ASSERT_EQ(ParseHttpRequest(rest.data(), rest.size(), 100, &r, &consumed, &code, &error),
            ParseResult::kComplete);
  EXPECT_FALSE(r.keep_alive);  // HTTP/1.0 without keep-alive
  EXPECT_EQ(ParseHttpRequest(wire.data(), 20, 100, &r, &consumed, &code, &error),
            ParseResult::kIncomplete);
}

TEST(HttpParse, RejectsWhatItCannotServe) {
  HttpRequest r;
  size_t consumed = 0;
  int code = 0;
  std::string error;
  std::string big = "POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n";
  EXPECT_EQ(ParseHttpRequest(big.data(), big.size(), 100, &r, &consumed, &code, &error),
            ParseResult::kError);
  EXPECT_EQ(code, 413);
  std::string chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(ParseHttpRequest(chunked.data(), chunked.size(), 100, &r, &consumed, &code, &error),
            ParseResult::kError);
  EXPECT_EQ(code, 501);
  std::string garbage = "hello\r\n\r\n";
  EXPECT_EQ(ParseHttpRequest(garbage.data(), garbage.size(), 100, &r, &consumed, &code, &error),
            ParseResult::kError);
  EXPECT_EQ(code, 400);
}

TEST(HttpParse, SerializesWithContentLength) {
  HttpResponse resp;
  resp.body = "{}";
  std::string wire = SerializeHttpResponse(resp, false);
  EXPECT_NE(wire.find("Content-Length: 2\r\n"), std::string::npos);
  EXPECT_NE(wire.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(wire.find("chunked"), std::string::npos);
}

}  // namespace
}  // namespace rec
