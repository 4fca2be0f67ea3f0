// Attention over bf16 KV streams as mergeable online-softmax states.
//
// Version log (2-core AMD EPYC Zen5 host, AVX3 target):
//   v1  AttendStream reads rows in tiles of 32: the tile's keys (and values, unless they are the
//       same rows, as in MLA) are converted once to f32 scratch padded to the vector width; scores
//       for all G heads come from a 4-head x 4-row register tile (16 accumulators); the running max
//       per head is updated once per tile and o rescaled only when it grows; exp via Highway's
//       contrib Exp; exp-weighted V is accumulated by a 4-head x 4-vector register tile. The
//       tile's state is merged into the caller's with the same MergeStates arithmetic.
//       Measured (1 thread, loaded shared 2-core host): MLA G=16 dk=576 dv=512 n=32768:
//       1.6-2.6 Mrows/s = 1.8-3.0 GB/s, 0.11-0.18 of read bandwidth, 55-90 GFLOP/s: compute-bound
//       (34.8 kFLOP per 1152-byte row; matching bandwidth would need ~700 GFLOP/s per core).
//       G=128: 110-185 GFLOP/s. GQA G=4 dk=dv=128: ~20 Mrows/s = 10.3 GB/s, 0.5-0.67 of bandwidth
//       (16 horizontal sums per 4x4 score tile weigh more at dk=128: the next thing to fix).
//   v2  Micro-tiles shared with the packed Geodesia kernel (kernels/attention_tile-inl.h): the 16
//       score accumulators reduced by one transpose-and-add tree (45 ops for 16 sums), 4/3/2/1-head
//       groups, 64-row tiles; rows converted bf16 -> f32 in registers when one head group reads
//       them (staged into f32 scratch for G > 4 or ragged widths); software prefetch of the rows
//       two tiles ahead (and of the caller's next stream) spread over the score micro-tiles;
//       the full policy reads runs of 16 pages per call. GQA 16k tokens, 32 q / 8 KV heads,
//       D = 128, per decode step: 1 thread 4.08 -> 3.4-3.7 ms, 2 threads 4.37 -> 1.77-2.2 ms
//       (~30-36 GB/s, memory-bound). D = 64, G = 3 (a 125M llama): compute-bound at ~17 cycles
//       per (token, head): 1.0 ms per 16k-token layer on one thread.
//   v3  Not compute: bookkeeping. The prefetch queue took two ranges per row (key, value), which
//       never coalesced, overflowed the queue every tile (burst issue) and cost a quarter of the
//       kernel's time; it now takes one key range and one value range per page run. Row
//       pointers are filled per page run from the run's first row (the row-by-row fill chained
//       each pointer through the one just stored). 16k tokens, 1 thread: D = 64, G = 3 5.0 ->
//       2.52-2.54 ns per (token, head); D = 128, G = 4 6.1 -> 4.4-4.6 ns (28 GB/s); 2 threads,
//       32 q / 8 KV heads: 1.7-1.9 -> 1.4-1.8 ms.
//   v4  --attn-math bf16 (issue 21 parts 1-2; kernels/attn_math.h): the scaled query is rounded to
//       bf16 once per call; with AVX512_BF16 (cpuid) scores come from vdpbf16ps micro-tiles on the
//       rows as stored (4 heads x 4 rows, 32 values per step, masked tail, the same reduction
//       tree) and the value side from vdpbf16ps on row pairs interleaved in registers
//       (probabilities rounded to bf16, f32 accumulators in a permuted column order restored at
//       the merge): nothing is staged to f32. Elsewhere (or SetNativeBf16ForTest(false)) the
//       portable form runs the f32 tiles on the rounded query. Error bound and its test:
//       kernels/attention_test.cc (Bf16MathWithinStatedBoundNativeAndPortable).
//       Measured (1 thread, thread CPU time, best of 7, shared host under load ~18 on 2 cores;
//       /tmp driver calling AttendStream): MLA G=16 dk=576 dv=512, 8192 rows: f32 22.7-28.9 ns
//       per (token, head), native bf16 34.8-40.1, portable bf16 22.1-29.6; 512 rows
//       (cache-resident): f32 21.7, native 33.8; GQA G=4 D=128, 16384 rows: f32 8.7-10.2, native
//       12.8-13.6. Cache-resident, each native half runs at ~0.82 ns per vdpbf16ps, while the f32
//       kernel's 68 FMAs per (token, head) take ~0.32 ns each: on this Zen5 core vdpbf16ps zmm
//       retires about a third as fast as an FMA, so two products per lane lose. (A first version
//       kept the 16 score accumulators in a helper's pointer argument and GCC stored all of them
//       to the stack every step; fixed, no change in speed: the instruction rate is the limit.)
//       Intel Xeon (Emerald Rapids, session 18; a standalone loop of 8 / 16 independent zmm
//       accumulators, the other core busy): vdpbf16ps 1.10-1.32 ns per instruction, FMA
//       0.24-0.30 ns, vpdpbusd 0.43-0.47 ns; so vdpbf16ps loses there too (2.3x slower per
//       product), while vpdpbusd gives 2x the FMA's products per ns (part 3's int8 path unmeasured
//       there).
//       Hence auto is the f32 path for bf16 rows (Bf16RowsMath); bf16 stays selectable and
//       tested (the model-level contract holds for it: model/attn_math_model_test.cc).
//   v5  (session 20; AMD EPYC family 0x1A model 0x02, Zen 5, 2 cores, a shared VM with ~30 %
//       steal) The same loop of 12 independent zmm accumulators: vfmadd231ps 7.55-7.63 G
//       instructions/s, vdpbf16ps 7.00-7.04, vpdpbusd 7.57-7.61, i.e. vdpbf16ps at ~0.93 of the
//       FMA's instruction rate and 1.85x its products (unlike v4's hosts). Here the native bf16
//       kernel wins: bench attention --kind mla --policy full,vestige --threads 1, 32768 rows:
//       f32 7.42 ms, bf16 5.17 (1.44x; vestige 1.10x of full f32 vs 0.82x); 2 threads 4.21 vs
//       2.73 (1.54x). GQA full (memory-bound) 0.97x. So auto now takes bf16 for MLA latent rows
//       where DotFeatures::bf16_dot_full_rate (AMD family >= 0x1A), f32 everywhere else
//       (Bf16RowsMath(m, latent_rows)); GQA rows stay f32 under auto on every CPU (the
//       model-level contract fails for bf16 on the synthetic llama / qwen2).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "hwy/cache_control.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
// foreach_target must come first, math-inl after highway.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/attention_tile-inl.h"
// clang-format on

