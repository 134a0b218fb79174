#include "model/model_spec.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/repository_layout.h"
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

// Every refusal of a malformed rec.json field is worded as rec/contract/manifest.py words it:
// `<source>: "<field>" must be <what>, got <value>` (tests/serve_cpp/test_manifest_contract.py
// feeds both the same files).
Status BadField(const ModelSpec& spec, const std::string& source, const std::string& field,
                const std::string& want, const nlohmann::json* got) {
  return InvalidArgument("model '" + spec.name + "': " + source + ": \"" + field + "\" must be " +
                         want + ", got " + (got ? got->dump() : std::string("none")));
}

bool IsStringList(const nlohmann::json& v) {
  if (!v.is_array()) return false;
  for (const auto& x : v) {
    if (!x.is_string()) return false;
  }
  return true;
}

// A config with max_batch_size 0 (export.triton_batching: none) says nothing about batching:
// Triton cannot batch it. rec.json's "serving" (written by `rec export` whatever the form)
// gives the limit and the batching window, and rec.json's presence vouches that the model's
// I/O concatenates along dim 0 (docs/architecture.md#batching-by-concatenation), so the server
// batches it like the ragged form.
// Without "serving" (an older manifest) the model stays one request per forward.
Status ApplyServing(const nlohmann::json& manifest, const std::string& source, ModelSpec* spec) {
  if (!manifest.contains("serving")) return Status::Ok();
  const nlohmann::json& serving = manifest["serving"];
  auto bad = [&](const std::string& key, const std::string& want) {
    std::string got = serving.is_object() && serving.contains(key) ? serving[key].dump() : "none";
    return InvalidArgument("model '" + spec->name + "': " + source + ": \"serving." + key +
                           "\" must be " + want + ", got " + got);
  };
  if (!serving.is_object()) {
    return InvalidArgument("model '" + spec->name + "': " + source +
                           ": \"serving\" must be an object, got " + serving.dump());
  }
  auto integer = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() <= (int64_t{1} << 30);
  };
  const auto max_batch = serving.find("max_batch_size");
  if (max_batch == serving.end() || !integer(*max_batch) || max_batch->get<int64_t>() < 1) {
    return bad("max_batch_size", "an integer in [1, 2^30]");
  }
  int64_t max_batch_size = max_batch->get<int64_t>();
  int64_t delay_us = 0;
  const auto delay = serving.find("max_queue_delay_us");
  if (delay != serving.end()) {
    if (!integer(*delay) || delay->get<int64_t>() < 0) {
      return bad("max_queue_delay_us", "an integer in [0, 2^30]");
    }
    delay_us = delay->get<int64_t>();
  }
  std::vector<int64_t> preferred;
  const auto sizes = serving.find("preferred_batch_sizes");
  if (sizes != serving.end()) {
    std::string want =
        "a list of integers in [1, max_batch_size=" + std::to_string(max_batch_size) + "]";
    if (!sizes->is_array()) return bad("preferred_batch_sizes", want);
    for (const auto& size : *sizes) {
      if (!integer(size) || size.get<int64_t>() < 1 || size.get<int64_t>() > max_batch_size) {
        return bad("preferred_batch_sizes", want);
      }
      preferred.push_back(size.get<int64_t>());
    }
  }
  // Checked whatever the form (rec/contract/manifest.py does too); applied to the `none` form.
  if (!spec->config || spec->config->max_batch_size() > 0) return Status::Ok();
  spec->max_batch_size = max_batch_size;
  spec->max_queue_delay_us = delay_us;
  spec->preferred_batch_sizes = std::move(preferred);
  spec->dynamic_batching = true;
  return Status::Ok();
}

