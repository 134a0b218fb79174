// rec::feature_major_ids: a request's batch-major ids as FBGEMM's TBE reads them, in one pass
// (rec/export/served.py's feature_major_ids).
//
//   lengths [B, C] int32/int64 (ids per sample per request column), values [N] int64 raw ids,
//   rows [F] int64 (rows of the table TBE feature k reads), column_of [F] int64 or None (the
//   request column of feature k; a permutation of the C columns, None: feature k is column k)
//   -> (ids [N], the raw ids feature-major; indices [N], each `id mod rows` (non-negative, as
//       torch.remainder); offsets [F * B + 1] int64, bag k * B + b = feature k, sample b)
//
// The same result as fbgemm's permute_1D_sparse_data, a complete cumsum, a bucketize for each
// id's feature and a remainder, which were 14 TorchScript ops and ~15 us of a ~40 us B = 1
// forward on the default model (interpreter dispatch and small allocations, not arithmetic).
// Unlike permute_1D_sparse_data given the id count, it refuses lengths that do not add up to
// the ids it was given (negative lengths included) instead of reading past them.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace rec_ops {
namespace {

using Ids = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// feature -> request column, checked to be a permutation of the columns.
std::vector<int64_t> ColumnsOf(const c10::optional<at::Tensor>& column_of, int64_t columns) {
  std::vector<int64_t> col(columns);
  if (!column_of.has_value()) {
    for (int64_t k = 0; k < columns; ++k) col[k] = k;
    return col;
  }
  const at::Tensor c = column_of->to(at::kLong).contiguous();
  TORCH_CHECK(c.dim() == 1 && c.size(0) == columns, "rec::feature_major_ids: column_of must name ",
              "each of the ", columns, " request columns once; got ", c.sizes());
  std::vector<bool> seen(columns, false);
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t k = 0; k < columns; ++k) {
    TORCH_CHECK(p[k] >= 0 && p[k] < columns && !seen[p[k]],
                "rec::feature_major_ids: column_of is not a permutation of the request columns");
    seen[p[k]] = true;
    col[k] = p[k];
  }
  return col;
}

template <typename L>
void Permute(const L* len, const int64_t* values, const int64_t* rows,
             const std::vector<int64_t>& col, int64_t batch, int64_t columns, int64_t n,
             int64_t* ids, int64_t* indices, int64_t* offsets) {
  // Where each request bag's ids start in `values` (batch-major), checked against N.
  std::vector<int64_t> start(batch * columns + 1);
  start[0] = 0;
  for (int64_t i = 0; i < batch * columns; ++i) {
    TORCH_CHECK(len[i] >= 0, "rec::feature_major_ids: sparse_lengths holds a negative length");
    start[i + 1] = start[i] + static_cast<int64_t>(len[i]);
  }
  TORCH_CHECK(start[batch * columns] == n, "rec::feature_major_ids: sparse_lengths add up to ",
              start[batch * columns], " ids but sparse_values holds ", n);
  int64_t out = 0;
  offsets[0] = 0;
  for (int64_t k = 0; k < columns; ++k) {
    const int64_t r = rows[k];
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t bag = b * columns + col[k];
      for (int64_t i = start[bag]; i < start[bag + 1]; ++i, ++out) {
        const int64_t id = values[i];
        int64_t m = id % r;  // torch.remainder: the divisor's sign (rows > 0: non-negative)
        if (m < 0) m += r;
        ids[out] = id;
        indices[out] = m;
      }
      offsets[k * batch + b + 1] = out;
    }
  }
}

Ids FeatureMajorIds(const at::Tensor& lengths, const at::Tensor& values, const at::Tensor& rows,
                    const c10::optional<at::Tensor>& column_of) {
  TORCH_CHECK(lengths.dim() == 2, "rec::feature_major_ids: sparse_lengths must be [B, C], got ",
              lengths.sizes());
  TORCH_CHECK(lengths.scalar_type() == at::kInt || lengths.scalar_type() == at::kLong,
              "rec::feature_major_ids: sparse_lengths must be int32 or int64");
  TORCH_CHECK(values.dim() == 1, "rec::feature_major_ids: sparse_values must be [N]");
  const int64_t batch = lengths.size(0), columns = lengths.size(1), n = values.size(0);
  TORCH_CHECK(rows.dim() == 1 && rows.size(0) == columns, "rec::feature_major_ids: rows must ",
              "be [", columns, "], one per request column; got ", rows.sizes());
  const at::Tensor len = lengths.contiguous();
  const at::Tensor vals = values.to(at::kLong).contiguous();
  const at::Tensor rws = rows.to(at::kLong).contiguous();
  const int64_t* r = rws.data_ptr<int64_t>();
  for (int64_t k = 0; k < columns; ++k) {
    TORCH_CHECK(r[k] > 0, "rec::feature_major_ids: a table has no rows");
  }
  const std::vector<int64_t> col = ColumnsOf(column_of, columns);
  at::Tensor ids = at::empty({n}, vals.options());
  at::Tensor indices = at::empty({n}, vals.options());
  at::Tensor offsets = at::empty({columns * batch + 1}, vals.options());
  if (len.scalar_type() == at::kInt) {
    Permute(len.data_ptr<int32_t>(), vals.data_ptr<int64_t>(), r, col, batch, columns, n,
            ids.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), offsets.data_ptr<int64_t>());
  } else {
    Permute(len.data_ptr<int64_t>(), vals.data_ptr<int64_t>(), r, col, batch, columns, n,
            ids.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), offsets.data_ptr<int64_t>());
  }
  return {ids, indices, offsets};
}

// Symbolic sizes for torch.export: every column is read, so the ids are the request's N.
Ids FeatureMajorIdsMeta(const at::Tensor& lengths, const at::Tensor& values, const at::Tensor& rows,
                        const c10::optional<at::Tensor>& column_of) {
  const auto opts = values.options().dtype(at::kLong);
  at::Tensor ids = at::empty_symint(values.sym_sizes(), opts);
  at::Tensor indices = at::empty_symint(values.sym_sizes(), opts);
  c10::SymInt bags = lengths.sym_size(0) * lengths.sym_size(1) + 1;
  at::Tensor offsets = at::empty_symint({bags}, opts);
  return {ids, indices, offsets};
}

}  // namespace
}  // namespace rec_ops

TORCH_LIBRARY_FRAGMENT(rec, m) {
  m.def(
      "feature_major_ids(Tensor lengths, Tensor values, Tensor rows, Tensor? column_of) -> "
      "(Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}
TORCH_LIBRARY_IMPL(rec, CPU, m) { m.impl("feature_major_ids", &rec_ops::FeatureMajorIds); }
TORCH_LIBRARY_IMPL(rec, Meta, m) { m.impl("feature_major_ids", &rec_ops::FeatureMajorIdsMeta); }
