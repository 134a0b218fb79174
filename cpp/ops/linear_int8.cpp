// rec::linear_int8: a dense layer in int8 whose row results never depend on the batch; and
// rec::cross_int8, the same layer with a low-rank cross layer's x0 * y + x_l in its epilogue.
//
//   per row i:    s_i = max_k |x[i][k]| / 127 (1 for an all-zero row),
//                 q[i][k] = clamp(nearbyint(x[i][k] / s_i), -127, 127)        (int8)
//   per output j: acc[i][j] = sum_k q[i][k] * W[j][k]                          (int32, exact)
//                 y[i][j] = (float(acc[i][j]) * s_i) * w_scale[j] + b[j]
//
// A row's quantization reads only that row, so its codes are the same in any batch. The
// products and sums are integers, exact whatever order or kernel adds them (|acc| <= 127 *
// 127 * K, far inside int32 for any layer here), so the int32 result is one number whichever
// GEMM computes it; the rest is element-wise IEEE arithmetic. That is why the op may pick its
// kernel by CPU and batch size without changing any bit. Batches up to 16 rows go to the AVX-512
// VNNI kernel below, which reads the weights in their stored layout with no per-call set-up.
// Larger ones go, on a CPU with AMX-INT8, to the AMX kernel below, which reads the weights in
// tile order (`w_tiles`, stored by Int8Linear beside the plain codes); otherwise (or for a model
// exported without w_tiles) to `at::_int_mm` (oneDNN's int8 GEMM through PyTorch, which reorders
// the weights on every call). Without AVX-512 VNNI, an AVX2 kernel of ours runs
// every batch: PyTorch's `at::_int_mm` then falls back to a scalar loop (measured 22x slower
// than fp32 at 512 x 1728 x 1728 on an AVX2-only AMD EPYC), so the op does not use it there.
// The AVX2 kernel widens codes and weights to int16 (vpmovsxbw) and multiplies pairs into int32
// (vpmaddwd): |q * W| <= 127 * 127, so a pair's sum fits in int16's product range and nothing
// saturates, unlike vpmaddubsw's u8 x s8 form, whose +128 shift could overflow int16.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <torch/library.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace rec_ops {
namespace {

// Batches up to this many rows use the VNNI kernel (measured on an AMD EPYC, one thread:
// _int_mm's per-call weight reorder costs more than the kernel's whole product below it).
constexpr int64_t kSmallBatch = 16;

// One row's scale: max |x| / 127 (1 for an all-zero row).
inline float RowScale(float amax) { return amax > 0.0f ? amax / 127.0f : 1.0f; }

// One code: clamp(nearbyint(v / s), -127, 127), rounding half to even; `shift` 128 gives the
// unsigned form vpdpbusd takes (the same code + 128).
inline uint8_t Code(float v, float s, int shift) {
  const float q = std::min(127.0f, std::max(-127.0f, std::nearbyint(v / s)));
  return static_cast<uint8_t>(static_cast<int>(q) + shift);
}

// The same per-row quantization, 16 values at a time: IEEE division and round-to-nearest-even
// give the scalar loop's codes exactly.
__attribute__((target("avx512f,avx512bw"))) void QuantizeRowAvx512(const float* row, int64_t k,
                                                                   uint8_t* out, float* scale,
                                                                   int shift) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(row + c)));
  float amax = _mm512_reduce_max_ps(vmax);
  for (; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
  const float s = RowScale(amax);
  *scale = s;
  const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i vshift = _mm512_set1_epi32(shift);
  for (c = 0; c + 16 <= k; c += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(row + c), vs),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(hi, _mm512_max_ps(lo, q));
    const __m512i qi = _mm512_add_epi32(_mm512_cvtps_epi32(q), vshift);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm512_cvtepi32_epi8(qi));
  }
  for (; c < k; ++c) out[c] = Code(row[c], s, shift);
}

// 8 codes as int32: clamp(round-half-even(v / s), -127, 127).
__attribute__((target("avx2"))) inline __m256i Codes8(const float* v, __m256 s, __m256 lo,
                                                      __m256 hi) {
  const __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(v), s),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, q)));
}

