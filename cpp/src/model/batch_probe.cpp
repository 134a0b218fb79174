#include "model/batch_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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
      flat.push_back(0);  // ids are copied below as integers, not through double
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

// The probe's parts agree with each other: as many rows in every batch-major input, and as many
// ids as the lengths count (SliceRow relies on both).
Status CheckProbeShape(const ModelSpec& spec, const BatchProbe& probe, const std::string& source) {
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
  probe->rows = probe->batch[0].shape[0];
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

Status RunBatchProbe(Runner* runner, const ModelSpec& spec, const BatchProbe& probe,
                     double* max_diff) {
  *max_diff = 0;
  std::vector<Tensor> batched;
  REC_RETURN_IF_ERROR(runner->Run(probe.batch, &batched));
  const Tensor& scores = batched[0];
  const int64_t width = scores.shape.size() > 1 ? scores.shape[1] : 1;
  for (int64_t row = 0; row < probe.rows; ++row) {
    std::vector<Tensor> single;
    REC_RETURN_IF_ERROR(runner->Run(SliceRow(spec, probe.batch, row), &single));
    const float* want = scores.As<float>() + row * width;
    const float* got = single[0].As<float>();
    if (std::memcmp(want, got, static_cast<size_t>(width) * sizeof(float)) == 0) continue;
    for (int64_t c = 0; c < width; ++c) {
      double d = std::fabs(static_cast<double>(want[c]) - static_cast<double>(got[c]));
      *max_diff = std::max(*max_diff, std::isnan(d) ? INFINITY : std::max(d, 1e-45));
    }
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
