#include "tensor.h"

namespace rec {
namespace {

struct TypeInfo {
  DataType dtype;
  const char* name;
  size_t size;
};

constexpr TypeInfo kTypes[] = {
    {DataType::kBool, "BOOL", 1},   {DataType::kUint8, "UINT8", 1}, {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2}, {DataType::kInt32, "INT32", 4}, {DataType::kInt64, "INT64", 8},
    {DataType::kFp16, "FP16", 2},   {DataType::kFp32, "FP32", 4},   {DataType::kFp64, "FP64", 8},
};

}  // namespace

size_t ElementSize(DataType dtype) {
  for (const auto& t : kTypes) {
    if (t.dtype == dtype) return t.size;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  for (const auto& t : kTypes) {
    if (t.dtype == dtype) return t.name;
  }
  return "INVALID";
}

DataType ParseDataType(const std::string& name) {
  std::string bare = name.rfind("TYPE_", 0) == 0 ? name.substr(5) : name;
  if (bare == "STRING") return DataType::kInvalid;
  for (const auto& t : kTypes) {
    if (bare == t.name) return t.dtype;
  }
  return DataType::kInvalid;
}

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace rec
