// The HTTP/REST body codec of the KServe v2 protocol: a JSON inference header optionally followed
// by Triton's binary tensor data extension (Inference-Header-Content-Length, binary_data_size,
// binary_data / binary_data_output), and gzip/deflate request bodies.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "model/request.h"

namespace rec {

// Decompresses `body` in place for Content-Encoding "gzip" or "deflate" (zlib); other non-empty
// encodings are rejected. Refuses to inflate beyond `max_bytes`.
Status DecodeContentEncoding(const std::string& encoding, size_t max_bytes, std::string* body);

// Decodes an inference request body. `header_length` is the value of
// Inference-Header-Content-Length, or -1 when the whole body is JSON.
Status DecodeInferRequest(const std::string& body, long long header_length, InferRequest* request);

// Encodes the response for `request` from its (sliced) outputs, in the spec's output order.
// Sets *header_length to the JSON header's size when binary data follows it, else to -1.
// `parameters`: the response's own (the embedding watermark), none when null.
void EncodeInferResponse(const InferRequest& request, const std::string& model_version,
                         const std::vector<Tensor>& outputs, std::string* body,
                         long long* header_length,
                         const std::vector<std::pair<std::string, int64_t>>* parameters = nullptr);

// {"error": "..."} with proper JSON escaping.
std::string ErrorJson(const std::string& message);

}  // namespace rec
