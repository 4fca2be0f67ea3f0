// VestigeKV's recall-index scan kernels (see recall_scan.h), Highway SIMD with runtime dispatch.
//
// Moved from kv/vestige/recall.cc (issue 12): same code and arithmetic, on plain views.
// Version log (2-core AMD EPYC Zen5 host, AVX3 target):
//   v1  Scan over the archive list in 32-row tiles: each tile's [branch bf16 (d_r) ; csk f16 (r)]
//       is widened once to f32 scratch, and idx for all active heads comes from a 4-head x 4-row
//       register tile (the attention kernel's layout). Fire flags per archived row, a sequential
//       position-order compaction. Threads split the archive list statically (deterministic).
//       Measured by `strata bench attention` (cli/bench_attention.cc).
//   v2  csk stored in 16-row tiles, channel-major ([r, 16] f16 per tile; same bytes, no copy), an
//       archive bit mask per tile, and a tile kernel over 16 rows x all heads: per channel one
//       vector load + convert (f16 -> f32, or bf16 word -> 2 channels by shift / mask) feeds one
//       FMA per head (16 accumulators on AVX3; the query is channel-major per 16-head group, so
//       the broadcasts are constant offsets). The branch still comes from each row's tail in the
//       store (docs/reference/vestigekv.md §1.3, no sidecar): one key_row per tile (a tile lies
//       in one page), prefetched a tile ahead, transposed 16 x 16 words in registers
//       (ConcatEven/ConcatOdd unzip, AVX3; a scalar word copy elsewhere). csk prefetched two
//       tiles ahead. Vectorised fire test (score = lam * dot + z * (cq * eta), f32, unfused as
//       before) and fired-row bit masks per tile; compaction walks the masks. Threads split the tile span statically.
//       Roundings and summation order unchanged: each (head, row) dot is still one f32 FMA chain in
//       channel order [branch ; csk], so idx and the fire sets equal v1's bit for bit (bench: same
//       fetched rows and bisected z). Kept rows inside a tile are computed and masked out (1/ratio
//       extra FMAs; their branch is not read). Resident bytes: +2 B per 16 indexed rows (mask).
//       `bench attention --ctx 8192,32768 --heads 16 --threads 2` (shared, loaded host, 3 runs):
//       scan 0.65-0.71 -> 0.26-0.30 ms at 8k, 2.72-2.81 -> 0.86-1.09 ms at 32k; one thread at 32k
//       (thread CPU time): ~0.9 ms = 28 ns per archived row, ~75% of it the FMA chain.
//   v3  Moved to kernels/ on plain views (a row callback + tile stride instead of the LayerStore);
//       the store's tiles take one row() call per tile as they took one key_row. Same results.
#include "kernels/recall_scan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/recall_scan.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "kernels/attention_tile-inl.h"
// clang-format on

#ifndef STRATA_KERNELS_RECALL_SCAN_ONCE_  // this file is re-included once per SIMD target
#define STRATA_KERNELS_RECALL_SCAN_ONCE_
namespace strata {
namespace recall_scan_internal {
inline const uint16_t* RowOf(const RecallRowSource& s, int64_t u, uint16_t* scratch) {
  return s.row(s.ctx, u, scratch);
}
}  // namespace recall_scan_internal
}  // namespace strata
#endif  // STRATA_KERNELS_RECALL_SCAN_ONCE_

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
using recall_scan_internal::RowOf;
namespace {  // internal linkage: other kernels define helpers with the same names per target
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int kTile = 32;  // rows per tile
#if HWY_TARGET <= HWY_AVX3
constexpr int kR = 4;  // rows per register tile (4 heads x 4 rows = 16 accumulators)
#else
constexpr int kR = 2;
#endif

int64_t PadLanes(int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return (n + N - 1) / N * N;
}

// s[h * s_stride + r] = q_h . k_r for H heads (q rows dp apart) and kR rows (k rows dp apart).
template <int H>
HWY_INLINE void ScoreTile(const float* q, const float* k, int64_t dp, float* s, int64_t s_stride) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc[H][kR];
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < kR; ++r) acc[h][r] = hn::Zero(df);
  for (int64_t c = 0; c < dp; c += N) {
    VF kv[kR];
    for (int r = 0; r < kR; ++r) kv[r] = hn::Load(df, k + r * dp + c);
    for (int h = 0; h < H; ++h) {
      const VF qv = hn::Load(df, q + h * dp + c);
      for (int r = 0; r < kR; ++r) acc[h][r] = hn::MulAdd(qv, kv[r], acc[h][r]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < kR; ++r) s[h * s_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[h][r]));
}

