#include "model/request.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "model/context_request.h"

namespace rec {
namespace {

std::string InputError(const std::string& name, const std::string& problem) {
  return "input '" + name + "': " + problem;
}

}  // namespace

Status CheckRaggedShape(Tensor* t) {
  if (t->shape.size() == 2 && t->shape[0] == 1) t->shape = {t->shape[1]};
  if (t->shape.size() != 1 || t->shape[0] < 0) {
    return InvalidArgument(InputError(t->name, "expected shape [n], got " + ShapeString(t->shape)));
  }
  return Status::Ok();
}

namespace {

Status CheckInputShape(const ModelSpec& spec, const IoSpec& io, Tensor* t, int64_t* batch) {
  if (io.ragged) return CheckRaggedShape(t);
  std::vector<int64_t> expected = {-1};
  expected.insert(expected.end(), io.dims.begin(), io.dims.end());
  bool match = t->shape.size() == expected.size();
  for (size_t i = 1; match && i < expected.size(); ++i) match = t->shape[i] == expected[i];
  if (!match || t->shape[0] < 1) {
    std::string want = ShapeString(expected);
    want.replace(1, 2, "B");
    return InvalidArgument(InputError(
        t->name, "expected shape " + want + " with B >= 1, got " + ShapeString(t->shape)));
  }
  if (t->shape[0] > spec.max_batch_size) {
    return InvalidArgument(InputError(t->name, "batch size " + std::to_string(t->shape[0]) +
                                                   " exceeds max_batch_size " +
                                                   std::to_string(spec.max_batch_size)));
  }
  if (*batch >= 0 && *batch != t->shape[0]) {
    return InvalidArgument(InputError(t->name, "batch size " + std::to_string(t->shape[0]) +
                                                   " differs from other inputs' " +
                                                   std::to_string(*batch)));
  }
  *batch = t->shape[0];
  return Status::Ok();
}

// A NaN or an infinity would come out as a NaN score that a ranking then uses without a word;
// training never saw one (its readers refuse or fill non-numbers), so the request is refused.
Status CheckFinite(const Tensor& t) {
  const float* v = t.As<float>();
  int64_t n = ElementCount(t.shape);
  int64_t width = t.shape.size() == 2 ? t.shape[1] : 1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    std::string what = std::isnan(v[i]) ? "nan" : (v[i] > 0 ? "inf" : "-inf");
    return InvalidArgument(InputError(
        t.name, "value " + what + " at [" + std::to_string(i / width) + ", " +
                    std::to_string(i % width) + "]: every value must be a finite number"));
  }
  return Status::Ok();
}

}  // namespace

Status CheckDtype(const IoSpec& io, const Tensor& t) {
  if (t.dtype == io.dtype) return Status::Ok();
  return InvalidArgument(InputError(t.name, std::string("expected datatype ") +
                                                DataTypeName(io.dtype) + ", got " +
                                                DataTypeName(t.dtype)));
}

Status CheckData(const Tensor& t) {
  size_t expected_bytes = static_cast<size_t>(ElementCount(t.shape)) * ElementSize(t.dtype);
  if (t.data.size() != expected_bytes) {
    return InvalidArgument(InputError(
        t.name, "shape " + ShapeString(t.shape) + " needs " + std::to_string(expected_bytes) +
                    " bytes of data, got " + std::to_string(t.data.size())));
  }
  if (t.dtype == DataType::kFp32) return CheckFinite(t);
  return Status::Ok();
}

namespace {

Status CheckInput(const ModelSpec& spec, const IoSpec& io, Tensor* t, int64_t* batch) {
  REC_RETURN_IF_ERROR(CheckDtype(io, *t));
  REC_RETURN_IF_ERROR(CheckInputShape(spec, io, t, batch));
  return CheckData(*t);
}

}  // namespace

// lengths >= 0 and sum(lengths) == the number of values (`values_count`, named `values_name`).
Status CheckJagged(const Tensor& lengths, const std::string& values_name, int64_t values_count) {
  const int32_t* l = lengths.As<int32_t>();
  int64_t n = ElementCount(lengths.shape);
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (l[i] < 0) {
      return InvalidArgument(InputError(lengths.name, "negative length " + std::to_string(l[i]) +
                                                          " at flat index " + std::to_string(i)));
    }
    sum += l[i];
  }
  if (sum != values_count) {
    return InvalidArgument(InputError(values_name, "has " + std::to_string(values_count) +
                                                       " values but sum of '" + lengths.name +
                                                       "' is " + std::to_string(sum)));
  }
  return Status::Ok();
}