// The same, 16 values at a time with AVX2. Codes are packed with signed saturation (they are in
// [-127, 127] already) and the +128 shift, when asked for, is a flip of the top bit.
__attribute__((target("avx2"))) void QuantizeRowAvx2(const float* row, int64_t k, uint8_t* out,
                                                     float* scale, int shift) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8)
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(row + c), abs_mask));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0.0f;
  for (float v : lanes) amax = std::max(amax, v);
  for (; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
  const float s = RowScale(amax);
  *scale = s;
  const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m128i flip = _mm_set1_epi8(shift ? static_cast<char>(0x80) : 0);
  for (c = 0; c + 16 <= k; c += 16) {
    // packs interleaves 128-bit lanes: [a0-3 b0-3 a4-7 b4-7]; the permute puts a before b.
    const __m256i words = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(Codes8(row + c, vs, lo, hi), Codes8(row + c + 8, vs, lo, hi)), 0xD8);
    const __m128i bytes =
        _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), _mm_xor_si128(bytes, flip));
  }
  for (; c < k; ++c) out[c] = Code(row[c], s, shift);
}

bool HasAvx512() {
  static const bool yes = [] {
    __builtin_cpu_init();
    const char* cap = std::getenv("REC_MAX_CPU_ISA");
    if (cap && std::string(cap) != "avx512") return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return yes;
}

bool HasAvx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    const char* cap = std::getenv("REC_MAX_CPU_ISA");  // scalar: no AVX2 kernel
    if (cap && std::string(cap) == "scalar") return false;
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}

// Per-row symmetric quantization of x [M, K] into codes (int8, or uint8 = int8 + 128 when
// `shift` is 128) and scales [M]. The codes may be padded to [rows, cols] (AMX's whole tiles):
// the padding is zeros, which add nothing to a product.
void QuantizeRows(const at::Tensor& x, int shift, at::Tensor* codes, at::Tensor* scales,
                  int64_t rows = 0, int64_t cols = 0) {
  const int64_t m = x.size(0), k = x.size(1);
  rows = std::max(rows, m);
  cols = std::max(cols, k);
  *codes = at::empty({rows, cols}, x.options().dtype(shift ? at::kByte : at::kChar));
  *scales = at::empty({m}, x.options());
  const float* xp = x.data_ptr<float>();
  auto* qp = static_cast<uint8_t*>(codes->data_ptr());
  float* sp = scales->data_ptr<float>();
  if (rows > m) std::fill(qp + m * cols, qp + rows * cols, uint8_t{0});
  const bool wide = HasAvx512(), avx2 = HasAvx2();
  // A row's codes read only that row: threads split the rows without changing a bit.
  at::parallel_for(0, m, std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t i = r0; i < r1; ++i) {
                       const float* row = xp + i * k;
                       uint8_t* out = qp + i * cols;
                       if (wide) {
                         QuantizeRowAvx512(row, k, out, sp + i, shift);
                       } else if (avx2) {
                         QuantizeRowAvx2(row, k, out, sp + i, shift);
                       } else {
                         float amax = 0.0f;
                         for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
                         sp[i] = RowScale(amax);
                         for (int64_t c = 0; c < k; ++c) out[c] = Code(row[c], sp[i], shift);
                       }
                       std::fill(out + k, out + cols, uint8_t{0});
                     }
                   });
}

bool HasVnni() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    const char* cap = std::getenv("REC_MAX_CPU_ISA");  // avx2/scalar: no VNNI kernel
    if (cap && std::string(cap) != "avx512") return false;
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  }();
  return vnni;
}