// s[h * s_stride + r] = q_h . kt_r for G heads and nr rows (kt padded to a multiple of kR rows).
void TileScores(const float* q, int G, const float* kt, int nr, int64_t dp, float* s,
                int64_t s_stride) {
  for (int r0 = 0; r0 < nr; r0 += kR) {
    const float* k = kt + r0 * dp;
    int h0 = 0;
    for (; h0 + 4 <= G; h0 += 4) ScoreTile<4>(q + h0 * dp, k, dp, s + h0 * s_stride + r0, s_stride);
    switch (G - h0) {
      case 3: ScoreTile<3>(q + h0 * dp, k, dp, s + h0 * s_stride + r0, s_stride); break;
      case 2: ScoreTile<2>(q + h0 * dp, k, dp, s + h0 * s_stride + r0, s_stride); break;
      case 1: ScoreTile<1>(q + h0 * dp, k, dp, s + h0 * s_stride + r0, s_stride); break;
      default: break;
    }
  }
}

struct Scratch {
  AlignedBuffer<float> kt;  // [kTile, dp] tile rows as f32, zero padded
  AlignedBuffer<float> q;   // [G, dp] queries, zero padded
  std::vector<float> s;     // [G, kTile] scores
  std::vector<uint16_t> row;  // [k_dim] reader scratch
};

// b[0..n) = 0 (grown when needed).
void Zeros(AlignedBuffer<float>* b, size_t n) {
  if (b->size() < n) b->Resize(n);
  std::fill(b->data(), b->data() + n, 0.f);
}

// ---- The scan kernel (v2). Lanes run over the 16 rows of a tile; each (head, row) dot is one FMA
// chain over the dd = d_r + r channels in channel order [branch (d_r) ; csk (r)], so a row's idx
// does not depend on its tile, its lane or the call (Scan and IndexScores agree bit for bit).

constexpr int kN16 = static_cast<int>(hn::MaxLanes(DF()));
constexpr int kTV = kRecallTileRows / kN16 > 0 ? kRecallTileRows / kN16 : 1;  // vectors per tile
// Heads per register tile: kH x kTV accumulators (16 of 32 registers on AVX3, 8 of 16 below).
constexpr int kH = ((HWY_TARGET <= HWY_AVX3) ? 16 : 8) / kTV > 0
                       ? ((HWY_TARGET <= HWY_AVX3) ? 16 : 8) / kTV
                       : 1;
static_assert(kRecallTileRows % kN16 == 0 || kN16 > kRecallTileRows, "tile of whole vectors");
static_assert(kRecallHeadPad % kH == 0, "head padding covers whole head groups");

