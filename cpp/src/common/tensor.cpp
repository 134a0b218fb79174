#include "common/tensor.h"

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
    {DataType::kBytes, "BYTES", 0},
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

void AppendBytesElement(std::string_view element, std::string* data) {
  uint32_t n = static_cast<uint32_t>(element.size());
  const char prefix[4] = {static_cast<char>(n), static_cast<char>(n >> 8),
                          static_cast<char>(n >> 16), static_cast<char>(n >> 24)};
  data->append(prefix, 4);
  data->append(element.data(), element.size());
}

Status NextBytesElement(const Tensor& t, size_t index, size_t* offset, std::string_view* element) {
  const std::string& d = t.data;
  auto bad = [&](const std::string& problem) {
    return InvalidArgument("input '" + t.name + "': BYTES element " + std::to_string(index) + " " +
                           problem);
  };
  if (*offset >= d.size()) return bad("is missing: the data ends before it");
  if (d.size() - *offset < 4) return bad("has a cut-off length prefix at the end of the data");
  const auto* p = reinterpret_cast<const unsigned char*>(d.data() + *offset);
  size_t n = static_cast<size_t>(p[0]) | static_cast<size_t>(p[1]) << 8 |
             static_cast<size_t>(p[2]) << 16 | static_cast<size_t>(p[3]) << 24;
  size_t left = d.size() - *offset - 4;
  if (n > left) {
    return bad("has length " + std::to_string(n) + " but only " + std::to_string(left) +
               " bytes of data follow its prefix");
  }
  *element = std::string_view(d.data() + *offset + 4, n);
  *offset += 4 + n;
  return Status::Ok();
}

}  // namespace rec