// R rows x C outputs: acc[r][c] = sum_k (q[r][k] + 128) * W[c][k], by vpdpbusd over 64 k at a
// time (unsigned x signed bytes), then the bias of the +128 shift taken off by the caller.
template <int R, int C>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void VnniTile(const uint8_t* xu,
                                                                     const int8_t* w, int64_t k,
                                                                     int64_t row0, int64_t col0,
                                                                     int64_t n, int32_t* acc_out) {
  __m512i acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  for (int64_t kk = 0; kk < k; kk += 64) {
    const int64_t left = k - kk;
    const __mmask64 mask = left >= 64 ? ~__mmask64{0} : ((__mmask64{1} << left) - 1);
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_epi8(mask, w + (col0 + c) * k + kk);
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mask, xu + (row0 + r) * k + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc_out[(row0 + r) * n + col0 + c] = _mm512_reduce_add_epi32(acc[r][c]);
}

using VnniFn = void (*)(const uint8_t*, const int8_t*, int64_t, int64_t, int64_t, int64_t,
                        int32_t*);

template <int R, int C>
constexpr VnniFn kVnni = &VnniTile<R, C>;

constexpr int kRows = 4, kCols = 4;
const VnniFn kVnniTable[kRows][kCols] = {
    {kVnni<1, 1>, kVnni<1, 2>, kVnni<1, 3>, kVnni<1, 4>},
    {kVnni<2, 1>, kVnni<2, 2>, kVnni<2, 3>, kVnni<2, 4>},
    {kVnni<3, 1>, kVnni<3, 2>, kVnni<3, 3>, kVnni<3, 4>},
    {kVnni<4, 1>, kVnni<4, 2>, kVnni<4, 3>, kVnni<4, 4>},
};

// acc [M, N] = sum_k (q + 128) W, exact, by the VNNI tiles (small M); the caller takes off
// 128 * sum_k W[j][k].
at::Tensor VnniProduct(const at::Tensor& shifted, const at::Tensor& w) {
  const int64_t m = shifted.size(0), k = shifted.size(1), n = w.size(0);
  at::Tensor acc = at::empty({m, n}, shifted.options().dtype(at::kInt));
  const uint8_t* xu = shifted.data_ptr<uint8_t>();
  const int8_t* wp = w.data_ptr<int8_t>();
  int32_t* out = acc.data_ptr<int32_t>();
  at::parallel_for(0, (n + kCols - 1) / kCols, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t col = b0 * kCols; col < std::min(n, b1 * kCols); col += kCols) {
      const int cols = static_cast<int>(std::min<int64_t>(kCols, n - col));
      for (int64_t row = 0; row < m; row += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - row));
        kVnniTable[rows - 1][cols - 1](xu, wp, k, row, col, n, out);
      }
    }
  });
  return acc;
}

// 16 codes widened to int16 lanes.
__attribute__((target("avx2"))) inline __m256i Load16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// AVX2, without VNNI: acc[r][c] = sum_k q[r][k] * W[c][k] over R rows x C outputs. 16 k at a
// time widened to int16 lanes, pairs multiplied and added into int32 by vpmaddwd; the k % 16
// tail is added in scalar code (integers: the same sum). 4 x 3 tiles use 12 + 3 + 1 of the 16
// ymm registers. vpmaddwd's throughput bounds it, 16 products per instruction where an fp32 FMA
// does 8 but issues twice per cycle on Zen 3, so on such a CPU int8 runs at about fp32's speed
// at large batches and wins only where fp32 is bound by the weight's bytes (small batches).
// Widening codes and weights to int16 once per call instead was measured no faster.
template <int R, int C>
__attribute__((target("avx2"))) void Avx2Tile(const int8_t* x, const int8_t* w, int64_t k,
                                              int64_t row0, int64_t col0, int64_t n,
                                              int32_t* acc_out) {
  __m256i acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
  const int64_t body = k - k % 16;
  for (int64_t kk = 0; kk < body; kk += 16) {
    __m256i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = Load16(w + (col0 + c) * k + kk);
    for (int r = 0; r < R; ++r) {
      const __m256i xv = Load16(x + (row0 + r) * k + kk);
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(xv, wv[c]));
    }
  }
  for (int r = 0; r < R; ++r) {
    const int8_t* xr = x + (row0 + r) * k;
    for (int c = 0; c < C; ++c) {
      const int8_t* wc = w + (col0 + c) * k;
      __m128i s =
          _mm_add_epi32(_mm256_castsi256_si128(acc[r][c]), _mm256_extracti128_si256(acc[r][c], 1));
      s = _mm_hadd_epi32(s, s);
      s = _mm_hadd_epi32(s, s);
      int32_t total = _mm_cvtsi128_si32(s);
      for (int64_t kk = body; kk < k; ++kk) total += int32_t{xr[kk]} * int32_t{wc[kk]};
      acc_out[(row0 + r) * n + col0 + c] = total;
    }
  }
}

using Avx2Fn = void (*)(const int8_t*, const int8_t*, int64_t, int64_t, int64_t, int64_t, int32_t*);

template <int R, int C>
constexpr Avx2Fn kAvx2 = &Avx2Tile<R, C>;