// s[h * 16 + i] = q_h . [branch_i ; csk_i] for kH heads and the 16 rows of one tile, from
// channel-major operands (q too: its broadcasts are constant offsets, no index registers):
//   q:   channel c of head h at q[c * kRecallHeadPad + h] (a compile-time stride)
//   br:  [ceil(d_r / 2), 16] u32, word j of row i = bf16 channels 2j (low half), 2j + 1 (high)
//   csk: [r, 16] f16
HWY_INLINE void TileDots(const float* HWY_RESTRICT q,
                         const uint32_t* HWY_RESTRICT br, int d_r, const uint16_t* HWY_RESTRICT csk,
                         int r, float* HWY_RESTRICT s) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<hwy::float16_t, DF> dh;
  constexpr int N = kN16;
  VF acc[kH][kTV];
  for (int h = 0; h < kH; ++h)
    for (int v = 0; v < kTV; ++v) acc[h][v] = hn::Zero(df);
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  const float* qc = q;  // channel c of head h: qc[h]
  for (int j = 0; j < d_r / 2; ++j, qc += 2 * kRecallHeadPad) {
    VF lo[kTV], hi[kTV];
    for (int v = 0; v < kTV; ++v) {
      const auto w = hn::LoadU(du, br + j * kRecallTileRows + v * N);
      lo[v] = hn::BitCast(df, hn::ShiftLeft<16>(w));
      hi[v] = hn::BitCast(df, hn::And(w, hi_mask));
    }
    for (int h = 0; h < kH; ++h) {
      const VF q0 = hn::Set(df, qc[h]);
      for (int v = 0; v < kTV; ++v) acc[h][v] = hn::MulAdd(q0, lo[v], acc[h][v]);
    }
    const float* qc1 = qc + kRecallHeadPad;
    for (int h = 0; h < kH; ++h) {
      const VF q1 = hn::Set(df, qc1[h]);
      for (int v = 0; v < kTV; ++v) acc[h][v] = hn::MulAdd(q1, hi[v], acc[h][v]);
    }
  }
  if (d_r & 1) {
    const int j = d_r / 2;
    VF lo[kTV];
    for (int v = 0; v < kTV; ++v) {
      lo[v] = hn::BitCast(df, hn::ShiftLeft<16>(hn::LoadU(du, br + j * kRecallTileRows + v * N)));
    }
    for (int h = 0; h < kH; ++h) {
      const VF q0 = hn::Set(df, qc[h]);
      for (int v = 0; v < kTV; ++v) acc[h][v] = hn::MulAdd(q0, lo[v], acc[h][v]);
    }
    qc += kRecallHeadPad;
  }
  const hwy::float16_t* ck = reinterpret_cast<const hwy::float16_t*>(csk);
  for (int k = 0; k < r; ++k, qc += kRecallHeadPad) {
    VF kv[kTV];
    for (int v = 0; v < kTV; ++v) {
      kv[v] = hn::PromoteTo(df, hn::LoadU(dh, ck + k * kRecallTileRows + v * N));
    }
    for (int h = 0; h < kH; ++h) {
      const VF qv = hn::Set(df, qc[h]);
      for (int v = 0; v < kTV; ++v) acc[h][v] = hn::MulAdd(qv, kv[v], acc[h][v]);
    }
  }
  for (int h = 0; h < kH; ++h)
    for (int v = 0; v < kTV; ++v) hn::Store(acc[h][v], df, s + h * kRecallTileRows + v * N);
}

// a + b, never fused with the products that made a or b: GCC contracts x * y + c into an FMA on
// FMA targets (-ffp-contract=fast is its C++ default), which would round the reference score
// lam * dot + z * cert differently from the scalar form IndexScores' callers compute.
HWY_INLINE VF AddUnfused(VF a, VF b) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(a.raw), "+v"(b.raw));  // opaque values: no instruction is emitted
#endif
  return hn::Add(a, b);
}

struct TileScratch {
  AlignedBuffer<uint32_t> br;   // [ceil(d_r / 2), 16] staged branch words
  AlignedBuffer<uint16_t> csk;  // [r, 16] gathered sketch (IndexScores)
  AlignedBuffer<float> s;       // [heads padded, 16] dots
  std::vector<uint16_t> rows;   // [16, k_dim] reader scratch
  void Size(const RecallScanView& a) {
    const size_t nb = static_cast<size_t>((a.d_r + 1) / 2) * kRecallTileRows;
    if (br.size() < nb) br.Resize(nb);
    const size_t nc = static_cast<size_t>(a.r) * kRecallTileRows;
    if (csk.size() < nc) csk.Resize(nc);
    const size_t ns = static_cast<size_t>(a.n_heads_pad) * kRecallTileRows;
    if (s.size() < ns) s.Resize(ns);
    const size_t nr = static_cast<size_t>(kRecallTileRows) * a.src.k_dim;
    if (rows.size() < nr) rows.resize(nr);
  }
};

