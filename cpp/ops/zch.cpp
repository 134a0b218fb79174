// rec::zch_lookup: a ZCH table's id map lookup (rec/zch.py's `lookup`), one fused loop;
// rec::zch_remap, every ZCH feature of a served request in one call (rec/export/id_maps.py);
// rec::zch_remap_counted, the same counting each feature's unknown ids for the server, which
// takes the counts with rec::zch_take_unknowns (or rec_zch_take_unknowns, its C form).
//
// rows[i] = the slot s of ids[i]'s window that holds it (used[s] and keys[s] == ids[i]), or
// `slots` (the table's default row) when none does. The window is `probes` slots from
// home(id, slots) on, wrapping at `slots`; home is rec/zch.py's integer hash, version 2, in the
// same int64 operations (none overflows: see rec/zch.py). The unfused ops cost ~16 int64
// tensors per id; this reads the window's keys in place, ~`probes` compares per id.
// tests/export/test_id_maps.py holds it equal to rec.zch.lookup on int64's extremes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "../src/contract/zch_home.h"

namespace rec_ops {
namespace {

// rec.zch.home (cpp/src/contract/zch_home.h, shared with rec-server's update path).
inline int64_t Home(int64_t id, int64_t slots) { return rec::ZchHome(id, slots); }

// The first slot of [start, start + count) holding x, or -1. Keys first: a key equal to x is
// rare, so the branch is well predicted; testing `held` first (a coin toss on a half-full map)
// cost 3x.
int64_t ScanScalar(const int64_t* key, const uint8_t* held, int64_t start, int64_t count,
                   int64_t x) {
  for (int64_t s = start; s < start + count; ++s) {
    if (key[s] == x && held[s]) return s;
  }
  return -1;
}

// The same, 8 keys to a compare (16 probes: 2); masked loads read nothing past the window.
__attribute__((target("avx512f"))) int64_t ScanAvx512(const int64_t* key, const uint8_t* held,
                                                      int64_t start, int64_t count, int64_t x) {
  const __m512i want = _mm512_set1_epi64(x);
  for (int64_t s = start; s < start + count; s += 8) {
    const int64_t n = std::min<int64_t>(8, start + count - s);
    const auto lanes = static_cast<__mmask8>((1u << n) - 1);
    auto hit = static_cast<unsigned>(
        _mm512_mask_cmpeq_epi64_mask(lanes, _mm512_maskz_loadu_epi64(lanes, key + s), want));
    for (; hit != 0; hit &= hit - 1) {  // lowest lane first: probe order
      const int64_t slot = s + __builtin_ctz(hit);
      if (held[slot]) return slot;
    }
  }
  return -1;
}

using Scan = int64_t (*)(const int64_t*, const uint8_t*, int64_t, int64_t, int64_t);

Scan ChosenScan() {
  static const Scan scan = [] {
    __builtin_cpu_init();
    // REC_MAX_CPU_ISA (as for rec::linear): avx2 or scalar holds the scan to the scalar loop,
    // which tests/export/test_id_maps.py checks against the AVX-512 one.
    const char* cap = std::getenv("REC_MAX_CPU_ISA");
    const bool avx512_ok =
        cap == nullptr || std::strcmp(cap, "") == 0 || std::strcmp(cap, "avx512") == 0;
    return avx512_ok && __builtin_cpu_supports("avx512f") ? &ScanAvx512 : &ScanScalar;
  }();
  return scan;
}

// rows[i] for ids[0, n): the slot of ids[i]'s window holding it, or `slots`. Returns how many
// read `slots` (the unknown ids).
int64_t LookupInto(const int64_t* id, int64_t n, const int64_t* key, const uint8_t* held,
                   int64_t slots, int64_t probes, int64_t* row) {
  const Scan scan = ChosenScan();
  std::atomic<int64_t> unknown{0};
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    int64_t missed = 0;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t x = id[i];
      const int64_t home = Home(x, slots);
      // The window wraps at most once.
      const int64_t first = std::min(probes, slots - home);
      int64_t found = scan(key, held, home, first, x);
      if (found < 0) found = scan(key, held, 0, probes - first, x);
      missed += found < 0;
      row[i] = found < 0 ? slots : found;
    }
    unknown.fetch_add(missed, std::memory_order_relaxed);
  });
  return unknown.load(std::memory_order_relaxed);
}

// The unknown ids of this thread's remaps since the last take, per request column (a feature
// of features.sparse); -1 for a column no map read. Per thread, because a server runs a forward
// on the thread that asks for its counts afterwards (the op runs on its caller's thread; only
// its inner loop may fan out), and two threads' forwards must not mix.
thread_local std::vector<int64_t> t_unknown;

