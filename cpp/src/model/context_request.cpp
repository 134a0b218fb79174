#include "model/context_request.h"

#include <cstring>
#include <utility>

namespace rec {
namespace {

std::string InputError(const std::string& name, const std::string& problem) {
  return "input '" + name + "': " + problem;
}

// Each form's request inputs, in the order a mixed request's refusal looks for the first of
// each (rec/contract/context.py FLAT_REQUEST_INPUTS, CONTEXT_REQUEST_INPUTS).
constexpr const char* kFlatRequestInputs[] = {"dense_features", "sparse_lengths", "sparse_values",
                                              kSparseStringsInput};
constexpr const char* kContextRequestInputs[] = {
    "context_dense",     "context_lengths",    "context_values",
    "candidate_dense",   "candidate_lengths",  "candidate_values",
    "candidate_offsets", kContextStringsInput, kCandidateStringsInput};

const Tensor* Find(const InferRequest& r, const std::string& name) {
  for (const Tensor& t : r.inputs) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

template <size_t N>
const char* FirstOf(const InferRequest& r, const char* const (&names)[N]) {
  for (const char* name : names) {
    if (Find(r, name)) return name;
  }
  return nullptr;
}

// The checks of a context-form request's shape that come before any other, in
// rec/contract/context.py request_form's order (both servers give the same first refusal):
// candidate_offsets sent, a context batch other than 1, no candidate, too many.
Status CheckContextForm(const ModelSpec& spec, const InferRequest& r) {
  if (Find(r, "candidate_offsets")) {
    return InvalidArgument(InputError("candidate_offsets", "filled by the server, do not send it"));
  }
  for (const char* name : {"context_dense", "context_lengths"}) {
    const Tensor* t = Find(r, name);
    if (!t || (!t->shape.empty() && t->shape[0] == 1)) continue;
    const std::string got = t->shape.empty() ? "a scalar" : std::to_string(t->shape[0]);
    return InvalidArgument(InputError(name, "a request carries one context (batch 1), got " + got));
  }
  const Tensor* candidates = Find(r, "candidate_lengths");
  if (!candidates || candidates->shape.empty()) return Status::Ok();
  if (candidates->shape[0] == 0) {
    return InvalidArgument(
        InputError("candidate_lengths", "a request needs at least one candidate, got 0"));
  }
  if (candidates->shape[0] > spec.max_batch_size) {
    return InvalidArgument("request has " + std::to_string(candidates->shape[0]) +
                           " candidates, above max_batch_size " +
                           std::to_string(spec.max_batch_size));
  }
  return Status::Ok();
}

Tensor Zeros(const std::string& name, DataType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(static_cast<size_t>(ElementCount(t.shape)) * ElementSize(dtype), '\0');
  return t;
}

int64_t CandidateWidth(const ModelSpec& spec) {
  return spec.inputs[spec.context.candidate_lengths].dims[0];
}

// candidate_offsets for requests of `counts` candidates: Fn * (0, c0, c0 + c1, ...).
Tensor Offsets(const ModelSpec& spec, const std::vector<int64_t>& counts) {
  const int64_t fn = CandidateWidth(spec);
  Tensor t = Zeros(spec.inputs[spec.context.candidate_offsets].name, DataType::kInt32,
                   {static_cast<int64_t>(counts.size()) + 1});
  int32_t* o = t.MutableAs<int32_t>();
  for (size_t i = 0; i < counts.size(); ++i) o[i + 1] = o[i] + static_cast<int32_t>(fn * counts[i]);
  return t;
}

// Columns `cols` of a row-major [rows, width] tensor, as input `name`.
Tensor Columns(const Tensor& t, const std::vector<int64_t>& cols, const std::string& name) {
  const int64_t rows = t.shape[0], width = t.shape[1];
  const size_t elem = ElementSize(t.dtype);
  Tensor out = Zeros(name, t.dtype, {rows, static_cast<int64_t>(cols.size())});
  char* dst = out.data.data();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c : cols) {
      std::memcpy(dst, t.data.data() + static_cast<size_t>(r * width + c) * elem, elem);
      dst += elem;
    }
  }
  return out;
}

Tensor Ids(const std::string& name, const std::vector<int64_t>& ids) {
  Tensor t = Zeros(name, DataType::kInt64, {static_cast<int64_t>(ids.size())});
  if (!ids.empty()) std::memcpy(t.data.data(), ids.data(), t.data.size());
  return t;
}

// Rows [begin, begin + count) of a 2-D tensor.
Tensor Rows(const Tensor& t, int64_t begin, int64_t count) {
  Tensor out = t;
  const size_t row_bytes = static_cast<size_t>(t.shape[1]) * ElementSize(t.dtype);
  out.shape[0] = count;
  out.data =
      t.data.substr(static_cast<size_t>(begin) * row_bytes, static_cast<size_t>(count) * row_bytes);
  return out;
}

// The ids of rows [begin, begin + count) of a jagged pair.
Tensor RowIds(const Tensor& lengths, const Tensor& values, int64_t begin, int64_t count) {
  const int64_t width = lengths.shape[1];
  const int32_t* l = lengths.As<int32_t>();
  int64_t first = 0, n = 0;
  for (int64_t i = 0; i < begin * width; ++i) first += l[i];
  for (int64_t i = begin * width; i < (begin + count) * width; ++i) n += l[i];
  Tensor out = values;
  out.shape = {n};
  out.data = values.data.substr(static_cast<size_t>(first) * sizeof(int64_t),
                                static_cast<size_t>(n) * sizeof(int64_t));
  return out;
}

// Shape of one context-form input: ragged [n] (or [1, n]); a context's [1, W]; candidates'
// [N, W] with 1 <= N <= max_batch_size, N the same for every candidate input.
Status CheckContextShape(const ModelSpec& spec, int i, Tensor* t, int64_t* candidates) {
  const IoSpec& io = spec.inputs[i];
  if (io.ragged) return CheckRaggedShape(t);
  const bool context = i == spec.context.context_dense || i == spec.context.context_lengths;
  const std::string width = std::to_string(io.dims[0]);
  if (t->shape.size() != 2 || t->shape[1] != io.dims[0]) {
    return InvalidArgument(InputError(t->name, "expected shape [" +
                                                   std::string(context ? "1" : "N") + ", " + width +
                                                   "], got " + ShapeString(t->shape)));
  }
  const int64_t rows = t->shape[0];
  if (context) {
    if (rows == 1) return Status::Ok();
    return InvalidArgument(InputError(
        t->name, "a request carries one context (batch 1), got " + std::to_string(rows)));
  }
  if (rows < 1) {
    return InvalidArgument(
        InputError(t->name, "a request needs at least one candidate, got " + std::to_string(rows)));
  }
  if (*candidates >= 0 && rows != *candidates) {
    return InvalidArgument(InputError(
        t->name,
        std::to_string(rows) + " candidates, other inputs have " + std::to_string(*candidates)));
  }
  if (rows > spec.max_batch_size) {
    return InvalidArgument("request has " + std::to_string(rows) +
                           " candidates, above max_batch_size " +
                           std::to_string(spec.max_batch_size));
  }
  *candidates = rows;
  return Status::Ok();
}

// One side's strings (if sent) become its values; else its values are checked against its
// lengths. `columns` maps the side's negative-id counts onto the flat features.
Status FinishSide(const ModelSpec& spec, int lengths_i, int values_i, bool has_strings,
                  Tensor* strings, const std::vector<SparseEncoding>& encodings,
                  const std::vector<int64_t>& columns, InferRequest* r) {
  const Tensor& lengths = r->inputs[lengths_i];
  Tensor& values = r->inputs[values_i];
  if (!has_strings) return CheckJagged(lengths, values.name, values.shape[0]);
  std::vector<int64_t> negatives;
  REC_RETURN_IF_ERROR(StringsToValues(encodings, strings, lengths, spec.inputs[values_i].name,
                                      &values, &negatives));
  r->negative_ids.resize(static_cast<size_t>(spec.context.num_sparse), 0);
  for (size_t j = 0; j < negatives.size() && j < columns.size(); ++j) {
    r->negative_ids[columns[j]] += negatives[j];
  }
  return Status::Ok();
}

}  // namespace