// p[i] = the branch [d_r] bf16 of rows[i], or null where rows[i] < 0 (any row source).
HWY_INLINE void BranchPtrs(const RecallScanView& a, const int64_t* rows, TileScratch* sc,
                           const uint16_t** p) {
  for (int i = 0; i < kRecallTileRows; ++i) {
    const int64_t u = rows[i];
    if (u < 0) {
      p[i] = nullptr;
    } else if (a.src.branch_sidecar != nullptr) {
      p[i] = a.src.branch_sidecar + u * a.d_r;
    } else {
      p[i] = RowOf(a.src, u, sc->rows.data() + static_cast<size_t>(i) * a.src.k_dim) + a.d_c;
    }
  }
}

// The same for the archived rows (bits of mask) of tile t from a source whose tiles are strided
// (tile_row_stride > 0, e.g. a store page holds whole tiles): one row() per tile gives all 16 (the
// derived pointer of the last row is checked against row()).
HWY_INLINE void StridedTilePtrs(const RecallScanView& a, int64_t t, uint32_t mask, TileScratch* sc,
                                const uint16_t** p) {
  const int first = static_cast<int>(hwy::Num0BitsBelowLS1Bit_Nonzero32(mask));
  const int last = 31 - static_cast<int>(hwy::Num0BitsAboveMS1Bit_Nonzero32(mask));
  const int64_t u0 = t * kRecallTileRows;
  const int64_t k = a.src.tile_row_stride;
  const uint16_t* base = RowOf(a.src, u0 + first, sc->rows.data()) + a.d_c;
  STRATA_CHECK(RowOf(a.src, u0 + last, sc->rows.data() + a.src.k_dim) + a.d_c ==
               base + (last - first) * k);
  for (int i = 0; i < kRecallTileRows; ++i)
    p[i] = (mask >> i) & 1 ? base + (i - first) * k : nullptr;
}

// Stages the branches p[i] (null: zero) as channel-major words: br[j * 16 + i] holds bf16
// channels 2j (low half) and 2j + 1 (high half) of row i.
HWY_INLINE void StageBranches(const RecallScanView& a, const uint16_t* const* p, TileScratch* sc) {
  uint32_t* br = sc->br.data();
#if HWY_TARGET <= HWY_AVX3
  if (kN16 == kRecallTileRows && a.d_r % 32 == 0) {
    // 16 x 16 word blocks transposed in registers: four rounds of a flat unzip (ConcatEven /
    // ConcatOdd of row pairs) rotate the 8 index bits (row, word) into (word, row).
    const hn::RebindToUnsigned<DF> du;
    using VU = hn::Vec<decltype(du)>;
    for (int b = 0; b < a.d_r / 32; ++b) {
      VU v[16];
      for (int i = 0; i < 16; ++i) {
        v[i] = p[i] != nullptr
                   ? hn::LoadU(du, reinterpret_cast<const uint32_t*>(p[i] + 32 * b))
                   : hn::Zero(du);
      }
      for (int round = 0; round < 4; ++round) {
        VU w[16];
        for (int k = 0; k < 8; ++k) {
          w[k] = hn::ConcatEven(du, v[2 * k + 1], v[2 * k]);
          w[8 + k] = hn::ConcatOdd(du, v[2 * k + 1], v[2 * k]);
        }
        for (int k = 0; k < 16; ++k) v[k] = w[k];
      }
      for (int j = 0; j < 16; ++j) hn::Store(v[j], du, br + (16 * b + j) * kRecallTileRows);
    }
    return;
  }
#endif
  const int nw = (a.d_r + 1) / 2, pairs = a.d_r / 2;
  for (int i = 0; i < kRecallTileRows; ++i) {
    if (p[i] == nullptr) {
      for (int j = 0; j < nw; ++j) br[j * kRecallTileRows + i] = 0;
      continue;
    }
    for (int j = 0; j < pairs; ++j) {
      uint32_t w;
      std::memcpy(&w, p[i] + 2 * j, sizeof(w));  // little-endian: channel 2j in the low half
      br[j * kRecallTileRows + i] = w;
    }
    if (a.d_r & 1) br[pairs * kRecallTileRows + i] = p[i][a.d_r - 1];
  }
}

