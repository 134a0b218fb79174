#include "common/feature_encoding.h"

#include <cstring>

namespace rec {
namespace {

// ---- BLAKE2b, RFC 7693 -----------------------------------------------------------------------
// Written from the RFC (sections 2 and 3): the initialization vector (2.6), the message schedule
// (2.7), G with BLAKE2b's rotations 32, 24, 16, 63 (3.1), and compression F (3.2). Only the
// unkeyed form is needed: the parameter block is just the digest length.

constexpr uint64_t kIv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

// Rounds 10 and 11 reuse the permutations of rounds 0 and 1.
constexpr uint8_t kSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

constexpr size_t kBlockBytes = 128;

uint64_t Rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

// Little-endian whatever the host: the RFC defines words as little-endian bytes.
uint64_t LoadLe64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

void G(uint64_t* v, int a, int b, int c, int d, uint64_t x, uint64_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = Rotr(v[d] ^ v[a], 32);
  v[c] = v[c] + v[d];
  v[b] = Rotr(v[b] ^ v[c], 24);
  v[a] = v[a] + v[b] + y;
  v[d] = Rotr(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = Rotr(v[b] ^ v[c], 63);
}

// F: mixes one 128-byte block into the state h. `bytes` is the offset counter t (the number of
// message bytes compressed so far, this block included); a 64-bit size_t never fills t's high
// word.
void Compress(uint64_t h[8], const uint8_t block[kBlockBytes], uint64_t bytes, bool last) {
  uint64_t m[16];
  for (int i = 0; i < 16; ++i) m[i] = LoadLe64(block + 8 * i);
  uint64_t v[16];
  for (int i = 0; i < 8; ++i) {
    v[i] = h[i];
    v[i + 8] = kIv[i];
  }
  v[12] ^= bytes;  // low word of t; the high word is 0
  if (last) v[14] = ~v[14];
  for (const auto& s : kSigma) {
    G(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    G(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    G(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    G(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    G(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    G(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    G(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    G(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

// ---- tokens ----------------------------------------------------------------------------------

// `int_or_hash`'s own-id case: the whole token is -?[0-9]+ and its value fits int64 (leading
// zeros allowed, "-0" is 0), exactly what rec/features.py's regex and range check accept.
bool ParseDecimal(std::string_view token, int64_t* id) {
  bool negative = !token.empty() && token[0] == '-';
  std::string_view digits = token.substr(negative ? 1 : 0);
  if (digits.empty()) return false;
  // Magnitudes up to 2^63 (only -2^63 may reach it), accumulated unsigned so nothing overflows.
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (limit - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *id = negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
  return true;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ParseHex(std::string_view token, int64_t* id) {
  if (token.empty() || token.size() > 16) return false;
  uint64_t value = 0;
  for (char c : token) {
    int d = HexDigit(c);
    if (d < 0) return false;
    value = value << 4 | static_cast<uint64_t>(d);
  }
  *id = static_cast<int64_t>(value);  // the uint64's bits as int64, as features.hex_id does
  return true;
}

// Length of the well-formed UTF-8 sequence at s[i], else 0 (the Unicode standard's table of
// well-formed byte sequences: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t Utf8Sequence(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (p[0] >= 0xC2 && p[0] <= 0xDF) {
    n = 2;
  } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
    n = 3;
    if (p[0] == 0xE0) lo = 0xA0;
    if (p[0] == 0xED) hi = 0x9F;
  } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
    n = 4;
    if (p[0] == 0xF0) lo = 0x90;
    if (p[0] == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < n || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((p[k] & 0xC0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

Status ParseEncoding(const std::string& name, Encoding* encoding) {
  if (name == "int_or_hash") {
    *encoding = Encoding::kIntOrHash;
  } else if (name == "hex") {
    *encoding = Encoding::kHex;
  } else {
    return InvalidArgument("unknown encoding '" + name + "' (rec-server knows int_or_hash, hex)");
  }
  return Status::Ok();
}

const char* EncodingName(Encoding encoding) {
  return encoding == Encoding::kHex ? "hex" : "int_or_hash";
}

void Blake2b(const void* data, size_t size, uint8_t* out, size_t out_size) {
  uint64_t h[8];
  std::memcpy(h, kIv, sizeof(h));
  h[0] ^= 0x01010000ULL ^ out_size;  // parameter block: depth 1, fanout 1, no key
  const auto* in = static_cast<const uint8_t*>(data);
  // Every block but the last is compressed as it is; the last (the only one, and empty, for an
  // empty message) is zero-padded and flagged final, even when the message fills it exactly.
  size_t done = 0;
  while (size - done > kBlockBytes) {
    done += kBlockBytes;
    Compress(h, in + done - kBlockBytes, done, false);
  }
  uint8_t last[kBlockBytes] = {};
  if (size > done) std::memcpy(last, in + done, size - done);
  Compress(h, last, size, true);
  for (size_t i = 0; i < out_size; ++i) out[i] = static_cast<uint8_t>(h[i / 8] >> (8 * (i % 8)));
}

int64_t HashId(std::string_view token) {
  uint8_t digest[kHashDigestBytes];
  Blake2b(token.data(), token.size(), digest, sizeof(digest));
  return static_cast<int64_t>(LoadLe64(digest));
}

std::string QuoteToken(std::string_view token) {
  constexpr size_t kLimit = 40;
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  size_t i = 0;
  while (i < token.size() && i < kLimit) {
    size_t n = Utf8Sequence(token, i);
    unsigned char c = static_cast<unsigned char>(token[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f))) {
      // Messages travel as JSON and gRPC status text: keep them printable UTF-8.
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
      i += 1;
      continue;
    }
    if (i + n > kLimit) break;  // do not cut a character in two
    out.append(token.substr(i, n));
    i += n;
  }
  if (i < token.size()) out += "...";
  return out + "'";
}

Status EncodeToken(Encoding encoding, std::string_view token, int64_t* id) {
  if (encoding == Encoding::kHex) {
    if (ParseHex(token, id)) return Status::Ok();
    return InvalidArgument(QuoteToken(token) + " is not hex (1 to 16 hex digits)");
  }
  if (!ParseDecimal(token, id)) *id = HashId(token);
  return Status::Ok();
}

bool IsNegativeInteger(std::string_view token) {
  if (token.size() < 2 || token[0] != '-') return false;
  bool nonzero = false;
  for (char c : token.substr(1)) {
    if (c < '0' || c > '9') return false;
    nonzero = nonzero || c != '0';
  }
  return nonzero;  // "-0" is zero
}

Status EncodeSparseStrings(const std::vector<SparseEncoding>& features, const Tensor& strings,
                           const Tensor& lengths, Tensor* values, std::vector<int64_t>* negatives) {
  auto input_error = [](const Tensor& t, const std::string& problem) {
    return InvalidArgument("input '" + t.name + "': " + problem);
  };
  if (strings.dtype != DataType::kBytes || strings.shape.size() != 1 || strings.shape[0] < 0) {
    return input_error(strings, std::string("expected BYTES [n], got ") +
                                    DataTypeName(strings.dtype) + " " + ShapeString(strings.shape));
  }
  const int64_t num_features = static_cast<int64_t>(features.size());
  const int64_t count = ElementCount(lengths.shape);
  if (lengths.dtype != DataType::kInt32 || lengths.shape.size() != 2 || lengths.shape[0] < 0 ||
      lengths.shape[1] != num_features || lengths.data.size() != 4 * static_cast<size_t>(count)) {
    return input_error(lengths, "expected INT32 [B, " + std::to_string(num_features) +
                                    "] (one count per sparse feature), got " +
                                    DataTypeName(lengths.dtype) + " " + ShapeString(lengths.shape));
  }
  const int32_t* l = lengths.As<int32_t>();
  int64_t sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (l[i] < 0) {
      return input_error(lengths, "negative length " + std::to_string(l[i]) + " at flat index " +
                                      std::to_string(i));
    }
    sum += l[i];
  }
  const int64_t n = strings.shape[0];
  if (sum != n) {
    return input_error(strings, "has " + std::to_string(n) + " values but sum of '" + lengths.name +
                                    "' is " + std::to_string(sum));
  }
  values->dtype = DataType::kInt64;
  values->shape = {n};
  values->data.assign(static_cast<size_t>(n) * sizeof(int64_t), '\0');
  int64_t* ids = values->MutableAs<int64_t>();
  if (negatives != nullptr) negatives->assign(features.size(), 0);
  size_t offset = 0;
  int64_t k = 0;  // flat index of the value, in the request's batch-major order
  for (int64_t i = 0; i < count; ++i) {
    const SparseEncoding& feature = features[i % num_features];
    for (int32_t j = 0; j < l[i]; ++j, ++k) {
      std::string_view token;
      REC_RETURN_IF_ERROR(NextBytesElement(strings, static_cast<size_t>(k), &offset, &token));
      Status st = EncodeToken(feature.encoding, token, &ids[k]);
      if (!st.ok()) {
        return input_error(strings, "feature '" + feature.feature + "', value at flat index " +
                                        std::to_string(k) + ": " + st.message());
      }
      if (negatives != nullptr && feature.encoding == Encoding::kIntOrHash &&
          IsNegativeInteger(token)) {
        ++(*negatives)[i % num_features];
      }
    }
  }
  if (offset != strings.data.size()) {
    return input_error(strings, "BYTES data holds more than its " + std::to_string(n) +
                                    " elements (" + std::to_string(strings.data.size() - offset) +
                                    " bytes left over)");
  }
  return Status::Ok();
}

}  // namespace rec
