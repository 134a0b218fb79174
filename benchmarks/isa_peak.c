// Peak multiply-accumulate rate of the instructions a dense layer's inner loop can use, on this
// CPU, one thread: 12 independent accumulators per loop so that throughput, not latency, bounds
// it. Printed as JSON, one "name": products per second. Built and run by isa_peak.py.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LOOPS 50000000L

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// One instruction into register d from registers 14 and 15; twelve of them into 0..11.
#define I1(op, r, d) op " %%" r "14, %%" r "15, %%" r #d "\n"
// clang-format reflows this macro differently on every pass.
// clang-format off
#define X12(op, r)                                                                \
  I1(op, r, 0) I1(op, r, 1) I1(op, r, 2) I1(op, r, 3) I1(op, r, 4) I1(op, r, 5)    \
  I1(op, r, 6) I1(op, r, 7) I1(op, r, 8) I1(op, r, 9) I1(op, r, 10) I1(op, r, 11)
// clang-format on

#define CLOBBER                                                                             \
  "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
      "xmm10", "xmm11", "xmm12", "xmm13"

#define PEAK(name, body)         \
  static double name(void) {     \
    long n = LOOPS;              \
    double t = Now();            \
    __asm__ volatile("1:\n" body \
                     "dec %0\n"  \
                     "jnz 1b\n"  \
                     : "+r"(n)   \
                     :           \
                     : CLOBBER); \
    return LOOPS / (Now() - t);  \
  }

// fp32 FMA: 8 products per instruction.
PEAK(FmaYmm, X12("vfmadd231ps", "ymm"))
// int16 pairs multiplied and added into int32: 16 products, exact for int8 values.
PEAK(MaddwdYmm, X12("vpmaddwd", "ymm"))
// u8 x s8 pairs into saturating int16: 32 products.
PEAK(MaddubswYmm, X12("vpmaddubsw", "ymm"))
// rec's AVX2 int8 step: vpmaddwd into a temporary, vpaddd into an int32 accumulator.
PEAK(MaddwdAddYmm,
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm0, %%ymm0\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm1, %%ymm1\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm2, %%ymm2\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm3, %%ymm3\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm4, %%ymm4\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm5, %%ymm5\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm6, %%ymm6\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm7, %%ymm7\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm8, %%ymm8\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm9, %%ymm9\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n vpaddd %%ymm12, %%ymm10, %%ymm10\n"
     "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n vpaddd %%ymm13, %%ymm11, %%ymm11\n")
__attribute__((target("avx512f"))) PEAK(FmaZmm, X12("vfmadd231ps", "zmm"))
    // u8 x s8 quadruples added into int32 accumulators: 64 exact products.
    __attribute__((target("avx512f,avx512vnni"))) PEAK(DpbusdZmm, X12("vpdpbusd", "zmm"))
// AMX-INT8: tdpbssd adds a 16x64 by 64x16 s8 product into a 16x16 int32 tile, 16,384 exact
// products per instruction. Four accumulator tiles (0-3) fed by two A tiles (4, 5) and two B
// tiles (6, 7), the 2x2 blocking an AMX GEMM's inner loop uses. Linux hands out the tile state
// only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), and refuses it on a CPU or
// kernel without AMX: then 0, "not on this CPU".
#define AMX_LOOPS 2000000L
        static double TdpbssdPeak(void) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 0;
  struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } __attribute__((packed)) config;
  memset(&config, 0, sizeof config);
  config.palette = 1;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  static int8_t data[16 * 64];
  long n = AMX_LOOPS;
  __asm__ volatile(
      "ldtilecfg (%1)\n"
      "tileloadd (%2,%3,1), %%tmm4\n tileloadd (%2,%3,1), %%tmm5\n"
      "tileloadd (%2,%3,1), %%tmm6\n tileloadd (%2,%3,1), %%tmm7\n"
      "tilezero %%tmm0\n tilezero %%tmm1\n tilezero %%tmm2\n tilezero %%tmm3\n"
      :
      : "r"(n), "r"(&config), "r"(data), "r"(64L)
      : "memory");
  double t = Now();
  __asm__ volatile(
      "1:\n"
      "tdpbssd %%tmm6, %%tmm4, %%tmm0\n tdpbssd %%tmm7, %%tmm4, %%tmm1\n"
      "tdpbssd %%tmm6, %%tmm5, %%tmm2\n tdpbssd %%tmm7, %%tmm5, %%tmm3\n"
      "dec %0\n jnz 1b\n"
      : "+r"(n)
      :
      : "memory");
  double seconds = Now() - t;
  __asm__ volatile("tilerelease" ::: "memory");
  return AMX_LOOPS * 4 * 16384.0 / seconds;
}

int main(void) {
  __builtin_cpu_init();
  const int rounds = 3;
  double fma = 0, madd = 0, maddub = 0, madd_add = 0, fma512 = 0, vnni = 0, amx = 0;
  for (int r = 0; r < rounds; ++r) {  // the best of three: this VM's speed swings
    double v;
    if ((v = FmaYmm() * 12 * 8) > fma) fma = v;
    if ((v = MaddwdYmm() * 12 * 16) > madd) madd = v;
    if ((v = MaddubswYmm() * 12 * 32) > maddub) maddub = v;
    if ((v = MaddwdAddYmm() * 12 * 16) > madd_add) madd_add = v;
    if (__builtin_cpu_supports("avx512f") && (v = FmaZmm() * 12 * 16) > fma512) fma512 = v;
    if (__builtin_cpu_supports("avx512vnni") && (v = DpbusdZmm() * 12 * 64) > vnni) vnni = v;
    if ((v = TdpbssdPeak()) > amx) amx = v;
  }
  printf(
      "{\"vfmadd231ps_ymm\": %.4g, \"vpmaddwd_ymm\": %.4g, \"vpmaddubsw_ymm\": %.4g, "
      "\"vpmaddwd_vpaddd_ymm\": %.4g, \"vfmadd231ps_zmm\": %.4g, \"vpdpbusd_zmm\": %.4g, "
      "\"tdpbssd_amx\": %.4g}\n",
      fma, madd, maddub, madd_add, fma512, vnni, amx);
  return 0;
}