// Dots of all (padded) heads for one staged tile: s [heads padded, 16].
HWY_INLINE void TileAllHeads(const RecallScanView& a, const uint16_t* csk, TileScratch* sc) {
  const int64_t group = static_cast<int64_t>(a.d_r + a.r) * kRecallHeadPad;
  for (int h0 = 0; h0 < a.n_heads; h0 += kH) {
    TileDots(a.q + h0 / kRecallHeadPad * group + h0 % kRecallHeadPad, sc->br.data(), a.d_r, csk,
             a.r, sc->s.data() + static_cast<int64_t>(h0) * kRecallTileRows);
  }
}

// Scan of tiles [t_begin, t_end): fire[t - t_begin] = bit i set iff archived row 16 t + i fires
// for some head; *fired += (head, row) pairs that fired.
void RecallScanTilesImpl(const RecallScanView* a_, int64_t t_begin, int64_t t_end, uint16_t* fire,
                         int64_t* fired) {
  const RecallScanView& a = *a_;
  thread_local TileScratch sc;
  sc.Size(a);
  const DF df;
  constexpr int N = kN16;
  const bool from_store = a.src.branch_sidecar == nullptr && a.src.tile_row_stride > 0;
  const int64_t tile_csk = static_cast<int64_t>(a.r) * kRecallTileRows;
  // Branch pointers of tile t. From a strided source (the store) they are taken one tile ahead
  // and prefetched (the branch sits at a 2 (d_c + d_r)-byte stride); a row-by-row source's
  // scratch is only valid until its next call, so that source is read tile by tile.
  auto tile_ptrs = [&](int64_t t, const uint16_t** p) {
    const uint32_t m = a.arch_mask[t];
    if (from_store) {
      StridedTilePtrs(a, t, m, &sc, p);
      for (int i = 0; i < kRecallTileRows; ++i) {
        if (p[i] == nullptr) continue;
        for (int off = 0; off < a.d_r; off += 32) hwy::Prefetch(p[i] + off);
      }
      return;
    }
    int64_t rows[kRecallTileRows];
    for (int i = 0; i < kRecallTileRows; ++i)
      rows[i] = (m >> i) & 1 ? t * kRecallTileRows + i : -1;
    BranchPtrs(a, rows, &sc, p);
  };
  auto next_tile = [&](int64_t t) {  // the next tile after t with archived rows, or t_end
    for (++t; t < t_end && a.arch_mask[t] == 0; ++t) {
    }
    return t;
  };
  const uint16_t* ptr[2][kRecallTileRows];
  int cur = 0;
  if (from_store) {
    const int64_t t0 = a.arch_mask[t_begin] != 0 ? t_begin : next_tile(t_begin);
    if (t0 < t_end) tile_ptrs(t0, ptr[0]);
  }
  int64_t cnt = 0;
  const VF lam = hn::Set(df, a.lam), z = hn::Set(df, a.z);
  for (int64_t t = t_begin; t < t_end; ++t) {
    const uint32_t m = a.arch_mask[t];
    if (m == 0) {
      fire[t - t_begin] = 0;
      continue;
    }
    if (from_store) {
      const int64_t tn = next_tile(t);
      if (tn < t_end) tile_ptrs(tn, ptr[cur ^ 1]);
    } else {
      tile_ptrs(t, ptr[cur]);
    }
    StageBranches(a, ptr[cur], &sc);
    if (from_store) cur ^= 1;
    // The csk stream (r * 32 B per tile) is prefetched two tiles ahead: the hardware prefetcher
    // alone left the FMA loop waiting on it (measured: -0.2 ms of 1.2 ms at 32k, one thread).
    if (t + 2 < t_end) {
      const char* c2 = reinterpret_cast<const char*>(a.csk + (t + 2) * tile_csk);
      for (int64_t off = 0; off < tile_csk * 2; off += 64) hwy::Prefetch(c2 + off);
    }
    TileAllHeads(a, a.csk + t * tile_csk, &sc);
    // score = lam * dot + z * (cq_h * eta_u), fire iff score > thr_h (the f32 op order of §3.2).
    VF eta[kTV];
    for (int v = 0; v < kTV; ++v) eta[v] = hn::LoadU(df, a.eta + t * kRecallTileRows + v * N);
    uint32_t any = 0;
    for (int h = 0; h < a.n_heads; ++h) {
      const VF c = hn::Set(df, a.cq[h]), thr = hn::Set(df, a.thr[h]);
      uint32_t bits = 0;
      for (int v = 0; v < kTV; ++v) {
        const VF idx = hn::Mul(lam, hn::Load(df, sc.s.data() + h * kRecallTileRows + v * N));
        const VF score = AddUnfused(idx, hn::Mul(z, hn::Mul(c, eta[v])));
        uint8_t mb[8] = {0};
        hn::StoreMaskBits(df, hn::Gt(score, thr), mb);
        uint32_t b;
        std::memcpy(&b, mb, sizeof(b));
        bits |= (b & ((N >= 32 ? 0u : (1u << N)) - 1u)) << (v * N);
      }
      bits &= m;
      any |= bits;
      cnt += static_cast<int64_t>(hwy::PopCount(bits));
    }
    fire[t - t_begin] = static_cast<uint16_t>(any);
  }
  *fired += cnt;
}

