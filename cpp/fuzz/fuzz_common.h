// What every fuzz target does once a request is decoded: validate it against a model spec shaped
// like the exported model's and assemble a batch from it, as the server does before the forward.
#pragma once

#include <stdexcept>  // test_util.h throws std::runtime_error
#include <vector>

#include "request.h"
#include "test_util.h"

namespace rec::fuzz {

inline const ModelSpec& Spec() {
  static const ModelSpec spec = testing::MakeSpec();
  return spec;
}

inline void ValidateAndBatch(InferRequest* request) {
  if (!ValidateRequest(Spec(), request).ok()) return;
  // Twice: the batcher concatenates several requests.
  std::vector<const InferRequest*> batch = {request, request};
  std::vector<Tensor> inputs = ConcatenateInputs(Spec(), batch);
  std::vector<Tensor> outputs;
  for (const IoSpec& out : Spec().outputs) {
    Tensor t;
    t.name = out.name;
    t.dtype = out.dtype;
    t.shape = {2 * request->batch_size, out.dims.empty() ? 1 : out.dims[0]};
    t.data.assign(ElementCount(t.shape) * ElementSize(t.dtype), '\0');
    outputs.push_back(std::move(t));
  }
  if (!CheckOutputs(Spec(), 2 * request->batch_size, outputs).ok()) __builtin_trap();
  SliceOutputs(outputs, request->batch_size, request->batch_size);
}

}  // namespace rec::fuzz