bool HasInput(const InferRequest& r, const std::string& name) {
  for (const Tensor& t : r.inputs) {
    if (t.name == name) return true;
  }
  return false;
}

Status TakeStrings(const ModelSpec& spec, const std::string& strings_name,
                   const std::string& values_name, InferRequest* r, Tensor* strings,
                   bool* has_strings) {
  *has_strings = false;
  const bool given = HasInput(*r, strings_name);
  const bool has_values = HasInput(*r, values_name);
  if (!given && (!spec.has_feature_spec || has_values)) return Status::Ok();
  if (given && !spec.has_feature_spec) {
    return InvalidArgument(InputError(
        strings_name, "model '" + spec.name +
                          "' has no feature spec (its rec.json has no \"feature_spec\"), "
                          "so it cannot map strings to ids: send '" +
                          values_name + "' as INT64 ids"));
  }
  if (given == has_values) {
    return InvalidArgument("a request carries either '" + values_name + "' (INT64 ids) or '" +
                           strings_name + "' (BYTES tokens); this one has " +
                           (given ? "both" : "neither"));
  }
  auto is_strings = [&](const Tensor& t) { return t.name == strings_name; };
  auto it = std::find_if(r->inputs.begin(), r->inputs.end(), is_strings);
  if (std::find_if(std::next(it), r->inputs.end(), is_strings) != r->inputs.end()) {
    return InvalidArgument(InputError(strings_name, "given more than once"));
  }
  *strings = std::move(*it);
  r->inputs.erase(it);
  *has_strings = true;
  return Status::Ok();
}

Status StringsToValues(const std::vector<SparseEncoding>& encodings, Tensor* strings,
                       const Tensor& lengths, const std::string& values_name, Tensor* values,
                       std::vector<int64_t>* negatives) {
  if (strings->dtype != DataType::kBytes) {
    return InvalidArgument(InputError(strings->name, std::string("expected datatype BYTES, got ") +
                                                         DataTypeName(strings->dtype)));
  }
  REC_RETURN_IF_ERROR(CheckRaggedShape(strings));  // ragged like the values
  REC_RETURN_IF_ERROR(CheckJagged(lengths, strings->name, strings->shape[0]));
  REC_RETURN_IF_ERROR(EncodeSparseStrings(encodings, *strings, lengths, values, negatives));
  values->name = values_name;
  return Status::Ok();
}

Status OrderInputs(const ModelSpec& spec, const std::function<bool(int)>& pending,
                   InferRequest* r) {
  std::vector<Tensor> ordered(spec.inputs.size());
  std::vector<bool> seen(spec.inputs.size(), false);
  for (Tensor& t : r->inputs) {
    int i = FindInput(spec, t.name);
    if (i < 0) return InvalidArgument(InputError(t.name, "unexpected input name"));
    if (seen[i]) return InvalidArgument(InputError(t.name, "given more than once"));
    seen[i] = true;
    ordered[i] = std::move(t);
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (!seen[i] && !pending(static_cast<int>(i))) {
      return InvalidArgument(InputError(spec.inputs[i].name, "missing"));
    }
  }
  r->inputs = std::move(ordered);
  return Status::Ok();
}

Status CheckOutputs(const ModelSpec& spec, const InferRequest& r) {
  for (const RequestedOutput& o : r.outputs) {
    if (FindOutput(spec, o.name) < 0) {
      return InvalidArgument("output '" + o.name + "': unexpected output name");
    }
  }
  return Status::Ok();
}

Status ValidateRequest(const ModelSpec& spec, InferRequest* request) {
  if (spec.context.present) return ValidateContextModelRequest(spec, request);
  Tensor strings;
  bool has_strings = false;
  const std::string values_name =
      spec.values_input >= 0 ? spec.inputs[spec.values_input].name : "sparse_values";
  REC_RETURN_IF_ERROR(
      TakeStrings(spec, kSparseStringsInput, values_name, request, &strings, &has_strings));
  // With strings, the values' slot stays empty until they are mapped, once the lengths are
  // known to be good.
  auto pending = [&](int i) { return has_strings && i == spec.values_input; };
  REC_RETURN_IF_ERROR(OrderInputs(spec, pending, request));
  int64_t batch = -1;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (pending(static_cast<int>(i))) continue;
    REC_RETURN_IF_ERROR(CheckInput(spec, spec.inputs[i], &request->inputs[i], &batch));
  }
  if (batch < 1) return InvalidArgument("request has no batched input");
  request->batch_size = batch;
  REC_RETURN_IF_ERROR(CheckOutputs(spec, *request));
  if (has_strings) {
    return StringsToValues(spec.sparse_encodings, &strings, request->inputs[spec.lengths_input],
                           spec.inputs[spec.values_input].name, &request->inputs[spec.values_input],
                           &request->negative_ids);
  }
  if (spec.lengths_input < 0) return Status::Ok();
  const Tensor& values = request->inputs[spec.values_input];
  return CheckJagged(request->inputs[spec.lengths_input], values.name, values.shape[0]);
}