#ifndef STRATA_KERNELS_ATTENTION_MERGE_ONCE_  // this file is re-included once per SIMD target
#define STRATA_KERNELS_ATTENTION_MERGE_ONCE_
namespace strata {
namespace attention_internal {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Merges the state (sm, sd, so[dv]) into (*dm, *dd, dO[dv]). Empty sides (m = -inf) contribute
// nothing; an empty destination takes the source verbatim (so a fresh read is reproduced exactly).
inline void MergeOne(float* dm, float* dd, float* d_o, float sm, float sd, const float* so,
                     int dv) {
  if (sm == kNegInf) return;
  if (*dm == kNegInf) {
    *dm = sm;
    *dd = sd;
    std::memcpy(d_o, so, sizeof(float) * dv);
    return;
  }
  const float m = std::max(*dm, sm);
  const float a = std::exp(*dm - m);
  const float b = std::exp(sm - m);
  *dd = *dd * a + sd * b;
  for (int j = 0; j < dv; ++j) d_o[j] = d_o[j] * a + so[j] * b;
  *dm = m;
}

// bf16 dot-product scores with vdpbf16ps (defined once below, compiled for AVX512_BF16, called
// only when the CPU has it): s[h * ss + r] = sum_{c < dk} qb[h * qbs + c] * krow[r][c] for h < G
// and rows r of [0, n_rows) in micro-tiles of 16 / H rows (heads in groups of 4, then 3, 2 or 1),
// so up to 15 rows past n_rows are evaluated and written: krow and s must have them. qb rows are
// bf16, zero-padded to qbs (a multiple of 32 >= dk); key rows are read for dk values only.
// Each lane sums pairs of exact bf16 x bf16 products in f32 (denormal inputs read as zero).
void ScoreBf16Native(const uint16_t* qb, int64_t qbs, int G, int dk, const uint16_t* const* krow,
                     int n_rows, float* s, int64_t ss);
// The value side with vdpbf16ps: o[h * os + .] += sum_{t < n_rows} bf16(p[h * ps + t]) vrow[t][.]
// over dv columns, for h < G. Rows are taken in pairs (t, t + 1) whose values are interleaved
// in registers; p[h * ps + n_rows] must be 0 and vrow[n_rows] readable when n_rows is odd. o is
// kept in the permuted order of those interleaves, 32 columns per chunk (o rows dv32 = dv rounded
// up to 32 wide): UnpermuteBf16Values restores column order.
void AccumBf16Native(const float* p, int64_t ps, int G, int dv, const uint16_t* const* vrow,
                     int n_rows, float* o, int64_t os);
// dst[j] = o[position of column j], j < dv (the layout AccumBf16Native accumulates in).
inline void UnpermuteBf16Values(const float* o, int dv, float* dst) {
  for (int j = 0; j < dv; ++j) {
    const int c = j / 32 * 32, i = j % 32;  // chunk, column in chunk
    // Within a 128-bit block k of a 32-column chunk: columns 8k..8k+3 in the low half's lanes
    // 4k..4k+3, columns 8k+4..8k+7 in the high half's lanes 4k..4k+3.
    const int k = i / 8, w = i % 8;
    dst[j] = o[c + (w < 4 ? 0 : 16) + 4 * k + (w % 4)];
  }
}

}  // namespace attention_internal
}  // namespace strata
#endif  // STRATA_KERNELS_ATTENTION_MERGE_ONCE_

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int kTileRows = 64;                       // KV rows per tile
constexpr int kRowsPad = kTileRows + tile::kRowSlack;  // score rows and row pointers per tile

