// Helpers shared by the unit tests: a small spec shaped like the exported model's.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/request.h"

namespace rec::testing {

inline const char* kConfig = R"pb(
  name: "m"
  platform: "pytorch_libtorch"
  max_batch_size: 8 input
  [ {
    name: "dense_features"
    data_type: TYPE_FP32
    dims: [ 2 ]
  }
    , {
      name: "sparse_lengths"
      data_type: TYPE_INT32
      dims: [ 3 ]
    }
    , {
      name: "sparse_values"
      data_type: TYPE_INT64
      dims: [ -1 ]
      allow_ragged_batch: true
    }] output
  [ {
    name: "scores"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }]
  dynamic_batching { max_queue_delay_microseconds: 1000 }
)pb";

inline ModelSpec MakeSpec() {
  ModelSpec spec;
  Status st = ParseModelSpec(kConfig, "m", &spec);
  if (!st.ok()) throw std::runtime_error(st.message());
  return spec;
}

// The spec's features x, y, z with a feature spec as `rec export` writes it; y is hex (Criteo's
// encoding), the others int_or_hash.
inline const char* kFeatureSpecManifest = R"({
  "features": {"dense": ["a", "b"], "sparse": ["x", "y", "z"]},
  "feature_spec": {"format": "csv", "labels": ["label"], "dense": [],
    "sparse": [{"name": "x", "column": "x", "encoding": "int_or_hash", "separator": "|"},
               {"name": "y", "column": "y", "encoding": "hex", "separator": null},
               {"name": "z", "column": "z", "encoding": "int_or_hash", "separator": "|"}],
    "hash": {"algorithm": "blake2b", "digest_bytes": 8, "byte_order": "little", "signed": true,
             "input": "utf-8 bytes of the token", "version": 1}}})";

inline ModelSpec MakeSpecWithFeatureSpec() {
  ModelSpec spec = MakeSpec();
  Status st = ApplyManifestText(kFeatureSpecManifest, "rec.json", &spec);
  if (!st.ok()) throw std::runtime_error(st.message());
  return spec;
}

// A BYTES tensor of `elements` (each length-prefixed, as the protocol serializes them).
inline Tensor MakeBytesTensor(const std::string& name, std::vector<int64_t> shape,
                              const std::vector<std::string>& elements) {
  Tensor t;
  t.name = name;
  t.dtype = DataType::kBytes;
  t.shape = std::move(shape);
  for (const std::string& e : elements) AppendBytesElement(e, &t.data);
  return t;
}

template <typename T>
Tensor MakeTensor(const std::string& name, DataType dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values) {
  Tensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

// A valid request of `rows` rows; dense values encode (row offset + r), lengths are r % 3.
inline InferRequest MakeRequest(int64_t rows, float base) {
  InferRequest r;
  std::vector<float> dense;
  std::vector<int32_t> lengths;
  std::vector<int64_t> values;
  for (int64_t i = 0; i < rows; ++i) {
    dense.push_back(base + static_cast<float>(i));
    dense.push_back(-(base + static_cast<float>(i)));
    for (int f = 0; f < 3; ++f) {
      int32_t n = static_cast<int32_t>((i + f) % 3);
      lengths.push_back(n);
      for (int k = 0; k < n; ++k) values.push_back(static_cast<int64_t>(base) * 100 + i * 10 + k);
    }
  }
  r.inputs.push_back(
      MakeTensor("sparse_values", DataType::kInt64, {static_cast<int64_t>(values.size())}, values));
  r.inputs.push_back(MakeTensor("dense_features", DataType::kFp32, {rows, 2}, dense));
  r.inputs.push_back(MakeTensor("sparse_lengths", DataType::kInt32, {rows, 3}, lengths));
  return r;
}

}  // namespace rec::testing