constexpr int kAvx2Rows = 4, kAvx2Cols = 3;
const Avx2Fn kAvx2Table[kAvx2Rows][kAvx2Cols] = {
    {kAvx2<1, 1>, kAvx2<1, 2>, kAvx2<1, 3>},
    {kAvx2<2, 1>, kAvx2<2, 2>, kAvx2<2, 3>},
    {kAvx2<3, 1>, kAvx2<3, 2>, kAvx2<3, 3>},
    {kAvx2<4, 1>, kAvx2<4, 2>, kAvx2<4, 3>},
};

// Rows are taken kAvx2RowBlock at a time so that their codes stay in L2 while every output
// tile passes over them (a block of 32 rows of K = 1728 is 55 KB).
constexpr int64_t kAvx2RowBlock = 32;

// acc [M, N] = sum_k q W, exact, by the AVX2 tiles (any M).
at::Tensor Avx2Product(const at::Tensor& codes, const at::Tensor& w) {
  const int64_t m = codes.size(0), k = codes.size(1), n = w.size(0);
  at::Tensor acc = at::empty({m, n}, codes.options().dtype(at::kInt));
  const int8_t* xp = codes.data_ptr<int8_t>();
  const int8_t* wp = w.data_ptr<int8_t>();
  int32_t* out = acc.data_ptr<int32_t>();
  const int64_t tiles = (n + kAvx2Cols - 1) / kAvx2Cols;
  for (int64_t block = 0; block < m; block += kAvx2RowBlock) {
    const int64_t block_end = std::min(m, block + kAvx2RowBlock);
    at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t col = t0 * kAvx2Cols; col < std::min(n, t1 * kAvx2Cols); col += kAvx2Cols) {
        const int cols = static_cast<int>(std::min<int64_t>(kAvx2Cols, n - col));
        for (int64_t row = block; row < block_end; row += kAvx2Rows) {
          const int rows = static_cast<int>(std::min<int64_t>(kAvx2Rows, block_end - row));
          kAvx2Table[rows - 1][cols - 1](xp, wp, k, row, col, n, out);
        }
      }
    });
  }
  return acc;
}

// AMX-INT8 (Intel Xeon since Sapphire Rapids), for batches above kSmallBatch when the layer
// carries its weight in tile order (`w_tiles`, Int8Linear's buffer: [N/16 padded to even, K/64,
// 16, 64] with w_tiles[nb][kb][r][4c + q] = W[16nb + c][64kb + 4r + q], zeros past N and K).
// tdpbssd adds a 16x64 block of codes times one such 64x16 weight tile into a 16x16 int32 tile:
// signed bytes, exact integer sums, so the same int32 as every other path. Measured on an Intel
// Xeon with AMX, one thread: tdpbssd peaks at ~3.8 T products/s against AVX-512 VNNI's 0.47 T
// (benchmarks/isa_peak.py), and at::_int_mm reached 0.4-0.9 T on these layers (it reorders the
// weight on every call).
constexpr int64_t kAmxRows = 32, kAmxCols = 32, kAmxK = 64;

bool HasAmx() {
  static const bool yes = [] {
    if (std::getenv("REC_MAX_CPU_ISA")) return false;  // any cap (avx512, avx2, scalar) is below
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;  // AMX-TILE, AMX-INT8
    // Linux hands a process the tile state only when asked (ARCH_REQ_XCOMP_PERM for
    // XTILEDATA), and refuses it where the kernel or a hypervisor does not support it.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return yes;
}

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed));

