// An inference request body alone: the first byte picks the Inference-Header-Content-Length
// (none, the whole input, or a length read from the next two bytes), the rest is the body.
// Decodes, validates, batches and encodes a response as HttpApi::Infer does.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "http/infer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  long long header_length = -1;
  if (data[0] % 3 == 1) header_length = static_cast<long long>(size - 3);
  if (data[0] % 3 == 2) header_length = data[1] | (data[2] << 8);
  std::string body(reinterpret_cast<const char*>(data) + 3, size - 3);
  rec::InferRequest request;
  if (!rec::DecodeInferRequest(body, header_length, &request).ok()) return 0;
  rec::fuzz::ValidateAndBatch(&request);
  if (request.batch_size > 0) {
    std::vector<rec::Tensor> outputs = rec::fuzz::ZeroOutputs(request.batch_size);
    std::string response;
    long long response_header_length = 0;
    rec::EncodeInferResponse(request, "1", outputs, &response, &response_header_length);
  }
  return 0;
}