void CountUnknown(int64_t column, int64_t n) {
  if (static_cast<int64_t>(t_unknown.size()) <= column) t_unknown.resize(column + 1, -1);
  t_unknown[column] = std::max<int64_t>(t_unknown[column], 0) + n;
}

// A map's keys and used, checked, contiguous.
struct Map {
  at::Tensor keys, used;
  int64_t slots, probes;
};

Map CheckedMap(const at::Tensor& keys, const at::Tensor& used, int64_t probes) {
  TORCH_CHECK(keys.scalar_type() == at::kLong, "rec::zch: keys must be int64");
  TORCH_CHECK(used.scalar_type() == at::kBool || used.scalar_type() == at::kByte,
              "rec::zch: used must be bool (or its bytes, uint8)");
  TORCH_CHECK(keys.dim() == 1 && used.dim() == 1 && keys.numel() == used.numel(),
              "rec::zch: keys and used must be [slots] each");
  const int64_t slots = keys.numel();
  TORCH_CHECK(slots >= 1 && probes >= 1 && probes <= slots,
              "rec::zch: needs 1 <= probes <= slots, got probes ", probes, " and slots ", slots);
  return {keys.contiguous(), used.contiguous(), slots, probes};
}

int64_t LookupInto(const int64_t* id, int64_t n, const Map& m, int64_t* row) {
  return LookupInto(id, n, m.keys.data_ptr<int64_t>(),
                    static_cast<const uint8_t*>(m.used.data_ptr()), m.slots, m.probes, row);
}

at::Tensor ZchLookup(const at::Tensor& ids, const at::Tensor& keys, const at::Tensor& used,
                     int64_t probes) {
  TORCH_CHECK(ids.scalar_type() == at::kLong, "rec::zch_lookup: ids must be int64");
  const Map m = CheckedMap(keys, used, probes);
  const at::Tensor in = ids.contiguous();
  at::Tensor rows = at::empty_like(in);
  LookupInto(in.data_ptr<int64_t>(), in.numel(), m, rows.data_ptr<int64_t>());
  return rows;
}

// rec::zch_remap: the served model's whole remap in one call. `indices` are a request's rows by
// modulo, feature-major: TBE feature k's ids at [offsets[k * B], offsets[(k + 1) * B]), B the
// batch (offsets: [features * B + 1]). table_of[k] is the map (index into keys, used, probes)
// feature k reads, or -1 for a modulo feature. Returns a copy of `indices` with every ZCH
// feature's ids looked up in its map. Raw pointers per feature: ATen ops per feature (narrow,
// copy, an allocation) cost more than the lookups at B = 1.
// `columns` (zch_remap_counted): feature k's request column, under which its unknown ids are
// counted (CountUnknown); empty: not counted (zch_remap, what artifacts exported before the
// counts call).
at::Tensor RemapCounting(const at::Tensor& ids, const at::Tensor& indices,
                         const at::Tensor& offsets, at::TensorList keys, at::TensorList used,
                         at::IntArrayRef probes, at::IntArrayRef table_of,
                         at::IntArrayRef columns) {
  TORCH_CHECK(keys.size() == used.size() && keys.size() == probes.size(),
              "rec::zch_remap: one keys, used and probes per map");
  const auto features = static_cast<int64_t>(table_of.size());
  TORCH_CHECK(columns.empty() || static_cast<int64_t>(columns.size()) == features,
              "rec::zch_remap_counted: one column per feature");
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && features > 0 &&
                  (offsets.numel() - 1) % features == 0,
              "rec::zch_remap: offsets must be int64 [features * batch + 1]");
  TORCH_CHECK(ids.scalar_type() == at::kLong && indices.scalar_type() == at::kLong &&
                  ids.numel() == indices.numel(),
              "rec::zch_remap: one int64 index per int64 id");
  // The batch from the offsets, not an argument: under torch.export it is symbolic.
  const int64_t batch = (offsets.numel() - 1) / features;
  std::vector<Map> maps;
  for (size_t t = 0; t < keys.size(); ++t) maps.push_back(CheckedMap(keys[t], used[t], probes[t]));
  at::Tensor out = indices.clone(at::MemoryFormat::Contiguous);
  const at::Tensor in = ids.contiguous(), off = offsets.contiguous();
  const int64_t* bounds = off.data_ptr<int64_t>();
  const int64_t n = in.numel();
  for (int64_t k = 0; k < features; ++k) {
    const int64_t t = table_of[k];
    if (t < 0) continue;
    TORCH_CHECK(t < static_cast<int64_t>(maps.size()), "rec::zch_remap: no map ", t);
    const int64_t start = bounds[k * batch], stop = bounds[(k + 1) * batch];
    TORCH_CHECK(0 <= start && start <= stop && stop <= n, "rec::zch_remap: offsets out of range");
    const int64_t unknown = LookupInto(in.data_ptr<int64_t>() + start, stop - start, maps[t],
                                       out.data_ptr<int64_t>() + start);
    if (!columns.empty()) {
      TORCH_CHECK(columns[k] >= 0, "rec::zch_remap_counted: negative column");
      CountUnknown(columns[k], unknown);
    }
  }
  return out;
}