// acc[m0 .. m0 + 31][32 pb .. 32 pb + 31] for pb in [pb0, pb1), every m0: four accumulator
// tiles (0-3) fed by two tiles of codes (4, 5) and two weight tiles (6, 7). A block of 32 rows'
// codes (32 x K bytes: 16 KB at K = 512) stays in L1 while every pair of weight columns passes
// over it. Measured one thread, M = 512, AMX Xeon: 1.5x the other loop order (weight pair
// outside, rows inside) at K = 512, N = 1728 (the cross layers), the same at K = 1728.
__attribute__((target("amx-tile,amx-int8"))) void AmxTiles(const int8_t* codes, int64_t mp,
                                                           int64_t kp, const int8_t* w_tiles,
                                                           int64_t pb0, int64_t pb1, int32_t* acc,
                                                           int64_t np) {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  _tile_loadconfig(&config);
  const int64_t kb = kp / kAmxK, tile = 16 * 64;
  for (int64_t m = 0; m < mp; m += kAmxRows) {
    const int8_t* a0 = codes + m * kp;
    const int8_t* a1 = a0 + 16 * kp;
    for (int64_t pb = pb0; pb < pb1; ++pb) {
      const int8_t* b0 = w_tiles + (2 * pb) * kb * tile;
      const int8_t* b1 = b0 + kb * tile;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < kb; ++k) {
        _tile_loadd(4, a0 + k * kAmxK, kp);
        _tile_loadd(5, a1 + k * kAmxK, kp);
        _tile_loadd(6, b0 + k * tile, 64);
        _tile_loadd(7, b1 + k * tile, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
      int32_t* c = acc + m * np + pb * kAmxCols;
      _tile_stored(0, c, np * 4);
      _tile_stored(1, c + 16, np * 4);
      _tile_stored(2, c + 16 * np, np * 4);
      _tile_stored(3, c + 16 * np + 16, np * 4);
    }
  }
  _tile_release();
}

// acc [M padded to 32, N padded to 32] = codes W^T, exact, by AMX. `codes` is [M padded, K
// padded to 64] with zeros in the padding.
at::Tensor AmxProduct(const at::Tensor& codes, const at::Tensor& w_tiles) {
  const int64_t mp = codes.size(0), kp = codes.size(1), np = w_tiles.size(0) * 16;
  at::Tensor acc = at::empty({mp, np}, codes.options().dtype(at::kInt));
  const int8_t* a = codes.data_ptr<int8_t>();
  const int8_t* b = w_tiles.data_ptr<int8_t>();
  int32_t* c = acc.data_ptr<int32_t>();
  at::parallel_for(0, np / kAmxCols, 1,
                   [&](int64_t p0, int64_t p1) { AmxTiles(a, mp, kp, b, p0, p1, c, np); });
  return acc;
}

// What follows the int32 product, element by element: y = (float(acc - shift * w_sum_j) * s_i)
// * w_scale_j + b_j, and for a cross layer then x0 * y + residual. Plain IEEE multiplies and
// adds in this order on every path (the library is built with -ffp-contract=off, so none is
// fused into an FMA): vectorized or not, the same bits, and the same as the unfused
// `x0 * linear_int8(h) + residual` in torch.
struct Epilogue {
  const int32_t* acc;  // [M, acc_stride]
  int64_t acc_stride;
  const float* scales;
  const float* w_scale;
  const int32_t* w_sum;
  int shift;
  const float* bias;      // or null
  const float* x0;        // a cross layer's x0 and residual, or null
  const float* residual;  // (row-major [M, N] like the output)
};

// Outputs [j0, n) of row i, one at a time: the scalar path, and the AVX2 path's n % 8 tail.
void EpilogueScalar(const Epilogue& e, int64_t i, int64_t j0, int64_t n, float* y) {
  const float s = e.scales[i];
  const int32_t* a = e.acc + i * e.acc_stride;
  for (int64_t j = j0; j < n; ++j) {
    float v = static_cast<float>(a[j] - e.shift * e.w_sum[j]) * s * e.w_scale[j];
    if (e.bias) v = v + e.bias[j];
    if (e.x0) v = e.x0[i * n + j] * v + e.residual[i * n + j];
    y[i * n + j] = v;
  }
}

void EpilogueRowScalar(const Epilogue& e, int64_t i, int64_t n, float* y) {
  EpilogueScalar(e, i, 0, n, y);
}

// 16 outputs at a time, the tail under a mask.
__attribute__((target("avx512f"))) void EpilogueRowAvx512(const Epilogue& e, int64_t i, int64_t n,
                                                          float* y) {
  const __m512 vs = _mm512_set1_ps(e.scales[i]);
  const __m512i vshift = _mm512_set1_epi32(e.shift);
  const int64_t row = i * n;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m =
        n - j >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512i acc =
        _mm512_sub_epi32(_mm512_maskz_loadu_epi32(m, e.acc + i * e.acc_stride + j),
                         _mm512_mullo_epi32(vshift, _mm512_maskz_loadu_epi32(m, e.w_sum + j)));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), vs),
                             _mm512_maskz_loadu_ps(m, e.w_scale + j));
    if (e.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, e.bias + j));
    if (e.x0)
      v = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, e.x0 + row + j), v),
                        _mm512_maskz_loadu_ps(m, e.residual + row + j));
    _mm512_mask_storeu_ps(y + row + j, m, v);
  }
}