// feature_spec.hash must be the hash this server implements: ids computed with another would
// differ from training's without any error, so such a model does not load.
Status CheckHash(const nlohmann::json& hash, const std::function<Status(std::string)>& bad) {
  auto field = [&](const char* key) {
    return hash.is_object() && hash.contains(key) ? hash[key] : nlohmann::json();
  };
  const std::string implemented = std::string("rec-server implements hash version ") +
                                  std::to_string(kHashVersion) + " (" + kHashAlgorithm + ", " +
                                  std::to_string(kHashDigestBytes) + "-byte digest)";
  if (field("version") != kHashVersion) {
    return bad(".hash.version is " + field("version").dump() + ", not implemented: " + implemented);
  }
  if (field("algorithm") != kHashAlgorithm || field("digest_bytes") != kHashDigestBytes) {
    return bad(".hash is " + hash.dump() + ", not implemented: " + implemented);
  }
  // Optional in the manifest, but if given they must describe the same digest reading.
  if ((hash.contains("byte_order") && hash["byte_order"] != "little") ||
      (hash.contains("signed") && hash["signed"] != true)) {
    return bad(".hash is " + hash.dump() + ", not implemented: " + implemented +
               ", read as a little-endian signed int64");
  }
  return Status::Ok();
}

// rec.json's "feature_spec" (rec/features.py): the server needs only each sparse feature's
// encoding, in sparse_lengths' column order, and the hash. Dense transforms are inside the model.
Status ApplyFeatureSpec(const nlohmann::json& manifest, const std::string& source,
                        ModelSpec* spec) {
  auto it = manifest.find("feature_spec");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  auto bad = [&](const std::string& problem) {
    return InvalidArgument("model '" + spec->name + "': " + source + ": feature_spec" + problem);
  };
  const nlohmann::json& fs = *it;
  if (!fs.is_object()) return BadField(*spec, source, "feature_spec", "an object or null", &fs);
  REC_RETURN_IF_ERROR(CheckHash(fs.contains("hash") ? fs["hash"] : nlohmann::json(), bad));
  if (!fs.contains("sparse") || !fs["sparse"].is_array()) return bad(".sparse must be a list");
  const nlohmann::json& sparse = fs["sparse"];
  std::vector<SparseEncoding> encodings;
  for (size_t i = 0; i < sparse.size(); ++i) {
    const nlohmann::json& f = sparse[i];
    const std::string where = ".sparse[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        !f.contains("encoding") || !f["encoding"].is_string()) {
      return bad(where + " needs a string \"name\" and \"encoding\", got " + f.dump());
    }
    SparseEncoding e;
    e.feature = f["name"].get<std::string>();
    Status st = ParseEncoding(f["encoding"].get<std::string>(), &e.encoding);
    if (!st.ok()) return bad(where + " (feature '" + e.feature + "'): " + st.message());
    if (i < spec->sparse_feature_names.size() && spec->sparse_feature_names[i] != e.feature) {
      return bad(where + " is feature '" + e.feature + "' but features.sparse[" +
                 std::to_string(i) + "] is '" + spec->sparse_feature_names[i] + "'");
    }
    encodings.push_back(std::move(e));
  }
  if (spec->lengths_input < 0) {
    return bad(" is given but config.pbtxt has no sparse lengths / ragged values pair of inputs");
  }
  const IoSpec& lengths = spec->inputs[spec->lengths_input];
  if (lengths.dims.size() != 1 || lengths.dims[0] != static_cast<int64_t>(encodings.size())) {
    return bad(" lists " + std::to_string(encodings.size()) +
               " sparse features but config.pbtxt gives input '" + lengths.name + "' dims " +
               ShapeString(lengths.dims));
  }
  spec->has_feature_spec = true;
  spec->sparse_encodings = std::move(encodings);
  return Status::Ok();
}

// features.dense / features.sparse and num_tasks: optional for a foreign model, checked if given.
Status ApplyNames(const nlohmann::json& manifest, const std::string& source, ModelSpec* spec) {
  if (manifest.contains("features")) {
    const nlohmann::json& f = manifest["features"];
    for (const char* key : {"dense", "sparse"}) {
      const nlohmann::json* names = f.is_object() && f.contains(key) ? &f[key] : nullptr;
      if (!names || !IsStringList(*names)) {
        return BadField(*spec, source, std::string("features.") + key, "a list of strings", names);
      }
      auto& out =
          std::string(key) == "dense" ? spec->dense_feature_names : spec->sparse_feature_names;
      out = names->get<std::vector<std::string>>();
    }
  }
  if (manifest.contains("num_tasks")) {
    const nlohmann::json& n = manifest["num_tasks"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > (int64_t{1} << 30)) {
      return BadField(*spec, source, "num_tasks", "an integer in [1, 2^30]", &n);
    }
    spec->num_tasks = n.get<int64_t>();
  }
  return Status::Ok();
}

