// SIMD micro-kernels shared by the attention readers (kernels/attention.cc over bf16 streams,
// kernels/packed_attention.cc over graded blocks): a score tile that computes q.k for a few
// query heads and rows with one register accumulator per (head, row) and reduces all of them at
// once, the exp-weighted value accumulation, and the tile softmax.
//
// Rows and values come from callables, so the same code reads f32 scratch, bf16 rows converted in
// registers or quantization codes:
//   key(r, c) -> Vec: lanes [c, c + N) of row r's key (or of a stand-in that is used only through
//                     a weight of zero; the caller masks such rows).
//   val(t, c) -> Vec: lanes [c, c + N) of row t's value.
//
// Per-target header (Highway's -inl convention): included inside each SIMD target's namespace
// through foreach_target by the files that use it.
#if defined(STRATA_KERNELS_ATTENTION_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_ATTENTION_TILE_INL_H_
#undef STRATA_KERNELS_ATTENTION_TILE_INL_H_
#else
#define STRATA_KERNELS_ATTENTION_TILE_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/buffer.h"
#include "core/dtype.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace tile {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Accumulators per score tile: heads x rows = kAcc. With 32 vector registers (AVX-512) 16 of them
// hold the sums and are reduced by one transpose-and-add tree; elsewhere 8, reduced one by one.
#undef STRATA_TILE_TREE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define STRATA_TILE_TREE 1
constexpr int kAcc = 16;
#else
#define STRATA_TILE_TREE 0
constexpr int kAcc = 8;
#endif

// Rows per score tile for H heads (1 to 4): H x RowsFor <= kAcc accumulators.
template <int H>
constexpr int RowsFor() {
  return kAcc / H;
}
// Score tiles evaluate up to this many rows past the last one asked for; score rows need that
// much room past their end (see ScoreTile).
constexpr int kRowSlack = kAcc;

// Software prefetch spread over a tile's work: byte ranges queued up front, issued a quota of
// cache lines at a time from inside the score and value loops. A burst of hundreds of prefetches
// stalls the load pipeline until they drain; a few per micro-tile overlap with the arithmetic.
class PrefetchQueue {
 public:
  static constexpr int kMaxRanges = 2 * 80 + 4;
  void Clear() { head_ = count_ = 0, lines_ = 0; }
  // Queues [p, p + bytes); a range that continues the previous one extends it.
  void Add(const void* p, int64_t bytes) {
    if (bytes <= 0) return;
    const char* c = reinterpret_cast<const char*>(p);
    if (head_ == count_) head_ = count_ = 0;  // everything issued: reuse the slots
    lines_ += (bytes + 63) / 64;
    if (count_ > head_ && r_[count_ - 1].p + r_[count_ - 1].n == c) {
      r_[count_ - 1].n += bytes;
      return;
    }
    if (count_ == kMaxRanges) {  // full: issue the queued ranges now
      Drain();
      head_ = count_ = 0;
      lines_ = (bytes + 63) / 64;
    }
    r_[count_++] = {c, bytes};
  }
  // Sets the quota so that the queued lines drain in about `calls` Tick()s.
  void Spread(int calls) {
    calls = std::max(1, calls);
    quota_ = static_cast<int>((lines_ + calls - 1) / calls);
  }
  void Tick() { Issue(quota_); }
  void Drain() { Issue(1 << 30); }

 private:
  void Issue(int64_t lines) {
    while (lines > 0 && head_ < count_) {
      Range& r = r_[head_];
      const int64_t n = std::min(lines, (r.n + 63) / 64);
      for (int64_t i = 0; i < n; ++i) hwy::Prefetch(r.p + 64 * i);
      r.p += 64 * n;
      r.n -= 64 * n;
      lines -= n;
      lines_ -= n;
      if (r.n <= 0) ++head_;
    }
  }
  struct Range {
    const char* p;
    int64_t n;
  };
  Range r_[kMaxRanges];
  int head_ = 0, count_ = 0, quota_ = 4;
  int64_t lines_ = 0;
};

