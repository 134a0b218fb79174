#include "context_inputs.h"

#include <array>
#include <cstring>
#include <utility>

#include "bench_io.h"
#include "model/context_request.h"
#include "model/context_spec.h"

namespace rec::bench {
namespace {

// One side's inputs (dense, lengths, values by index into spec.inputs; -1 left out) as a spec of
// their own, so RandomBatch draws them with its jagged pair.
ModelSpec SideSpec(const ModelSpec& spec, std::array<int, 3> roles) {
  ModelSpec side;
  for (size_t k = 0; k < roles.size(); ++k) {
    if (roles[k] < 0) continue;
    if (k == 1) side.lengths_input = static_cast<int>(side.inputs.size());
    if (k == 2) side.values_input = static_cast<int>(side.inputs.size());
    side.inputs.push_back(spec.inputs[static_cast<size_t>(roles[k])]);
  }
  return side;
}

// Where a flat column comes from: the context's column `index` or the candidate's.
struct Source {
  bool context = false;
  size_t index = 0;
};

std::vector<Source> Sources(const std::vector<int64_t>& context_columns, int64_t width) {
  std::vector<Source> sources(static_cast<size_t>(width));
  for (size_t j = 0; j < context_columns.size(); ++j) {
    sources[static_cast<size_t>(context_columns[j])] = {true, j};
  }
  // The candidate's columns are the complement, ascending.
  size_t candidate = 0;
  for (Source& s : sources) {
    if (!s.context) s.index = candidate++;
  }
  return sources;
}

const Tensor* Named(const std::vector<Tensor>& request, const ModelSpec& spec, int role) {
  if (role < 0) return nullptr;
  for (const Tensor& t : request) {
    if (t.name == spec.inputs[static_cast<size_t>(role)].name) return &t;
  }
  return nullptr;
}

Tensor Empty(const std::string& name, DataType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(ElementCount(t.shape)) * ElementSize(dtype));
  return t;
}

Tensor RepeatDense(const ContextSpec& c, const Tensor* context, const Tensor* candidate,
                   int64_t rows) {
  Tensor out = Empty(kFlatDenseInput, DataType::kFp32, {rows, c.num_dense});
  const std::vector<Source> sources = Sources(c.dense, c.num_dense);
  const auto dn = static_cast<int64_t>(c.cand_dense.size());
  float* d = out.MutableAs<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t col = 0; col < sources.size(); ++col) {
      const Source& s = sources[col];
      const auto j = static_cast<int64_t>(s.index);
      d[r * c.num_dense + static_cast<int64_t>(col)] =
          s.context ? context->As<float>()[j] : candidate->As<float>()[r * dn + j];
    }
  }
  return out;
}

// Where each bag of a batch-major lengths tensor starts in its values.
std::vector<int64_t> BagStarts(const Tensor* lengths) {
  if (lengths == nullptr) return {};
  const int64_t n = ElementCount(lengths->shape);
  std::vector<int64_t> starts(static_cast<size_t>(n));
  int64_t at = 0;
  for (int64_t k = 0; k < n; ++k) {
    starts[static_cast<size_t>(k)] = at;
    at += lengths->As<int32_t>()[k];
  }
  return starts;
}

}  // namespace

std::vector<Tensor> RandomContextRequest(const ModelSpec& spec, int64_t candidates, uint32_t seed) {
  const ContextSpec& c = spec.context;
  std::vector<Tensor> request =
      RandomBatch(SideSpec(spec, {c.context_dense, c.context_lengths, c.context_values}), 1, seed);
  for (Tensor& t :
       RandomBatch(SideSpec(spec, {c.candidate_dense, c.candidate_lengths, c.candidate_values}),
                   candidates, seed + 1)) {
    request.push_back(std::move(t));
  }
  return request;
}

std::vector<Tensor> RepeatContext(const ModelSpec& spec, const std::vector<Tensor>& request) {
  const ContextSpec& c = spec.context;
  const Tensor* cand_lengths = Named(request, spec, c.candidate_lengths);
  const Tensor* ctx_lengths = Named(request, spec, c.context_lengths);
  const Tensor* cand_values = Named(request, spec, c.candidate_values);
  const Tensor* ctx_values = Named(request, spec, c.context_values);
  const int64_t rows = cand_lengths->shape[0];
  const auto fn = static_cast<int64_t>(c.cand_sparse.size());
  std::vector<Tensor> flat;
  if (c.num_dense > 0) {
    flat.push_back(RepeatDense(c, Named(request, spec, c.context_dense),
                               Named(request, spec, c.candidate_dense), rows));
  }
  Tensor lengths = Empty(kFlatLengthsInput, DataType::kInt32, {rows, c.num_sparse});
  std::vector<int64_t> ids;
  const std::vector<int64_t> ctx_starts = BagStarts(ctx_lengths);
  const std::vector<int64_t> cand_starts = BagStarts(cand_lengths);
  const std::vector<Source> sources = Sources(c.sparse, c.num_sparse);
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t col = 0; col < sources.size(); ++col) {
      const Source& s = sources[col];
      const auto bag = static_cast<int64_t>(s.index) + (s.context ? 0 : r * fn);
      const Tensor* values = s.context ? ctx_values : cand_values;
      const int32_t n = (s.context ? ctx_lengths : cand_lengths)->As<int32_t>()[bag];
      const int64_t* first =
          values->As<int64_t>() + (s.context ? ctx_starts : cand_starts)[static_cast<size_t>(bag)];
      lengths.MutableAs<int32_t>()[r * c.num_sparse + static_cast<int64_t>(col)] = n;
      ids.insert(ids.end(), first, first + n);
    }
  }
  flat.push_back(std::move(lengths));
  Tensor values = Empty(kFlatValuesInput, DataType::kInt64, {static_cast<int64_t>(ids.size())});
  if (!ids.empty()) std::memcpy(values.data.data(), ids.data(), values.data.size());
  flat.push_back(std::move(values));
  return flat;
}

Status ModelInputs(const ModelSpec& spec, std::vector<Tensor> request, std::vector<Tensor>* out) {
  if (!spec.context.present) {
    *out = std::move(request);
    return Status::Ok();
  }
  InferRequest r;
  r.inputs = std::move(request);
  REC_RETURN_IF_ERROR(ValidateContextModelRequest(spec, &r));
  *out = std::move(r.inputs);
  return Status::Ok();
}

}  // namespace rec::bench