struct Scratch {
  AlignedBuffer<float> q;   // [G, dkp] scaled query heads, zero-padded
  AlignedBuffer<uint16_t> qb;  // [G, dkb] the same rounded to bf16 (native bf16 path), dkb % 32 == 0
  AlignedBuffer<float> kt;  // [kTileRows, dkp] tile keys as f32 (when converted up front)
  AlignedBuffer<float> vt;  // [kTileRows, dvp] tile values as f32 (idem, unless shared)
  AlignedBuffer<float> s;   // [G, kRowsPad] scores, then probabilities
  AlignedBuffer<float> o;   // [G, dvp] local unnormalised outputs
  std::vector<float> m, d;  // [G]
};

using tile::Bf16RowToF32;
using tile::Grow;

// End of the run of rows starting at u (before `end`) that lie in one page: `end` itself for a
// stream that is not paged.
HWY_INLINE int64_t PageRunEnd(const KvStreamView& kv, int64_t u, int64_t end) {
  if (kv.key_pages == nullptr) return end;
  const int64_t page = int64_t{1} << kv.page_shift;
  return std::min(end, (u / page + 1) * page);
}

// Queues rows [r0, r0 + n) of a stream (keys; values unless shared with keys). Consecutive rows
// (no row list, no row pointers) are queued as one key range and one value range per page run;
// otherwise row by row, all keys first, then all values, so that adjacent rows coalesce.
HWY_INLINE void QueueRows(const KvStreamView& kv, const int64_t* rows, int64_t r0, int64_t n,
                          tile::PrefetchQueue* pf) {
  const bool shared = kv.values_in_keys();
  const int64_t vb = kv.value_bytes();  // strides count 2-byte units, rows vb-byte values
  if (rows == nullptr && kv.key_ptrs == nullptr) {
    for (int64_t a = r0, b; a < r0 + n; a = b) {
      b = PageRunEnd(kv, a, r0 + n);
      pf->Add(kv.key_row(a), (b - a - 1) * kv.k_stride * 2 + kv.dk * vb);
      if (!shared) pf->Add(kv.val_row(a), (b - a - 1) * kv.v_stride * 2 + kv.dv * vb);
    }
    return;
  }
  for (int64_t i = r0; i < r0 + n; ++i) pf->Add(kv.key_row(rows ? rows[i] : i), kv.dk * vb);
  if (shared) return;
  for (int64_t i = r0; i < r0 + n; ++i) pf->Add(kv.val_row(rows ? rows[i] : i), kv.dv * vb);
}

// Row src (n values of the stream's type) as f32 in dst[0..n), zero-padded to dp.
HWY_INLINE void RowToF32(DType t, const uint16_t* HWY_RESTRICT src, int64_t n, int64_t dp,
                         float* HWY_RESTRICT dst) {
  if (t == DType::kBF16) {
    Bf16RowToF32(src, n, dp, dst);
    return;
  }
  if (t == DType::kF16) {
    tile::F16ToF32Row(src, n, dst);
  } else {
    std::memcpy(dst, src, sizeof(float) * n);
  }
  for (int64_t c = n; c < dp; ++c) dst[c] = 0.f;
}

