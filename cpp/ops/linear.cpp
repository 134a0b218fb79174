// rec::linear: y = x W^T + b with one fixed reduction order per output, so that a row's result
// never depends on the batch it is in, the CPU, or the instruction set that computes it.
//
// The invariant: every output y[i][j] is computed as
//     acc = 0; for k in 0 .. K-1: acc = fma(x[i][k], W[j][k], acc);  y[i][j] = acc + b[j]
// in that order, in fp32, whatever M is, whatever tile (i, j) falls in, and whichever of the
// AVX-512, AVX2 or scalar paths runs. FMA rounds once, exactly as IEEE 754 specifies, so the
// three paths produce the same bits, and tiling only chooses which outputs are computed
// together, never how one is computed. The kernels vectorize across outputs (columns j), never
// across k: there is no horizontal sum anywhere.
//
// The weight is packed once (rec.export.dense) into panels of 16 columns, K-major:
//     packed[p][k][c] = W[16 p + c][k]  (zero past N),  shape [ceil(N / 16), K, 16]
// so a panel row is one 64-byte line, read by one AVX-512 or two AVX2 loads. The packed tensor
// is a plain float tensor: it is saved and loaded with the model as it is.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace rec_ops {
namespace {

constexpr int64_t kPanel = 16;

struct Problem {
  const float* x;  // [M, K], row stride ldx
  const float* w;  // packed [P, K, 16]
  const float* b;  // [N] or nullptr
  float* y;        // [M, N], row stride N
  int64_t m, k, n, ldx;
};

// Writes one panel's accumulated row (16 values, `cols` of them real) with the bias added.
inline void StoreRow(const Problem& p, const float* acc, int64_t row, int64_t col, int64_t cols) {
  float* out = p.y + row * p.n + col;
  for (int64_t c = 0; c < cols; ++c) out[c] = acc[c] + (p.b ? p.b[col + c] : 0.0f);
}

// The reference definition, for CPUs without AVX2: the same chain, one output at a time.
void ScalarTile(const Problem& p, int64_t row0, int64_t rows, int64_t panel0, int64_t panels) {
  float acc[kPanel];
  for (int64_t r = row0; r < row0 + rows; ++r) {
    const float* xr = p.x + r * p.ldx;
    for (int64_t q = panel0; q < panel0 + panels; ++q) {
      const float* wq = p.w + q * p.k * kPanel;
      for (int64_t c = 0; c < kPanel; ++c) {
        float a = 0.0f;
        for (int64_t k = 0; k < p.k; ++k) a = std::fma(xr[k], wq[k * kPanel + c], a);
        acc[c] = a;
      }
      StoreRow(p, acc, r, q * kPanel, std::min(kPanel, p.n - q * kPanel));
    }
  }
}

// AVX-512: an MR x (16 NP) tile in MR * NP zmm accumulators (at most 24 of the 32 registers).
template <int MR, int NP>
__attribute__((target("avx512f"))) void Avx512Tile(const Problem& p, int64_t row0, int64_t q0) {
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  const float* xr = p.x + row0 * p.ldx;
  const float* wq = p.w + q0 * p.k * kPanel;
  const int64_t panel_stride = p.k * kPanel;
  for (int64_t k = 0; k < p.k; ++k) {
    __m512 w[NP];
    for (int j = 0; j < NP; ++j) w[j] = _mm512_loadu_ps(wq + j * panel_stride + k * kPanel);
    for (int r = 0; r < MR; ++r) {
      __m512 a = _mm512_set1_ps(xr[r * p.ldx + k]);
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(a, w[j], acc[r][j]);
    }
  }
  for (int j = 0; j < NP; ++j) {
    const int64_t col = (q0 + j) * kPanel;
    const int64_t cols = std::min(kPanel, p.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    const __m512 bias = p.b ? _mm512_maskz_loadu_ps(mask, p.b + col) : _mm512_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      _mm512_mask_storeu_ps(p.y + (row0 + r) * p.n + col, mask, _mm512_add_ps(acc[r][j], bias));
    }
  }
}

// AVX2 + FMA: an MR x (16 NP) tile in MR * 2 NP ymm accumulators (at most 12 of 16).
template <int MR, int NP>
__attribute__((target("avx2,fma"))) void Avx2Tile(const Problem& p, int64_t row0, int64_t q0) {
  __m256 acc[MR][2 * NP];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 2 * NP; ++j) acc[r][j] = _mm256_setzero_ps();
  const float* xr = p.x + row0 * p.ldx;
  const float* wq = p.w + q0 * p.k * kPanel;
  const int64_t panel_stride = p.k * kPanel;
  for (int64_t k = 0; k < p.k; ++k) {
    __m256 w[2 * NP];
    for (int j = 0; j < NP; ++j) {
      w[2 * j] = _mm256_loadu_ps(wq + j * panel_stride + k * kPanel);
      w[2 * j + 1] = _mm256_loadu_ps(wq + j * panel_stride + k * kPanel + 8);
    }
    for (int r = 0; r < MR; ++r) {
      __m256 a = _mm256_set1_ps(xr[r * p.ldx + k]);
      for (int j = 0; j < 2 * NP; ++j) acc[r][j] = _mm256_fmadd_ps(a, w[j], acc[r][j]);
    }
  }
  alignas(32) float buf[kPanel];
  for (int j = 0; j < NP; ++j) {
    const int64_t col = (q0 + j) * kPanel;
    const int64_t cols = std::min(kPanel, p.n - col);
    for (int r = 0; r < MR; ++r) {
      if (cols == kPanel) {
        float* out = p.y + (row0 + r) * p.n + col;
        const __m256 b0 = p.b ? _mm256_loadu_ps(p.b + col) : _mm256_setzero_ps();
        const __m256 b1 = p.b ? _mm256_loadu_ps(p.b + col + 8) : _mm256_setzero_ps();
        _mm256_storeu_ps(out, _mm256_add_ps(acc[r][2 * j], b0));
        _mm256_storeu_ps(out + 8, _mm256_add_ps(acc[r][2 * j + 1], b1));
      } else {
        _mm256_store_ps(buf, acc[r][2 * j]);
        _mm256_store_ps(buf + 8, acc[r][2 * j + 1]);
        StoreRow(p, buf, row0 + r, col, cols);
      }
    }
  }
}