// rec.json's "inputs" name each input's role (dense, lengths, values): the jagged pair is taken
// from the roles, not guessed from dtype and rank. A manifest without roles keeps the guess.
Status ApplyRoles(const nlohmann::json& manifest, const std::string& source, ModelSpec* spec) {
  if (!manifest.contains("inputs")) return Status::Ok();
  const nlohmann::json& inputs = manifest["inputs"];
  if (!inputs.is_array()) {
    return BadField(*spec, source, "inputs", "a list of {name, role} objects", &inputs);
  }
  int lengths = -1, values = -1;
  bool seen_dense = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const nlohmann::json& entry = inputs[i];
    const std::string where = "inputs[" + std::to_string(i) + "]";
    const nlohmann::json* name =
        entry.is_object() && entry.contains("name") ? &entry["name"] : nullptr;
    if (!name || !name->is_string())
      return BadField(*spec, source, where + ".name", "a string", name);
    if (!entry.contains("role")) continue;
    const nlohmann::json& role = entry["role"];
    const std::string want = "one of dense, lengths, values, each once";
    if (!role.is_string()) return BadField(*spec, source, where + ".role", want, &role);
    const std::string r = role.get<std::string>();
    int* slot = r == "lengths" ? &lengths : r == "values" ? &values : nullptr;
    if ((r != "dense" && !slot) || (slot && *slot >= 0) || (r == "dense" && seen_dense)) {
      return BadField(*spec, source, where + ".role", want, &role);
    }
    if (r == "dense") {
      seen_dense = true;
      continue;
    }
    const int index = FindInput(*spec, name->get<std::string>());
    if (index < 0) {
      return BadField(*spec, source, where + ".name", "an input of config.pbtxt", name);
    }
    const IoSpec& io = spec->inputs[index];
    const bool fits = r == "lengths"
                          ? !io.ragged && io.dtype == DataType::kInt32 && io.dims.size() == 1
                          : io.ragged && io.dtype == DataType::kInt64;
    if (!fits) {
      return BadField(*spec, source, where + ".role",
                      r == "lengths" ? "lengths only for an INT32 [F] input of config.pbtxt"
                                     : "values only for a ragged INT64 input of config.pbtxt",
                      &role);
    }
    *slot = index;
  }
  if ((lengths >= 0) != (values >= 0)) {
    return BadField(*spec, source, "inputs", "roles with both lengths and values", &inputs);
  }
  if (lengths >= 0) {
    spec->lengths_input = lengths;
    spec->values_input = values;
  }
  return Status::Ok();
}

