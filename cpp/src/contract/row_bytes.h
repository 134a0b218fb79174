// Bytes of one embedding row, in the update log and in the store alike: dim * bits / 8 bytes of
// codes, then for int8 and int4 the row's fp16 scale and fp16 bias (4 bytes), as FBGEMM's
// quantized rows hold them. Python's one copy is rec.contract.updates.row_bytes; both languages'
// tests check theirs against tests/data/row_bytes_golden.json.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace rec {

// InvalidArgument, in the Python function's words, for a dtype that is not int8, int4, fp16 or
// fp32, or a row whose codes are not whole bytes: an int4 row of odd dim, which FBGEMM's
// quantizer refuses, so no export or publish holds one.
Status CheckRowBytes(int64_t dim, const std::string& dtype, int64_t* bytes);

// The same, -1 where CheckRowBytes refuses.
int64_t RowBytes(int64_t dim, const std::string& dtype);

}  // namespace rec
