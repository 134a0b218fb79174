// Sparse ids from strings: the C++ port of rec/features.py's token encodings and of its HASH
// (BLAKE2b with an 8-byte digest, RFC 7693; hash version 1), so that a request's `sparse_strings`
// become exactly the ids training computed from the same text. tests/data/hash_golden.json pins
// both ports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace rec {

// How one token (a value as text) becomes an int64 id (rec/features.py):
//   kIntOrHash  a decimal integer (-?[0-9]+) in int64 range is its own id; any other byte string
//               (including "", "+5", " 7", "1_000", out-of-range integers) gets HashId
//   kHex        1 to 16 hex digits, either case, read as uint64 and viewed as int64 (Criteo);
//               anything else is an error
enum class Encoding { kIntOrHash, kHex };

// The encoding named `name` in a feature spec ("int_or_hash", "hex"); InvalidArgument if unknown.
Status ParseEncoding(const std::string& name, Encoding* encoding);
const char* EncodingName(Encoding encoding);

// One sparse feature of rec.json's feature_spec, as the server needs it.
struct SparseEncoding {
  std::string feature;
  Encoding encoding = Encoding::kIntOrHash;
};

// The one hash this server implements: feature_spec.hash must say exactly this.
inline constexpr char kHashAlgorithm[] = "blake2b";
inline constexpr int64_t kHashDigestBytes = 8;
inline constexpr int64_t kHashVersion = 1;

// Unkeyed BLAKE2b (RFC 7693) of `size` bytes into `out_size` (1 to 64) digest bytes.
void Blake2b(const void* data, size_t size, uint8_t* out, size_t out_size);

// HASH of a token: BLAKE2b-64 of its bytes, the digest read as a little-endian signed int64.
int64_t HashId(std::string_view token);

// The id of one token under `encoding`; InvalidArgument (quoting the token, shortened) for a
// token `hex` cannot read. `int_or_hash` accepts every byte string.
Status EncodeToken(Encoding encoding, std::string_view token, int64_t* id);

// A token for a message, in single quotes: at most 40 bytes (cut at a UTF-8 boundary, then
// "...", as rec/features.py shortens it), control and non-UTF-8 bytes as \xNN.
std::string QuoteToken(std::string_view token);

// True for a token that is a negative decimal integer ("-3", also beyond int64's range): under
// int_or_hash a categorical value below zero, which the model maps by modulo (rec/features.py
// negative_ints; training's features.negative). A string whose hash is negative is not one.
bool IsNegativeInteger(std::string_view token);

// Maps a request's tokens to the ids the model takes. `strings` is a BYTES [N] tensor (errors
// name it) whose tokens are batch-major like sparse_values: sample 0's feature 0 tokens, its
// feature 1 tokens, ..., then sample 1's; each is mapped with its feature's encoding. `lengths`
// is the request's INT32 [B, F] counts, F == features.size(), summing to N. On success `values`
// holds the INT64 [N] ids (the caller names it) and, if given, `negatives` [F] each feature's
// count of IsNegativeInteger tokens (int_or_hash features only). An unreadable token's error
// names its feature, its flat index and its text.
Status EncodeSparseStrings(const std::vector<SparseEncoding>& features, const Tensor& strings,
                           const Tensor& lengths, Tensor* values,
                           std::vector<int64_t>* negatives = nullptr);

}  // namespace rec