void AttendStreamImpl(const float* q, int n_heads, float scale, const KvStreamView& kv,
                      const int64_t* rows, int64_t n, SoftmaxStates* st, const KvStreamView* next,
                      int64_t next_n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int G = n_heads;
  const int64_t dk = kv.dk, dv = kv.dv;
  const int64_t dkp = (dk + N - 1) / N * N;
  const int64_t dvp = (dv + N - 1) / N * N;
  // MLA: values are the first dv entries of the key rows.
  const bool shared = kv.values_in_keys();
  // --attn-math bf16 (or int8) over bf16 rows: the scaled query is rounded to bf16 once and
  // scores are sums of exact bf16 products in f32; with vdpbf16ps (native) straight from the
  // rows, otherwise (portable) by the f32 score tiles below on the rounded query.
  const bool bf16 = Bf16RowsMath(kv.math, shared) == AttnMath::kBF16 && kv.dtype == DType::kBF16;
  const bool native = bf16 && attn_math_internal::NativeBf16Dot();
  // Rows are converted to f32 scratch once per tile when several 4-head groups read them, or
  // when a row's width is not a whole number of vectors; otherwise in registers as they are used.
  // (f16 and f32 rows are always staged: the in-register path decodes bf16 only.) The native
  // bf16 path reads keys and values as they are (vdpbf16ps on the rows): nothing is staged.
  const bool staged = G > 4 || dkp != dk || dvp != dv || kv.dtype != DType::kBF16;
  const bool stage_keys = staged && !native;
  const bool stage_vals = staged && !native;     // native: values are read as bf16 too
  const bool vals_in_kt = shared && stage_keys;  // values read from the converted key rows
  const int64_t dkb = (dk + 31) / 32 * 32;
  // o's row width: native values accumulate in AccumBf16Native's permuted 32-column chunks.
  const int64_t os = native ? (dv + 31) / 32 * 32 : dvp;

  thread_local Scratch sc;
  Grow(&sc.q, G * dkp);
  Grow(&sc.s, G * kRowsPad);
  Grow(&sc.o, G * os);
  if (stage_keys) Grow(&sc.kt, kRowsPad * dkp);
  if (stage_vals && !vals_in_kt) Grow(&sc.vt, kTileRows * dvp);
  if (native) Grow(&sc.qb, G * dkb);
  sc.m.assign(G, attention_internal::kNegInf);
  sc.d.assign(G, 0.f);
  std::fill(sc.o.data(), sc.o.data() + G * os, 0.f);
  for (int g = 0; g < G; ++g) {
    float* dst = sc.q.data() + g * dkp;
    for (int64_t c = 0; c < dk; ++c) dst[c] = q[g * dk + c] * scale;
    std::fill(dst + dk, dst + dkp, 0.f);
    if (!bf16) continue;
    for (int64_t c = 0; c < dk; ++c) dst[c] = Bf16ToF32(F32ToBf16(dst[c]));
    if (!native) continue;
    uint16_t* qb = sc.qb.data() + g * dkb;
    for (int64_t c = 0; c < dk; ++c) qb[c] = F32ToBf16(dst[c]);
    std::fill(qb + dk, qb + dkb, uint16_t{0});
  }
  float* kt = sc.kt.data();
  const float* vt = vals_in_kt ? kt : sc.vt.data();
  const int64_t vts = vals_in_kt ? dkp : dvp;
  const uint16_t* krow[kRowsPad];
  const uint16_t* vrow[kRowsPad];
  thread_local tile::PrefetchQueue pf;

  for (int64_t t0 = 0; t0 < n; t0 += kTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kTileRows, n - t0));
    // Rows past nr (score tiles overrun by up to kRowSlack - 1 rows) repeat the last row; masked.
    if (rows == nullptr && kv.key_ptrs == nullptr) {
      // Consecutive rows: one stride apart, except across a page boundary.
      // (Each run's pointers from its first row: no chain through the arrays just written.)
      for (int i = 0; i < nr;) {
        const int64_t u = t0 + i;
        const int run = static_cast<int>(PageRunEnd(kv, u, t0 + nr) - u);
        const uint16_t* kb = kv.key_row(u);
        const uint16_t* vb = kv.val_row(u);
        for (int j = 0; j < run; ++j) {
          krow[i + j] = kb + j * kv.k_stride;
          vrow[i + j] = vb + j * kv.v_stride;
        }
        i += run;
      }
    } else {
      for (int i = 0; i < nr; ++i) {
        const int64_t u = rows ? rows[t0 + i] : t0 + i;
        krow[i] = kv.key_row(u);
        vrow[i] = kv.val_row(u);
      }
    }
    for (int i = nr; i < kRowsPad; ++i) krow[i] = krow[nr - 1], vrow[i] = vrow[nr - 1];
    // The cache lines of the next tile's rows (or of the caller's next stream) are requested
    // while this tile's scores are computed; the first tile's, up front.
    // Rows [a, b) of this stream followed by the caller's next one.
    auto queue_span = [&](int64_t a, int64_t b) {
      if (a < n) QueueRows(kv, rows, a, std::min(b, n) - a, &pf);
      if (next != nullptr && b > n) {
        const int64_t na = std::max<int64_t>(a - n, 0), nb = std::min<int64_t>(b - n, next_n);
        if (nb > na) QueueRows(*next, nullptr, na, nb - na, &pf);
      }
    };
    pf.Clear();
    if (t0 == 0) {
      queue_span(0, nr);
      pf.Drain();
      pf.Clear();
      queue_span(kTileRows, 2 * kTileRows);
    }
    queue_span(t0 + 2 * kTileRows, t0 + 3 * kTileRows);
    float* s = sc.s.data();
    if (stage_vals && !vals_in_kt) {
      for (int i = 0; i < nr; ++i) RowToF32(kv.dtype, vrow[i], dv, dvp, sc.vt.data() + i * dvp);
    }
    if (native) {
      // 16-row slices (all heads), the prefetch queue ticked after each.
      constexpr int kSlice = 16;
      pf.Spread((nr + kSlice - 1) / kSlice);
      for (int i0 = 0; i0 < nr; i0 += kSlice) {
        attention_internal::ScoreBf16Native(sc.qb.data(), dkb, G, static_cast<int>(dk), krow + i0,
                                            std::min(kSlice, nr - i0), s + i0, kRowsPad);
        pf.Tick();
      }
    } else if (stage_keys) {
      pf.Spread(tile::ScoreCalls(G, nr));
      const int n_conv = nr + tile::kRowSlack - 1;
      for (int i = 0; i < n_conv; ++i) RowToF32(kv.dtype, krow[i], dk, dkp, kt + i * dkp);
      tile::ScoreTile(sc.q.data(), dkp, G, dkp,
                      [&](int r, int64_t c) { return hn::Load(df, kt + r * dkp + c); }, nr, s,
                      kRowsPad, &pf);
    } else {
      pf.Spread(tile::ScoreCalls(G, nr));
      tile::ScoreTile(sc.q.data(), dkp, G, dkp,
                      [&](int r, int64_t c) { return tile::Bf16Vec(krow[r], c); }, nr, s,
                      kRowsPad, &pf);
    }
    pf.Drain();

    // Online softmax update per head: p = exp(s - m), o rescaled when m grows.
    const VF vfloor = hn::Set(df, -87.f);  // exp(-87) = 1.6e-38: the smallest weight kept
    for (int g = 0; g < G; ++g) {
      float* sg = s + g * kRowsPad;
      for (int i = nr; i < kTileRows; ++i) sg[i] = attention_internal::kNegInf;
      VF vmax = hn::Set(df, attention_internal::kNegInf);
      for (int i = 0; i < kTileRows; i += static_cast<int>(N)) vmax = hn::Max(vmax, hn::Load(df, sg + i));
      const float tmax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float m_old = sc.m[g];
      if (tmax > m_old) {
        if (m_old != attention_internal::kNegInf) {
          const float f = std::exp(m_old - tmax);
          sc.d[g] *= f;
          float* og = sc.o.data() + g * os;
          const VF vf = hn::Set(df, f);
          for (int64_t j = 0; j < os; j += N)
            hn::Store(hn::Mul(hn::Load(df, og + j), vf), df, og + j);
        }
        sc.m[g] = tmax;
      }
      const VF vm = hn::Set(df, sc.m[g]);
      VF sum = hn::Zero(df);
      for (int i = 0; i < kTileRows; i += static_cast<int>(N)) {
        // Weights below exp(-87) (< 2^-125) are 0, not subnormal: subnormal operands cost a
        // microcode assist per instruction on Intel cores (kernels/attention_many.cc, Softmax).
        const VF x = hn::Sub(hn::Load(df, sg + i), vm);
        const VF p = hn::IfThenElseZero(hn::Ge(x, vfloor), hn::Exp(df, hn::Max(x, vfloor)));
        hn::Store(p, df, sg + i);
        sum = hn::Add(sum, p);
      }
      sc.d[g] += hn::GetLane(hn::SumOfLanes(df, sum));
    }

    // o += P V.
    if (native) {
      attention_internal::AccumBf16Native(s, kRowsPad, G, static_cast<int>(dv), vrow, nr,
                                          sc.o.data(), os);
    } else if (stage_vals) {
      tile::AccumTile(s, kRowsPad, G,
                      [&](int t, int64_t c) { return hn::Load(df, vt + t * vts + c); }, nr, 0, dvp,
                      sc.o.data(), dvp);
    } else {
      tile::AccumTile(s, kRowsPad, G, [&](int t, int64_t c) { return tile::Bf16Vec(vrow[t], c); },
                      nr, 0, dvp, sc.o.data(), dvp);
    }
  }

  thread_local std::vector<float> col;  // a native head's o in column order
  for (int g = 0; g < G; ++g) {
    const float* og = sc.o.data() + g * os;
    if (native) {
      col.resize(dv);
      attention_internal::UnpermuteBf16Values(og, static_cast<int>(dv), col.data());
      og = col.data();
    }
    attention_internal::MergeOne(&st->m[g], &st->d[g], st->o + g * dv, sc.m[g], sc.d[g], og,
                                 static_cast<int>(dv));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if defined(__x86_64__)
#include <immintrin.h>
#endif
namespace strata {

namespace attention_internal {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STRATA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define STRATA_BF16_INLINE STRATA_BF16_TARGET __attribute__((always_inline)) inline
namespace {

// Block k of the result: blocks 2k and 2k + 1 of (a, b) added.
STRATA_BF16_INLINE __m512 AddBlocks(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane i of the result = the sum of the lanes of acc[i] (the transpose-and-add tree of
// attention_tile-inl.h's ReduceAcc, in AVX-512 intrinsics).
STRATA_BF16_INLINE __m512 Reduce16(const __m512* acc) {
  __m512 t[8];
  for (int k = 0; k < 8; ++k) {
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * k], acc[2 * k + 1]),
                         _mm512_unpackhi_ps(acc[2 * k], acc[2 * k + 1]));
  }
  __m512 u[4];
  for (int k = 0; k < 4; ++k) {
    const __m512d c = _mm512_castps_pd(t[2 * k]), d = _mm512_castps_pd(t[2 * k + 1]);
    u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
  }
  return AddBlocks(AddBlocks(u[0], u[1]), AddBlocks(u[2], u[3]));
}

// H heads x 16 / H rows starting at row i0, 32 values per step; the last (partial) step's keys
// are masked loads (q is zero-padded). One function with the accumulators local: passed to a
// helper by pointer, GCC stored all 16 to the stack on every step (measured 2x slower).
template <int H>
STRATA_BF16_INLINE void ScoreRowsBf16(const uint16_t* qb, int64_t qbs, int dk,
                                             const uint16_t* const* krow, int i0, float* s,
                                             int64_t ss) {
  constexpr int R = 16 / H;
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const uint16_t* kr[R];
  for (int r = 0; r < R; ++r) kr[r] = krow[i0 + r];
  for (int c = 0; c < dk; c += 32) {
    const __mmask32 mask = c + 32 <= dk ? ~__mmask32{0}
                                        : static_cast<__mmask32>((uint64_t{1} << (dk - c)) - 1);
    if constexpr (H >= 4) {
      __m512i kv[R];
      for (int r = 0; r < R; ++r) kv[r] = _mm512_maskz_loadu_epi16(mask, kr[r] + c);
      for (int h = 0; h < H; ++h) {
        const __m512i qv = _mm512_loadu_si512(qb + h * qbs + c);
        for (int r = 0; r < R; ++r)
          acc[h * R + r] = _mm512_dpbf16_ps(acc[h * R + r], (__m512bh)qv, (__m512bh)kv[r]);
      }
    } else {
      __m512i qv[H];
      for (int h = 0; h < H; ++h) qv[h] = _mm512_loadu_si512(qb + h * qbs + c);
      for (int r = 0; r < R; ++r) {
        const __m512i kv = _mm512_maskz_loadu_epi16(mask, kr[r] + c);
        for (int h = 0; h < H; ++h)
          acc[h * R + r] = _mm512_dpbf16_ps(acc[h * R + r], (__m512bh)qv[h], (__m512bh)kv);
      }
    }
  }
  alignas(64) float red[16];
  _mm512_store_ps(red, Reduce16(acc));
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < R; ++r) s[h * ss + i0 + r] = red[h * R + r];
}

template <int H>
STRATA_BF16_TARGET void ScoreGroupBf16(const uint16_t* qb, int64_t qbs, int dk,
                                       const uint16_t* const* krow, int n_rows, float* s,
                                       int64_t ss) {
  for (int i0 = 0; i0 < n_rows; i0 += 16 / H) ScoreRowsBf16<H>(qb, qbs, dk, krow, i0, s, ss);
}

// H heads x C chunks of 32 columns from column c0: rows in pairs, values interleaved.
template <int H, int C>
STRATA_BF16_INLINE void AccumPairsBf16(const uint32_t* pp, int64_t pps, int dv,
                                              const uint16_t* const* vrow, int n_pairs, int c0,
                                              float* o, int64_t os) {
  __m512 lo[H][C], hi[H][C];
  __mmask32 mask[C];
  for (int j = 0; j < C; ++j) {
    const int left = dv - (c0 + 32 * j);
    mask[j] = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << left) - 1);
    for (int h = 0; h < H; ++h) {
      lo[h][j] = _mm512_loadu_ps(o + h * os + c0 + 32 * j);
      hi[h][j] = _mm512_loadu_ps(o + h * os + c0 + 32 * j + 16);
    }
  }
  for (int t = 0; t < n_pairs; ++t) {
    __m512i vl[C], vh[C];
    for (int j = 0; j < C; ++j) {
      const __m512i a = _mm512_maskz_loadu_epi16(mask[j], vrow[2 * t] + c0 + 32 * j);
      const __m512i b = _mm512_maskz_loadu_epi16(mask[j], vrow[2 * t + 1] + c0 + 32 * j);
      vl[j] = _mm512_unpacklo_epi16(a, b);
      vh[j] = _mm512_unpackhi_epi16(a, b);
    }
    for (int h = 0; h < H; ++h) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(pp[h * pps + t]));
      for (int j = 0; j < C; ++j) {
        lo[h][j] = _mm512_dpbf16_ps(lo[h][j], (__m512bh)vl[j], (__m512bh)w);
        hi[h][j] = _mm512_dpbf16_ps(hi[h][j], (__m512bh)vh[j], (__m512bh)w);
      }
    }
  }
  for (int j = 0; j < C; ++j) {
    for (int h = 0; h < H; ++h) {
      _mm512_storeu_ps(o + h * os + c0 + 32 * j, lo[h][j]);
      _mm512_storeu_ps(o + h * os + c0 + 32 * j + 16, hi[h][j]);
    }
  }
}