Status ValidateContextModelRequest(const ModelSpec& spec, InferRequest* request) {
  const char* flat = FirstOf(*request, kFlatRequestInputs);
  const char* context = FirstOf(*request, kContextRequestInputs);
  if (flat && context) {
    return InvalidArgument(
        "a request carries either the flat inputs (dense_features, sparse_lengths, "
        "sparse_values) or the context form (context_*, candidate_*), not both: got '" +
        std::string(flat) + "' and '" + context + "'");
  }
  return context ? ValidateContextRequest(spec, request) : SplitFlatRequest(spec, request);
}

Status ValidateContextRequest(const ModelSpec& spec, InferRequest* request) {
  REC_RETURN_IF_ERROR(CheckContextForm(spec, *request));
  const ContextSpec& c = spec.context;
  Tensor context_strings, candidate_strings;
  bool context_has = false, candidate_has = false;
  if (c.context_values >= 0) {
    REC_RETURN_IF_ERROR(TakeStrings(spec, kContextStringsInput, spec.inputs[c.context_values].name,
                                    request, &context_strings, &context_has));
  }
  REC_RETURN_IF_ERROR(TakeStrings(spec, kCandidateStringsInput,
                                  spec.inputs[c.candidate_values].name, request, &candidate_strings,
                                  &candidate_has));
  auto pending = [&](int i) {
    return (context_has && i == c.context_values) || (candidate_has && i == c.candidate_values) ||
           i == c.candidate_offsets;
  };
  REC_RETURN_IF_ERROR(OrderInputs(spec, pending, request));
  // Lengths before dense, so that a refusal of the batch names the input every request has.
  int64_t candidates = -1;
  for (int i : {c.context_lengths, c.context_dense, c.candidate_lengths, c.candidate_dense,
                c.context_values, c.candidate_values}) {
    if (i < 0 || pending(i)) continue;
    Tensor& t = request->inputs[i];
    REC_RETURN_IF_ERROR(CheckDtype(spec.inputs[i], t));
    REC_RETURN_IF_ERROR(CheckContextShape(spec, i, &t, &candidates));
    REC_RETURN_IF_ERROR(CheckData(t));
  }
  REC_RETURN_IF_ERROR(CheckOutputs(spec, *request));
  if (c.context_values >= 0) {
    REC_RETURN_IF_ERROR(FinishSide(spec, c.context_lengths, c.context_values, context_has,
                                   &context_strings, c.context_encodings, c.sparse, request));
  }
  REC_RETURN_IF_ERROR(FinishSide(spec, c.candidate_lengths, c.candidate_values, candidate_has,
                                 &candidate_strings, c.candidate_encodings, c.cand_sparse,
                                 request));
  request->inputs[c.candidate_offsets] = Offsets(spec, {candidates});
  request->batch_size = candidates;
  return Status::Ok();
}

