#include "contract/row_bytes.h"

namespace rec {

Status CheckRowBytes(int64_t dim, const std::string& dtype, int64_t* bytes) {
  int64_t bits = 0, scale_bias = 0;
  if (dtype == "int8") {
    bits = 8;
    scale_bias = 4;
  } else if (dtype == "int4") {
    bits = 4;
    scale_bias = 4;
  } else if (dtype == "fp16") {
    bits = 16;
  } else if (dtype == "fp32") {
    bits = 32;
  } else {
    return InvalidArgument("dtype '" + dtype + "' is not one of ['int8', 'int4', 'fp16', 'fp32']");
  }
  if (dim < 0 || dim % 8 * bits % 8 != 0) {
    return InvalidArgument("a " + dtype + " row of dim " + std::to_string(dim) +
                           " is not a whole number of bytes");
  }
  *bytes = dim * bits / 8 + scale_bias;
  return Status::Ok();
}

int64_t RowBytes(int64_t dim, const std::string& dtype) {
  int64_t bytes = -1;
  return CheckRowBytes(dim, dtype, &bytes).ok() ? bytes : -1;
}

}  // namespace rec