template <int H>
STRATA_BF16_TARGET void AccumHeadsBf16(const uint32_t* pp, int64_t pps, int dv,
                                       const uint16_t* const* vrow, int n_pairs, float* o,
                                       int64_t os) {
  constexpr int C = H >= 4 ? 2 : (H == 1 ? 8 : 4);  // 2 H C <= 16 accumulators
  int c0 = 0;
  for (; c0 + 32 * C <= dv; c0 += 32 * C) AccumPairsBf16<H, C>(pp, pps, dv, vrow, n_pairs, c0, o, os);
  for (; c0 < dv; c0 += 32) AccumPairsBf16<H, 1>(pp, pps, dv, vrow, n_pairs, c0, o, os);
}

}  // namespace

STRATA_BF16_TARGET void AccumBf16Native(const float* p, int64_t ps, int G, int dv, const uint16_t* const* vrow,
                     int n_rows, float* o, int64_t os) {
  // Probabilities rounded to bf16 (round to nearest even), consecutive rows packed in pairs:
  // uint32 t of a head's row = [bf16 p_2t | bf16 p_2t+1 << 16].
  const int n_pairs = (n_rows + 1) / 2;
  const int64_t pps = (n_pairs + 15) / 16 * 16;
  thread_local std::vector<uint32_t> buf;
  if (buf.size() < static_cast<size_t>(G * pps)) buf.resize(G * pps);
  uint32_t* pp = buf.data();
  for (int h = 0; h < G; ++h) {
    for (int t = 0; t < 2 * n_pairs; t += 32) {
      const __m512 a = _mm512_loadu_ps(p + h * ps + t);
      const __m512 b = _mm512_loadu_ps(p + h * ps + t + 16);
      _mm512_storeu_si512(pp + h * pps + t / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
  int h0 = 0;
  for (; h0 + 4 <= G; h0 += 4) AccumHeadsBf16<4>(pp + h0 * pps, pps, dv, vrow, n_pairs, o + h0 * os, os);
  switch (G - h0) {
    case 3: AccumHeadsBf16<3>(pp + h0 * pps, pps, dv, vrow, n_pairs, o + h0 * os, os); break;
    case 2: AccumHeadsBf16<2>(pp + h0 * pps, pps, dv, vrow, n_pairs, o + h0 * os, os); break;
    case 1: AccumHeadsBf16<1>(pp + h0 * pps, pps, dv, vrow, n_pairs, o + h0 * os, os); break;
    default: break;
  }
}

void ScoreBf16Native(const uint16_t* qb, int64_t qbs, int G, int dk, const uint16_t* const* krow,
                     int n_rows, float* s, int64_t ss) {
  int h0 = 0;
  for (; h0 + 4 <= G; h0 += 4) ScoreGroupBf16<4>(qb + h0 * qbs, qbs, dk, krow, n_rows, s + h0 * ss, ss);
  switch (G - h0) {
    case 3: ScoreGroupBf16<3>(qb + h0 * qbs, qbs, dk, krow, n_rows, s + h0 * ss, ss); break;
    case 2: ScoreGroupBf16<2>(qb + h0 * qbs, qbs, dk, krow, n_rows, s + h0 * ss, ss); break;
    case 1: ScoreGroupBf16<1>(qb + h0 * qbs, qbs, dk, krow, n_rows, s + h0 * ss, ss); break;
    default: break;
  }
}
#undef STRATA_BF16_TARGET
#undef STRATA_BF16_INLINE
#else
void ScoreBf16Native(const uint16_t*, int64_t, int, int, const uint16_t* const*, int, float*,
                     int64_t) {
  STRATA_CHECK_MSG(false, "vdpbf16ps scores called on a build without x86 AVX-512 support");
}
void AccumBf16Native(const float*, int64_t, int, int, const uint16_t* const*, int, float*,
                     int64_t) {
  STRATA_CHECK_MSG(false, "vdpbf16ps values called on a build without x86 AVX-512 support");
}
#endif

}  // namespace attention_internal

HWY_EXPORT(AttendStreamImpl);

void SoftmaxStates::Reset() {
  for (int h = 0; h < n_heads; ++h) {
    m[h] = attention_internal::kNegInf;
    d[h] = 0.f;
  }
  if (n_heads > 0 && dv > 0) std::memset(o, 0, sizeof(float) * n_heads * dv);
}

SoftmaxStateBuffer::SoftmaxStateBuffer(int n_heads, int dv) {
  STRATA_CHECK(n_heads >= 0 && dv >= 0);
  // m and d each start on their own 64-byte line; o starts 64-byte aligned.
  const size_t hp = (static_cast<size_t>(n_heads) + 15) / 16 * 16;
  const size_t total = 2 * hp + static_cast<size_t>(n_heads) * dv;
  mem_.reset(Alloc(total));
  st_.n_heads = n_heads;
  st_.dv = dv;
  st_.m = mem_.get();
  st_.d = mem_.get() + hp;
  st_.o = mem_.get() + 2 * hp;
  st_.Reset();
}

float* SoftmaxStateBuffer::Alloc(size_t n) {
  const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  STRATA_CHECK(p != nullptr);
  return static_cast<float*>(p);
}

void SoftmaxStateBuffer::Free::operator()(float* p) const { std::free(p); }

SoftmaxStates HeadSlice(const SoftmaxStates& st, int first, int n) {
  SoftmaxStates s;
  s.n_heads = n;
  s.dv = st.dv;
  s.m = st.m + first;
  s.d = st.d + first;
  s.o = st.o + static_cast<int64_t>(first) * st.dv;
  return s;
}

void MergeStates(SoftmaxStates* dst, const SoftmaxStates& src) {
  STRATA_CHECK(dst->n_heads == src.n_heads && dst->dv == src.dv);
  for (int h = 0; h < src.n_heads; ++h) {
    attention_internal::MergeOne(&dst->m[h], &dst->d[h], dst->o + h * dst->dv, src.m[h], src.d[h],
                                 src.o + h * src.dv, src.dv);
  }
}

void FinalizeStates(const SoftmaxStates& st, float* out) {
  for (int h = 0; h < st.n_heads; ++h) {
    float* dst = out + h * st.dv;
    const float* o = st.o + h * st.dv;
    if (st.d[h] == 0.f) {
      std::fill(dst, dst + st.dv, 0.f);
      continue;
    }
    const float inv = 1.f / st.d[h];
    for (int j = 0; j < st.dv; ++j) dst[j] = o[j] * inv;
  }
}

void AttendStream(const float* q, int n_heads, float scale, const KvStreamView& kv,
                  const int64_t* rows, int64_t n, SoftmaxStates* st, const KvStreamView* next,
                  int64_t next_n) {
  STRATA_CHECK(st->n_heads == n_heads && st->dv == kv.dv);
  if (n <= 0 || n_heads <= 0) return;
  HWY_DYNAMIC_DISPATCH(AttendStreamImpl)(q, n_heads, scale, kv, rows, n, st, next, next_n);
}

void AttendStreamRef(const float* q, int n_heads, float scale, const KvStreamView& kv,
                     const int64_t* rows, int64_t n, double* out) {
  std::vector<double> s(std::max<int64_t>(n, 1));
  std::vector<float> row(std::max(kv.dk, kv.dv));
  for (int g = 0; g < n_heads; ++g) {
    double* og = out + static_cast<int64_t>(g) * kv.dv;
    std::fill(og, og + kv.dv, 0.0);
    if (n <= 0) continue;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t u = rows ? rows[i] : i;
      ToF32(kv.dtype, kv.key_row(u), row.data(), kv.dk);
      double acc = 0;
      for (int c = 0; c < kv.dk; ++c) acc += static_cast<double>(q[g * kv.dk + c]) * row[c];
      s[i] = acc * scale;
      m = std::max(m, s[i]);
    }
    double d = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t u = rows ? rows[i] : i;
      ToF32(kv.dtype, kv.val_row(u), row.data(), kv.dv);
      const double p = std::exp(s[i] - m);
      d += p;
      for (int j = 0; j < kv.dv; ++j) og[j] += p * row[j];
    }
    for (int j = 0; j < kv.dv; ++j) og[j] /= d;
  }
}

}  // namespace strata
#endif  // HWY_ONCE