// out[h * out_stride + i] = lam * q_h . [branch(rows[i]) ; csk(rows[i])] for a.n_heads heads, the
// same kernel as the scan (rows gathered into tiles of 16).
void RecallIndexDotsImpl(const RecallScanView* a_, const int64_t* rows, int64_t n, float* out,
                         int64_t out_stride) {
  const RecallScanView& a = *a_;
  thread_local TileScratch sc;
  sc.Size(a);
  const int64_t tile_csk = static_cast<int64_t>(a.r) * kRecallTileRows;
  int64_t rr[kRecallTileRows];
  for (int64_t t0 = 0; t0 < n; t0 += kRecallTileRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRecallTileRows, n - t0));
    for (int i = 0; i < kRecallTileRows; ++i) rr[i] = i < nr ? rows[t0 + i] : -1;
    const uint16_t* ptr[kRecallTileRows];
    BranchPtrs(a, rr, &sc, ptr);
    StageBranches(a, ptr, &sc);
    uint16_t* ck = sc.csk.data();
    for (int i = 0; i < kRecallTileRows; ++i) {
      const int64_t u = rr[i];
      const uint16_t* src = u >= 0 ? a.csk + (u / kRecallTileRows) * tile_csk + u % kRecallTileRows
                                   : nullptr;
      for (int k = 0; k < a.r; ++k)
        ck[k * kRecallTileRows + i] = src ? src[k * kRecallTileRows] : 0;
    }
    TileAllHeads(a, ck, &sc);
    for (int h = 0; h < a.n_heads; ++h)
      for (int i = 0; i < nr; ++i)
        out[h * out_stride + t0 + i] = a.lam * sc.s[h * kRecallTileRows + i];
  }
}