// "updates": where each table's rows lie in the model's storage, for the update log.
Status ApplyUpdates(const nlohmann::json& manifest, const std::string& source, ModelSpec* spec) {
  auto it = manifest.find("updates");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  const nlohmann::json& u = *it;
  if (!u.is_object()) return BadField(*spec, source, "updates", "an object or null", &u);
  UpdatesSpec out;
  out.present = true;
  auto text = [&](const char* key, std::string* dst) -> Status {
    auto f = u.find(key);
    if (f == u.end() || f->is_null()) return Status::Ok();
    if (!f->is_string())
      return BadField(*spec, source, std::string("updates.") + key, "a string or null", &*f);
    *dst = f->get<std::string>();
    return Status::Ok();
  };
  REC_RETURN_IF_ERROR(text("url", &out.url));
  REC_RETURN_IF_ERROR(text("run", &out.run));
  auto step = u.find("step");
  if (step == u.end() || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return BadField(*spec, source, "updates.step", "an integer >= 0",
                    step == u.end() ? nullptr : &*step);
  }
  out.step = step->get<int64_t>();
  auto gen = u.find("gen");  // absent in an export of before generations: 0
  if (gen != u.end() && (!gen->is_number_integer() || gen->get<int64_t>() < 0)) {
    return BadField(*spec, source, "updates.gen", "an integer >= 0", &*gen);
  }
  out.gen = gen == u.end() ? 0 : gen->get<int64_t>();
  auto tables = u.find("tables");
  if (tables == u.end() || !tables->is_object()) {
    return BadField(*spec, source, "updates.tables", "an object",
                    tables == u.end() ? nullptr : &*tables);
  }
  for (auto item = tables->begin(); item != tables->end(); ++item) {
    // Named, not a structured binding: clang (the fuzz build) cannot capture those in lambdas.
    const std::string name = item.key();
    const nlohmann::json& t = item.value();
    const std::string where = "updates.tables." + name;
    TablePlace p;
    auto num = [&](const char* key, int64_t* dst) -> Status {
      auto f = t.is_object() ? t.find(key) : t.end();
      if (!t.is_object() || f == t.end() || !f->is_number_integer() || f->get<int64_t>() < 0) {
        return BadField(*spec, source, where + "." + key, "an integer >= 0",
                        t.is_object() && f != t.end() ? &*f : nullptr);
      }
      *dst = f->get<int64_t>();
      return Status::Ok();
    };
    REC_RETURN_IF_ERROR(num("offset", &p.offset));
    REC_RETURN_IF_ERROR(num("row_stride", &p.row_stride));
    REC_RETURN_IF_ERROR(num("rows", &p.rows));
    REC_RETURN_IF_ERROR(num("dim", &p.dim));
    auto str = [&](const char* key, std::string* dst) -> Status {
      auto f = t.find(key);
      if (f == t.end() || !f->is_string()) {
        return BadField(*spec, source, where + "." + key, "a string", f == t.end() ? nullptr : &*f);
      }
      *dst = f->get<std::string>();
      return Status::Ok();
    };
    REC_RETURN_IF_ERROR(str("buffer", &p.buffer));
    REC_RETURN_IF_ERROR(str("dtype", &p.dtype));
    std::string sb;
    REC_RETURN_IF_ERROR(str("scale_bias", &sb));
    if (UpdateRowBytes(p.dim, p.dtype) < 0) {
      const nlohmann::json& got = t["dtype"];
      return BadField(*spec, source, where + ".dtype", "one of int8, int4, fp16, fp32", &got);
    }
    if (sb != "first" && sb != "none") {
      const nlohmann::json& got = t["scale_bias"];
      return BadField(*spec, source, where + ".scale_bias", "\"first\" or \"none\"", &got);
    }
    p.scale_bias_first = sb == "first";
    if (p.scale_bias_first != (p.dtype == "int8" || p.dtype == "int4")) {
      const nlohmann::json& got = t["scale_bias"];
      return BadField(*spec, source, where + ".scale_bias",
                      "\"first\" for int8/int4 rows and \"none\" otherwise", &got);
    }
    out.tables[name] = p;
  }
  spec->updates = std::move(out);
  return Status::Ok();
}

Status ApplyManifest(const nlohmann::json& manifest, const std::string& source, ModelSpec* spec) {
  REC_RETURN_IF_ERROR(ApplyServing(manifest, source, spec));
  REC_RETURN_IF_ERROR(ApplyUpdates(manifest, source, spec));
  REC_RETURN_IF_ERROR(ApplyNames(manifest, source, spec));
  REC_RETURN_IF_ERROR(ApplyRoles(manifest, source, spec));
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
  return ApplyFeatureSpec(manifest, source, spec);
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
  std::ifstream in(manifest_path);
  if (!in) {
    *out = spec.updates;  // a version without its own rec.json: the model's
    return Status::Ok();
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json manifest = nlohmann::json::parse(text.str(), nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return InvalidArgument("model '" + spec.name + "': " + manifest_path + " is not a JSON object");
  }
  ModelSpec copy;
  copy.name = spec.name;
  try {
    REC_RETURN_IF_ERROR(ApplyUpdates(manifest, manifest_path, &copy));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("model '" + spec.name + "': " + manifest_path + ": " + e.what());
  }
  *out = std::move(copy.updates);
  return Status::Ok();
}

Status ApplyManifestText(const std::string& manifest_text, const std::string& source,
                         ModelSpec* spec) {
  nlohmann::json manifest = nlohmann::json::parse(manifest_text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return InvalidArgument("model '" + spec->name + "': " + source + " is not a JSON object");
  }
  try {
    return ApplyManifest(manifest, source, spec);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("model '" + spec->name + "': " + source + ": " + e.what());
  }
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
