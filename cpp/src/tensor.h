// Tensor: a named, typed, shaped block of raw bytes (row-major). The protocol layers decode into
// it and the model layer reads from it, so neither needs to know the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rec {

enum class DataType { kInvalid, kBool, kUint8, kInt8, kInt16, kInt32, kInt64, kFp16, kFp32, kFp64 };

// Size of one element in bytes; 0 for kInvalid.
size_t ElementSize(DataType dtype);
// Protocol name: "FP32", "INT64", ...
const char* DataTypeName(DataType dtype);
// Parses a protocol name ("FP32") or a model-config name ("TYPE_FP32"); kInvalid if unknown.
DataType ParseDataType(const std::string& name);

int64_t ElementCount(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);

struct Tensor {
  std::string name;
  DataType dtype = DataType::kInvalid;
  std::vector<int64_t> shape;
  std::string data;  // ElementCount(shape) * ElementSize(dtype) bytes

  template <typename T>
  const T* As() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <typename T>
  T* MutableAs() {
    return reinterpret_cast<T*>(data.data());
  }
};

}  // namespace rec
