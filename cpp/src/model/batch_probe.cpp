#include "model/batch_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "model/context_request.h"

namespace rec {
namespace {

// Fills `t` (named, typed and shaped from the spec's input) from a JSON array of rows or ids.
Status FillInput(const nlohmann::json& value, const IoSpec& io, const std::string& source,
                 Tensor* t) {
  t->name = io.name;
  t->dtype = io.dtype;
  auto bad = [&](const std::string& why) {
    return InvalidArgument(source + ": batch_probe." + io.name + " " + why);
  };
  if (!value.is_array() || (value.empty() && !io.ragged)) return bad("must be a non-empty array");
  std::vector<double> flat;
  int64_t width = -1;
  for (const auto& row : value) {
    if (io.ragged) {
      if (!row.is_number_integer()) return bad("must hold integer ids");
      // ids are copied below as integers, not through double; offsets (INT32) are small
      flat.push_back(io.dtype == DataType::kInt32 ? row.get<double>() : 0);
      continue;
    }
    if (!row.is_array()) return bad("must be an array of rows");
    if (width >= 0 && static_cast<int64_t>(row.size()) != width)
      return bad("has rows of two widths");
    width = static_cast<int64_t>(row.size());
    for (const auto& v : row) {
      if (!v.is_number()) return bad("must hold numbers");
      const double d = v.get<double>();
      if (io.dtype == DataType::kInt32 && !(d >= 0 && d <= 1 << 20 && d == std::floor(d))) {
        return bad("must hold whole counts in [0, 2^20]");
      }
      if (io.dtype == DataType::kFp32 && !std::isfinite(static_cast<float>(d))) {
        return bad("must hold finite float32 values");
      }
      flat.push_back(d);
    }
  }
  t->shape = io.ragged ? std::vector<int64_t>{static_cast<int64_t>(value.size())}
                       : std::vector<int64_t>{static_cast<int64_t>(value.size()), width};
  if (!io.ragged && !io.dims.empty() && io.dims[0] >= 0 && io.dims[0] != width) {
    return bad("has rows of " + std::to_string(width) + " values, the model takes " +
               std::to_string(io.dims[0]));
  }
  t->data.assign(flat.size() * ElementSize(io.dtype), '\0');
  for (size_t i = 0; i < flat.size(); ++i) {
    switch (io.dtype) {
      case DataType::kFp32:
        t->MutableAs<float>()[i] = static_cast<float>(flat[i]);
        break;
      case DataType::kInt32:
        t->MutableAs<int32_t>()[i] = static_cast<int32_t>(flat[i]);
        break;
      case DataType::kInt64:
        t->MutableAs<int64_t>()[i] = value[i].get<int64_t>();
        break;
      default:
        return bad("has a type the probe does not handle");
    }
  }
  return Status::Ok();
}

// A context probe's parts agree with each other: offsets Fn * (0, N1, ...) ascending from 0 over
// R contexts and every candidate row, and each side's ids as many as its lengths count.
Status CheckContextProbe(const ModelSpec& spec, const BatchProbe& probe,
                         const std::string& source) {
  const ContextSpec& c = spec.context;
  auto bad = [&](const std::string& why) {
    return InvalidArgument(source + ": batch_probe " + why);
  };
  const Tensor& offsets = probe.batch[c.candidate_offsets];
  const int64_t fn = spec.inputs[c.candidate_lengths].dims[0];
  const int64_t contexts = offsets.shape[0] - 1;
  const int64_t candidates = probe.batch[c.candidate_lengths].shape[0];
  const int32_t* o = offsets.As<int32_t>();
  bool ascending = contexts >= 1 && o[0] == 0 && o[contexts] == fn * candidates;
  for (int64_t r = 0; ascending && r < contexts; ++r) {
    ascending = o[r + 1] > o[r] && (o[r + 1] - o[r]) % fn == 0;
  }
  if (!ascending) return bad("candidate_offsets do not split its candidates into contexts");
  for (int i : {c.context_dense, c.context_lengths, c.candidate_dense}) {
    const int64_t want = i == c.candidate_dense ? candidates : contexts;
    if (i >= 0 && probe.batch[i].shape[0] != want) {
      return bad("inputs have different numbers of rows");
    }
  }
  for (auto [lengths, values] : {std::pair{c.context_lengths, c.context_values},
                                 std::pair{c.candidate_lengths, c.candidate_values}}) {
    if (lengths < 0) continue;
    int64_t ids = 0;
    const Tensor& l = probe.batch[lengths];
    for (int64_t k = 0; k < ElementCount(l.shape); ++k) ids += l.As<int32_t>()[k];
    if (probe.batch[values].shape[0] != ids) {
      return bad("has " + std::to_string(probe.batch[values].shape[0]) + " ids in '" +
                 probe.batch[values].name + "' but its lengths count " + std::to_string(ids));
    }
  }
  return Status::Ok();
}

// The probe's parts agree with each other: as many rows in every batch-major input, and as many
// ids as the lengths count (SliceRow relies on both).
Status CheckProbeShape(const ModelSpec& spec, const BatchProbe& probe, const std::string& source) {
  if (spec.context.present) return CheckContextProbe(spec, probe, source);
  int64_t rows = -1, ids = 0;
  for (size_t i = 0; i < probe.batch.size(); ++i) {
    const Tensor& t = probe.batch[i];
    if (spec.inputs[i].ragged) continue;
    if (rows >= 0 && t.shape[0] != rows) {
      return InvalidArgument(source + ": batch_probe inputs have different numbers of rows");
    }
    rows = t.shape[0];
    if (static_cast<int>(i) == spec.lengths_input) {
      for (int64_t k = 0; k < ElementCount(t.shape); ++k) ids += t.As<int32_t>()[k];
    }
  }
  if (spec.values_input >= 0 && probe.batch[spec.values_input].shape[0] != ids) {
    return InvalidArgument(source + ": batch_probe has " +
                           std::to_string(probe.batch[spec.values_input].shape[0]) +
                           " ids but its lengths count " + std::to_string(ids));
  }
  return Status::Ok();
}

Status ReadProbeJson(const nlohmann::json& manifest, const std::string& manifest_path,
                     const ModelSpec& spec, BatchProbe* probe) {
  const auto dense = manifest.value("dense", nlohmann::json::object());
  if (!dense.is_object() || !dense.value("batch_invariant", false)) return Status::Ok();
  if (!manifest.contains("batch_probe")) return Status::Ok();
  const auto& stored = manifest["batch_probe"];
  for (const IoSpec& io : spec.inputs) {
    if (!stored.is_object() || !stored.contains(io.name)) {
      return InvalidArgument(manifest_path + ": batch_probe has no input '" + io.name + "'");
    }
    Tensor t;
    REC_RETURN_IF_ERROR(FillInput(stored[io.name], io, manifest_path, &t));
    probe->batch.push_back(std::move(t));
  }
  probe->rows = probe->batch[spec.context.present ? spec.context.candidate_lengths : 0].shape[0];
  const auto verified = dense.value("verified_on", nlohmann::json::object());
  probe->verified_on =
      verified.is_object() ? verified.value("model", "an unrecorded CPU") : "an unrecorded CPU";
  REC_RETURN_IF_ERROR(CheckProbeShape(spec, *probe, manifest_path));
  probe->present = true;
  return Status::Ok();
}

}  // namespace

Status ReadBatchProbe(const std::string& manifest_path, const ModelSpec& spec, BatchProbe* probe) {
  *probe = BatchProbe();
  std::ifstream in(manifest_path);
  if (!in) return Status::Ok();
  nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object()) return InvalidArgument(manifest_path + " is not valid JSON");
  try {  // a key of the wrong type throws: rec.json is a file anyone may have edited
    return ReadProbeJson(manifest, manifest_path, spec, probe);
  } catch (const nlohmann::json::exception& e) {
    *probe = BatchProbe();
    return InvalidArgument(manifest_path + ": batch_probe or dense: " + e.what());
  }
}