using TileFn = void (*)(const Problem&, int64_t, int64_t);

// Tile shapes per ISA: kRows rows of kPanels panels in the steady state; one row of up to
// kWidePanels panels when M = 1 (more independent chains to hide FMA latency while the weights
// stream); smaller tiles for the edges. Any shape computes each output the same way.
template <int MR, int NP>
struct Avx512 {
  static constexpr TileFn fn = &Avx512Tile<MR, NP>;
};
template <int MR, int NP>
struct Avx2 {
  static constexpr TileFn fn = &Avx2Tile<MR, NP>;
};

// table[mr - 1][np - 1] for mr in 1..MR, np in 1..NP.
template <template <int, int> class K, int MR, int NP>
struct Table {
  TileFn t[MR][NP];
  Table() { Fill<1>(); }
  template <int R>
  void Fill() {
    if constexpr (R <= MR) {
      FillRow<R, 1>();
      Fill<R + 1>();
    }
  }
  template <int R, int Q>
  void FillRow() {
    if constexpr (Q <= NP) {
      t[R - 1][Q - 1] = K<R, Q>::fn;
      FillRow<R, Q + 1>();
    }
  }
};

struct Isa {
  const char* name;
  int rows;         // tile rows in the steady state
  int panels;       // tile panels in the steady state
  int wide_panels;  // panels per tile when a block has one row
  TileFn (*tile)(int rows, int panels);
};

TileFn Avx512Lookup(int rows, int panels) {
  static const Table<Avx512, 8, 4> table;  // 1 x 4 is the widest single-row tile used
  return table.t[rows - 1][panels - 1];
}
TileFn Avx2Lookup(int rows, int panels) {
  static const Table<Avx2, 6, 4> table;
  return table.t[rows - 1][panels - 1];
}

