// Runner: one loaded, warmed-up model version. The batcher only sees this interface, so the
// batching unit compiles and is tested without LibTorch.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"

namespace rec {

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const std::string& version() const = 0;
  // One forward pass on a batch (inputs in the spec's order); fills the outputs in the spec's
  // order. Safe to call from several threads at once. Never throws.
  virtual Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) = 0;
};

}  // namespace rec
