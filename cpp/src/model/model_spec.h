// ModelSpec: what the server needs to know about a model, read once from config.pbtxt (and
// rec.json). Requests are validated against it; the loaded TorchScript is checked against it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/feature_encoding.h"
#include "common/status.h"
#include "common/tensor.h"
#include "contract/updates_spec.h"

namespace inference {
class ModelConfig;
}

namespace rec {

struct IoSpec {
  std::string name;
  DataType dtype = DataType::kInvalid;
  std::vector<int64_t> dims;  // without the batch dimension; -1 = any size
  bool ragged = false;        // allow_ragged_batch: concatenated end to end, no batch dim
};

struct ModelSpec;

// A context model (rec.json "context"): a request carries one context (the request's own
// features: user, device, time) and N candidates, and the model reads the context once per
// request. Its inputs, by role, in forward order: context_dense, context_lengths,
// context_values, candidate_dense, candidate_lengths, candidate_values, candidate_offsets (a
// zero-width one left out). The offsets are [R+1] per batch of R requests, filled by the server.
struct ContextSpec {
  bool present = false;
  // Indices into ModelSpec::inputs by role; -1 for an input left out (zero width).
  int context_dense = -1;
  int context_lengths = -1;
  int context_values = -1;
  int candidate_dense = -1;
  int candidate_lengths = -1;
  int candidate_values = -1;
  int candidate_offsets = -1;
  // Flat column indices, ascending: the context's, and the candidates' (the complement). A flat
  // request (dense_features [B, num_dense], sparse_lengths [B, num_sparse]) is split by them.
  std::vector<int64_t> dense, sparse, cand_dense, cand_sparse;
  int64_t num_dense = 0;
  int64_t num_sparse = 0;
  // With a feature spec: the encodings of `sparse` and of `cand_sparse`, for context_strings
  // and candidate_strings.
  std::vector<SparseEncoding> context_encodings, candidate_encodings;
  // The flat form as a spec of its own (dense_features, sparse_lengths, sparse_values; the
  // model's limits and feature spec): what a flat request is validated against before its split.
  std::shared_ptr<const ModelSpec> flat;
};

struct ModelSpec {
  std::string name;
  // As parsed, for the config endpoints. Behind a pointer so that this header does not pull
  // in protobuf: LibTorch ships protobuf headers of another version.
  std::shared_ptr<const inference::ModelConfig> config;
  std::string platform;
  std::string backend;
  std::string default_model_filename;
  // 0 in the config (dims include the batch): taken from rec.json "serving" when it has one
  // (batched like any other model), else 2^30 and one request per forward.
  int64_t max_batch_size = 0;
  int64_t max_queue_delay_us = 0;
  std::vector<int64_t> preferred_batch_sizes;
  bool dynamic_batching = false;
  int instance_count = 1;      // sum of instance_group counts
  std::vector<IoSpec> inputs;  // in the order the model's forward takes them
  std::vector<IoSpec> outputs;
  // The jagged pair: per-sample lengths (INT32 [B, F]) and the ids they count (ragged INT64).
  // -1 if the model has no such pair.
  int lengths_input = -1;
  int values_input = -1;
  // From rec.json when present (empty otherwise).
  std::vector<std::string> dense_feature_names;
  std::vector<std::string> sparse_feature_names;
  int64_t num_tasks = -1;
  // rec.json's feature_spec: how each sparse feature's tokens become ids, in sparse_lengths'
  // column order. Without one (a foreign model, an older export) requests must send ids.
  bool has_feature_spec = false;
  std::vector<SparseEncoding> sparse_encodings;
  // rec.json's "updates": the tables' places for the update log (present: the model can take
  // updates).
  UpdatesSpec updates;
  // rec.json's "context": the model takes the context form (lengths_input and values_input are
  // then -1; the flat form is split into it per request, model/context_request.h).
  ContextSpec context;
};

// Parses <model_dir>/config.pbtxt (protobuf text format) and <model_dir>/rec.json if present,
// and checks that they agree with each other and that the server can serve the model.
Status LoadModelSpec(const std::string& model_dir, const std::string& model_name, ModelSpec* spec);

// Parses config text into a spec (no rec.json); exposed for tests.
Status ParseModelSpec(const std::string& config_text, const std::string& model_name,
                      ModelSpec* spec);

// Applies rec.json's text (read from `source`, named in errors) to a parsed spec: feature names,
// num_tasks, the sparse encodings of "feature_spec" (a hash other than the one this server
// implements fails), for a max_batch_size 0 config the batching settings of "serving", and
// "context" (the model's inputs become rec.json's "inputs", in their order).
// Exposed for tests.
Status ApplyManifestText(const std::string& manifest_text, const std::string& source,
                         ModelSpec* spec);

// The "updates" section of one version's rec.json (`manifest_path`); the model's own when that
// version has no rec.json.
Status ReadUpdatesSpec(const std::string& manifest_path, const ModelSpec& spec, UpdatesSpec* out);

// Returns the index of the input named `name`, or -1.
int FindInput(const ModelSpec& spec, const std::string& name);
int FindOutput(const ModelSpec& spec, const std::string& name);

}  // namespace rec