std::vector<Tensor> SliceRow(const ModelSpec& spec, const std::vector<Tensor>& batch, int64_t row) {
  // Ids before this row: the lengths of every earlier row.
  int64_t first = 0, count = 0;
  if (spec.lengths_input >= 0) {
    const Tensor& lengths = batch[spec.lengths_input];
    const int64_t width = lengths.shape[1];
    for (int64_t i = 0; i < row * width; ++i) first += lengths.As<int32_t>()[i];
    for (int64_t i = row * width; i < (row + 1) * width; ++i) count += lengths.As<int32_t>()[i];
  }
  std::vector<Tensor> out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const Tensor& t = batch[i];
    Tensor& s = out[i];
    s.name = t.name;
    s.dtype = t.dtype;
    s.shape = t.shape;
    const size_t elem = ElementSize(t.dtype);
    if (spec.inputs[i].ragged) {
      s.shape[0] = count;
      s.data = t.data.substr(static_cast<size_t>(first) * elem, static_cast<size_t>(count) * elem);
    } else {
      s.shape[0] = 1;
      const size_t row_bytes = static_cast<size_t>(ElementCount(s.shape)) * elem;
      s.data = t.data.substr(static_cast<size_t>(row) * row_bytes, row_bytes);
    }
  }
  return out;
}

