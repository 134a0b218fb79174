// What every fuzz target does once a request is decoded: validate it against a model spec shaped
// like the exported model's (with a feature spec, so `sparse_strings` are mapped to ids) and
// assemble a batch from it, as the server does before the forward.
#pragma once

#include <stdexcept>  // test_util.h throws std::runtime_error
#include <vector>

#include "model/request.h"
#include "test_util.h"

namespace rec::fuzz {

inline const ModelSpec& Spec() {
  static const ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  return spec;
}

// Zero-filled outputs of `rows` rows, shaped as the model's outputs: stand-ins for a forward's
// result, so the response encoders run on every decoded request.
inline std::vector<Tensor> ZeroOutputs(int64_t rows) {
  std::vector<Tensor> outputs;
  for (const IoSpec& out : Spec().outputs) {
    Tensor t;
    t.name = out.name;
    t.dtype = out.dtype;
    t.shape = {rows, out.dims.empty() ? 1 : out.dims[0]};
    t.data.assign(ElementCount(t.shape) * ElementSize(t.dtype), '\0');
    outputs.push_back(std::move(t));
  }
  return outputs;
}

inline void ValidateAndBatchOnce(InferRequest* request) {
  if (!ValidateRequest(Spec(), request).ok()) return;
  // Twice: the batcher concatenates several requests.
  std::vector<const InferRequest*> batch = {request, request};
  std::vector<Tensor> inputs = ConcatenateInputs(Spec(), batch);
  std::vector<Tensor> outputs = ZeroOutputs(2 * request->batch_size);
  if (!CheckOutputs(Spec(), 2 * request->batch_size, outputs).ok()) __builtin_trap();
  SliceOutputs(outputs, request->batch_size, request->batch_size);
}

// Validates and batches the request, and before that a copy whose INT64 ids are relabelled as
// `sparse_strings` BYTES data: the seeds carry ids, so from the first run their (mutated) bytes
// go through the length prefixes and the token encodings too.
inline void ValidateAndBatch(InferRequest* request) {
  InferRequest as_strings = *request;
  for (Tensor& t : as_strings.inputs) {
    if (t.name == "sparse_values" && t.dtype == DataType::kInt64) {
      t.name = kSparseStringsInput;
      t.dtype = DataType::kBytes;
    }
  }
  ValidateAndBatchOnce(&as_strings);
  ValidateAndBatchOnce(request);
}

}  // namespace rec::fuzz
