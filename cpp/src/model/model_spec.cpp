#include "model/model_spec.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "contract/manifest.h"
#include "contract/repository_layout.h"
#include "model/context_spec.h"
#include "model_config.pb.h"

namespace rec {
namespace {

Status ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return Status::Ok();
}

Status ConvertIo(const std::string& kind, const std::string& name, inference::DataType dtype,
                 const google::protobuf::RepeatedField<int64_t>& dims, bool ragged, IoSpec* io) {
  io->name = name;
  io->dtype = ParseDataType(inference::DataType_Name(dtype));
  if (io->dtype == DataType::kInvalid) {
    return InvalidArgument(kind + " '" + name + "' has unsupported data type " +
                           inference::DataType_Name(dtype));
  }
  io->dims.assign(dims.begin(), dims.end());
  io->ragged = ragged;
  if (ragged && io->dims.size() != 1) {
    return InvalidArgument(kind + " '" + name + "' is ragged and must have dims [-1]");
  }
  return Status::Ok();
}

// The jagged pair: the single ragged INT64 input, and the INT32 [F] input that counts its ids.
void FindJaggedPair(ModelSpec* spec) {
  for (size_t i = 0; i < spec->inputs.size(); ++i) {
    const IoSpec& io = spec->inputs[i];
    if (io.ragged && spec->values_input < 0) spec->values_input = static_cast<int>(i);
    if (!io.ragged && io.dtype == DataType::kInt32 && io.dims.size() == 1 &&
        spec->lengths_input < 0) {
      spec->lengths_input = static_cast<int>(i);
    }
  }
  if (spec->values_input < 0 || spec->lengths_input < 0) {
    spec->values_input = spec->lengths_input = -1;
  }
}

// max_batch_size 0 means the config's dims include the batch dimension (Triton batches nothing).
// Such a model is served one request per forward: the leading -1 becomes the batch dimension, and
// the 1-D [-1] INT64 input is the jagged values.
Status NormalizeUnbatched(ModelSpec* spec) {
  if (spec->max_batch_size > 0) return Status::Ok();
  auto strip = [&](IoSpec* io, const char* kind) -> Status {
    if (io->dims.size() == 1 && io->dims[0] == -1 && io->dtype == DataType::kInt64) {
      io->ragged = true;
      return Status::Ok();
    }
    if (io->dims.empty() || io->dims[0] != -1) {
      return InvalidArgument("model '" + spec->name + "': max_batch_size is 0, so " + kind + " '" +
                             io->name + "' needs a leading -1 batch dimension, got " +
                             ShapeString(io->dims));
    }
    io->dims.erase(io->dims.begin());
    return Status::Ok();
  };
  for (IoSpec& io : spec->inputs) REC_RETURN_IF_ERROR(strip(&io, "input"));
  for (IoSpec& io : spec->outputs) {
    if (io.dims.empty() || io.dims[0] != -1) {
      return InvalidArgument("model '" + spec->name + "': output '" + io.name +
                             "' needs a leading -1 batch dimension");
    }
    io.dims.erase(io.dims.begin());
  }
  spec->max_batch_size = int64_t{1} << 30;  // no limit but the body size
  spec->dynamic_batching = false;
  return Status::Ok();
}

Status CheckServable(const ModelSpec& spec) {
  if (spec.inputs.empty() || spec.outputs.empty()) {
    return InvalidArgument("model '" + spec.name + "': config has no inputs or no outputs");
  }
  for (const IoSpec& io : spec.inputs) {
    for (int64_t d : io.dims) {
      if (d < 0 && !io.ragged) {
        return InvalidArgument("model '" + spec.name + "': input '" + io.name +
                               "' has a variable dimension but is not ragged");
      }
    }
  }
  return Status::Ok();
}

// A config with max_batch_size 0 (export.triton_batching: none) says nothing about batching:
// Triton cannot batch it. rec.json's "serving" (written by `rec export` whatever the form)
// gives the limit and the batching window, and rec.json's presence vouches that the model's
// I/O concatenates along dim 0 (docs/architecture.md#batching-by-concatenation), so the server
// batches it like the ragged form.
// Without "serving" (an older manifest) the model stays one request per forward.
void ApplyServing(const ServingSection& serving, ModelSpec* spec) {
  if (!serving.present || !spec->config || spec->config->max_batch_size() > 0) return;
  spec->max_batch_size = serving.max_batch_size;
  spec->max_queue_delay_us = serving.max_queue_delay_us;
  spec->preferred_batch_sizes = serving.preferred_batch_sizes;
  spec->dynamic_batching = true;
}

// rec.json's "inputs" name each input's role (dense, lengths, values): the jagged pair is taken
// from the roles, not guessed from dtype and rank. A manifest without roles keeps the guess.
Status ApplyRoles(const std::vector<InputRole>& roles, const std::string& source, ModelSpec* spec) {
  auto bad = [&](const std::string& field, const std::string& want, const std::string& got) {
    return InvalidArgument("model '" + spec->name + "': " + source + ": \"" + field +
                           "\" must be " + want + ", got " + got);
  };
  int lengths = -1, values = -1;
  for (size_t i = 0; i < roles.size(); ++i) {
    const InputRole& r = roles[i];
    if (r.role != "lengths" && r.role != "values") continue;
    const std::string at = "inputs[" + std::to_string(i) + "]";
    const int index = FindInput(*spec, r.name);
    if (index < 0)
      return bad(at + ".name", "an input of config.pbtxt", nlohmann::json(r.name).dump());
    const IoSpec& io = spec->inputs[index];
    const bool fits = r.role == "lengths"
                          ? !io.ragged && io.dtype == DataType::kInt32 && io.dims.size() == 1
                          : io.ragged && io.dtype == DataType::kInt64;
    if (!fits) {
      return bad(at + ".role",
                 r.role == "lengths" ? "lengths only for an INT32 [F] input of config.pbtxt"
                                     : "values only for a ragged INT64 input of config.pbtxt",
                 nlohmann::json(r.role).dump());
    }
    (r.role == "lengths" ? lengths : values) = index;
  }
  if (lengths >= 0) {  // with values: the manifest's reader checks that they come as a pair
    spec->lengths_input = lengths;
    spec->values_input = values;
  }
  return Status::Ok();
}

// The feature names and num_tasks against the config's inputs and output.
Status CheckCounts(ModelSpec* spec) {
  auto expect = [&](int i, size_t n, const char* what) -> Status {
    if (i < 0 || n == 0 || spec->inputs[i].dims.size() != 1) return Status::Ok();
    if (spec->inputs[i].dims[0] != static_cast<int64_t>(n)) {
      return InvalidArgument("model '" + spec->name + "': rec.json lists " + std::to_string(n) +
                             " " + what + " features but config.pbtxt gives input '" +
                             spec->inputs[i].name + "' dims " + ShapeString(spec->inputs[i].dims));
    }
    return Status::Ok();
  };
  REC_RETURN_IF_ERROR(
      expect(FindInput(*spec, "dense_features"), spec->dense_feature_names.size(), "dense"));
  REC_RETURN_IF_ERROR(expect(spec->lengths_input, spec->sparse_feature_names.size(), "sparse"));
  if (spec->num_tasks > 0 && spec->outputs.size() == 1 && spec->outputs[0].dims.size() == 1 &&
      spec->outputs[0].dims[0] != spec->num_tasks) {
    return InvalidArgument("model '" + spec->name + "': rec.json num_tasks " +
                           std::to_string(spec->num_tasks) + " but config.pbtxt output dims " +
                           ShapeString(spec->outputs[0].dims));
  }
  return Status::Ok();
}

// "feature_spec" needs the jagged pair, with one sparse_lengths column per feature.
Status ApplyFeatureSpec(FeatureSpecSection feature_spec, const std::string& source,
                        ModelSpec* spec) {
  if (!feature_spec.present) return Status::Ok();
  auto bad = [&](const std::string& problem) {
    return InvalidArgument("model '" + spec->name + "': " + source + ": feature_spec" + problem);
  };
  const size_t n = feature_spec.sparse.size();
  if (spec->context.present) {  // the flat columns, split between context and candidates
    if (static_cast<int64_t>(n) != spec->context.num_sparse) {
      return bad(" lists " + std::to_string(n) + " sparse features but \"context\" has " +
                 std::to_string(spec->context.num_sparse));
    }
    spec->has_feature_spec = true;
    spec->sparse_encodings = std::move(feature_spec.sparse);
    return Status::Ok();
  }
  if (spec->lengths_input < 0) {
    return bad(" is given but config.pbtxt has no sparse lengths / ragged values pair of inputs");
  }
  const IoSpec& lengths = spec->inputs[spec->lengths_input];
  if (lengths.dims.size() != 1 || lengths.dims[0] != static_cast<int64_t>(n)) {
    return bad(" lists " + std::to_string(n) + " sparse features but config.pbtxt gives input '" +
               lengths.name + "' dims " + ShapeString(lengths.dims));
  }
  spec->has_feature_spec = true;
  spec->sparse_encodings = std::move(feature_spec.sparse);
  return Status::Ok();
}

}  // namespace