// 8 outputs at a time; the n % 8 tail by EpilogueScalar (the same operations).
__attribute__((target("avx2"))) void EpilogueRowAvx2(const Epilogue& e, int64_t i, int64_t n,
                                                     float* y) {
  const __m256 vs = _mm256_set1_ps(e.scales[i]);
  const __m256i vshift = _mm256_set1_epi32(e.shift);
  const int64_t row = i * n;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i acc = _mm256_sub_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.acc + i * e.acc_stride + j)),
        _mm256_mullo_epi32(vshift,
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.w_sum + j))));
    __m256 v =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), vs), _mm256_loadu_ps(e.w_scale + j));
    if (e.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(e.bias + j));
    if (e.x0)
      v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(e.x0 + row + j), v),
                        _mm256_loadu_ps(e.residual + row + j));
    _mm256_storeu_ps(y + row + j, v);
  }
  EpilogueScalar(e, i, j, n, y);
}

at::Tensor ApplyEpilogue(const Epilogue& e, int64_t m, int64_t n, const at::TensorOptions& opts) {
  at::Tensor y = at::empty({m, n}, opts);
  float* yp = y.data_ptr<float>();
  const auto row_fn = HasAvx512() ? EpilogueRowAvx512
                      : HasAvx2() ? EpilogueRowAvx2
                                  : EpilogueRowScalar;
  // Rows are independent: threads split them without changing a bit.
  at::parallel_for(0, m, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t i = r0; i < r1; ++i) row_fn(e, i, n, yp);
                   });
  return y;
}

// Checks the layer's arguments; returns the number of outputs.
int64_t CheckLayer(const char* op, const at::Tensor& x, const at::Tensor& w,
                   const at::Tensor& w_scale, const at::Tensor& w_sum,
                   const c10::optional<at::Tensor>& bias,
                   const c10::optional<at::Tensor>& w_tiles) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, op, ": x must be float32 [M, K], got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous(), op,
              ": the weight must be contiguous int8 [N, K]");
  TORCH_CHECK(w.size(1) == x.size(1), op, ": x has ", x.size(1), " columns, the weight ",
              w.size(1));
  const int64_t n = w.size(0);
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat && w_scale.numel() == n, op,
              ": w_scale must be float32 [", n, "]");
  TORCH_CHECK(w_sum.scalar_type() == at::kInt && w_sum.numel() == n, op, ": w_sum must be int32 [",
              n, "]");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->scalar_type() == at::kFloat && bias->numel() == n), op,
              ": bias must be float32 [", n, "]");
  if (w_tiles.has_value() && w_tiles->defined()) {
    const int64_t blocks = (n + kAmxCols - 1) / kAmxCols * 2, kb = (w.size(1) + kAmxK - 1) / kAmxK;
    TORCH_CHECK(w_tiles->scalar_type() == at::kChar && w_tiles->dim() == 4 &&
                    w_tiles->sizes() == at::IntArrayRef({blocks, kb, 16, 64}),
                op, ": w_tiles must be int8 [", blocks, ", ", kb,
                ", 16, 64] (Int8Linear's tile order), got ", w_tiles->scalar_type(), " ",
                w_tiles->sizes());
  }
  return n;
}

