// VestigeKV tier 2: the recall index and its scan (see recall.h).
//
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
//       store (spec 1.3, no sidecar): one key_row per tile (a tile lies in one page), prefetched a
//       tile ahead, transposed 16 x 16 words in registers (ConcatEven/ConcatOdd unzip, AVX3; a
//       scalar word copy elsewhere). csk prefetched two tiles ahead. Vectorised fire test
//       (score = lam * dot + z * (cq * eta), f32, unfused as before) and fired-row bit masks per
//       tile; compaction walks the masks. Threads split the tile span statically.
//       Roundings and summation order unchanged: each (head, row) dot is still one f32 FMA chain in
//       channel order [branch ; csk], so idx and the fire sets equal v1's bit for bit (bench: same
//       fetched rows and bisected z). Kept rows inside a tile are computed and masked out (1/ratio
//       extra FMAs; their branch is not read). Resident bytes: +2 B per 16 indexed rows (mask).
//       `bench attention --ctx 8192,32768 --heads 16 --threads 2` (shared, loaded host, 3 runs):
//       scan 0.65-0.71 -> 0.26-0.30 ms at 8k, 2.72-2.81 -> 0.86-1.09 ms at 32k; one thread at 32k
//       (thread CPU time): ~0.9 ms = 28 ns per archived row, ~75% of it the FMA chain.
#include "kv/vestige/recall.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "kv/vestige/calibration.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/vestige/recall.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "kernels/attention_tile-inl.h"

#ifndef STRATA_KV_RECALL_ONCE_  // this file is re-included once per SIMD target
#define STRATA_KV_RECALL_ONCE_
namespace strata {
namespace recall_internal {

// Where rows come from: the store, or the policy's reader when one is installed.
struct RowSrc {
  const LayerStore* store = nullptr;
  const RecallRowReader* reader = nullptr;  // null or empty: store.key_row(0, u)
  const uint16_t* sidecar = nullptr;        // [n_indexed, d_r] branch copy, or null
  int k_dim = 0;
};
inline const uint16_t* GetRow(const RowSrc& s, int64_t u, uint16_t* scratch) {
  if (s.reader != nullptr && *s.reader) return (*s.reader)(u, scratch);
  return s.store->key_row(0, u);
}

// The index keeps csk in tiles of kRecallTileRows consecutive rows, channel-major within a tile:
// csk of row u, channel k at [(u / 16) * r * 16 + k * 16 + u % 16].
constexpr int kRecallTileRows = 16;
// Scan operands carry the active heads padded with zero queries to a multiple of this.
constexpr int kRecallHeadPad = 16;
inline int64_t CskAt(int64_t u, int k, int r) {
  return (u / kRecallTileRows) * r * kRecallTileRows + static_cast<int64_t>(k) * kRecallTileRows +
         u % kRecallTileRows;
}

// Writes head h's [dd] operand into the scan layout [heads / 16, dd, 16].
inline void PutQuery(const float* qh, int64_t dd, int h, float* q) {
  float* g = q + h / kRecallHeadPad * dd * kRecallHeadPad + h % kRecallHeadPad;
  for (int64_t c = 0; c < dd; ++c) g[c * kRecallHeadPad] = qh[c];
}

// One scan's operands (see RecallScanTilesImpl).
struct ScanArgs {
  // [n_heads_pad / 16, d_r + r, 16] [bf16(q_r) ; f16(qsk)] as f32: channel-major per group of 16
  // heads (QueryOperands); the padding heads are zero.
  const float* q = nullptr;
  int n_heads = 0;             // active heads
  int n_heads_pad = 0;         // multiple of kRecallHeadPad
  const float* cq = nullptr;   // [n_heads] lam * qres / sqrt(d_c - r)
  const float* thr = nullptr;  // [n_heads] max1 - margin
  float lam = 1.f, z = 0.f;
  const RowSrc* src = nullptr;
  int d_c = 0, d_r = 0, r = 0;
  const uint16_t* csk = nullptr;        // tiled, see CskAt
  const float* eta = nullptr;           // [n_tiles * 16], zero padded
  const uint16_t* arch_mask = nullptr;  // [n_tiles] bit i: row 16 t + i archived
};

}  // namespace recall_internal
}  // namespace strata
#endif  // STRATA_KV_RECALL_ONCE_

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
using recall_internal::GetRow;
using recall_internal::kRecallHeadPad;
using recall_internal::kRecallTileRows;
using recall_internal::RowSrc;
using recall_internal::ScanArgs;
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

// f32 dot product (vector lanes, then a horizontal sum, then a scalar tail).
float RecallDotImpl(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
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
// FMA targets (-ffp-contract=fast is its C++ default), which would round the spec's score
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
  void Size(const ScanArgs& a) {
    const size_t nb = static_cast<size_t>((a.d_r + 1) / 2) * kRecallTileRows;
    if (br.size() < nb) br.Resize(nb);
    const size_t nc = static_cast<size_t>(a.r) * kRecallTileRows;
    if (csk.size() < nc) csk.Resize(nc);
    const size_t ns = static_cast<size_t>(a.n_heads_pad) * kRecallTileRows;
    if (s.size() < ns) s.Resize(ns);
    const size_t nr = static_cast<size_t>(kRecallTileRows) * a.src->k_dim;
    if (rows.size() < nr) rows.resize(nr);
  }
};

