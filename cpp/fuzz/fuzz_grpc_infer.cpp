// A serialized inference::ModelInferRequest as gRPC hands it to ModelInfer: parse, convert to
// tensors (raw_input_contents or typed contents), validate, batch and encode the response.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "grpc/grpc_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  rec::InferRequest request;
  if (!rec::DecodeGrpcRequest(in, &request).ok()) return 0;
  rec::fuzz::ValidateAndBatch(&request);
  if (request.batch_size > 0) {
    std::vector<rec::Tensor> outputs = rec::fuzz::ZeroOutputs(request.batch_size);
    inference::ModelInferResponse response;
    rec::EncodeGrpcResponse(request, "1", outputs, &response);
  }
  return 0;
}