// out[i] = sum of the lanes of acc[i], i < kAcc; with the tree, also returned as one vector
// (lane i) so that callers can store it without a round trip through memory.
HWY_INLINE void ReduceAcc(const VF* acc, float* HWY_RESTRICT out, VF* vout = nullptr) {
  const DF df;
#if STRATA_TILE_TREE
  static_assert(kAcc == 16);
  const hn::Repartition<double, DF> dd;
  // Pairs: per 128-bit block [a0+a2, b0+b2, a1+a3, b1+b3].
  VF t[8];
  for (int k = 0; k < 8; ++k) {
    t[k] = hn::Add(hn::InterleaveLower(df, acc[2 * k], acc[2 * k + 1]),
                   hn::InterleaveUpper(df, acc[2 * k], acc[2 * k + 1]));
  }
  // Quads: per 128-bit block the block sums of sources 4k..4k+3, in order.
  VF u[4];
  for (int k = 0; k < 4; ++k) {
    const auto c = hn::BitCast(dd, t[2 * k]), d = hn::BitCast(dd, t[2 * k + 1]);
    u[k] = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, c, d)),
                   hn::BitCast(df, hn::InterleaveUpper(dd, c, d)));
  }
  // Across the four 128-bit blocks: block k of the result holds the totals of sources 4k..4k+3.
  auto blocks = [](VF a, VF b) {
    const __m512 x = _mm512_shuffle_f32x4(a.raw, b.raw, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 y = _mm512_shuffle_f32x4(a.raw, b.raw, _MM_SHUFFLE(3, 1, 3, 1));
    return VF{_mm512_add_ps(x, y)};
  };
  const VF s01 = blocks(u[0], u[1]), s23 = blocks(u[2], u[3]);
  const VF all = blocks(s01, s23);
  if (vout != nullptr) {
    *vout = all;
  } else {
    hn::StoreU(all, df, out);
  }
#else
  for (int i = 0; i < kAcc; ++i) out[i] = hn::GetLane(hn::SumOfLanes(df, acc[i]));
#endif
}

// s[h * ss + i0 + r] = sum_{c < D} q[h * qs + c] * key(i0 + r, c) for h < H, r < RowsFor<H>().
// D is a multiple of the lane count; q rows are padded to it.
template <int H, class KeyAt>
HWY_INLINE void ScoreRows(const float* HWY_RESTRICT q, int64_t qs, int64_t D, const KeyAt& key,
                          int i0, float* HWY_RESTRICT s, int64_t ss) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int R = RowsFor<H>();
  VF acc[kAcc];  // [h * R + r]; entries past H * R stay zero
  for (int i = 0; i < kAcc; ++i) acc[i] = hn::Zero(df);
  for (int64_t c = 0; c < D; c += N) {
    if constexpr (H >= 4) {
      VF kv[R];
      for (int r = 0; r < R; ++r) kv[r] = key(i0 + r, c);
      for (int h = 0; h < H; ++h) {
        const VF qv = hn::LoadU(df, q + h * qs + c);
        for (int r = 0; r < R; ++r) acc[h * R + r] = hn::MulAdd(qv, kv[r], acc[h * R + r]);
      }
    } else {
      VF qv[H];
      for (int h = 0; h < H; ++h) qv[h] = hn::LoadU(df, q + h * qs + c);
      for (int r = 0; r < R; ++r) {
        const VF kv = key(i0 + r, c);
        for (int h = 0; h < H; ++h) acc[h * R + r] = hn::MulAdd(qv[h], kv, acc[h * R + r]);
      }
    }
  }
  alignas(64) float red[kAcc];
#if STRATA_TILE_TREE
  if constexpr (H == 4) {  // lanes [4h, 4h + 4) are head h's rows: one 128-bit store per head
    VF all;
    ReduceAcc(acc, red, &all);
    _mm_storeu_ps(s + 0 * ss + i0, _mm512_extractf32x4_ps(all.raw, 0));
    _mm_storeu_ps(s + 1 * ss + i0, _mm512_extractf32x4_ps(all.raw, 1));
    _mm_storeu_ps(s + 2 * ss + i0, _mm512_extractf32x4_ps(all.raw, 2));
    _mm_storeu_ps(s + 3 * ss + i0, _mm512_extractf32x4_ps(all.raw, 3));
    return;
  }
#endif
  ReduceAcc(acc, red);
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < R; ++r) s[h * ss + i0 + r] = red[h * R + r];
}