// p[i] = the branch [d_r] bf16 of rows[i], or null where rows[i] < 0 (any row source).
HWY_INLINE void BranchPtrs(const ScanArgs& a, const int64_t* rows, TileScratch* sc,
                           const uint16_t** p) {
  for (int i = 0; i < kRecallTileRows; ++i) {
    const int64_t u = rows[i];
    if (u < 0) {
      p[i] = nullptr;
    } else if (a.src->sidecar != nullptr) {
      p[i] = a.src->sidecar + u * a.d_r;
    } else {
      p[i] = GetRow(*a.src, u, sc->rows.data() + static_cast<size_t>(i) * a.src->k_dim) + a.d_c;
    }
  }
}

// The same for the archived rows (bits of mask) of tile t read from the store: a page holds
// kPageRows consecutive rows k_dim apart and a tile never straddles pages, so one key_row per tile
// gives all 16 (the derived pointer of the last row is checked against the store).
HWY_INLINE void StoreTilePtrs(const ScanArgs& a, int64_t t, uint32_t mask, const uint16_t** p) {
  static_assert(LayerStore::kPageRows % kRecallTileRows == 0, "a tile lies in one page");
  const int first = static_cast<int>(hwy::Num0BitsBelowLS1Bit_Nonzero32(mask));
  const int last = 31 - static_cast<int>(hwy::Num0BitsAboveMS1Bit_Nonzero32(mask));
  const int64_t u0 = t * kRecallTileRows;
  const int64_t k = a.src->k_dim;
  const uint16_t* base = a.src->store->key_row(0, u0 + first) + a.d_c;
  STRATA_CHECK(a.src->store->key_row(0, u0 + last) + a.d_c == base + (last - first) * k);
  for (int i = 0; i < kRecallTileRows; ++i)
    p[i] = (mask >> i) & 1 ? base + (i - first) * k : nullptr;
}