const Isa& ChosenIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    // REC_MAX_CPU_ISA=avx2|scalar holds the kernels below what the CPU has (tests prove the
    // paths give the same bits; a user can rule out the ISA as a cause of a difference).
    const char* cap_env = std::getenv("REC_MAX_CPU_ISA");
    const std::string cap = cap_env ? cap_env : "";
    const bool avx512_ok = cap.empty() || cap == "avx512";
    const bool avx2_ok = avx512_ok || cap == "avx2";
    if (avx512_ok && __builtin_cpu_supports("avx512f")) {
      return Isa{"avx512", 8, 3, 4, &Avx512Lookup};
    }
    if (avx2_ok && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return Isa{"avx2", 6, 1, 4, &Avx2Lookup};
    }
    return Isa{"scalar", 0, 0, 0, nullptr};
  }();
  return isa;
}

// Rows [row0, row0 + rows) x panels [q0, q1): panel blocks outer (their weights stay in cache
// while every row block passes), row blocks inner.
void RunBlock(const Problem& p, const Isa& isa, int64_t q0, int64_t q1) {
  if (isa.tile == nullptr) {
    ScalarTile(p, 0, p.m, q0, q1 - q0);
    return;
  }
  const int64_t step = p.m == 1 ? isa.wide_panels : isa.panels;
  for (int64_t q = q0; q < q1; q += step) {
    const int np = static_cast<int>(std::min<int64_t>(step, q1 - q));
    for (int64_t r = 0; r < p.m; r += isa.rows) {
      const int mr = static_cast<int>(std::min<int64_t>(isa.rows, p.m - r));
      isa.tile(mr, np)(p, r, q);
    }
  }
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& packed,
                  const c10::optional<at::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(x.dim() == 2, "rec::linear: x must be [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "rec::linear: x and the packed weight must be float32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel,
              "rec::linear: packed weight must be [ceil(N/16), K, 16], got ", packed.sizes());
  const int64_t k = x.size(1);
  TORCH_CHECK(packed.size(1) == k, "rec::linear: x has ", k, " columns, the weight ",
              packed.size(1));
  TORCH_CHECK(out_features > 0 && (out_features + kPanel - 1) / kPanel == packed.size(0),
              "rec::linear: ", out_features, " outputs do not fit ", packed.size(0), " panels");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == out_features,
                "rec::linear: bias must be float32 [", out_features, "]");
  }
  at::Tensor xc = x.contiguous();
  at::Tensor wc = packed.contiguous();
  at::Tensor bc = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor y = at::empty({x.size(0), out_features}, x.options());
  if (x.size(0) == 0) return y;
  Problem p{xc.data_ptr<float>(),
            wc.data_ptr<float>(),
            has_bias ? bc.data_ptr<float>() : nullptr,
            y.data_ptr<float>(),
            x.size(0),
            k,
            out_features,
            k};
  const Isa& isa = ChosenIsa();
  // Threads split the panels (whole outputs), never the reduction: results do not depend on
  // the thread count either.
  const int64_t panels = packed.size(0);
  const int64_t grain = std::max<int64_t>(1, isa.panels) * 4;
  at::parallel_for(0, panels, grain, [&](int64_t q0, int64_t q1) { RunBlock(p, isa, q0, q1); });
  return y;
}

at::Tensor LinearMeta(const at::Tensor& x, const at::Tensor& packed,
                      const c10::optional<at::Tensor>& bias, int64_t out_features) {
  // sym_size: under torch.export the batch is symbolic, and size(0) would pin it to the example's.
  return at::empty_symint({x.sym_size(0), c10::SymInt(out_features)}, x.options());
}

}  // namespace

std::string LinearIsa() { return ChosenIsa().name; }

}  // namespace rec_ops

TORCH_LIBRARY(rec, m) {
  m.def("linear(Tensor x, Tensor packed_weight, Tensor? bias, int out_features) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("linear_isa() -> str", &rec_ops::LinearIsa);
}

TORCH_LIBRARY_IMPL(rec, CPU, m) { m.impl("linear", &rec_ops::Linear); }
TORCH_LIBRARY_IMPL(rec, Meta, m) { m.impl("linear", &rec_ops::LinearMeta); }