Status SplitFlatRequest(const ModelSpec& spec, InferRequest* request) {
  REC_RETURN_IF_ERROR(ValidateRequest(*spec.context.flat, request));
  request->inputs = SplitFlatInputs(spec, request->inputs);
  return Status::Ok();
}

std::vector<Tensor> SplitFlatInputs(const ModelSpec& spec, const std::vector<Tensor>& flat) {
  const ContextSpec& c = spec.context;
  const Tensor& lengths = flat[c.flat->lengths_input];
  const Tensor& values = flat[c.flat->values_input];
  const int64_t rows = lengths.shape[0];
  std::vector<Tensor> out(spec.inputs.size());
  auto name = [&](int i) { return spec.inputs[i].name; };
  if (c.context_dense >= 0) out[c.context_dense] = Columns(flat[0], c.dense, name(c.context_dense));
  if (c.candidate_dense >= 0) {
    out[c.candidate_dense] = Columns(flat[0], c.cand_dense, name(c.candidate_dense));
  }
  if (c.context_lengths >= 0) {
    out[c.context_lengths] = Columns(lengths, c.sparse, name(c.context_lengths));
  }
  out[c.candidate_lengths] = Columns(lengths, c.cand_sparse, name(c.candidate_lengths));
  // Each row's ids, feature by feature, to the side its feature belongs to.
  std::vector<bool> is_context(static_cast<size_t>(c.num_sparse), false);
  for (int64_t col : c.sparse) is_context[col] = true;
  std::vector<int64_t> context_ids, candidate_ids;
  const int32_t* l = lengths.As<int32_t>();
  const int64_t* v = values.As<int64_t>();
  int64_t at = 0;
  for (int64_t k = 0; k < ElementCount(lengths.shape); ++k) {
    auto& side = is_context[k % c.num_sparse] ? context_ids : candidate_ids;
    side.insert(side.end(), v + at, v + at + l[k]);
    at += l[k];
  }
  if (c.context_values >= 0) out[c.context_values] = Ids(name(c.context_values), context_ids);
  out[c.candidate_values] = Ids(name(c.candidate_values), candidate_ids);
  out[c.candidate_offsets] = Offsets(spec, std::vector<int64_t>(static_cast<size_t>(rows), 1));
  return out;
}