namespace {

// Folds the difference between `want` and `got` (`width` scores each) into *max_diff.
void Compare(const float* want, const float* got, int64_t width, double* max_diff) {
  if (std::memcmp(want, got, static_cast<size_t>(width) * sizeof(float)) == 0) return;
  for (int64_t c = 0; c < width; ++c) {
    double d = std::fabs(static_cast<double>(want[c]) - static_cast<double>(got[c]));
    *max_diff = std::max(*max_diff, std::isnan(d) ? INFINITY : std::max(d, 1e-45));
  }
}

// A context probe: each request (context with its candidates) alone, and each candidate alone
// with its context, against the batch's rows.
Status RunContextProbe(Runner* runner, const ModelSpec& spec, const BatchProbe& probe,
                       const float* scores, int64_t width, double* max_diff) {
  for (int64_t r = 0; r < ContextCount(spec, probe.batch); ++r) {
    int64_t first = 0, count = 0;
    ContextCandidates(spec, probe.batch, r, &first, &count);
    std::vector<Tensor> alone;
    REC_RETURN_IF_ERROR(runner->Run(SliceContext(spec, probe.batch, r, 0, count), &alone));
    Compare(scores + first * width, alone[0].As<float>(), count * width, max_diff);
    for (int64_t k = 0; k < count; ++k) {
      std::vector<Tensor> pair;
      REC_RETURN_IF_ERROR(runner->Run(SliceContext(spec, probe.batch, r, k, 1), &pair));
      Compare(scores + (first + k) * width, pair[0].As<float>(), width, max_diff);
    }
  }
  return Status::Ok();
}

}  // namespace

Status RunBatchProbe(Runner* runner, const ModelSpec& spec, const BatchProbe& probe,
                     double* max_diff) {
  *max_diff = 0;
  std::vector<Tensor> batched;
  REC_RETURN_IF_ERROR(runner->Run(probe.batch, &batched));
  const Tensor& scores = batched[0];
  const int64_t width = scores.shape.size() > 1 ? scores.shape[1] : 1;
  if (spec.context.present) {
    return RunContextProbe(runner, spec, probe, scores.As<float>(), width, max_diff);
  }
  for (int64_t row = 0; row < probe.rows; ++row) {
    std::vector<Tensor> single;
    REC_RETURN_IF_ERROR(runner->Run(SliceRow(spec, probe.batch, row), &single));
    Compare(scores.As<float>() + row * width, single[0].As<float>(), width, max_diff);
  }
  return Status::Ok();
}

std::string CpuDescription() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  bool amx = false, seen_model = false;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = line.substr(std::min(line.size(), colon + 2));
    if (key == "model name" && !seen_model) {
      model = value;
      seen_model = true;
    } else if (key == "flags") {
      std::istringstream flags(value);
      std::string f;
      while (flags >> f) amx = amx || f == "amx_tile";
      break;
    }
  }
  return model + (amx ? " (with AMX)" : " (no AMX)");
}

}  // namespace rec