// out[h * out_stride + i] = lam * q_h . row_i (full rows, dk wide); row_i = rows[i] or begin + i.
void RecallScoreRowsImpl(const float* q, int G, const RecallRowSource* src, const int64_t* rows,
                         int64_t begin, int64_t n, float lam, float* out, int64_t out_stride) {
  const int dk = src->k_dim;
  const int64_t dp = PadLanes(dk);
  thread_local Scratch sc;
  Zeros(&sc.kt, static_cast<size_t>(kTile) * dp);
  Zeros(&sc.q, static_cast<size_t>(G) * dp);
  for (int h = 0; h < G; ++h) std::memcpy(sc.q.data() + h * dp, q + h * dk, sizeof(float) * dk);
  sc.s.resize(static_cast<size_t>(G) * kTile);
  sc.row.resize(dk);
  float* kt = sc.kt.data();
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int nr = static_cast<int>(std::min<int64_t>(kTile, n - t0));
    const int nr_pad = (nr + kR - 1) / kR * kR;
    for (int i = 0; i < nr; ++i) {
      const int64_t u = rows ? rows[t0 + i] : begin + t0 + i;
      tile::Bf16RowToF32(RowOf(*src, u, sc.row.data()), dk, dk, kt + i * dp);
    }
    for (int i = nr; i < nr_pad; ++i) std::fill(kt + i * dp, kt + i * dp + dk, 0.f);
    TileScores(sc.q.data(), G, kt, nr_pad, dp, sc.s.data(), kTile);
    for (int h = 0; h < G; ++h)
      for (int i = 0; i < nr; ++i) out[h * out_stride + t0 + i] = lam * sc.s[h * kTile + i];
  }
}

}  // namespace
}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(RecallIndexDotsImpl);
HWY_EXPORT(RecallScanTilesImpl);
HWY_EXPORT(RecallScoreRowsImpl);

void RecallScanTiles(const RecallScanView& a, int64_t t_begin, int64_t t_end, uint16_t* fire,
                     int64_t* fired) {
  if (t_end <= t_begin) return;
  HWY_DYNAMIC_DISPATCH(RecallScanTilesImpl)(&a, t_begin, t_end, fire, fired);
}

void RecallIndexDots(const RecallScanView& a, const int64_t* rows, int64_t n, float* out,
                     int64_t out_stride) {
  if (n <= 0) return;
  HWY_DYNAMIC_DISPATCH(RecallIndexDotsImpl)(&a, rows, n, out, out_stride);
}

void RecallIndexDotsRef(const RecallScanView& a, const int64_t* rows, int64_t n, double* out,
                        int64_t out_stride) {
  std::vector<uint16_t> scratch(a.src.k_dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t u = rows[i];
    const uint16_t* br = a.src.branch_sidecar != nullptr
                             ? a.src.branch_sidecar + u * a.d_r
                             : recall_scan_internal::RowOf(a.src, u, scratch.data()) + a.d_c;
    for (int h = 0; h < a.n_heads; ++h) {
      const float* qh = a.q + h / kRecallHeadPad * (a.d_r + a.r) * kRecallHeadPad +
                        h % kRecallHeadPad;
      double s = 0;
      for (int j = 0; j < a.d_r; ++j) {
        s += static_cast<double>(qh[j * kRecallHeadPad]) * Bf16ToF32(br[j]);
      }
      for (int k = 0; k < a.r; ++k) {
        s += static_cast<double>(qh[(a.d_r + k) * kRecallHeadPad]) *
             F16ToF32(a.csk[RecallCskAt(u, k, a.r)]);
      }
      out[h * out_stride + i] = a.lam * s;
    }
  }
}

void RecallScoreRows(const float* q, int G, const RecallRowSource& src, const int64_t* rows,
                     int64_t begin, int64_t n, float lam, float* out, int64_t out_stride) {
  if (n <= 0) return;
  HWY_DYNAMIC_DISPATCH(RecallScoreRowsImpl)(q, G, &src, rows, begin, n, lam, out, out_stride);
}

}  // namespace strata
#endif  // HWY_ONCE