Tensor ConcatenateOffsets(const ModelSpec& spec, const std::vector<const InferRequest*>& requests) {
  const int index = spec.context.candidate_offsets;
  std::vector<int32_t> offsets = {0};
  for (const InferRequest* r : requests) {
    const Tensor& t = r->inputs[index];
    const int32_t base = offsets.back();
    for (int64_t k = 1; k < t.shape[0]; ++k) offsets.push_back(base + t.As<int32_t>()[k]);
  }
  Tensor out =
      Zeros(spec.inputs[index].name, DataType::kInt32, {static_cast<int64_t>(offsets.size())});
  std::memcpy(out.data.data(), offsets.data(), out.data.size());
  return out;
}

std::vector<IoSpec> ContextRequestInputs(const ModelSpec& spec) {
  const ContextSpec& c = spec.context;
  std::vector<IoSpec> inputs;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (static_cast<int>(i) != c.candidate_offsets) inputs.push_back(spec.inputs[i]);
  }
  if (spec.has_feature_spec) {
    if (c.context_values >= 0)
      inputs.push_back({kContextStringsInput, DataType::kBytes, {-1}, true});
    inputs.push_back({kCandidateStringsInput, DataType::kBytes, {-1}, true});
  }
  for (IoSpec& io : RequestInputs(*c.flat)) inputs.push_back(std::move(io));
  return inputs;
}

int64_t ContextCount(const ModelSpec& spec, const std::vector<Tensor>& batch) {
  return batch[spec.context.candidate_offsets].shape[0] - 1;
}

void ContextCandidates(const ModelSpec& spec, const std::vector<Tensor>& batch, int64_t r,
                       int64_t* first, int64_t* count) {
  const int32_t* o = batch[spec.context.candidate_offsets].As<int32_t>();
  const int64_t fn = CandidateWidth(spec);
  *first = o[r] / fn;
  *count = (o[r + 1] - o[r]) / fn;
}

std::vector<Tensor> SliceContext(const ModelSpec& spec, const std::vector<Tensor>& batch,
                                 int64_t context, int64_t first, int64_t count) {
  const ContextSpec& c = spec.context;
  int64_t begin = 0, all = 0;
  ContextCandidates(spec, batch, context, &begin, &all);
  begin += first;
  std::vector<Tensor> out(batch.size());
  if (c.context_dense >= 0) out[c.context_dense] = Rows(batch[c.context_dense], context, 1);
  if (c.context_lengths >= 0) {
    out[c.context_lengths] = Rows(batch[c.context_lengths], context, 1);
    out[c.context_values] = RowIds(batch[c.context_lengths], batch[c.context_values], context, 1);
  }
  if (c.candidate_dense >= 0) {
    out[c.candidate_dense] = Rows(batch[c.candidate_dense], begin, count);
  }
  out[c.candidate_lengths] = Rows(batch[c.candidate_lengths], begin, count);
  out[c.candidate_values] =
      RowIds(batch[c.candidate_lengths], batch[c.candidate_values], begin, count);
  out[c.candidate_offsets] = Offsets(spec, {count});
  return out;
}

}  // namespace rec
