// What the execution units share: rec::Tensor <-> at::Tensor and the warm-up batch every loaded
// model runs before it serves. Includes LibTorch: only torch_model.cpp and aoti_model.cpp see it.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "model/model_spec.h"
#include "model/runner.h"

namespace rec {

// A view of `t`'s bytes (no copy): `t` must outlive the returned tensor's use.
at::Tensor WrapInput(const Tensor& t);

// Copies `value` (made contiguous) into `out`, named `name`.
Status ToTensor(const std::string& name, const at::Tensor& value, Tensor* out);

// The first non-empty line of an exception's message (LibTorch's may start with a newline and
// go on with a C++ backtrace).
std::string FirstLine(const std::exception& e);

// Runs a small valid batch through `runner` and checks its outputs against the spec.
Status WarmUp(Runner* runner, const ModelSpec& spec, const std::string& model_path);

}  // namespace rec