// Number of ScoreRows calls ScoreTile makes (for PrefetchQueue::Spread).
inline int ScoreCalls(int G, int n_rows) {
  auto steps = [&](int r) { return (n_rows + r - 1) / r; };
  int n = (G / 4) * steps(RowsFor<4>());
  switch (G % 4) {
    case 3: n += steps(RowsFor<3>()); break;
    case 2: n += steps(RowsFor<2>()); break;
    case 1: n += steps(RowsFor<1>()); break;
    default: break;
  }
  return n;
}

// Scores of rows [0, n_rows) for the H heads at q (H <= 4), RowsFor<H>() rows per micro-tile.
template <int H, class KeyAt>
HWY_INLINE void ScoreGroup(const float* HWY_RESTRICT q, int64_t qs, int64_t D, const KeyAt& key,
                           int n_rows, float* HWY_RESTRICT s, int64_t ss, PrefetchQueue* pf) {
  for (int i0 = 0; i0 < n_rows; i0 += RowsFor<H>()) {
    ScoreRows<H>(q, qs, D, key, i0, s, ss);
    if (pf) pf->Tick();
  }
}

// Scores of rows [0, n_rows) for heads [0, G) (heads in groups of 4, then one group of the
// remaining 3, 2 or 1); rows are processed in steps of RowsFor<H>(), so up to kRowSlack - 1 rows
// past n_rows are evaluated and written too: key() must accept them and s rows need the room.
// s: [G, ss]. A head's scores do not depend on the group it falls in.
// pf (optional): ticked after every micro-tile.
template <class KeyAt>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT q, int64_t qs, int G, int64_t D,
                          const KeyAt& key, int n_rows, float* HWY_RESTRICT s, int64_t ss,
                          PrefetchQueue* pf = nullptr) {
  int h0 = 0;
  for (; h0 + 4 <= G; h0 += 4) ScoreGroup<4>(q + h0 * qs, qs, D, key, n_rows, s + h0 * ss, ss, pf);
  switch (G - h0) {
    case 3: ScoreGroup<3>(q + h0 * qs, qs, D, key, n_rows, s + h0 * ss, ss, pf); break;
    case 2: ScoreGroup<2>(q + h0 * qs, qs, D, key, n_rows, s + h0 * ss, ss, pf); break;
    case 1: ScoreGroup<1>(q + h0 * qs, qs, D, key, n_rows, s + h0 * ss, ss, pf); break;
    default: break;
  }
}

// o[h * os + c0 + j*N ..] += sum_{t < nr} w[h * ws + t] * val(t, c0 + j*N) for h < H, j < C.
template <int H, int C, class ValAt>
HWY_INLINE void AccumRows(const float* HWY_RESTRICT w, int64_t ws, const ValAt& val, int nr,
                          int64_t c0, float* HWY_RESTRICT o, int64_t os) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc[H][C];
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < C; ++j) acc[h][j] = hn::LoadU(df, o + h * os + c0 + j * N);
  for (int t = 0; t < nr; ++t) {
    VF vv[C];
    for (int j = 0; j < C; ++j) vv[j] = val(t, c0 + j * N);
    for (int h = 0; h < H; ++h) {
      const VF pb = hn::Set(df, w[h * ws + t]);
      for (int j = 0; j < C; ++j) acc[h][j] = hn::MulAdd(pb, vv[j], acc[h][j]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < C; ++j) hn::StoreU(acc[h][j], df, o + h * os + c0 + j * N);
}

#if STRATA_TILE_TREE
constexpr int kVCols = 4;  // 4 heads x 4 vectors: 16 accumulators
#else
constexpr int kVCols = 2;
#endif

template <int H, class ValAt>
HWY_INLINE void AccumCols(int nc, const float* w, int64_t ws, const ValAt& val, int nr, int64_t c0,
                          float* o, int64_t os) {
  switch (nc) {
    case 1: return AccumRows<H, 1>(w, ws, val, nr, c0, o, os);
    case 2: return AccumRows<H, 2>(w, ws, val, nr, c0, o, os);
#if STRATA_TILE_TREE
    case 3: return AccumRows<H, 3>(w, ws, val, nr, c0, o, os);
    case 4: return AccumRows<H, 4>(w, ws, val, nr, c0, o, os);
#endif
    default: HWY_ASSERT(false);
  }
}

// o[h * os + c] += sum_{t < nr} w[h * ws + t] * val(t, c) for h < G, c in [c_begin, c_end) (a
// multiple of N wide), in passes of at most kVCols vectors and 4 heads.
template <class ValAt>
HWY_INLINE void AccumTile(const float* w, int64_t ws, int G, const ValAt& val, int nr,
                          int64_t c_begin, int64_t c_end, float* o, int64_t os) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int h0 = 0; h0 < G; h0 += 4) {
    const int nh = G - h0 < 4 ? G - h0 : 4;
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kVCols * N) {
      const int nc = static_cast<int>((c_end - c0) / N < kVCols ? (c_end - c0) / N : kVCols);
      const float* wg = w + h0 * ws;
      float* og = o + h0 * os;
      switch (nh) {
        case 1: AccumCols<1>(nc, wg, ws, val, nr, c0, og, os); break;
        case 2: AccumCols<2>(nc, wg, ws, val, nr, c0, og, os); break;
        case 3: AccumCols<3>(nc, wg, ws, val, nr, c0, og, os); break;
        default: AccumCols<4>(nc, wg, ws, val, nr, c0, og, os); break;
      }
    }
  }
}

