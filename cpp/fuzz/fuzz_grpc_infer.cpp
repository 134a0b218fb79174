// A serialized inference::ModelInferRequest as gRPC hands it to ModelInfer: parse, convert to
// tensors (raw_input_contents or typed contents), validate, batch and encode the response.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "grpc_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest in;
  if (!in.ParseFromArray(data, static_cast<int>(size))) return 0;
  rec::InferRequest request;
  if (!rec::DecodeGrpcRequest(in, &request).ok()) return 0;
  rec::fuzz::ValidateAndBatch(&request);
  if (request.batch_size > 0) {
    std::vector<rec::Tensor> outputs;
    for (const rec::IoSpec& out : rec::fuzz::Spec().outputs) {
      rec::Tensor t;
      t.name = out.name;
      t.dtype = out.dtype;
      t.shape = {request.batch_size, 1};
      t.data.assign(rec::ElementCount(t.shape) * rec::ElementSize(t.dtype), '\0');
      outputs.push_back(std::move(t));
    }
    inference::ModelInferResponse response;
    rec::EncodeGrpcResponse(request, "1", outputs, &response);
  }
  return 0;
}