at::Tensor ZchRemap(const at::Tensor& ids, const at::Tensor& indices, const at::Tensor& offsets,
                    at::TensorList keys, at::TensorList used, at::IntArrayRef probes,
                    at::IntArrayRef table_of) {
  return RemapCounting(ids, indices, offsets, keys, used, probes, table_of, {});
}

at::Tensor ZchRemapCounted(const at::Tensor& ids, const at::Tensor& indices,
                           const at::Tensor& offsets, at::TensorList keys, at::TensorList used,
                           at::IntArrayRef probes, at::IntArrayRef table_of,
                           at::IntArrayRef columns) {
  return RemapCounting(ids, indices, offsets, keys, used, probes, table_of, columns);
}

// This thread's counts since the last take (int64 [columns], -1: no map read the column), reset.
at::Tensor ZchTakeUnknowns() {
  std::vector<int64_t> counts;
  counts.swap(t_unknown);
  return at::tensor(counts, at::kLong);
}

at::Tensor ZchRemapMeta(const at::Tensor& ids, const at::Tensor& indices, const at::Tensor& offsets,
                        at::TensorList keys, at::TensorList used, at::IntArrayRef probes,
                        at::IntArrayRef table_of) {
  return at::empty_symint(indices.sym_sizes(), indices.options());
}

at::Tensor ZchRemapCountedMeta(const at::Tensor& ids, const at::Tensor& indices,
                               const at::Tensor& offsets, at::TensorList keys, at::TensorList used,
                               at::IntArrayRef probes, at::IntArrayRef table_of,
                               at::IntArrayRef columns) {
  return at::empty_symint(indices.sym_sizes(), indices.options());
}

at::Tensor ZchLookupMeta(const at::Tensor& ids, const at::Tensor& keys, const at::Tensor& used,
                         int64_t probes) {
  // Symbolic sizes: under torch.export the id count is dynamic.
  return at::empty_symint(ids.sym_sizes(), ids.options().dtype(at::kLong));
}

}  // namespace
}  // namespace rec_ops

// rec::zch_take_unknowns for a C++ server without the dispatcher's boxing: copies up to
// `capacity` of this thread's counts (-1: no map read the column) into `out`, resets them, and
// returns how many columns there were. rec-server finds it with dlsym (model/zch_unknowns.cpp).
extern "C" __attribute__((visibility("default"))) int64_t rec_zch_take_unknowns(int64_t* out,
                                                                                int64_t capacity) {
  const auto n = static_cast<int64_t>(rec_ops::t_unknown.size());
  std::copy_n(rec_ops::t_unknown.begin(), std::min(n, capacity), out);
  rec_ops::t_unknown.clear();
  return n;
}

TORCH_LIBRARY_FRAGMENT(rec, m) {
  m.def("zch_lookup(Tensor ids, Tensor keys, Tensor used, int probes) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def(
      "zch_remap(Tensor ids, Tensor indices, Tensor offsets, Tensor[] keys, Tensor[] used, "
      "int[] probes, int[] table_of) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // A new op, not an argument more to zch_remap: artifacts exported before it call zch_remap by
  // its schema (AOTInductor's calls are compiled in), so that one stays as it was.
  m.def(
      "zch_remap_counted(Tensor ids, Tensor indices, Tensor offsets, Tensor[] keys, "
      "Tensor[] used, int[] probes, int[] table_of, int[] columns) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def("zch_take_unknowns() -> Tensor", &rec_ops::ZchTakeUnknowns);
}

TORCH_LIBRARY_IMPL(rec, CPU, m) {
  m.impl("zch_lookup", &rec_ops::ZchLookup);
  m.impl("zch_remap", &rec_ops::ZchRemap);
  m.impl("zch_remap_counted", &rec_ops::ZchRemapCounted);
}
TORCH_LIBRARY_IMPL(rec, Meta, m) {
  m.impl("zch_lookup", &rec_ops::ZchLookupMeta);
  m.impl("zch_remap", &rec_ops::ZchRemapMeta);
  m.impl("zch_remap_counted", &rec_ops::ZchRemapCountedMeta);
}