// In place over s[0..n) (n a multiple of N; -inf entries are rows that do not count): returns the
// tile max m (or -inf when every entry is -inf) and writes p = exp(s - m) and *sum = sum p.
HWY_INLINE float SoftmaxRow(float* HWY_RESTRICT s, int n, float* sum) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  VF vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < n; i += N) vmax = hn::Max(vmax, hn::Load(df, s + i));
  const float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int i = 0; i < n; i += N) hn::Store(hn::Zero(df), df, s + i);
    *sum = 0.f;
    return m;
  }
  const VF vm = hn::Set(df, m);
  const VF vfloor = hn::Set(df, -1000.f);  // exp(-1000) = 0 and keeps Exp's argument in range
  VF acc = hn::Zero(df);
  for (int i = 0; i < n; i += N) {
    const VF p = hn::Exp(df, hn::Max(hn::Sub(hn::Load(df, s + i), vm), vfloor));
    hn::Store(p, df, s + i);
    acc = hn::Add(acc, p);
  }
  *sum = hn::GetLane(hn::SumOfLanes(df, acc));
  return m;
}

// bf16 lanes [c, c + N) of a row, as f32.
HWY_INLINE VF Bf16Vec(const uint16_t* HWY_RESTRICT row, int64_t c) {
  const DF df;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<uint32_t, DF> du32;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, row + c))));
}

// dst[0..dp) = bf16 src[0..n) as f32, zeros in [n, dp) (dp >= n).
HWY_INLINE void Bf16RowToF32(const uint16_t* HWY_RESTRICT src, int64_t n, int64_t dp,
                             float* HWY_RESTRICT dst) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t c = 0;
  for (; c + N <= n; c += N) hn::StoreU(Bf16Vec(src, c), df, dst + c);
  for (; c < n; ++c) dst[c] = Bf16ToF32(src[c]);
  for (; c < dp; ++c) dst[c] = 0.f;
}

// Grows a scratch buffer to at least n elements (contents discarded when it grows).
template <typename T>
inline void Grow(AlignedBuffer<T>* b, size_t n) {
  if (b->size() < n) b->Resize(n);
}

// dst[0..n) = f16 src[0..n) as f32.
HWY_INLINE void F16ToF32Row(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto* s16 = reinterpret_cast<const hwy::float16_t*>(src);
  int64_t c = 0;
  for (; c + N <= n; c += N) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s16 + c)), df, dst + c);
  if (c < n) {
    alignas(64) hwy::float16_t tmp[hn::MaxLanes(df)] = {};
    alignas(64) float out[hn::MaxLanes(df)];
    for (int64_t i = c; i < n; ++i) tmp[i - c] = s16[i];
    hn::Store(hn::PromoteTo(df, hn::Load(dh, tmp)), df, out);
    for (int64_t i = c; i < n; ++i) dst[i] = out[i - c];
  }
}

// u8 code lanes [c, c + N) of a row, as f32.
HWY_INLINE VF CodeVec(const uint8_t* HWY_RESTRICT row, int64_t c) {
  const DF df;
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<int32_t, DF> di32;
  return hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(du8, row + c)));
}

}  // namespace tile
}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#endif  // include guard