int FindInput(const ModelSpec& spec, const std::string& name) {
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int FindOutput(const ModelSpec& spec, const std::string& name) {
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    if (spec.outputs[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Status ParseModelSpec(const std::string& config_text, const std::string& model_name,
                      ModelSpec* spec) {
  auto config = std::make_shared<inference::ModelConfig>();
  if (!google::protobuf::TextFormat::ParseFromString(config_text, config.get())) {
    return InvalidArgument("model '" + model_name + "': config.pbtxt is not a valid ModelConfig");
  }
  if (config->name().empty()) config->set_name(model_name);
  spec->config = config;
  const inference::ModelConfig& c = *config;
  spec->platform = c.platform();
  spec->backend = c.backend();
  spec->default_model_filename = c.default_model_filename();
  spec->name = model_name;
  spec->max_batch_size = c.max_batch_size();
  spec->dynamic_batching = c.has_dynamic_batching();
  int instances = 0;
  for (const auto& group : c.instance_group()) instances += std::max(1, group.count());
  spec->instance_count = std::clamp(instances, 1, 64);
  spec->max_queue_delay_us =
      static_cast<int64_t>(c.dynamic_batching().max_queue_delay_microseconds());
  spec->preferred_batch_sizes.assign(c.dynamic_batching().preferred_batch_size().begin(),
                                     c.dynamic_batching().preferred_batch_size().end());
  for (const auto& in : c.input()) {
    IoSpec io;
    REC_RETURN_IF_ERROR(
        ConvertIo("input", in.name(), in.data_type(), in.dims(), in.allow_ragged_batch(), &io));
    spec->inputs.push_back(io);
  }
  for (const auto& out : c.output()) {
    IoSpec io;
    REC_RETURN_IF_ERROR(ConvertIo("output", out.name(), out.data_type(), out.dims(), false, &io));
    spec->outputs.push_back(io);
  }
  REC_RETURN_IF_ERROR(NormalizeUnbatched(spec));
  FindJaggedPair(spec);
  return CheckServable(*spec);
}

Status ReadUpdatesSpec(const std::string& manifest_path, const ModelSpec& spec, UpdatesSpec* out) {
  std::string text;
  if (!ReadFile(manifest_path, &text).ok()) {
    *out = spec.updates;  // a version without its own rec.json: the model's
    return Status::Ok();
  }
  return ParseUpdatesSection(text, spec.name, manifest_path, out);
}

Status ApplyManifestText(const std::string& manifest_text, const std::string& source,
                         ModelSpec* spec) {
  Manifest manifest;
  REC_RETURN_IF_ERROR(ParseManifest(manifest_text, spec->name, source, &manifest));
  ApplyServing(manifest.serving, spec);
  spec->updates = std::move(manifest.updates);
  if (manifest.has_features) {
    spec->dense_feature_names = std::move(manifest.dense_features);
    spec->sparse_feature_names = std::move(manifest.sparse_features);
  }
  if (manifest.num_tasks > 0) spec->num_tasks = manifest.num_tasks;
  REC_RETURN_IF_ERROR(ApplyRoles(manifest.inputs, source, spec));
  const bool batched_config = spec->config && spec->config->max_batch_size() > 0;
  REC_RETURN_IF_ERROR(
      ApplyContext(manifest.context, manifest.inputs, source, batched_config, spec));
  REC_RETURN_IF_ERROR(CheckCounts(spec));
  REC_RETURN_IF_ERROR(ApplyFeatureSpec(std::move(manifest.feature_spec), source, spec));
  FinishContext(spec);
  return Status::Ok();
}

Status LoadModelSpec(const std::string& model_dir, const std::string& model_name, ModelSpec* spec) {
  std::string text;
  REC_RETURN_IF_ERROR(ReadFile(model_dir + "/" + kTritonConfigFile, &text));
  REC_RETURN_IF_ERROR(ParseModelSpec(text, model_name, spec));
  std::string manifest_text;
  const std::string manifest_path = model_dir + "/" + kManifestFile;
  if (!ReadFile(manifest_path, &manifest_text).ok()) return Status::Ok();
  return ApplyManifestText(manifest_text, manifest_path, spec);
}

}  // namespace rec
