// Tensor: a named, typed, shaped block of raw bytes (row-major). The protocol layers decode into
// it and the model layer reads from it, so neither needs to know the other.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rec {

// kBytes (protocol "BYTES") is only ever a request input (`sparse_strings`): no model config can
// declare it (TYPE_STRING stays unsupported), so it never reaches the model.
enum class DataType {
  kInvalid,
  kBool,
  kUint8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kFp32,
  kFp64,
  kBytes
};

// Size of one element in bytes; 0 for kInvalid and for kBytes (elements of any size).
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
  // ElementCount(shape) * ElementSize(dtype) bytes. BYTES: each element as a 4-byte
  // little-endian length and its bytes, the protocol's own serialization (HTTP binary data and
  // gRPC raw contents arrive so, and stay unparsed until the request is validated).
  std::string data;

  template <typename T>
  const T* As() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <typename T>
  T* MutableAs() {
    return reinterpret_cast<T*>(data.data());
  }
};

// Appends one BYTES element to a tensor's data (its 4-byte little-endian length, then it).
void AppendBytesElement(std::string_view element, std::string* data);

// Reads element `index` of a BYTES tensor's data at *offset into *element (a view into t.data)
// and moves *offset past it. InvalidArgument naming the tensor when the data ends before the
// element or its length prefix runs past the end: the client controls every prefix.
Status NextBytesElement(const Tensor& t, size_t index, size_t* offset, std::string_view* element);

}  // namespace rec