// The layer: codes, the exact int32 product, then the epilogue (with a cross layer's x0 and
// residual when given).
at::Tensor Int8Layer(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale,
                     const at::Tensor& w_sum, const c10::optional<at::Tensor>& bias,
                     const c10::optional<at::Tensor>& w_tiles, const at::Tensor* x0,
                     const at::Tensor* residual) {
  const int64_t m = x.size(0), n = w.size(0);
  if (m == 0) return at::empty({0, n}, x.options());
  const bool small = m <= kSmallBatch && HasVnni();
  const bool amx = !small && w_tiles.has_value() && w_tiles->defined() && HasAmx();
  const int shift = small ? 128 : 0;
  at::Tensor codes, scales, acc;
  if (amx) {
    const int64_t rows = (m + kAmxRows - 1) / kAmxRows * kAmxRows;
    const int64_t cols = (x.size(1) + kAmxK - 1) / kAmxK * kAmxK;
    QuantizeRows(x.contiguous(), 0, &codes, &scales, rows, cols);
    acc = AmxProduct(codes, w_tiles->contiguous());
  } else {
    QuantizeRows(x.contiguous(), shift, &codes, &scales);
    acc = small       ? VnniProduct(codes, w)
          : HasVnni() ? at::_int_mm(codes, w.t())
          : HasAvx2() ? Avx2Product(codes, w)
                      : at::_int_mm(codes, w.t());
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const at::Tensor ws = w_scale.contiguous(), sum = w_sum.contiguous();
  const at::Tensor x0c = x0 ? x0->contiguous() : at::Tensor();
  const at::Tensor resc = residual ? residual->contiguous() : at::Tensor();
  Epilogue e{acc.data_ptr<int32_t>(),
             acc.size(1),
             scales.data_ptr<float>(),
             ws.data_ptr<float>(),
             sum.data_ptr<int32_t>(),
             shift,
             has_bias ? b.data_ptr<float>() : nullptr,
             x0 ? x0c.data_ptr<float>() : nullptr,
             residual ? resc.data_ptr<float>() : nullptr};
  return ApplyEpilogue(e, x.size(0), n, x.options());
}

at::Tensor LinearInt8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale,
                      const at::Tensor& w_sum, const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& w_tiles) {
  CheckLayer("rec::linear_int8", x, w, w_scale, w_sum, bias, w_tiles);
  return Int8Layer(x, w, w_scale, w_sum, bias, w_tiles, nullptr, nullptr);
}

// A low-rank cross layer's second half, x0 * linear_int8(h) + residual, in one pass over the
// output: the unfused form writes the layer's output, then reads it back twice (the multiply,
// then the add), which at B = 512 and width 1728 is three passes over 3.5 MB from memory.
at::Tensor CrossInt8(const at::Tensor& h, const at::Tensor& w, const at::Tensor& w_scale,
                     const at::Tensor& w_sum, const c10::optional<at::Tensor>& bias,
                     const at::Tensor& x0, const at::Tensor& residual,
                     const c10::optional<at::Tensor>& w_tiles) {
  const int64_t n = CheckLayer("rec::cross_int8", h, w, w_scale, w_sum, bias, w_tiles);
  for (const at::Tensor* t : {&x0, &residual})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 && t->size(0) == h.size(0) &&
                    t->size(1) == n,
                "rec::cross_int8: x0 and the residual must be float32 [", h.size(0), ", ", n,
                "], got ", t->scalar_type(), " ", t->sizes());
  return Int8Layer(h, w, w_scale, w_sum, bias, w_tiles, &x0, &residual);
}

at::Tensor LinearInt8Meta(const at::Tensor& x, const at::Tensor& w, const at::Tensor&,
                          const at::Tensor&, const c10::optional<at::Tensor>&,
                          const c10::optional<at::Tensor>&) {
  return at::empty_symint({x.sym_size(0), w.sym_size(0)}, x.options());  // batch stays symbolic
}

at::Tensor CrossInt8Meta(const at::Tensor& h, const at::Tensor& w, const at::Tensor&,
                         const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&,
                         const at::Tensor&, const c10::optional<at::Tensor>&) {
  return at::empty_symint({h.sym_size(0), w.sym_size(0)}, h.options());
}

}  // namespace
}  // namespace rec_ops

TORCH_LIBRARY_FRAGMENT(rec, m) {
  m.def(
      "linear_int8(Tensor x, Tensor weight, Tensor w_scale, Tensor w_sum, Tensor? bias, "
      "Tensor? w_tiles=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "cross_int8(Tensor h, Tensor weight, Tensor w_scale, Tensor w_sum, Tensor? bias, Tensor x0, "
      "Tensor residual, Tensor? w_tiles=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(rec, CPU, m) {
  m.impl("linear_int8", &rec_ops::LinearInt8);
  m.impl("cross_int8", &rec_ops::CrossInt8);
}
TORCH_LIBRARY_IMPL(rec, Meta, m) {
  m.impl("linear_int8", &rec_ops::LinearInt8Meta);
  m.impl("cross_int8", &rec_ops::CrossInt8Meta);
}
