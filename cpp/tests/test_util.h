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

// A context model shaped like tests/data/request_golden.json's: dense [hour, price, age] with
// hour and age context, sparse [user, item, history, tags] with user and history context (item
// hex-encoded). So Dc = 2, Fc = 2, Dn = 1, Fn = 2; config.pbtxt in the unbatched form.
inline const char* kContextConfig = R"pb(
  name: "c"
  platform: "pytorch_libtorch"
  max_batch_size: 0 input
  [ {
    name: "context_dense"
    data_type: TYPE_FP32
    dims: [ -1, 2 ]
  }
    , {
      name: "context_lengths"
      data_type: TYPE_INT32
      dims: [ -1, 2 ]
    }
    , {
      name: "context_values"
      data_type: TYPE_INT64
      dims: [ -1 ]
    }
    , {
      name: "candidate_dense"
      data_type: TYPE_FP32
      dims: [ -1, 1 ]
    }
    , {
      name: "candidate_lengths"
      data_type: TYPE_INT32
      dims: [ -1, 2 ]
    }
    , {
      name: "candidate_values"
      data_type: TYPE_INT64
      dims: [ -1 ]
    }
    , {
      name: "candidate_offsets"
      data_type: TYPE_INT32
      dims: [ -1 ]
    }] output
  [ {
    name: "scores"
    data_type: TYPE_FP32
    dims: [ -1, 1 ]
  }]
)pb";

inline const char* kContextManifest = R"({
  "features": {"dense": ["hour", "price", "age"], "sparse": ["user", "item", "history", "tags"]},
  "num_tasks": 1,
  "inputs": [{"name": "context_dense", "role": "context_dense"},
             {"name": "context_lengths", "role": "context_lengths"},
             {"name": "context_values", "role": "context_values"},
             {"name": "candidate_dense", "role": "candidate_dense"},
             {"name": "candidate_lengths", "role": "candidate_lengths"},
             {"name": "candidate_values", "role": "candidate_values"},
             {"name": "candidate_offsets", "role": "candidate_offsets"}],
  "serving": {"max_batch_size": 8, "max_queue_delay_us": 1000},
  "context": {"version": 1, "dense": [0, 2], "sparse": [0, 2], "num_dense": 3, "num_sparse": 4},
  "feature_spec": {"format": "csv", "labels": ["label"], "dense": [],
    "sparse": [{"name": "user", "column": "user", "encoding": "int_or_hash"},
               {"name": "item", "column": "item", "encoding": "hex"},
               {"name": "history", "column": "history", "encoding": "int_or_hash"},
               {"name": "tags", "column": "tags", "encoding": "int_or_hash"}],
    "hash": {"algorithm": "blake2b", "digest_bytes": 8, "version": 1}}})";

inline ModelSpec MakeContextSpec(const std::string& manifest = kContextManifest) {
  ModelSpec spec;
  Status st = ParseModelSpec(kContextConfig, "c", &spec);
  if (st.ok()) st = ApplyManifestText(manifest, "rec.json", &spec);
  if (!st.ok()) throw std::runtime_error(st.message());
  return spec;
}

// A context request: one context (user `base`, history of two ids; dense base, base + 0.5) and
// `candidates` candidates (candidate i: dense base + i, one item, i % 2 tags).
inline InferRequest MakeContextRequest(int64_t candidates, float base) {
  const int64_t user = static_cast<int64_t>(base) * 100;
  std::vector<float> cand_dense;
  std::vector<int32_t> cand_lengths;
  std::vector<int64_t> cand_values;
  for (int64_t i = 0; i < candidates; ++i) {
    cand_dense.push_back(base + static_cast<float>(i));
    cand_lengths.push_back(1);
    cand_lengths.push_back(static_cast<int32_t>(i % 2));
    cand_values.push_back(user + 10 + i);
    if (i % 2) cand_values.push_back(user + 50 + i);
  }
  InferRequest r;
  r.inputs.push_back(
      MakeTensor<float>("context_dense", DataType::kFp32, {1, 2}, {base, base + .5f}));
  r.inputs.push_back(MakeTensor<int32_t>("context_lengths", DataType::kInt32, {1, 2}, {1, 2}));
  r.inputs.push_back(
      MakeTensor<int64_t>("context_values", DataType::kInt64, {3}, {user, user + 1, user + 2}));
  r.inputs.push_back(MakeTensor("candidate_dense", DataType::kFp32, {candidates, 1}, cand_dense));
  r.inputs.push_back(
      MakeTensor("candidate_lengths", DataType::kInt32, {candidates, 2}, cand_lengths));
  r.inputs.push_back(MakeTensor("candidate_values", DataType::kInt64,
                                {static_cast<int64_t>(cand_values.size())}, cand_values));
  return r;
}

}  // namespace rec::testing
