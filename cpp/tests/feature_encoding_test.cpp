// The token encodings and HASH against tests/data/hash_golden.json (the values Python's hashlib
// gives, which rec/features.py's tests pin too), and the BYTES -> ids conversion of a request.
#include "common/feature_encoding.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace rec {
namespace {

using nlohmann::json;

const json& Golden() {
  static const json golden = [] {
    std::ifstream in(REC_HASH_GOLDEN);
    std::stringstream ss;
    ss << in.rdbuf();
    // Integers parse exactly (int64 / uint64), never through double.
    return json::parse(ss.str(), nullptr, false);
  }();
  return golden;
}

// [token, id] pairs of one list; fails the test if the file is missing or the list is short.
std::vector<std::pair<std::string, int64_t>> Pairs(const char* list) {
  const json& g = Golden();
  EXPECT_FALSE(g.is_discarded()) << "cannot read " << REC_HASH_GOLDEN;
  std::vector<std::pair<std::string, int64_t>> pairs;
  if (g.is_discarded() || !g.contains(list)) return pairs;
  for (const json& p : g[list]) {
    EXPECT_TRUE(p[1].is_number_integer()) << p.dump();
    pairs.emplace_back(p[0].get<std::string>(), p[1].get<int64_t>());
  }
  EXPECT_GE(pairs.size(), 9u) << list;
  return pairs;
}

std::vector<int64_t> Ids(const Tensor& t) {
  return std::vector<int64_t>(t.As<int64_t>(), t.As<int64_t>() + ElementCount(t.shape));
}

TEST(Blake2b, Rfc7693AppendixA) {
  uint8_t digest[64];
  Blake2b("abc", 3, digest, sizeof(digest));
  static const char kWant[] =
      "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
      "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923";
  std::string hex;
  for (uint8_t b : digest) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 0xf];
  }
  EXPECT_EQ(hex, kWant);
}

TEST(FeatureEncoding, GoldenHashIsTheImplementedOne) {
  const json& hash = Golden()["hash"];
  EXPECT_EQ(hash["algorithm"], kHashAlgorithm);
  EXPECT_EQ(hash["digest_bytes"], kHashDigestBytes);
  EXPECT_EQ(hash["version"], kHashVersion);
}

// Includes "", multi-byte UTF-8 and tokens of 127, 128, 129, 255, 256 and 1000 bytes (block
// boundaries of BLAKE2b's 128-byte blocks).
TEST(FeatureEncoding, HashIdMatchesGolden) {
  for (const auto& [token, id] : Pairs("hash_id")) EXPECT_EQ(HashId(token), id) << token;
}

TEST(FeatureEncoding, IntOrHashMatchesGolden) {
  for (const auto& [token, want] : Pairs("int_or_hash")) {
    int64_t id = 0;
    ASSERT_TRUE(EncodeToken(Encoding::kIntOrHash, token, &id).ok());
    EXPECT_EQ(id, want) << token;
  }
}

TEST(FeatureEncoding, HexMatchesGolden) {
  for (const auto& [token, want] : Pairs("hex")) {
    int64_t id = 0;
    ASSERT_TRUE(EncodeToken(Encoding::kHex, token, &id).ok()) << token;
    EXPECT_EQ(id, want) << token;
  }
}

TEST(FeatureEncoding, HexRefusesGoldenInvalidTokens) {
  ASSERT_TRUE(Golden().contains("hex_invalid"));
  ASSERT_GE(Golden()["hex_invalid"].size(), 6u);
  for (const json& token : Golden()["hex_invalid"]) {
    int64_t id = 0;
    Status st = EncodeToken(Encoding::kHex, token.get<std::string>(), &id);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << token;
    EXPECT_NE(st.message().find("is not hex (1 to 16 hex digits)"), std::string::npos);
  }
}