// Stages the branches p[i] (null: zero) as channel-major words: br[j * 16 + i] holds bf16
// channels 2j (low half) and 2j + 1 (high half) of row i.
HWY_INLINE void StageBranches(const ScanArgs& a, const uint16_t* const* p, TileScratch* sc) {
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
HWY_INLINE void TileAllHeads(const ScanArgs& a, const uint16_t* csk, TileScratch* sc) {
  const int64_t group = static_cast<int64_t>(a.d_r + a.r) * kRecallHeadPad;
  for (int h0 = 0; h0 < a.n_heads; h0 += kH) {
    TileDots(a.q + h0 / kRecallHeadPad * group + h0 % kRecallHeadPad, sc->br.data(), a.d_r, csk,
             a.r, sc->s.data() + static_cast<int64_t>(h0) * kRecallTileRows);
  }
}

// Scan of tiles [t_begin, t_end): fire[t - t_begin] = bit i set iff archived row 16 t + i fires
// for some head; *fired += (head, row) pairs that fired.
void RecallScanTilesImpl(const ScanArgs* a_, int64_t t_begin, int64_t t_end, uint16_t* fire,
                         int64_t* fired) {
  const ScanArgs& a = *a_;
  thread_local TileScratch sc;
  sc.Size(a);
  const DF df;
  constexpr int N = kN16;
  const bool from_store = a.src->sidecar == nullptr && !(a.src->reader && *a.src->reader);
  const int64_t tile_csk = static_cast<int64_t>(a.r) * kRecallTileRows;
  // Branch pointers of tile t. From the store they are taken one tile ahead and prefetched (the
  // branch sits at a 2 (d_c + d_r)-byte stride); a reader's scratch is only valid until its next
  // call, so that source is read tile by tile.
  auto tile_ptrs = [&](int64_t t, const uint16_t** p) {
    const uint32_t m = a.arch_mask[t];
    if (from_store) {
      StoreTilePtrs(a, t, m, p);
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
    // score = lam * dot + z * (cq_h * eta_u), fire iff score > thr_h (the spec's f32 op order).
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
void RecallIndexDotsImpl(const ScanArgs* a_, const int64_t* rows, int64_t n, float* out,
                         int64_t out_stride) {
  const ScanArgs& a = *a_;
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
void RecallScoreRowsImpl(const float* q, int G, int dk, const RowSrc* src, const int64_t* rows,
                   int64_t begin, int64_t n, float lam, float* out, int64_t out_stride) {
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
      tile::Bf16RowToF32(GetRow(*src, u, sc.row.data()), dk, dk, kt + i * dp);
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

HWY_EXPORT(RecallDotImpl);
HWY_EXPORT(RecallIndexDotsImpl);
HWY_EXPORT(RecallScanTilesImpl);
HWY_EXPORT(RecallScoreRowsImpl);

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kF16Limit = 6e4f;  // |csk|, |qsk| must stay below this (f16 max is 65504)

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(RecallDotImpl)(a, b, n);
}

// Runs fn(b, e) over [0, n) on the pool (or inline), in grain-aligned static chunks.
void ParallelRows(ThreadPool* pool, int64_t n, int64_t grain,
                  const std::function<void(int64_t, int64_t, int)>& fn) {
  if (pool == nullptr || pool->size() == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  pool->ParallelForGrain(n, grain, fn);
}

// out [G, n]: lam * q_h . row for rows (or [begin, begin + n)), multi-threaded over rows.
void ScoreRows(const recall_internal::RowSrc& src, const float* q, int G, const int64_t* rows,
               int64_t begin, int64_t n, float lam, float* out, ThreadPool* pool) {
  ParallelRows(pool, n, 64, [&](int64_t b, int64_t e, int) {
    if (e <= b) return;
    HWY_DYNAMIC_DISPATCH(RecallScoreRowsImpl)(q, G, src.k_dim, &src, rows ? rows + b : nullptr,
                                        begin + b, e - b, lam, out + b, n);
  });
}

recall_internal::RowSrc StoreSrc(const LayerStore& store) {
  recall_internal::RowSrc s;
  s.store = &store;
  s.k_dim = store.geometry().k_dim;
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Options

std::string_view RecallCalibrationName(RecallCalibration c) {
  return c == RecallCalibration::kPrefix ? "prefix" : "decode";
}
std::string_view RecallZFloorName(RecallZFloor f) { return f == RecallZFloor::kNone ? "none" : "0"; }

std::vector<SettingDecl> RecallSettingDecls() {
  const RecallOptions o;
  return {
      SettingDecl::Int("rank", o.rank,
                       "recall: basis rank r; when not given, lowered to fit d_c (small models)")
          .Min(8)
          .Constraint("a multiple of 8, <= d_c")
          .Alias("recall-rank")
          .Shared(),
      SettingDecl::Int("recall-capacity", o.capacity,
                       "recall: fetch buffer rows; an overflow reads densely (or truncates)")
          .Min(1)
          .Shared(),
      SettingDecl::Real("recall-margin", o.margin, "recall: a row fires iff score > max1 - margin")
          .Min(0),
      SettingDecl::Enum("recall-overflow", o.truncate ? "truncate" : "fallback",
                        {"fallback", "truncate"},
                        "recall: more fired rows than the buffer: dense fallback or truncate"),
      SettingDecl::Enum("calibration", std::string(RecallCalibrationName(o.calibration)),
                        {"prefix", "decode"},
                        "recall: the threshold is calibrated on prompt or on decode queries")
          .Shared(),
      SettingDecl::Enum("z-floor", std::string(RecallZFloorName(o.z_floor)), {"none", "0"},
                        "recall: floor of the calibrated threshold z (0: never below 0)"),
      SettingDecl::Int("calib-queries", o.prefix_max_queries,
                       "recall: prompt queries labelled for calibration (0: all)")
          .Min(0),
      SettingDecl::Bool("recall-sidecar", o.branch_sidecar,
                        "recall: the scan keeps its own bf16 copy of the branch (always on with "
                        "archive=file:DIR)"),
  };
}

StatusOr<RecallOptions> RecallOptions::FromSpec(const PolicySpec& spec) {
  PolicySettings decl;
  decl.policy = spec.name.empty() ? "recall" : spec.name;
  decl.settings = RecallSettingDecls();
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(decl, spec.settings));
  return FromSettings(s);
}

StatusOr<RecallOptions> RecallOptions::FromSettings(const ResolvedSettings& s) {
  RecallOptions o;
  const int64_t rank = s.Int("rank");
  o.capacity = s.Int("recall-capacity");
  o.margin = static_cast<float>(s.Real("recall-margin"));
  o.prefix_max_queries = static_cast<int>(s.Int("calib-queries"));
  o.branch_sidecar = s.Bool("recall-sidecar");
  o.rank = static_cast<int>(rank);
  o.truncate = s.text("recall-overflow") == "truncate";
  o.calibration =
      s.text("calibration") == "decode" ? RecallCalibration::kDecode : RecallCalibration::kPrefix;
  o.z_floor = s.text("z-floor") == "none" ? RecallZFloor::kNone : RecallZFloor::kZero;
  if (rank < 8 || rank % 8 != 0 || rank > (1 << 20)) {
    return InvalidArgument("--recall-rank must be a positive multiple of 8, got " +
                           std::to_string(rank));
  }
  return o;
}

Status RecallOptions::Validate(int d_c) const {
  if (rank < 8 || rank % 8 != 0 || rank > d_c) {
    return InvalidArgument("--recall-rank must be a multiple of 8 in [8, " + std::to_string(d_c) +
                           "], got " + std::to_string(rank));
  }
  if (capacity < 1) {
    return InvalidArgument("--recall-capacity must be >= 1, got " + std::to_string(capacity));
  }
  if (!(margin >= 0.f) || !std::isfinite(margin)) {
    return InvalidArgument("--recall-margin must be finite and >= 0, got " + std::to_string(margin));
  }
  if (prefix_max_queries < 0) {
    return InvalidArgument("--calib-queries must be >= 0, got " +
                           std::to_string(prefix_max_queries));
  }
  if (decode_start < 1 || decode_max < decode_start) {
    return InvalidArgument("decode calibration window must satisfy 1 <= start <= max, got " +
                           std::to_string(decode_start) + ", " + std::to_string(decode_max));
  }
  return OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Configuration and index

Status RecallTier::Configure(const LayerGeometry& g, const RecallOptions& opt) {
  if (g.kind != AttnKind::kMla) {
    return InvalidArgument("recall tier needs an MLA layer, got " + g.ToString());
  }
  const int d_c = g.k_dim - g.rope_dim;
  if (g.rope_dim < 1 || d_c < 8) {
    return InvalidArgument("recall tier needs d_c >= 8 and d_r >= 1, got " + g.ToString());
  }
  RETURN_IF_ERROR(opt.Validate(d_c));
  *this = RecallTier();
  opt_ = opt;
  n_heads_ = g.n_q_heads;
  d_c_ = d_c;
  d_r_ = g.rope_dim;
  lam_ = g.scale;
  z_ = kRecallZMax;
  thr_g_ = kNegInf;
  basis_.assign(static_cast<size_t>(opt.rank) * d_c, 0.f);
  for (int k = 0; k < opt.rank; ++k) basis_[static_cast<size_t>(k) * d_c + k] = 1.f;
  collecting_ = opt.calibration == RecallCalibration::kDecode;
  decode_window_ = opt.decode_start;
  return OkStatus();
}

recall_internal::RowSrc RecallTier::Src(const LayerStore& store) const {
  recall_internal::RowSrc s;
  s.store = &store;
  s.reader = &reader_;
  s.sidecar = opt_.branch_sidecar ? branch_.data() : nullptr;
  s.k_dim = d_c_ + d_r_;
  return s;
}

void RecallTier::SetRowReader(RecallRowReader reader) { reader_ = std::move(reader); }

std::vector<uint16_t> RecallTier::csk(int64_t u) const {
  STRATA_CHECK(u >= 0 && u < n_indexed_);
  std::vector<uint16_t> out(opt_.rank);
  for (int k = 0; k < opt_.rank; ++k) out[k] = csk_[recall_internal::CskAt(u, k, opt_.rank)];
  return out;
}

float RecallTier::eta(int64_t u) const {
  STRATA_CHECK(u >= 0 && u < n_indexed_);
  return eta_[u];
}

int64_t RecallTier::ResidentBytes() const {
  return static_cast<int64_t>(basis_.size() * 4 + csk_.size() * 2 + eta_.size() * 4 +
                              branch_.size() * 2 +
                              arch_.size() * 8 + arch_mask_.size() * 2 + fetch_.capacity() * 8 +
                              tile_fire_.capacity() * 2 +
                              qbuf_.size() * 4 + qpos_.size() * 8);
}

Status RecallTier::ProjectRows(const LayerStore& store, const float* basis, int64_t begin,
                               int64_t end, uint16_t* csk, float* eta, int64_t* bad_row,
                               ThreadPool* pool) const {
  const int r = opt_.rank, dc = d_c_;
  const int64_t n = end - begin;
  if (n <= 0) return OkStatus();
  const int T = pool ? pool->size() : 1;
  const recall_internal::RowSrc src = Src(store);
  // First failing row per chunk: (row, channel, value).
  struct Bad {
    int64_t row = -1;
    int ch = 0;
    float value = 0.f;
  };
  std::vector<Bad> bad(T);
  ParallelRows(pool, n, 16, [&](int64_t b, int64_t e, int k) {
    std::vector<float> c(dc), res(dc), p(r);
    std::vector<uint16_t> scratch(src.k_dim);
    for (int64_t i = b; i < e; ++i) {
      const int64_t u = begin + i;
      const uint16_t* row = GetRow(src, u, scratch.data());
      for (int j = 0; j < dc; ++j) c[j] = Bf16ToF32(row[j]);
      for (int kk = 0; kk < r; ++kk) p[kk] = Dot(basis + static_cast<size_t>(kk) * dc, c.data(), dc);
      res = c;
      for (int kk = 0; kk < r; ++kk) {
        const float pk = p[kk];
        const float* v = basis + static_cast<size_t>(kk) * dc;
        for (int j = 0; j < dc; ++j) res[j] -= v[j] * pk;
      }
      eta[u] = std::sqrt(Dot(res.data(), res.data(), dc));
      for (int kk = 0; kk < r; ++kk) {
        if (!(std::fabs(p[kk]) < kF16Limit) && bad[k].row < 0) bad[k] = {u, kk, p[kk]};
        csk[recall_internal::CskAt(u, kk, r)] = F32ToF16(p[kk]);
      }
    }
  });
  for (const Bad& x : bad) {
    if (x.row >= 0 && (*bad_row < 0 || x.row < *bad_row)) *bad_row = x.row;
  }
  if (*bad_row >= 0) {
    for (const Bad& x : bad) {
      if (x.row == *bad_row) {
        return OutOfRange("recall index: csk of row " + std::to_string(x.row) + " channel " +
                          std::to_string(x.ch) + " is " + std::to_string(x.value) +
                          ", outside the f16 range |csk| < 6e4");
      }
    }
  }
  return OkStatus();
}

Status RecallTier::IndexClosedRows(const LayerStore& store, int64_t n_closed) {
  STRATA_CHECK(configured());
  STRATA_CHECK(n_closed <= store.n_rows());
  if (n_closed <= n_indexed_) return OkStatus();
  constexpr int64_t kT = recall_internal::kRecallTileRows;
  const int r = opt_.rank;
  // Tiles of 16 rows; the lanes past n_indexed() stay zero.
  csk_.resize(static_cast<size_t>((n_closed + kT - 1) / kT) * kT * r, 0);
  eta_.resize(static_cast<size_t>((n_closed + kT - 1) / kT) * kT, 0.f);
  int64_t bad = -1;
  Status s = ProjectRows(store, basis_.data(), n_indexed_, n_closed, csk_.data(), eta_.data(),
                         &bad, nullptr);
  const int64_t first = n_indexed_;
  n_indexed_ = bad >= 0 ? bad : n_closed;
  const int64_t n_tiles = (n_indexed_ + kT - 1) / kT;
  csk_.resize(static_cast<size_t>(n_tiles) * kT * r);
  eta_.resize(static_cast<size_t>(n_tiles) * kT);
  for (int64_t u = n_indexed_; u < n_tiles * kT; ++u) {
    eta_[u] = 0.f;
    for (int k = 0; k < r; ++k) csk_[recall_internal::CskAt(u, k, r)] = 0;
  }
  arch_mask_.resize(n_tiles, 0);
  if (opt_.branch_sidecar) {
    branch_.resize(static_cast<size_t>(n_indexed_) * d_r_);
    std::vector<uint16_t> scratch(d_c_ + d_r_);
    const recall_internal::RowSrc src = Src(store);
    for (int64_t u = first; u < n_indexed_; ++u) {
      const uint16_t* row = recall_internal::GetRow(src, u, scratch.data());
      std::copy(row + d_c_, row + d_c_ + d_r_, branch_.begin() + u * d_r_);
    }
  }
  return s;
}

void RecallTier::SetArchive(const int64_t* rows, int64_t n) {
  STRATA_CHECK(configured());
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK_MSG(rows[i] >= 0 && rows[i] < n_indexed_, "archived row %lld not indexed (%lld)",
                     static_cast<long long>(rows[i]), static_cast<long long>(n_indexed_));
    STRATA_CHECK_MSG(i == 0 || rows[i] > rows[i - 1], "archive must be ascending and distinct");
  }
  arch_.assign(rows, rows + n);
  constexpr int64_t kT = recall_internal::kRecallTileRows;
  arch_mask_.assign((n_indexed_ + kT - 1) / kT, 0);
  for (int64_t i = 0; i < n; ++i) {
    arch_mask_[rows[i] / kT] |= static_cast<uint16_t>(1u << (rows[i] % kT));
  }
}

Status RecallTier::SetBasis(const LayerStore& store, const float* v, ThreadPool* pool) {
  STRATA_CHECK(configured());
  const size_t sz = static_cast<size_t>(opt_.rank) * d_c_;
  // Indexed rows are re-projected; nothing changes unless every row stays in range.
  std::vector<float> basis(v, v + sz);
  std::vector<uint16_t> csk(csk_.size());
  std::vector<float> eta(eta_.size());
  int64_t bad = -1;
  RETURN_IF_ERROR(ProjectRows(store, basis.data(), 0, n_indexed_, csk.data(), eta.data(), &bad,
                              pool));
  basis_ = std::move(basis);
  csk_ = std::move(csk);
  eta_ = std::move(eta);
  return OkStatus();
}

void RecallTier::SetCalibration(float z, float gate_thr) {
  STRATA_CHECK(configured());
  z_ = z;
  thr_g_ = gate_thr;
  collecting_ = false;
}

// ------------------------------------------------------------------------------------------------
// Scan

bool RecallTier::needs_entropy() const { return std::isfinite(thr_g_); }

void RecallTier::PrepareQuery(const float* q, QueryPrep* p) const {
  const int G = n_heads_, r = opt_.rank, dc = d_c_, dr = d_r_, k = dc + dr;
  p->dp = dr + r;
  const int g_pad = (G + recall_internal::kRecallHeadPad - 1) / recall_internal::kRecallHeadPad *
                    recall_internal::kRecallHeadPad;
  p->qcat.assign(static_cast<size_t>(g_pad) * p->dp, 0.f);
  p->cq.assign(G, 0.f);
  p->in_range = true;
  std::vector<float> qsk(r), res(dc);
  const float inv_sqrt = dc > r ? 1.f / std::sqrt(static_cast<float>(dc - r)) : 0.f;
  for (int h = 0; h < G; ++h) {
    const float* qc = q + static_cast<int64_t>(h) * k;
    const float* qr = qc + dc;
    float* out = p->qcat.data() + h * p->dp;
    for (int j = 0; j < dr; ++j) out[j] = Bf16ToF32(F32ToBf16(qr[j]));
    for (int kk = 0; kk < r; ++kk) {
      qsk[kk] = Dot(basis_.data() + static_cast<size_t>(kk) * dc, qc, dc);
      if (!(std::fabs(qsk[kk]) < kF16Limit)) p->in_range = false;
      out[dr + kk] = F16ToF32(F32ToF16(qsk[kk]));
    }
    std::copy(qc, qc + dc, res.begin());
    for (int kk = 0; kk < r; ++kk) {
      const float pk = qsk[kk];
      const float* v = basis_.data() + static_cast<size_t>(kk) * dc;
      for (int j = 0; j < dc; ++j) res[j] -= v[j] * pk;
    }
    const float qres = std::sqrt(Dot(res.data(), res.data(), dc));
    p->cq[h] = lam_ * qres * inv_sqrt;
  }
}

void RecallTier::IndexScores(const LayerStore& store, const float* q, const int64_t* rows,
                             int64_t n, float* idx, float* cert) const {
  STRATA_CHECK(configured());
  for (int64_t i = 0; i < n; ++i) STRATA_CHECK(rows[i] >= 0 && rows[i] < n_indexed_);
  QueryPrep p;
  PrepareQuery(q, &p);
  if (n == 0) return;
  const recall_internal::RowSrc src = Src(store);
  recall_internal::ScanArgs a;
  const int g_pad = static_cast<int>(p.qcat.size() / p.dp);
  std::vector<float> qt(p.qcat.size());
  for (int h = 0; h < g_pad; ++h) {
    recall_internal::PutQuery(p.qcat.data() + h * p.dp, p.dp, h, qt.data());
  }
  a.q = qt.data();
  a.n_heads = n_heads_;
  a.n_heads_pad = g_pad;
  a.lam = lam_;
  a.src = &src;
  a.d_c = d_c_;
  a.d_r = d_r_;
  a.r = opt_.rank;
  a.csk = csk_.data();
  a.eta = eta_.data();
  HWY_DYNAMIC_DISPATCH(RecallIndexDotsImpl)(&a, rows, n, idx, n);
  for (int h = 0; h < n_heads_; ++h)
    for (int64_t i = 0; i < n; ++i) cert[h * n + i] = p.cq[h] * eta_[rows[i]];
}

RecallScan RecallTier::Scan(const LayerStore& store, const float* q, int64_t limit,
                            const float* max1, const float* entropy, ThreadPool* pool) {
  STRATA_CHECK(configured());
  STRATA_CHECK(limit >= 0 && limit <= store.n_rows());
  if (opt_.calibration == RecallCalibration::kDecode) MaybeCalibrateDecode(store, q, limit, pool);
  RecallScan out;
  fetch_.clear();
  const int64_t na = static_cast<int64_t>(arch_.size());
  if (na == 0) return out;
  STRATA_CHECK_MSG(arch_.back() < limit, "archived row %lld not visible (limit %lld)",
                   static_cast<long long>(arch_.back()), static_cast<long long>(limit));
  ++counters_.scans;
  counters_.scanned_rows += na;
  counters_.index_bytes_read += na * scan_bytes_per_row();

  QueryPrep p;
  PrepareQuery(q, &p);
  if (!p.in_range) {  // the sketch cannot be formed in f16: read everything, exactly
    out.overflow = out.fallback = true;
    ++counters_.fallbacks;
    return out;
  }
  // Active heads (gate open), their operands and thresholds.
  // The caller decided whether to pass the entropy before this call; when a decode-mode
  // calibration installed a gate threshold just now, the gate stays open for this step (it can
  // only add fires, never lose one).
  const bool gated = needs_entropy() && entropy != nullptr;
  std::vector<int> heads;
  for (int h = 0; h < n_heads_; ++h) {
    if (gated && !(entropy[h] > thr_g_)) {
      ++counters_.gated_heads;
      continue;
    }
    heads.push_back(h);
  }
  if (heads.empty()) return out;
  const int A = static_cast<int>(heads.size());
  constexpr int kHp = recall_internal::kRecallHeadPad;
  constexpr int64_t kT = recall_internal::kRecallTileRows;
  const int a_pad = (A + kHp - 1) / kHp * kHp;
  std::vector<float> qcat(static_cast<size_t>(a_pad) * p.dp, 0.f), cq(A), thr(A);
  for (int a = 0; a < A; ++a) {
    const int h = heads[a];
    recall_internal::PutQuery(p.qcat.data() + h * p.dp, p.dp, a, qcat.data());
    cq[a] = p.cq[h];
    thr[a] = max1[h] - opt_.margin;
  }
  const recall_internal::RowSrc src = Src(store);
  recall_internal::ScanArgs args;
  args.q = qcat.data();
  args.n_heads = A;
  args.n_heads_pad = a_pad;
  args.cq = cq.data();
  args.thr = thr.data();
  args.lam = lam_;
  args.z = z_;
  args.src = &src;
  args.d_c = d_c_;
  args.d_r = d_r_;
  args.r = opt_.rank;
  args.csk = csk_.data();
  args.eta = eta_.data();
  args.arch_mask = arch_mask_.data();
  // Tiles [t_lo, t_hi) hold the archive; a tile's kept rows are computed and masked out.
  const int64_t t_lo = arch_.front() / kT, t_hi = arch_.back() / kT + 1;
  tile_fire_.assign(t_hi - t_lo, 0);
  const int T = pool ? pool->size() : 1;
  std::vector<int64_t> fired(T, 0);
  ParallelRows(pool, t_hi - t_lo, 4, [&](int64_t b, int64_t e, int k) {
    if (e <= b) return;
    HWY_DYNAMIC_DISPATCH(RecallScanTilesImpl)(&args, t_lo + b, t_lo + e, tile_fire_.data() + b,
                                              &fired[k]);
  });
  for (int64_t c : fired) counters_.fired += c;
  // Position-order compaction (tiles ascend, and bits within a tile).
  int64_t n_fired = 0;
  for (uint16_t m : tile_fire_) n_fired += hwy::PopCount(m);
  out.n_fired = n_fired;
  if (n_fired > opt_.capacity) {
    out.overflow = true;
    if (!opt_.truncate) {
      out.fallback = true;
      ++counters_.fallbacks;
      return out;
    }
    ++counters_.truncations;
  }
  const int64_t keep = std::min<int64_t>(n_fired, opt_.capacity);
  fetch_.reserve(keep);
  for (int64_t t = t_lo; t < t_hi && static_cast<int64_t>(fetch_.size()) < keep; ++t) {
    uint32_t m = tile_fire_[t - t_lo];
    while (m != 0 && static_cast<int64_t>(fetch_.size()) < keep) {
      fetch_.push_back(t * kT + hwy::Num0BitsBelowLS1Bit_Nonzero32(m));
      m &= m - 1;
    }
  }
  out.rows = fetch_.data();
  out.n = static_cast<int64_t>(fetch_.size());
  counters_.fetched += out.n;
  return out;
}

// ------------------------------------------------------------------------------------------------
// Calibration

struct RecallTier::Label {
  int64_t tgt = -1;        // global argmax row
  bool hard = false;       // tgt archived
  int64_t best_arch = -1;  // best archived row (-1: none visible)
  double true_arch = 0;    // its true score
  float max1 = kNegInf;    // max over the attended (non-archived) visible rows
  double entropy = 0;      // entropy (nats) of the softmax over the attended rows
};

void RecallTier::ComputeLabels(const LayerStore& store, ThreadPool* pool,
                               std::vector<Label>* labels) const {
  const int G = n_heads_, k = d_c_ + d_r_;
  const int64_t n_q = static_cast<int64_t>(qpos_.size());
  labels->assign(static_cast<size_t>(n_q) * G, Label());
  std::vector<uint8_t> archived(store.n_rows(), 0);
  for (int64_t u : arch_) archived[u] = 1;
  std::vector<float> s;
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t lim = std::min(qpos_[i] + 1, store.n_rows());
    s.resize(static_cast<size_t>(G) * lim);
    ScoreRows(Src(store), qbuf_.data() + i * G * k, G, nullptr, 0, lim, lam_, s.data(), pool);
    for (int h = 0; h < G; ++h) {
      Label& L = (*labels)[i * G + h];
      const float* sh = s.data() + h * lim;
      float best = kNegInf, best_a = kNegInf;
      for (int64_t u = 0; u < lim; ++u) {
        if (L.tgt < 0 || sh[u] > best) {
          best = sh[u];
          L.tgt = u;
        }
        if (archived[u]) {
          if (L.best_arch < 0 || sh[u] > best_a) {
            best_a = sh[u];
            L.best_arch = u;
          }
        } else {
          L.max1 = std::max(L.max1, sh[u]);
        }
      }
      if (L.tgt >= 0) L.hard = archived[L.tgt] != 0;
      if (L.best_arch >= 0) L.true_arch = best_a;
      if (L.max1 > kNegInf) {
        double d = 0;
        for (int64_t u = 0; u < lim; ++u)
          if (!archived[u]) d += std::exp(static_cast<double>(sh[u]) - L.max1);
        double ent = 0;
        for (int64_t u = 0; u < lim; ++u) {
          if (archived[u]) continue;
          const double pu = std::exp(static_cast<double>(sh[u]) - L.max1) / d;
          ent -= pu * std::log(std::max(pu, 1e-12));
        }
        L.entropy = ent;
      }
    }
  }
}

Status RecallTier::RefitBasis(const LayerStore& store, ThreadPool* pool) {
  const int G = n_heads_, k = d_c_ + d_r_, r = opt_.rank;
  const int64_t n_q = static_cast<int64_t>(qpos_.size());
  std::vector<float> x(static_cast<size_t>(n_q) * G * d_c_);
  for (int64_t i = 0; i < n_q * G; ++i)
    std::copy(qbuf_.begin() + i * k, qbuf_.begin() + i * k + d_c_, x.begin() + i * d_c_);
  std::vector<float> basis(static_cast<size_t>(r) * d_c_);
  RETURN_IF_ERROR(FitRecallBasis(x.data(), n_q * G, d_c_, r, basis.data()));
  return SetBasis(store, basis.data(), pool);
}

void RecallTier::ObserveQuery(int64_t query_pos, const float* q) {
  STRATA_CHECK(configured());
  if (opt_.calibration != RecallCalibration::kPrefix) return;
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  const int64_t i = n_observed_++;
  if (i % obs_stride_ != 0) return;
  qpos_.push_back(query_pos);
  qidx_.push_back(i);
  qbuf_.insert(qbuf_.end(), q, q + k);
  const int64_t cap = opt_.prefix_max_queries;
  if (cap > 0 && static_cast<int64_t>(qpos_.size()) > 2 * cap) {
    // Double the stride: keep the observations whose index is a multiple of it (evenly spread).
    obs_stride_ *= 2;
    size_t w = 0;
    for (size_t j = 0; j < qpos_.size(); ++j) {
      if (qidx_[j] % obs_stride_ != 0) continue;
      qpos_[w] = qpos_[j];
      qidx_[w] = qidx_[j];
      std::copy(qbuf_.begin() + j * k, qbuf_.begin() + (j + 1) * k, qbuf_.begin() + w * k);
      ++w;
    }
    qpos_.resize(w);
    qidx_.resize(w);
    qbuf_.resize(w * k);
  }
}

Status RecallTier::CalibratePrefix(const LayerStore& store, ThreadPool* pool) {
  STRATA_CHECK(configured());
  if (opt_.calibration != RecallCalibration::kPrefix) {
    return InvalidArgument("CalibratePrefix with --calibration decode");
  }
  if (qpos_.empty()) return OkStatus();
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  // Evenly strided subset of at most prefix_max_queries.
  const int64_t have = static_cast<int64_t>(qpos_.size());
  const int64_t cap = opt_.prefix_max_queries;
  if (cap > 0 && have > cap) {
    std::vector<int64_t> pos(cap);
    std::vector<float> buf(static_cast<size_t>(cap) * k);
    for (int64_t j = 0; j < cap; ++j) {
      const int64_t src = j * have / cap;
      pos[j] = qpos_[src];
      std::copy(qbuf_.begin() + src * k, qbuf_.begin() + (src + 1) * k, buf.begin() + j * k);
    }
    qpos_ = std::move(pos);
    qbuf_ = std::move(buf);
  }
  Status st = RefitBasis(store, pool);
  if (st.ok()) {
    std::vector<Label> labels;
    ComputeLabels(store, pool, &labels);
    const int G = n_heads_;
    std::vector<double> hard_ent, all_ent;
    for (const Label& L : labels) {
      if (L.max1 == kNegInf) continue;
      all_ent.push_back(L.entropy);
      if (L.hard) hard_ent.push_back(L.entropy);
    }
    const GateFit gate =
        FitGate(hard_ent, all_ent, kRecallGateAlphaPrefix, kRecallMinHardPrefix);
    std::vector<LadderRow> ladder;
    for (size_t i = 0; i < qpos_.size(); ++i) {
      for (int h = 0; h < G; ++h) {
        const Label& L = labels[i * G + h];
        if (!L.hard) continue;
        std::vector<float> idx(G), cert(G);
        IndexScores(store, qbuf_.data() + i * k, &L.tgt, 1, idx.data(), cert.data());
        LadderRow row;
        row.idx = idx[h];
        row.cert = cert[h];
        row.max1 = L.max1;
        row.gate_open = !std::isfinite(gate.thr) || L.entropy > gate.thr;
        ladder.push_back(row);
      }
    }
    float z = FitLadderZ(ladder, opt_.margin);
    if (opt_.z_floor == RecallZFloor::kZero) z = std::max(z, 0.f);
    z_ = z;
    thr_g_ = gate.thr;
    calibrated_ = true;
    ++counters_.calibrations;
  }
  qpos_.clear();
  qidx_.clear();
  qbuf_.clear();
  qbuf_.shrink_to_fit();
  return st;
}

void RecallTier::MaybeCalibrateDecode(const LayerStore& store, const float* q, int64_t limit,
                                      ThreadPool* pool) {
  if (!collecting_ || arch_.empty()) return;
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  qpos_.push_back(limit - 1);
  qbuf_.insert(qbuf_.end(), q, q + k);
  const int64_t w = static_cast<int64_t>(qpos_.size());
  if (w < decode_window_) return;

  Status st = RefitBasis(store, pool);
  if (!st.ok()) {  // keep the provisional tier (sound at z = 8 up to the basis), stop refitting
    last_error_ = st;
    collecting_ = false;
    return;
  }
  std::vector<Label> labels;
  ComputeLabels(store, pool, &labels);
  const int G = n_heads_;
  std::vector<double> zq, hard_ent, all_ent;
  for (int64_t i = 0; i < w; ++i) {
    std::vector<int64_t> uniq;
    for (int h = 0; h < G; ++h) {
      if (labels[i * G + h].best_arch >= 0) uniq.push_back(labels[i * G + h].best_arch);
    }
    std::sort(uniq.begin(), uniq.end());
    uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
    const int64_t nu = static_cast<int64_t>(uniq.size());
    std::vector<float> idx(static_cast<size_t>(G) * nu), cert(static_cast<size_t>(G) * nu);
    IndexScores(store, qbuf_.data() + i * k, uniq.data(), nu, idx.data(), cert.data());
    for (int h = 0; h < G; ++h) {
      const Label& L = labels[i * G + h];
      if (L.max1 > kNegInf) {
        all_ent.push_back(L.entropy);
        if (L.hard) hard_ent.push_back(L.entropy);
      }
      if (L.best_arch < 0) continue;
      const int64_t j = std::lower_bound(uniq.begin(), uniq.end(), L.best_arch) - uniq.begin();
      zq.push_back(ZRequirement(L.true_arch, idx[h * nu + j], cert[h * nu + j]));
    }
  }
  const ConformalFit fit = FitConformalZ(zq, opt_.z_floor);
  const GateFit gate = FitGate(hard_ent, all_ent, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  z_ = fit.z;
  thr_g_ = gate.thr;
  calibrated_ = true;
  ++counters_.calibrations;
  // Window growth: stop once both fits have their minimum sample, or at decode_max; otherwise
  // grow by doubling or to the predicted size (rounded up to a power of two), unless the
  // prediction exceeds decode_max (then stop with what we have).
  const int64_t n_hard = gate.n_hard;
  bool done = (fit.n >= kRecallMinRowsDecode && n_hard >= kRecallMinRowsDecode) ||
              w >= opt_.decode_max;
  if (!done) {
    const int64_t lim_n = std::min(fit.n, n_hard);
    const double pred = lim_n > 0 ? std::ceil(static_cast<double>(kRecallMinRowsDecode) * w /
                                              static_cast<double>(lim_n))
                                  : std::numeric_limits<double>::infinity();
    if (pred > opt_.decode_max) {
      done = true;
    } else {
      int64_t next = 1;
      while (next < static_cast<int64_t>(pred)) next *= 2;
      decode_window_ = std::min<int64_t>(opt_.decode_max, std::max(2 * w, next));
    }
  }
  if (done) {
    collecting_ = false;
    qpos_.clear();
    qbuf_.clear();
    qbuf_.shrink_to_fit();
  }
}

// ------------------------------------------------------------------------------------------------

namespace {

// AttendedScoreStats over rows served by `src` (G query heads, scale lam).
void AttendedStatsFrom(const recall_internal::RowSrc& src, const float* q, int G, float lam,
                       const int64_t* rows, int64_t n, ThreadPool* pool, float* max1,
                       float* entropy) {
  if (n == 0) {
    for (int h = 0; h < G; ++h) {
      max1[h] = kNegInf;
      entropy[h] = 0.f;
    }
    return;
  }
  std::vector<float> s(static_cast<size_t>(G) * n);
  ScoreRows(src, q, G, rows, 0, n, lam, s.data(), pool);
  for (int h = 0; h < G; ++h) {
    const float* sh = s.data() + h * n;
    float m = kNegInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, sh[i]);
    double d = 0;
    for (int64_t i = 0; i < n; ++i) d += std::exp(static_cast<double>(sh[i]) - m);
    double ent = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double p = std::exp(static_cast<double>(sh[i]) - m) / d;
      ent -= p * std::log(std::max(p, 1e-12));
    }
    max1[h] = m;
    entropy[h] = static_cast<float>(ent);
  }
}

}  // namespace

void AttendedScoreStats(const LayerStore& store, const float* q, const int64_t* rows, int64_t n,
                        ThreadPool* pool, float* max1, float* entropy) {
  const LayerGeometry& g = store.geometry();
  AttendedStatsFrom(StoreSrc(store), q, g.n_q_heads, g.scale, rows, n, pool, max1, entropy);
}

void RecallTier::AttendedStats(const LayerStore& store, const float* q, const int64_t* rows,
                               int64_t n, ThreadPool* pool, float* max1, float* entropy) const {
  STRATA_CHECK(configured());
  // The row source without the branch sidecar: the scores need whole rows.
  recall_internal::RowSrc src = Src(store);
  src.sidecar = nullptr;
  AttendedStatsFrom(src, q, n_heads_, lam_, rows, n, pool, max1, entropy);
}

}  // namespace strata
#endif  // HWY_ONCE