std::vector<IoSpec> RequestInputs(const ModelSpec& spec) {
  if (spec.context.present) return ContextRequestInputs(spec);
  std::vector<IoSpec> inputs = spec.inputs;
  if (spec.has_feature_spec) {
    IoSpec strings;
    strings.name = kSparseStringsInput;
    strings.dtype = DataType::kBytes;
    strings.dims = {-1};
    strings.ragged = true;
    inputs.push_back(std::move(strings));
  }
  return inputs;
}

std::vector<Tensor> ConcatenateInputs(const ModelSpec& spec,
                                      const std::vector<const InferRequest*>& requests) {
  std::vector<Tensor> batch(spec.inputs.size());
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (static_cast<int>(i) == spec.context.candidate_offsets) {
      batch[i] = ConcatenateOffsets(spec, requests);
      continue;
    }
    Tensor& out = batch[i];
    out.name = spec.inputs[i].name;
    out.dtype = spec.inputs[i].dtype;
    size_t bytes = 0;
    int64_t dim0 = 0;
    for (const InferRequest* r : requests) {
      bytes += r->inputs[i].data.size();
      dim0 += r->inputs[i].shape[0];
    }
    out.shape = requests.front()->inputs[i].shape;
    out.shape[0] = dim0;
    out.data.resize(bytes);
    size_t offset = 0;
    for (const InferRequest* r : requests) {
      const std::string& d = r->inputs[i].data;
      if (!d.empty()) std::memcpy(&out.data[offset], d.data(), d.size());
      offset += d.size();
    }
  }
  return batch;
}

Status CheckOutputs(const ModelSpec& spec, int64_t batch_size, const std::vector<Tensor>& outputs) {
  if (outputs.size() != spec.outputs.size()) {
    return Internal("model returned " + std::to_string(outputs.size()) + " outputs, config has " +
                    std::to_string(spec.outputs.size()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const IoSpec& io = spec.outputs[i];
    std::vector<int64_t> expected = {batch_size};
    expected.insert(expected.end(), io.dims.begin(), io.dims.end());
    bool match = outputs[i].shape.size() == expected.size();
    for (size_t d = 0; match && d < expected.size(); ++d) {
      match = expected[d] < 0 || outputs[i].shape[d] == expected[d];
    }
    if (!match || outputs[i].dtype != io.dtype) {
      return Internal("output '" + io.name + "': model returned " + DataTypeName(outputs[i].dtype) +
                      " " + ShapeString(outputs[i].shape) + ", config says " +
                      DataTypeName(io.dtype) + " " + ShapeString(expected));
    }
  }
  return Status::Ok();
}

std::vector<Tensor> SliceOutputs(const std::vector<Tensor>& outputs, int64_t begin, int64_t rows) {
  std::vector<Tensor> sliced(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    size_t row_bytes = t.shape[0] > 0 ? t.data.size() / static_cast<size_t>(t.shape[0]) : 0;
    sliced[i].name = t.name;
    sliced[i].dtype = t.dtype;
    sliced[i].shape = t.shape;
    sliced[i].shape[0] = rows;
    sliced[i].data.assign(t.data, static_cast<size_t>(begin) * row_bytes,
                          static_cast<size_t>(rows) * row_bytes);
  }
  return sliced;
}

Status WriteSharedMemoryOutputs(const InferRequest& request, const std::vector<Tensor>& outputs) {
  for (const RequestedOutput& o : request.outputs) {
    if (!o.shm) continue;
    for (const Tensor& t : outputs) {
      if (t.name == o.name)
        REC_RETURN_IF_ERROR(WriteSlice(*o.shm, "output '" + t.name + "'", t.data));
    }
  }
  return Status::Ok();
}

}  // namespace rec