TEST(FeatureEncoding, IntOrHashEdges) {
  // Not in the golden file: bytes a JSON document cannot carry, and long runs of zeros.
  int64_t id = 0;
  ASSERT_TRUE(EncodeToken(Encoding::kIntOrHash, std::string(30, '0') + "42", &id).ok());
  EXPECT_EQ(id, 42);
  const std::string nul("7\0", 2);
  ASSERT_TRUE(EncodeToken(Encoding::kIntOrHash, nul, &id).ok());
  EXPECT_EQ(id, HashId(nul));
  ASSERT_TRUE(EncodeToken(Encoding::kIntOrHash, "\xff\xfe", &id).ok());
  EXPECT_EQ(id, HashId("\xff\xfe"));
}

TEST(FeatureEncoding, ParsesEncodingNames) {
  Encoding e = Encoding::kIntOrHash;
  ASSERT_TRUE(ParseEncoding("hex", &e).ok());
  EXPECT_EQ(e, Encoding::kHex);
  EXPECT_STREQ(EncodingName(e), "hex");
  Status st = ParseEncoding("murmur", &e);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("murmur"), std::string::npos);
}

TEST(FeatureEncoding, QuotesTokensShortAndPrintable) {
  EXPECT_EQ(QuoteToken("zz"), "'zz'");
  EXPECT_EQ(QuoteToken(std::string(50, 'q')), "'" + std::string(40, 'q') + "...'");
  EXPECT_EQ(QuoteToken("a\nb\xff"), "'a\\x0ab\\xff'");
  // 39 ASCII bytes, then a 2-byte character: not cut in two.
  EXPECT_EQ(QuoteToken(std::string(39, 'a') + "\xc3\xa9x"), "'" + std::string(39, 'a') + "...'");
}

// Which tokens are negative integers (features.negative): the golden lists Python checks too.
TEST(FeatureEncoding, NegativeIntegersMatchTheGoldenFile) {
  const json& g = Golden();
  ASSERT_FALSE(g.is_discarded());
  ASSERT_GE(g["negative_int"].size(), 3u);
  for (const json& t : g["negative_int"]) EXPECT_TRUE(IsNegativeInteger(t.get<std::string>())) << t;
  ASSERT_GE(g["not_negative_int"].size(), 3u);
  for (const json& t : g["not_negative_int"]) {
    EXPECT_FALSE(IsNegativeInteger(t.get<std::string>())) << t;
  }
}

std::vector<SparseEncoding> Features() {
  return {{"x", Encoding::kIntOrHash}, {"y", Encoding::kHex}, {"z", Encoding::kIntOrHash}};
}

TEST(EncodeSparseStrings, MapsEachTokenWithItsFeaturesEncoding) {
  // Sample 0: x = ["12", "apple"], y = ["ff"], z = []; sample 1: x = [], y = ["10"], z = ["10"].
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {2, 3}, {2, 1, 0, 0, 1, 1});
  Tensor strings =
      testing::MakeBytesTensor("sparse_strings", {5}, {"12", "apple", "ff", "10", "10"});
  Tensor values;
  Status st = EncodeSparseStrings(Features(), strings, lengths, &values);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(values.dtype, DataType::kInt64);
  EXPECT_EQ(values.shape, std::vector<int64_t>{5});
  EXPECT_EQ(Ids(values), (std::vector<int64_t>{12, HashId("apple"), 255, 16, 10}));
}

TEST(EncodeSparseStrings, CountsNegativeIntegersPerIntOrHashFeature) {
  // Sample 0: x = ["-3", "-0"], y = [], z = ["-7"]; sample 1: x = ["apple", "-12"], y = z = [].
  // "-0" is zero, "apple" hashes (to whatever sign): neither is a negative value.
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {2, 3}, {2, 0, 1, 2, 0, 0});
  Tensor strings =
      testing::MakeBytesTensor("sparse_strings", {5}, {"-3", "-0", "-7", "apple", "-12"});
  Tensor values;
  std::vector<int64_t> negatives;
  Status st = EncodeSparseStrings(Features(), strings, lengths, &values, &negatives);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(negatives, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(Ids(values), (std::vector<int64_t>{-3, 0, -7, HashId("apple"), -12}));
}

TEST(EncodeSparseStrings, EmptyRequestAndEmptyTokens) {
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {0, 0, 1});
  Tensor values;
  ASSERT_TRUE(
      EncodeSparseStrings(Features(), testing::MakeBytesTensor("s", {1}, {""}), lengths, &values)
          .ok());
  EXPECT_EQ(Ids(values), std::vector<int64_t>{HashId("")});
  lengths = testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {0, 0, 0});
  ASSERT_TRUE(
      EncodeSparseStrings(Features(), testing::MakeBytesTensor("s", {0}, {}), lengths, &values)
          .ok());
  EXPECT_TRUE(values.data.empty());
}

TEST(EncodeSparseStrings, CountMismatchNamesTheInput) {
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {2, 1, 1});
  Tensor values;
  Status st = EncodeSparseStrings(Features(),
                                  testing::MakeBytesTensor("sparse_strings", {3}, {"1", "a", "2"}),
                                  lengths, &values);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "input 'sparse_strings': has 3 values but sum of 'sparse_lengths' is 4");
}

TEST(EncodeSparseStrings, BadHexNamesFeatureIndexAndToken) {
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {2, 3}, {0, 1, 0, 1, 1, 0});
  std::string long_token = "0x" + std::string(60, 'f');
  Tensor values;
  Status st = EncodeSparseStrings(
      Features(), testing::MakeBytesTensor("sparse_strings", {3}, {"a1", "7", long_token}), lengths,
      &values);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "input 'sparse_strings': feature 'y', value at flat index 2: '0x" +
                              std::string(38, 'f') + "...' is not hex (1 to 16 hex digits)");
}

TEST(EncodeSparseStrings, MalformedBytesDataIsAnErrorNotAnOverRead) {
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {2, 0, 0});
  Tensor values;
  auto message = [&](const std::string& data) {
    Tensor strings = testing::MakeBytesTensor("sparse_strings", {2}, {});
    strings.data = data;
    Status st = EncodeSparseStrings(Features(), strings, lengths, &values);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    return st.message();
  };
  std::string one = std::string("\x01\x00\x00\x00", 4) + "a";
  // The second element's prefix claims 4 GiB - 1.
  EXPECT_EQ(message(one + "\xff\xff\xff\xff" + "b"),
            "input 'sparse_strings': BYTES element 1 has length 4294967295 but only 1 bytes of "
            "data follow its prefix");
  EXPECT_EQ(message(one + std::string("\x01\x00", 2)),
            "input 'sparse_strings': BYTES element 1 has a cut-off length prefix at the end of "
            "the data");
  EXPECT_EQ(message(one),
            "input 'sparse_strings': BYTES element 1 is missing: the data ends "
            "before it");
  EXPECT_EQ(message(one + one + one),
            "input 'sparse_strings': BYTES data holds more than its 2 elements (5 bytes left "
            "over)");
}

TEST(EncodeSparseStrings, RefusesBadShapesAndLengths) {
  Tensor values;
  Tensor strings = testing::MakeBytesTensor("sparse_strings", {1}, {"1"});
  Tensor wrong_columns =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 2}, {1, 0});
  EXPECT_EQ(EncodeSparseStrings(Features(), strings, wrong_columns, &values).code(),
            StatusCode::kInvalidArgument);
  Tensor negative =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {2, -1, 0});
  Status st = EncodeSparseStrings(Features(), strings, negative, &values);
  EXPECT_EQ(st.message(), "input 'sparse_lengths': negative length -1 at flat index 1");
  Tensor ids = testing::MakeTensor<int64_t>("sparse_strings", DataType::kInt64, {1}, {1});
  Tensor lengths =
      testing::MakeTensor<int32_t>("sparse_lengths", DataType::kInt32, {1, 3}, {1, 0, 0});
  EXPECT_EQ(EncodeSparseStrings(Features(), ids, lengths, &values).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rec
