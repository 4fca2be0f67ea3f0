// Geodesia-KV packed attention over mixed-level blocks (see packed_attention.h).
//
// Version log (2-core AMD EPYC Zen5 host, AVX3 target):
//   v1  Per block, in sub-tiles of 32 tokens: packed codes are unpacked to bytes in natural order
//       (128-bit shifts + byte/word interleaves, LSB-first), promoted to f32 and dequantized with
//       one FMA against the block's f32 scale rows into an L1 tile, once for all G query heads of
//       the KV group; scores come from a 4-head x 4-row register tile and o += P V from a
//       4-head x 4-vector tile (as in kernels/attention.cc); masked tokens (residual overrides,
//       t >= n_valid) get p = 0; a centroid block is one logit + ln(n); a block's residual rows
//       follow it as an exact tile. Measured: see BenchPackedAttention (DISABLED_ dev benches,
//       kv/geodesia/packed_attention_bench_test.cc) / docs/geodesia.md.
//   v2  (when the head dim and value groups are whole vectors) a whole block is one 64-row tile:
//       key steps folded into q per time group (s = (q*step).code + q.lo), value steps into the
//       probabilities per channel group (o += sum_t (p_t*step_t) code_t + sum_t p_t lo_t), codes
//       converted to f32 in registers inside the shared score/value micro-tiles
//       (kernels/attention_tile-inl.h); 2- and 4-bit codes unpacked without interleaving in
//       64-channel "span order" (q and steps permuted alike, outputs folded back at the end);
//       all heads' merge factors from one f64 vector exp; per-block states and per-head
//       selection in the same pass (PackedBlockIO); next-but-one block's slot prefetched during
//       the score phase. Single level, 16k tokens x 8 KV heads, 1 thread: 16-bit 2.9, 8-bit 2.4,
//       4-bit 2.6, 2-bit 2.7, centroid 0.3 ms (v1: 5.1, 3.3-3.7, 3.8, 2.7-3.0, 0.67).
//       The 32-row path above remains for other shapes (e.g. group 8 with AVX-512).
//   v2.1 Value steps/los of two channel groups and key steps in span order by vector even/odd
//       concatenation instead of per-element loops: from cache, 8-bit 3.82 -> 3.5-3.6 ns per
//       (token, head), 4-bit 4.42 -> 4.13-4.17, 2-bit 4.71 -> 4.39-4.42. Tried, slower, not merged
//       (branch experiment/vnni-packed): VNNI int8 dot products with three-piece weights, 8-bit
//       4.66-4.78 ns (the dot loops are cheaper than f32 FMAs; the transposes and the piece
//       splitting cost more than they save). See docs/geodesia.md.
//   v2.2 Moved from kv/geodesia/ to kernels/ (issue 12): the format it reads is
//       kernels/geodesia_format.h, the layer driver and benches stay in kv/geodesia/. Same code.
//   v3  (issue 21 part 3) PackedMath::kInt8, selectable per call (policies: attn-math=f32|int8;
//       f32 stays the default and the exact path): quantized blocks read with integer dot
//       products on the codes. Keys: 16 x 16 dword transposes of the code rows (16 tokens x 4
//       channels per vector), vpdpbusd with the int8 query broadcast from memory ({1to16});
//       values: 4 rows byte-interleaved (16 channels x 4 tokens), vpdpbusd with the int8
//       weights p_t step_t; q' and the weights rounded to TWO int8 pieces (one piece failed the
//       model-level contract for KIVI: mean KL 3.6e-4 / 1.2e-3 nats/token on synthetic llamas,
//       D 64 / 128; two pieces: <= 7e-6). AVX3_DL compiled in this file for vpdpbusd; other
//       targets use plain integer loops (the reference). Measured (host loaded ~18 on 2 cores by
//       other builds; bench attention --kind gqa --q-heads 32 --kv-heads 8 --threads 1, speedup
//       vs full in the same run): ctx 4096, best of 200 steps: geodesia@5 f32 1.82x, int8
//       1.53x; @2.5 2.86x / 2.63x; kivi2 1.60x / 1.02x; kivi4 1.41x / 0.92x. With ONE piece
//       (first version, not kept) ctx 2048 geodesia@2.5 was 3.28x f32 vs 4.17x int8. So on this
//       host the contract-meeting int8 path is slower than f32: the per-block quantization of
//       q' and of the weights (two passes each, per time group / channel group and head), the
//       byte unpacking and the transposes cost more than the FMAs saved; f32 remains what an
//       `auto` choice should pick here. Tried without gain: embedded broadcasts for the int8
//       operands (removing ~1280 shuffle uops per block), 8-head key tiles.
//       KIVI (kv/baselines/kivi.cc) now stores its GQA groups as packed slots (level = bits,
//       group 32) and reads them through this kernel: kivi2 at 16k went from 0.04x of full
//       (1136 ms/step, dequantize-then-attend) to 2.35-2.52x (f32).
//   (session 12, no code change) On a QUIET host the v3 ratios do not hold: bench attention --kind
//       gqa --ctx 16384 --q-heads 32 --kv-heads 8, 1 thread, vs full f32 in the same run:
//       geodesia@5:profile=reference 1.31x, @2.5 1.80x, kivi2 1.14x, kivi4 1.08x (2 threads 1.26x,
//       1.59x, 1.08x, 0.99x); full streams 64 MiB in 3.98 ms, while @2.5 spends ~4.2 ns per
//       (token, query head) on 0.15 of the bytes, this kernel's cache-resident rate: it is bound by
//       its instructions. The loaded-host figures above flattered it (full suffers more from load).
// This file compiles one more Highway target than the rest of the project, AVX3_DL (AVX-512 VNNI,
// for vpdpbusd in the kInt8 path), as kernels/quant_dot.cc does.
#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

#include "kernels/packed_attention.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "hwy/cache_control.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/packed_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/attention_tile-inl.h"

#ifndef STRATA_KERNELS_PACKED_ATTENTION_ONCE_  // this file is re-included once per SIMD target
#define STRATA_KERNELS_PACKED_ATTENTION_ONCE_
namespace strata::geodesia::packed_internal {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline uint64_t ValidMask(int nv) {
  return nv >= 64 ? ~uint64_t{0} : ((uint64_t{1} << nv) - 1);
}
// Overridden tokens of block b among its valid ones.
inline uint64_t OverrideMask(const PackedHeadView& v, int64_t b) {
  return v.res_mask ? (v.res_mask[b] & ValidMask(v.n_valid[b])) : 0;
}
// Residual row of token t of block b (t overridden).
inline int64_t ResidualRow(const PackedHeadView& v, int64_t b, int t) {
  const uint64_t below = t == 0 ? 0 : (v.res_mask[b] & ((uint64_t{1} << t) - 1));
  return v.res_begin[b] + std::popcount(below);
}
inline const uint8_t* SlotPtr(const PackedHeadView& v, int64_t b) {
  return v.slot(b);
}

// kInt8 integer sums, plain loops (the references, and the path of targets without VNNI).
// Rows [r0, r0 + nr): out[h * stride + (t - r0)] = sum_c q[h * D + c] codes[t * D + c].
inline void KeyDotsRows(const uint8_t* codes, int64_t D, int r0, int nr, const int8_t* q,
                        int n_q, int32_t* out, int64_t stride) {
  for (int h = 0; h < n_q; ++h) {
    for (int t = r0; t < r0 + nr; ++t) {
      int32_t acc = 0;
      const uint8_t* row = codes + t * D;
      const int8_t* qh = q + h * D;
      for (int64_t c = 0; c < D; ++c) acc += static_cast<int32_t>(row[c]) * qh[c];
      out[h * stride + (t - r0)] = acc;
    }
  }
}
inline void ValueSumsRows(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                          int32_t* out) {
  for (int h = 0; h < n_q; ++h) {
    for (int64_t c = 0; c < D; ++c) {
      const int8_t* wh = w + ((c / g) * n_q + h) * kBlockTokens;
      int32_t acc = 0;
      for (int t = 0; t < kBlockTokens; ++t) acc += wh[t] * static_cast<int32_t>(codes[t * D + c]);
      out[h * D + c] = acc;
    }
  }
}
inline bool Int8Applies(int D, int g) { return D % 64 == 0 && g % 16 == 0; }

}  // namespace strata::geodesia::packed_internal
#endif  // STRATA_KERNELS_PACKED_ATTENTION_ONCE_

HWY_BEFORE_NAMESPACE();
namespace strata::geodesia {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace pi = packed_internal;
namespace tile = ::strata::HWY_NAMESPACE::tile;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int kTile = 32;  // tokens per sub-tile (32-row path)
constexpr int kTileStride = kTile + tile::kRowSlack;  // its score rows (micro-tiles overrun)
constexpr int kScoreStride = kBlockTokens + tile::kRowSlack;  // whole-block path score rows
constexpr int kSpan = 64;     // channels per span of span-order codes
constexpr int kLayouts = 3;   // output layouts: channel order, 4-bit span order, 2-bit span order

// Span order of `bits`-bit codes (2 or 4): within each 64-channel span (32 bytes at 4 bits, 16
// at 2), field j of every byte is stored contiguously (4 bits: low nibbles, then high; 2 bits:
// bits 0-1, 2-3, 4-5, 6-7), so position p of the span holds channel SpanChannel(bits, p).
constexpr int SpanChannel(int bits, int p) {
  const int per = 8 / bits;       // codes per byte
  const int bytes = kSpan / per;  // bytes per span
  return (p % bytes) * per + p / bytes;
}
constexpr std::array<int, kSpan> MakeSpanPerm(int bits) {
  std::array<int, kSpan> t{};
  for (int p = 0; p < kSpan; ++p) t[p] = SpanChannel(bits, p);
  return t;
}
constexpr std::array<int, kSpan> kSpanPerm4 = MakeSpanPerm(4), kSpanPerm2 = MakeSpanPerm(2);
// The channel of each span position.
inline const int* SpanPerm(int bits) { return bits == 4 ? kSpanPerm4.data() : kSpanPerm2.data(); }

struct Scratch {
  AlignedBuffer<float> q;     // [G, Dp] scaled queries, zero-padded
  AlignedBuffer<float> kt;    // [kTile, Dp] dequantized keys
  AlignedBuffer<float> vt;    // [kTile, Dp] dequantized values
  AlignedBuffer<float> s;     // [G, kTile] scores, then probabilities
  AlignedBuffer<float> o;     // [G, Dp] one tile's unnormalised output (f32)
  AlignedBuffer<double> o64;  // [kLayouts, G, Dp] running output (f64) per code layout
  AlignedBuffer<float> ks;    // [64/g, Dp] key steps of the block (f32)
  AlignedBuffer<float> kl;    // [64/g, Dp] key los
  AlignedBuffer<float> cen;   // [2, Dp] centroid key and value
  AlignedBuffer<uint8_t> codes;  // [kTile * D + 64] unpacked codes
  // Fast path (whole blocks as one tile of 64 rows):
  AlignedBuffer<float> qf;       // [64/g, G, D] q * key step of each time group (codes' order)
  AlignedBuffer<float> qspan;    // [2, G, Dp] q in 4-bit / 2-bit span order
  AlignedBuffer<float> fs;       // [G, kScoreStride] scores, then probabilities
  AlignedBuffer<float> fw;       // [G, 64] probabilities * value step of one channel group
  AlignedBuffer<float> vs, vl;   // [D/g, 64] value steps and los per channel group and token
  AlignedBuffer<uint8_t> kc, vc; // [64 * D + 64] unpacked key and value codes
  std::vector<float> qa;         // [64/g * G] q . key lo of each time group
  std::vector<float> lsum;       // [G] sum_t p_t * value lo of one channel group
  std::vector<float> bm, bd;     // [G] state of the current block (tiles combined)
  std::vector<float> m, tm, td, oc;  // [G] running max, tile max, tile sum; [G * D]
  std::vector<double> d;             // [G] running sum
  std::vector<double> ef;            // [2, G padded] merge exponents / factors
  std::vector<int64_t> rows;     // residual rows of a block
  // kInt8 path:
  AlignedBuffer<uint8_t> kt8;    // [4][D/4][64] key codes, 16-token dword transposes
  AlignedBuffer<int8_t> qi;      // [2G, D] int8 folded queries of one time group (2 pieces)
  AlignedBuffer<int8_t> wi;      // [D/g][2G][64] int8 value weights (2 pieces)
  AlignedBuffer<int32_t> isum;   // [2G, 64] key dots, then [2G, D] value sums
  AlignedBuffer<float> qtmp;     // [2, D] q' of one head and its residual, then weights
  std::vector<float> dq, dq2, aq;  // [G] key scales and offset of one time group
  std::vector<float> ve, ve2, vb;  // [D/g * G] value scales and offset
};

using tile::Bf16RowToF32;
using tile::Grow;

// Unpacks n_bytes LSB-first packed bytes of `bits`-bit codes into codes in natural order.
HWY_INLINE void UnpackBytes(const uint8_t* src, int64_t n_bytes, int bits, uint8_t* dst) {
#if HWY_TARGET == HWY_SCALAR
  UnpackCodes(src, n_bytes * 8 / bits, bits, dst);
#else
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  int64_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // 64 packed bytes at a time: the byte / word interleaves work within 128-bit lanes, so the
  // lanes of their results are put back in order by 64-bit permutes (4-bit) or a 4 x 4 transpose
  // of 128-bit lanes (2-bit).
  if (bits == 4) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
    const __m512i i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    for (; i + 64 <= n_bytes; i += 64) {
      const __m512i v = _mm512_loadu_si512(src + i);
      const __m512i lo = _mm512_and_si512(v, m4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      const __m512i a = _mm512_unpacklo_epi8(lo, hi), b = _mm512_unpackhi_epi8(lo, hi);
      _mm512_storeu_si512(dst + 2 * i, _mm512_permutex2var_epi64(a, i0, b));
      _mm512_storeu_si512(dst + 2 * i + 64, _mm512_permutex2var_epi64(a, i1, b));
    }
  } else {
    const __m512i m2 = _mm512_set1_epi8(3);
    for (; i + 64 <= n_bytes; i += 64) {
      const __m512i v = _mm512_loadu_si512(src + i);
      const __m512i p0 = _mm512_and_si512(v, m2);
      const __m512i p1 = _mm512_and_si512(_mm512_srli_epi16(v, 2), m2);
      const __m512i p2 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m2);
      const __m512i p3 = _mm512_and_si512(_mm512_srli_epi16(v, 6), m2);
      const __m512i a_lo = _mm512_unpacklo_epi8(p0, p1), a_hi = _mm512_unpackhi_epi8(p0, p1);
      const __m512i b_lo = _mm512_unpacklo_epi8(p2, p3), b_hi = _mm512_unpackhi_epi8(p2, p3);
      // w_j lane L: the 16 codes of source bytes [16 L + 4 j, 16 L + 4 j + 4).
      const __m512i w0 = _mm512_unpacklo_epi16(a_lo, b_lo), w1 = _mm512_unpackhi_epi16(a_lo, b_lo);
      const __m512i w2 = _mm512_unpacklo_epi16(a_hi, b_hi), w3 = _mm512_unpackhi_epi16(a_hi, b_hi);
      // Output L = lane L of w0, w1, w2, w3.
      const __m512i x0 = _mm512_shuffle_i64x2(w0, w1, 0x44), x1 = _mm512_shuffle_i64x2(w0, w1, 0xEE);
      const __m512i x2 = _mm512_shuffle_i64x2(w2, w3, 0x44), x3 = _mm512_shuffle_i64x2(w2, w3, 0xEE);
      // x0 = [w0.0, w0.1, w1.0, w1.1], x2 = [w2.0, w2.1, w3.0, w3.1] (x1, x3 likewise lanes 2, 3).
      uint8_t* o = dst + 4 * i;
      _mm512_storeu_si512(o, _mm512_shuffle_i64x2(x0, x2, 0x88));
      _mm512_storeu_si512(o + 64, _mm512_shuffle_i64x2(x0, x2, 0xDD));
      _mm512_storeu_si512(o + 128, _mm512_shuffle_i64x2(x1, x3, 0x88));
      _mm512_storeu_si512(o + 192, _mm512_shuffle_i64x2(x1, x3, 0xDD));
    }
  }
#endif
  if (bits == 4) {
    const auto m4 = hn::Set(d8, 0x0F);
    for (; i + 16 <= n_bytes; i += 16) {
      const auto v = hn::LoadU(d8, src + i);
      const auto lo = hn::And(v, m4);
      const auto hi = hn::ShiftRight<4>(v);
      hn::StoreU(hn::InterleaveLower(d8, lo, hi), d8, dst + 2 * i);
      hn::StoreU(hn::InterleaveUpper(d8, lo, hi), d8, dst + 2 * i + 16);
    }
    for (; i < n_bytes; ++i) {
      dst[2 * i] = src[i] & 0xF;
      dst[2 * i + 1] = src[i] >> 4;
    }
  } else {  // bits == 2
    const auto m2 = hn::Set(d8, 3);
    for (; i + 16 <= n_bytes; i += 16) {
      const auto v = hn::LoadU(d8, src + i);
      const auto p0 = hn::And(v, m2);
      const auto p1 = hn::And(hn::ShiftRight<2>(v), m2);
      const auto p2 = hn::And(hn::ShiftRight<4>(v), m2);
      const auto p3 = hn::ShiftRight<6>(v);
      const auto a_lo = hn::BitCast(d16, hn::InterleaveLower(d8, p0, p1));
      const auto a_hi = hn::BitCast(d16, hn::InterleaveUpper(d8, p0, p1));
      const auto b_lo = hn::BitCast(d16, hn::InterleaveLower(d8, p2, p3));
      const auto b_hi = hn::BitCast(d16, hn::InterleaveUpper(d8, p2, p3));
      uint8_t* o = dst + 4 * i;
      hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d16, a_lo, b_lo)), d8, o);
      hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d16, a_lo, b_lo)), d8, o + 16);
      hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d16, a_hi, b_hi)), d8, o + 32);
      hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d16, a_hi, b_hi)), d8, o + 48);
    }
    for (; i < n_bytes; ++i) {
      for (int j = 0; j < 4; ++j) dst[4 * i + j] = (src[i] >> (2 * j)) & 3;
    }
  }
#endif
}

// Unpacks n_bytes LSB-first packed bytes of kBits-bit codes (2 or 4) into span order: per span
// of 64 codes (64 * kBits / 8 bytes), field j of each byte goes to [j * bytes, (j+1) * bytes).
// n_bytes is a multiple of the span's bytes.
template <int kBits>
HWY_INLINE void UnpackSpansT(const uint8_t* HWY_RESTRICT src, int64_t n_bytes,
                             uint8_t* HWY_RESTRICT dst) {
  constexpr int kSpanBytes = kSpan * kBits / 8;  // 32 or 16
  constexpr int kPer = 8 / kBits;
  const hn::CappedTag<uint8_t, kSpanBytes> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d8));
  const auto mask = hn::Set(d8, static_cast<uint8_t>((1 << kBits) - 1));
  for (int64_t b0 = 0; b0 < n_bytes; b0 += kSpanBytes) {
    uint8_t* out = dst + b0 * kPer;
    for (int64_t o = 0; o < kSpanBytes; o += L) {
      auto v = hn::LoadU(d8, src + b0 + o);
      for (int j = 0; j < kPer; ++j) {
        hn::StoreU(hn::And(v, mask), d8, out + j * kSpanBytes + o);
        v = hn::ShiftRight<kBits>(v);
      }
    }
  }
}

HWY_INLINE void UnpackSpans(const uint8_t* src, int64_t n_bytes, int bits, uint8_t* dst) {
  if (bits == 4) {
    UnpackSpansT<4>(src, n_bytes, dst);
  } else {
    UnpackSpansT<2>(src, n_bytes, dst);
  }
}

// dst[c] = codes[c] * step[c] + lo[c] for c < n (vectors), zeros in [n, dp).
HWY_INLINE void DequantRowVec(const uint8_t* codes, const float* step, const float* lo, int64_t n,
                              int64_t dp, float* dst) {
  const DF df;
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<int32_t, DF> di32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t c = 0;
  for (; c + N <= n; c += N) {
    const VF x = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(du8, codes + c)));
    hn::Store(hn::MulAdd(x, hn::Load(df, step + c), hn::Load(df, lo + c)), df, dst + c);
  }
  for (; c < n; ++c) dst[c] = static_cast<float>(codes[c]) * step[c] + lo[c];
  for (; c < dp; ++c) dst[c] = 0.f;
}

// dst[c] = codes[c] * step + lo over one channel group [0, n).
HWY_INLINE void DequantGroup(const uint8_t* codes, float step, float lo, int64_t n, float* dst) {
  const DF df;
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<int32_t, DF> di32;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF vs = hn::Set(df, step), vl = hn::Set(df, lo);
  int64_t c = 0;
  for (; c + N <= n; c += N) {
    const VF x = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(du8, codes + c)));
    hn::StoreU(hn::MulAdd(x, vs, vl), df, dst + c);
  }
  for (; c < n; ++c) dst[c] = static_cast<float>(codes[c]) * step + lo;
}

// ---- kInt8 primitives (see PackedMath in packed_attention.h) ----

// QuantizeInt8 with Highway: the same IEEE-exact operations, hence the same bytes. *res gets
// sum_i (x_i - d q_i) (f32, this target's order).
HWY_INLINE float QuantizeInt8T(const float* HWY_RESTRICT x, int64_t n, int qmax,
                               int8_t* HWY_RESTRICT q, float* res,
                               float* HWY_RESTRICT resid = nullptr) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  *res = 0.f;
  if (n <= 0) return 0.f;
  VF vmax = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, x + i)));
  float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float d = mx / static_cast<float>(qmax);
  if (!(d > 0.f)) {
    std::memset(q, 0, static_cast<size_t>(n));
    float r = 0.f;
    for (int64_t j = 0; j < n; ++j) r += x[j];
    if (resid != nullptr) std::memcpy(resid, x, static_cast<size_t>(n) * sizeof(float));
    *res = r;
    return 0.f;
  }
  const float id = static_cast<float>(qmax) / mx;
  const VF dv = hn::Set(df, d), idv = hn::Set(df, id);
  const auto lo = hn::Set(di, -qmax), hi = hn::Set(di, qmax);
  VF racc = hn::Zero(df);
  i = 0;
  for (; i + N <= n; i += N) {
    const VF xv = hn::LoadU(df, x + i);
    const auto r = hn::Min(hn::Max(hn::NearestInt(hn::Mul(xv, idv)), lo), hi);
    hn::StoreU(hn::DemoteTo(d8, r), d8, q + i);
    const VF rv = hn::NegMulAdd(dv, hn::ConvertTo(df, r), xv);
    if (resid != nullptr) hn::StoreU(rv, df, resid + i);
    racc = hn::Add(racc, rv);
  }
  float rs = hn::GetLane(hn::SumOfLanes(df, racc));
  for (; i < n; ++i) {
    const float c = std::clamp(std::nearbyint(x[i] * id), static_cast<float>(-qmax),
                               static_cast<float>(qmax));
    q[i] = static_cast<int8_t>(c);
    const float rv = std::fma(-d, c, x[i]);
    if (resid != nullptr) resid[i] = rv;
    rs += rv;
  }
  *res = rs;
  return d;
}

#undef STRATA_PACKED_VNNI  // (defined by the AVX3_DL pass only)
#if HWY_TARGET == HWY_AVX3_DL
#define STRATA_PACKED_VNNI 1
// acc + vpdpbusd(u, s) on zmm registers, written out: Highway 1.0.3's AVX3_DL target attributes
// name AVX-VNNI, not AVX512_VNNI, so the intrinsic does not inline (see kernels/quant_dot.cc).
HWY_INLINE __m512i Dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
// acc + vpdpbusd(u, the 4 signed bytes at p in every lane): an embedded {1to16} broadcast, so
// the broadcast costs no shuffle uop.
HWY_INLINE __m512i DpbusdBcast(__m512i acc, __m512i u, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}
// 16 key rows (16 * r16 ...) of 64 channels at a time, 16 x 16 dword transposes: for 16-row group
// r16 and dword j (channels 4j..4j+3), 64 bytes = row i's 4 codes in dword lane i.
HWY_INLINE void TransposeKeyCodes(const uint8_t* HWY_RESTRICT codes, int64_t D, int n16,
                                  uint8_t* HWY_RESTRICT out) {
  const int64_t nj = D / 4;
  for (int r16 = 0; r16 < n16; ++r16) {
    for (int64_t ch = 0; ch < D / 64; ++ch) {
      __m512i r[16], t[16], u[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = _mm512_loadu_si512(codes + (16 * r16 + i) * D + 64 * ch);
      }
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {  // rows i..i+3: u[i + k] = dword 4L + k of each row
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
      }
      uint8_t* o = out + (r16 * nj + 16 * ch) * 64;
      for (int k = 0; k < 4; ++k) {
        const __m512i x = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        const __m512i y = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
        const __m512i z = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i w = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        _mm512_store_si512(o + (0 + k) * 64, _mm512_shuffle_i32x4(x, z, 0x88));
        _mm512_store_si512(o + (4 + k) * 64, _mm512_shuffle_i32x4(y, w, 0x88));
        _mm512_store_si512(o + (8 + k) * 64, _mm512_shuffle_i32x4(x, z, 0xDD));
        _mm512_store_si512(o + (12 + k) * 64, _mm512_shuffle_i32x4(y, w, 0xDD));
      }
    }
  }
}

// Dots of the 16 rows of group r16 (transposed codes) with n_q int8 queries (q + h * D):
// out[h * stride + i], i < 16.
template <int kH>
HWY_INLINE void KeyDots16H(const uint8_t* HWY_RESTRICT tr, int64_t D, const int8_t* q,
                           int32_t* out, int64_t stride) {
  __m512i acc[kH];
  for (int h = 0; h < kH; ++h) acc[h] = _mm512_setzero_si512();
  const int64_t nj = D / 4;
  for (int64_t j = 0; j < nj; ++j) {
    const __m512i c = _mm512_load_si512(tr + j * 64);
    for (int h = 0; h < kH; ++h) acc[h] = DpbusdBcast(acc[h], c, q + h * D + 4 * j);
  }
  for (int h = 0; h < kH; ++h) _mm512_storeu_si512(out + h * stride, acc[h]);
}

HWY_INLINE void KeyDots16(const uint8_t* tr, int64_t D, const int8_t* q, int n_q, int32_t* out,
                          int64_t stride) {
  int h = 0;
  for (; h + 8 <= n_q; h += 8) KeyDots16H<8>(tr, D, q + h * D, out + h * stride, stride);
  for (; h + 4 <= n_q; h += 4) KeyDots16H<4>(tr, D, q + h * D, out + h * stride, stride);
  switch (n_q - h) {
    case 3: KeyDots16H<3>(tr, D, q + h * D, out + h * stride, stride); break;
    case 2: KeyDots16H<2>(tr, D, q + h * D, out + h * stride, stride); break;
    case 1: KeyDots16H<1>(tr, D, q + h * D, out + h * stride, stride); break;
    default: break;
  }
}

// Value sums of 64 rows, kH heads: out[h * D + c] = sum_t w[(cg(c) * n_q + h) * 64 + t] codes[t][c].
// Four rows of 64 channels are byte-interleaved (v[k] dword (L, i) = channel 16 L + 4 k + i, its 4
// bytes the 4 rows), so one vpdpbusd adds 4 tokens into 16 channels.
template <int kH>
HWY_INLINE void ValueSumsH(const uint8_t* HWY_RESTRICT codes, int64_t D, int g,
                           const int8_t* w, int n_q, int32_t* out) {
  for (int64_t ch = 0; ch < D / 64; ++ch) {
    // Channel group of each 128-bit lane (16 channels) of the chunk.
    int cgl[4];
    for (int L = 0; L < 4; ++L) cgl[L] = static_cast<int>((64 * ch + 16 * L) / g);
    __m512i acc[kH][4];
    for (int h = 0; h < kH; ++h) {
      for (int k = 0; k < 4; ++k) acc[h][k] = _mm512_setzero_si512();
    }
    for (int tq = 0; tq < 16; ++tq) {
      const uint8_t* r = codes + 4 * tq * D + 64 * ch;
      const __m512i r0 = _mm512_loadu_si512(r), r1 = _mm512_loadu_si512(r + D);
      const __m512i r2 = _mm512_loadu_si512(r + 2 * D), r3 = _mm512_loadu_si512(r + 3 * D);
      const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
      const __m512i c = _mm512_unpacklo_epi8(r2, r3), e = _mm512_unpackhi_epi8(r2, r3);
      const __m512i v0 = _mm512_unpacklo_epi16(a, c), v1 = _mm512_unpackhi_epi16(a, c);
      const __m512i v2 = _mm512_unpacklo_epi16(b, e), v3 = _mm512_unpackhi_epi16(b, e);
      if (cgl[3] == cgl[0]) {  // one channel group in the chunk: broadcast from memory
        for (int h = 0; h < kH; ++h) {
          const int8_t* wp = w + (cgl[0] * n_q + h) * 64 + 4 * tq;
          acc[h][0] = DpbusdBcast(acc[h][0], v0, wp);
          acc[h][1] = DpbusdBcast(acc[h][1], v1, wp);
          acc[h][2] = DpbusdBcast(acc[h][2], v2, wp);
          acc[h][3] = DpbusdBcast(acc[h][3], v3, wp);
        }
        continue;
      }
      for (int h = 0; h < kH; ++h) {
        int32_t wd[4];
        for (int L = 0; L < 4; ++L) std::memcpy(&wd[L], w + (cgl[L] * n_q + h) * 64 + 4 * tq, 4);
        __m512i wv = _mm512_set1_epi32(wd[0]);
        if (cgl[3] != cgl[0]) {
          wv = _mm512_mask_set1_epi32(wv, 0x00F0, wd[1]);
          wv = _mm512_mask_set1_epi32(wv, 0x0F00, wd[2]);
          wv = _mm512_mask_set1_epi32(wv, 0xF000, wd[3]);
        }
        acc[h][0] = Dpbusd(acc[h][0], v0, wv);
        acc[h][1] = Dpbusd(acc[h][1], v1, wv);
        acc[h][2] = Dpbusd(acc[h][2], v2, wv);
        acc[h][3] = Dpbusd(acc[h][3], v3, wv);
      }
    }
    for (int h = 0; h < kH; ++h) {
      int32_t* o = out + h * D + 64 * ch;
      for (int k = 0; k < 4; ++k) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 4 * k),
                         _mm512_extracti32x4_epi32(acc[h][k], 0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 + 4 * k),
                         _mm512_extracti32x4_epi32(acc[h][k], 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 + 4 * k),
                         _mm512_extracti32x4_epi32(acc[h][k], 2));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 48 + 4 * k),
                         _mm512_extracti32x4_epi32(acc[h][k], 3));
      }
    }
  }
}

HWY_INLINE void ValueSums(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                          int32_t* out) {
  int h = 0;
  for (; h + 4 <= n_q; h += 4) ValueSumsH<4>(codes, D, g, w + h * 64, n_q, out + h * D);
  switch (n_q - h) {
    case 3: ValueSumsH<3>(codes, D, g, w + h * 64, n_q, out + h * D); break;
    case 2: ValueSumsH<2>(codes, D, g, w + h * 64, n_q, out + h * D); break;
    case 1: ValueSumsH<1>(codes, D, g, w + h * 64, n_q, out + h * D); break;
    default: break;
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

class Runner {
 public:
  Runner(const PackedHeadView& view, const float* q, int G, float scale,
         PackedMath math = PackedMath::kF32)
      : v_(view), G_(G), D_(view.head_dim) {
    const DF df;
    N_ = static_cast<int64_t>(hn::Lanes(df));
    Dp_ = (D_ + N_ - 1) / N_ * N_;
    // Whole-block tiles need the head dim and the value channel groups in whole vectors.
    fast_ = D_ % N_ == 0 && v_.group_size % N_ == 0;
    sc_ = &scratch_;
    Scratch& sc = *sc_;
    Grow(&sc.q, G * Dp_);
    Grow(&sc.kt, kTileStride * Dp_);
    Grow(&sc.vt, kTile * Dp_);
    Grow(&sc.s, G * kTileStride);
    Grow(&sc.o, G * Dp_);
    Grow(&sc.ks, (kBlockTokens / v_.group_size) * Dp_);
    Grow(&sc.kl, (kBlockTokens / v_.group_size) * Dp_);
    Grow(&sc.cen, 2 * Dp_);
    if (sc.codes.size() < static_cast<size_t>(kTile * D_ + 64)) sc.codes.Resize(kTile * D_ + 64);
    // 2- and 4-bit codes are unpacked without interleaving, into "span order" (see SpanChannel)
    // when 64-channel spans fit the head dim and the value groups.
    span_ = fast_ && D_ % kSpan == 0 && v_.group_size % kSpan == 0 && N_ <= 16;
    int8_ = math == PackedMath::kInt8 && fast_ && pi::Int8Applies(D_, v_.group_size);
    const size_t n_o = static_cast<size_t>(kLayouts) * G * Dp_;
    if (sc.o64.size() < n_o) sc.o64.Resize(n_o);
    sc.m.assign(G, pi::kNegInf);
    sc.tm.assign(G, pi::kNegInf);
    sc.td.assign(G, 0.f);
    sc.d.assign(G, 0.0);
    std::fill(sc.o64.data(), sc.o64.data() + n_o, 0.0);
    used_.fill(false);
    for (int h = 0; h < G; ++h) {
      float* dst = sc.q.data() + h * Dp_;
      for (int c = 0; c < D_; ++c) dst[c] = q[h * D_ + c] * scale;
      std::fill(dst + D_, dst + Dp_, 0.f);
    }
  }

  static int LayoutOf(int bits) { return bits == 4 ? 1 : bits == 2 ? 2 : 0; }
  // q in span order ([G, Dp]) per code width, built on first use.
  const float* SpanQ(int bits) {
    const int l = LayoutOf(bits) - 1;
    Scratch& sc = *sc_;
    if (!qspan_ready_[l]) {
      if (sc.qspan.size() < static_cast<size_t>(2 * G_ * Dp_)) sc.qspan.Resize(2 * G_ * Dp_);
      const int* perm = SpanPerm(bits);
      for (int h = 0; h < G_; ++h) {
        const float* src = sc.q.data() + h * Dp_;
        float* dst = sc.qspan.data() + (static_cast<int64_t>(l) * G_ + h) * Dp_;
        for (int64_t c0 = 0; c0 < D_; c0 += kSpan) {
          for (int p = 0; p < kSpan; ++p) dst[c0 + p] = src[c0 + perm[p]];
        }
      }
      qspan_ready_[l] = true;
    }
    return sc.qspan.data() + static_cast<int64_t>(l) * G_ * Dp_;
  }

  // Reads block b into the running state; heads h with sel[h] == 0 do not take it (the block is
  // still evaluated for them). When bm / bd are given, they receive each head's state over the
  // block alone (max and sum of exp(s - max), residual rows included).
  void Block(int64_t b, const uint8_t* sel = nullptr, float* bm = nullptr, float* bd = nullptr) {
    sel_ = sel;
    Scratch& sc = *sc_;
    const bool record = bm != nullptr;
    if (record) {
      sc.bm.assign(G_, pi::kNegInf);
      sc.bd.assign(G_, 0.f);
    }
    record_ = record;
    const int nv = v_.n_valid[b];
    if (nv <= 0 || v_.level[b] == 1 || !fast_) pf_.Drain();  // no spread score phase
    if (nv > 0) {
      const int level = v_.level[b];
      const uint64_t over = pi::OverrideMask(v_, b);
      const uint8_t* slot = pi::SlotPtr(v_, b);
      if (level == 1) {
        Centroid(slot, nv - std::popcount(over));
      } else if (int8_ && level != 16) {
        BlockInt8(slot, level, nv, over);
      } else if (fast_) {
        BlockFast(slot, level, nv, over);
      } else if (level == 16) {
        const SlotLayout L = GetSlotLayout(16, D_, v_.group_size);
        const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
        const uint16_t* vr = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
        for (int t0 = 0; t0 < nv; t0 += kTile) {
          const int nr = std::min(kTile, nv - t0);
          for (int i = 0; i < nr; ++i) Bf16RowToF32(kr + (t0 + i) * D_, D_, Dp_, kt() + i * Dp_);
          Tile(nr, over >> t0, [&](float* vt) {
            for (int i = 0; i < nr; ++i) Bf16RowToF32(vr + (t0 + i) * D_, D_, Dp_, vt + i * Dp_);
          });
        }
      } else {
        Quantized(slot, level, nv, over);
      }
      if (over != 0) Residual(b, over);
    }
    if (record) {
      for (int h = 0; h < G_; ++h) bm[h] = sc.bm[h], bd[h] = sc.bd[h];
    }
    sel_ = nullptr;
    record_ = false;
  }

  // Queues the cache lines of block b's slot: requested a few at a time while the next Block()
  // computes its scores (all at once when issue_now, or when that block has no score phase).
  // NoPrefetch() empties the queue.
  void Prefetch(int64_t b, bool issue_now = false) {
    if (v_.n_valid[b] <= 0) return;
    pf_.Add(pi::SlotPtr(v_, b), SlotBytes(v_.level[b], D_, v_.group_size));
    if (issue_now) pf_.Drain();
  }

  void NoPrefetch() { pf_.Clear(); }

  // Merges the local state into st.
  void Finish(SoftmaxStates* st) {
    Scratch& sc = *sc_;
    sc.oc.resize(static_cast<size_t>(G_) * D_);
    sc.td.resize(G_);
    for (int l = 1; l < kLayouts; ++l) {  // span-order outputs back to channel order
      if (!used_[l]) continue;
      const int* perm = SpanPerm(l == 1 ? 4 : 2);
      for (int h = 0; h < G_; ++h) {
        double* nat = sc.o64.data() + h * Dp_;
        const double* sp = sc.o64.data() + (static_cast<int64_t>(l) * G_ + h) * Dp_;
        for (int c0 = 0; c0 < D_; c0 += kSpan) {
          for (int p = 0; p < kSpan; ++p) nat[c0 + perm[p]] += sp[c0 + p];
        }
      }
    }
    for (int h = 0; h < G_; ++h) {
      for (int c = 0; c < D_; ++c) sc.oc[h * D_ + c] = static_cast<float>(sc.o64[h * Dp_ + c]);
      sc.td[h] = static_cast<float>(sc.d[h]);
    }
    SoftmaxStates local;
    local.n_heads = G_;
    local.dv = D_;
    local.m = sc.m.data();
    local.d = sc.td.data();
    local.o = sc.oc.data();
    MergeStates(st, local);
  }

 private:
  float* kt() { return sc_->kt.data(); }

  void Quantized(const uint8_t* slot, int bits, int nv, uint64_t over) {
    Scratch& sc = *sc_;
    const int g = v_.group_size;
    const SlotLayout L = GetSlotLayout(bits, D_, g);
    const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
    const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
    const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
    const int n_tg = (nv + g - 1) / g;
    for (int tg = 0; tg < n_tg; ++tg) {
      tile::F16ToF32Row(kst + tg * D_, D_, sc.ks.data() + tg * Dp_);
      tile::F16ToF32Row(klo + tg * D_, D_, sc.kl.data() + tg * Dp_);
    }
    const int GV = D_ / g;
    uint8_t* codes = sc.codes.data();
    for (int t0 = 0; t0 < nv; t0 += kTile) {
      const int nr = std::min(kTile, nv - t0);
      // Keys.
      // Sub-tiles start at multiples of 32 tokens, hence on byte boundaries.
      const int64_t tile_off = int64_t{t0} * D_ * bits / 8;
      const int64_t tile_bytes = (int64_t{nr} * D_ * bits + 7) / 8;
      const uint8_t* kc = slot + L.k_codes + tile_off;
      if (bits != 8) {
        UnpackBytes(kc, tile_bytes, bits, codes);
        kc = codes;
      }
      for (int i = 0; i < nr; ++i) {
        const int tg = (t0 + i) / g;
        DequantRowVec(kc + i * D_, sc.ks.data() + tg * Dp_, sc.kl.data() + tg * Dp_, D_, Dp_,
                      kt() + i * Dp_);
      }
      Tile(nr, over >> t0, [&](float* vt) {
        const uint8_t* vc = slot + L.v_codes + tile_off;
        if (bits != 8) {
          UnpackBytes(vc, tile_bytes, bits, codes);
          vc = codes;
        }
        for (int i = 0; i < nr; ++i) {
          const int t = t0 + i;
          float* row = vt + i * Dp_;
          for (int cg = 0; cg < GV; ++cg) {
            DequantGroup(vc + i * D_ + cg * g, F16ToF32(vst[t * GV + cg]),
                         F16ToF32(vlo[t * GV + cg]), g, row + cg * g);
          }
          for (int c = D_; c < Dp_; ++c) row[c] = 0.f;
        }
      });
    }
  }

  void Centroid(const uint8_t* slot, int n) {
    if (n <= 0) return;
    Scratch& sc = *sc_;
    const DF df;
    const uint16_t* kc = reinterpret_cast<const uint16_t*>(slot);
    const uint16_t* vc = kc + D_;
    float* ck = sc.cen.data();
    float* cv = ck + Dp_;
    tile::F16ToF32Row(kc, D_, ck);
    tile::F16ToF32Row(vc, D_, cv);
    for (int c = D_; c < Dp_; ++c) ck[c] = cv[c] = 0.f;
    const float logn = std::log(static_cast<float>(n));
    for (int h = 0; h < G_; ++h) {
      VF acc = hn::Zero(df);
      const float* qh = sc.q.data() + h * Dp_;
      for (int64_t c = 0; c < Dp_; c += N_) {
        acc = hn::MulAdd(hn::Load(df, qh + c), hn::Load(df, ck + c), acc);
      }
      // A one-row tile: max s, sum 1, output the centroid value.
      sc.tm[h] = hn::GetLane(hn::SumOfLanes(df, acc)) + logn;
      sc.td[h] = 1.f;
    }
    MergeTiles(cv, 0);
  }

  // Merges the tile states (tm[h], td[h], to[h * to_stride .. + Dp]) of every head into the
  // running f64 state (heads not selected for the block are skipped; the per-block record is kept
  // for all). Tile states depend only on the tile's rows, never on how the block list was split,
  // and the f64 running state adds no f32 rounding: that is what keeps results split-invariant to
  // ~1e-7. The rescale factors of all heads come from one vector exp.
  void MergeTiles(const float* to, int64_t to_stride, int layout = 0) {
    Scratch& sc = *sc_;
    const int G = G_;
    const hn::ScalableTag<double> dd;
    const hn::Rebind<float, decltype(dd)> dfh;
    const int ND = static_cast<int>(hn::Lanes(dd));
    sc.ef.resize(static_cast<size_t>((G + ND - 1) / ND * ND) * 2);
    double* a = sc.ef.data();             // exponents of the running-state factors, then factors
    double* bw = a + sc.ef.size() / 2;    // exponents of the tile weights, then weights
    for (int h = 0; h < G; ++h) {
      const float tm = sc.tm[h], td = sc.td[h];
      if (record_ && tm != pi::kNegInf) {
        if (tm > sc.bm[h]) {
          sc.bd[h] = sc.bm[h] == pi::kNegInf ? 0.f : sc.bd[h] * std::exp(sc.bm[h] - tm);
          sc.bm[h] = tm;
        }
        // (A block's first tile sets the max: exp(0) = 1 needs no call.)
        sc.bd[h] += tm == sc.bm[h] ? td : td * std::exp(tm - sc.bm[h]);
      }
      const bool take = (sel_ == nullptr || sel_[h] != 0) && tm != pi::kNegInf;
      if (!take) {
        a[h] = 0.0;                // factor 1
        bw[h] = -1e300;            // weight 0
        continue;
      }
      const float m_new = std::max(sc.m[h], tm);
      a[h] = sc.m[h] == pi::kNegInf ? 0.0 : static_cast<double>(sc.m[h]) - m_new;
      bw[h] = static_cast<double>(tm) - m_new;
      sc.m[h] = m_new;
    }
    for (int h = G; h < static_cast<int>(sc.ef.size() / 2); ++h) a[h] = bw[h] = 0.0;
    const auto lo = hn::Set(dd, -1000.0);  // exp(-1000) = 0 and keeps Exp's argument in range
    for (int h = 0; h < G; h += ND) {
      hn::StoreU(hn::Exp(dd, hn::Max(hn::LoadU(dd, a + h), lo)), dd, a + h);
      hn::StoreU(hn::Exp(dd, hn::Max(hn::LoadU(dd, bw + h), lo)), dd, bw + h);
    }
    used_[layout] = true;
    for (int h = 0; h < G; ++h) {
      const double f = a[h], w = bw[h];
      if (w == 0.0) continue;  // not taken (or a tile that weighs nothing)
      sc.d[h] = sc.d[h] * f + w * static_cast<double>(sc.td[h]);
      if (f != 1.0) {  // the running max grew: rescale the other layouts' outputs too
        for (int l = 0; l < kLayouts; ++l) {
          if (l == layout || !used_[l]) continue;
          double* ol = sc.o64.data() + (static_cast<int64_t>(l) * G + h) * Dp_;
          for (int64_t c = 0; c < Dp_; ++c) ol[c] *= f;
        }
      }
      double* oh = sc.o64.data() + (static_cast<int64_t>(layout) * G + h) * Dp_;
      const float* th = to + h * to_stride;
      const auto vf = hn::Set(dd, f), vw = hn::Set(dd, w);
      int64_t c = 0;
      for (; c + ND <= Dp_; c += ND) {
        const auto t = hn::PromoteTo(dd, hn::LoadU(dfh, th + c));
        hn::StoreU(hn::MulAdd(t, vw, hn::Mul(hn::LoadU(dd, oh + c), vf)), dd, oh + c);
      }
      for (; c < Dp_; ++c) oh[c] = oh[c] * f + w * static_cast<double>(th[c]);
    }
  }

  void Residual(int64_t b, uint64_t over) {
    Scratch& sc = *sc_;
    sc.rows.clear();
    for (uint64_t m = over; m != 0; m &= m - 1) {
      sc.rows.push_back(pi::ResidualRow(v_, b, std::countr_zero(m)));
    }
    const int n = static_cast<int>(sc.rows.size());
    for (int t0 = 0; t0 < n; t0 += kTile) {
      const int nr = std::min(kTile, n - t0);
      for (int i = 0; i < nr; ++i) {
        Bf16RowToF32(v_.res_k + sc.rows[t0 + i] * D_, D_, Dp_, kt() + i * Dp_);
      }
      Tile(nr, 0, [&](float* vt) {
        for (int i = 0; i < nr; ++i) {
          Bf16RowToF32(v_.res_v + sc.rows[t0 + i] * D_, D_, Dp_, vt + i * Dp_);
        }
      });
    }
  }

  // One sub-tile: keys already in kt rows [0, nr); rows whose bit is set in `masked` (bit i =
  // row i) are skipped. fill_v(vt) writes the value rows [0, nr) (called only when needed).
  template <class FillV>
  void Tile(int nr, uint64_t masked, const FillV& fill_v) {
    Scratch& sc = *sc_;
    const DF df;
    float* k = kt();
    // The score micro-tiles evaluate up to kRowSlack - 1 rows past nr: zero rows, masked below.
    for (int i = nr; i < nr + tile::kRowSlack - 1; ++i) std::fill(k + i * Dp_, k + (i + 1) * Dp_, 0.f);
    float* s = sc.s.data();
    tile::ScoreTile(sc.q.data(), Dp_, G_, Dp_,
                    [&](int r, int64_t c) { return hn::Load(df, k + r * Dp_ + c); }, nr, s,
                    kTileStride);
    const uint64_t live = (nr >= 64 ? ~uint64_t{0} : ((uint64_t{1} << nr) - 1)) & ~masked;
    if (live == 0) return;
    for (int h = 0; h < G_; ++h) {
      float* sh = s + h * kTileStride;
      for (int i = 0; i < kTile; ++i) {
        if (!((live >> i) & 1)) sh[i] = pi::kNegInf;
      }
      sc.tm[h] = tile::SoftmaxRow(sh, kTile, &sc.td[h]);
    }
    std::fill(sc.o.data(), sc.o.data() + G_ * Dp_, 0.f);
    float* vt = sc.vt.data();
    fill_v(vt);
    tile::AccumTile(s, kTileStride, G_,
                    [&](int t, int64_t c) { return hn::Load(df, vt + t * Dp_ + c); }, nr, 0, Dp_,
                    sc.o.data(), Dp_);
    MergeTiles(sc.o.data(), Dp_);
  }

  // dst[c0 + p] = src[c0 + SpanChannel(bits, p)] per 64-channel span (D a multiple of 64). With
  // 16-lane vectors the span order is even / odd deinterleaving (4-bit: [evens, odds]; 2-bit:
  // channels = 0, 1, 2, 3 mod 4, i.e. [even-even, odd-even, even-odd, odd-odd]).
  void ToSpanOrder(int bits, const float* src, int64_t D, float* dst) const {
    if (N_ != 16 || HWY_TARGET == HWY_SCALAR) {
      const int* perm = SpanPerm(bits);
      for (int64_t c0 = 0; c0 < D; c0 += kSpan) {
        for (int p = 0; p < kSpan; ++p) dst[c0 + p] = src[c0 + perm[p]];
      }
      return;
    }
#if HWY_TARGET != HWY_SCALAR
    const DF df;
    for (int64_t c0 = 0; c0 < D; c0 += kSpan) {
      const float* x = src + c0;
      const VF v0 = hn::Load(df, x), v1 = hn::Load(df, x + 16);
      const VF v2 = hn::Load(df, x + 32), v3 = hn::Load(df, x + 48);
      const VF e0 = hn::ConcatEven(df, v1, v0), e1 = hn::ConcatEven(df, v3, v2);
      const VF o0 = hn::ConcatOdd(df, v1, v0), o1 = hn::ConcatOdd(df, v3, v2);
      float* y = dst + c0;
      if (bits == 4) {
        hn::Store(e0, df, y), hn::Store(e1, df, y + 16);
        hn::Store(o0, df, y + 32), hn::Store(o1, df, y + 48);
      } else {
        hn::Store(hn::ConcatEven(df, e1, e0), df, y);
        hn::Store(hn::ConcatEven(df, o1, o0), df, y + 16);
        hn::Store(hn::ConcatOdd(df, e1, e0), df, y + 32);
        hn::Store(hn::ConcatOdd(df, o1, o0), df, y + 48);
      }
    }
#endif
  }

  // Whole-block tile (fast path): scores of all 64 rows and G heads, one softmax, values folded
  // with their steps. Quantized keys: s = q.(code * step + lo) = (q * step).code + q.lo per time
  // group; values: sum_t p_t (code * step_t + lo_t) = sum_t (p_t step_t) code + sum_t p_t lo_t per
  // channel group. Codes are converted to f32 in registers; 2- and 4-bit codes are unpacked to
  // bytes first.
  void BlockFast(const uint8_t* slot, int level, int nv, uint64_t over) {
    Scratch& sc = *sc_;
    const DF df;
    constexpr int T = kBlockTokens;
    constexpr int SS = kScoreStride;  // score tiles write up to kRowSlack - 1 rows past the block
    const int64_t D = D_;
    const int g = v_.group_size;
    const int G = G_;
    const SlotLayout L = GetSlotLayout(level, D_, g);
    if (sc.fs.size() < static_cast<size_t>(G * SS)) sc.fs.Resize(G * SS);
    if (sc.fw.size() < static_cast<size_t>(G * T)) sc.fw.Resize(G * T);
    float* s = sc.fs.data();
    float* o = sc.o.data();
    std::fill(o, o + G * Dp_, 0.f);
    if (level == 16) {
      const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
      const uint16_t* vr = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
      // Rows past the block read the value rows that follow the keys in the slot; masked.
      pf_.Spread(tile::ScoreCalls(G, nv));
      tile::ScoreTile(sc.q.data(), Dp_, G, D,
                      [&](int r, int64_t c) { return tile::Bf16Vec(kr + r * D, c); }, nv, s, SS,
                      &pf_);
      pf_.Drain();
      if (!Softmax(nv, over)) return;
      tile::AccumTile(s, SS, G, [&](int t, int64_t c) { return tile::Bf16Vec(vr + t * D, c); }, nv,
                      0, D, o, Dp_);
      FinishTile();
      return;
    }
    const int bits = level;
    const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
    const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
    const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
    const uint8_t* kc = slot + L.k_codes;
    const uint8_t* vc = slot + L.v_codes;
    const bool span = bits != 8 && span_;
    const int layout = span ? LayoutOf(bits) : 0;
    if (bits != 8) {
      const size_t n_codes = static_cast<size_t>(T + tile::kRowSlack) * D;
      if (sc.kc.size() < n_codes) sc.kc.Resize(n_codes);
      if (sc.vc.size() < n_codes) sc.vc.Resize(n_codes);
      const int64_t n_bytes = int64_t{nv} * D * bits / 8;  // D is a multiple of 16
      if (span) {
        UnpackSpans(kc, n_bytes, bits, sc.kc.data());
        UnpackSpans(vc, n_bytes, bits, sc.vc.data());
      } else {
        UnpackBytes(kc, n_bytes, bits, sc.kc.data());
        UnpackBytes(vc, n_bytes, bits, sc.vc.data());
      }
      kc = sc.kc.data();
      vc = sc.vc.data();
    }
    // Keys, per time group: q' = q * step, a = q . lo.
    const int n_tg = (nv + g - 1) / g;
    if (sc.qf.size() < static_cast<size_t>(n_tg * G * D)) sc.qf.Resize(n_tg * G * D);
    sc.qa.resize(static_cast<size_t>(n_tg) * G);
    const int64_t N = N_;
    for (int tg = 0; tg < n_tg; ++tg) {
      float* st = sc.ks.data();  // step and lo of the time group as f32
      float* lo = sc.kl.data();
      tile::F16ToF32Row(kst + tg * D, D, st);
      tile::F16ToF32Row(klo + tg * D, D, lo);
      // q' = q * step in the codes' order (span order: q and step permuted alike).
      const float* qsrc = span ? SpanQ(bits) : sc.q.data();
      if (span) {
        ToSpanOrder(bits, st, D, sc.kt.data());
        st = sc.kt.data();
      }
      for (int h = 0; h < G; ++h) {
        const float* qh = sc.q.data() + h * Dp_;
        const float* qo = qsrc + h * Dp_;
        float* qf = sc.qf.data() + (tg * G + h) * D;
        VF a = hn::Zero(df);
        for (int64_t c = 0; c < D; c += N) {
          hn::Store(hn::Mul(hn::Load(df, qo + c), hn::Load(df, st + c)), df, qf + c);
          a = hn::MulAdd(hn::Load(df, qh + c), hn::Load(df, lo + c), a);
        }
        sc.qa[tg * G + h] = hn::GetLane(hn::SumOfLanes(df, a));
      }
    }
    pf_.Spread(tile::ScoreCalls(G, nv));
    for (int tg = 0; tg < n_tg; ++tg) {
      const int r0 = tg * g, nr = std::min(g, nv - r0);
      const uint8_t* kb = kc + r0 * D;
      // Rows past the group are evaluated with this group's q' and overwritten by the next
      // group's tile (or masked past the block): 8-bit codes past the block's keys are its value
      // codes, unpacked codes have kRowSlack rows of room.
      tile::ScoreTile(sc.qf.data() + tg * G * D, D, G, D,
                      [&](int r, int64_t c) { return tile::CodeVec(kb + r * D, c); }, nr, s + r0,
                      SS, &pf_);
      if (n_tg == 1) continue;  // one time group: q.lo is added to the tile max below
      for (int h = 0; h < G; ++h) {
        const float a = sc.qa[tg * G + h];
        float* sh = s + h * SS + r0;
        for (int i = 0; i < nr; ++i) sh[i] += a;
      }
    }
    pf_.Drain();
    if (!Softmax(nv, over)) return;
    if (n_tg == 1) {
      // A constant logit offset per head leaves exp(s - max) unchanged and moves the max.
      for (int h = 0; h < G; ++h) sc.tm[h] += sc.qa[h];
    }
    // Values, per channel group.
    const int GV = static_cast<int>(D / g);
    ValueScales(vst, vlo, nv, GV);
    float* w = sc.fw.data();
    sc.lsum.resize(static_cast<size_t>(G));  // sum_t p_t lo_t per head, one channel group
    for (int cg = 0; cg < GV; ++cg) {
      const float* vs = sc.vs.data() + cg * T;
      const float* vl = sc.vl.data() + cg * T;
      for (int h = 0; h < G; ++h) {
        const float* ph = s + h * SS;
        float* wh = w + h * T;
        VF ls = hn::Zero(df);
        for (int t = 0; t < T; t += static_cast<int>(N)) {
          const VF p = hn::Load(df, ph + t);
          hn::Store(hn::Mul(p, hn::Load(df, vs + t)), df, wh + t);
          ls = hn::MulAdd(p, hn::Load(df, vl + t), ls);
        }
        sc.lsum[h] = hn::GetLane(hn::SumOfLanes(df, ls));
      }
      tile::AccumTile(w, T, G, [&](int t, int64_t c) { return tile::CodeVec(vc + t * D, c); }, nv,
                      int64_t{cg} * g, int64_t{cg + 1} * g, o, Dp_);
      for (int h = 0; h < G; ++h) {
        const VF add = hn::Set(df, sc.lsum[h]);
        float* oh = o + h * Dp_ + int64_t{cg} * g;
        for (int c = 0; c < g; c += static_cast<int>(N)) {
          hn::Store(hn::Add(hn::Load(df, oh + c), add), df, oh + c);
        }
      }
    }
    FinishTile(layout);
  }

  // kInt8 whole-block tile of a quantized block (see PackedMath): integer key dots per time
  // group with the folded query rounded to int8, one block softmax in f32, integer value sums
  // with the weights p_t step_t rounded to int8 per channel group; output in channel order.
  void BlockInt8(const uint8_t* slot, int bits, int nv, uint64_t over) {
    Scratch& sc = *sc_;
    const DF df;
    constexpr int T = kBlockTokens;
    constexpr int SS = kScoreStride;
    const int64_t D = D_;
    const int g = v_.group_size;
    const int G = G_;
    const int64_t N = N_;
    const SlotLayout L = GetSlotLayout(bits, D_, g);
    Grow(&sc.fs, static_cast<size_t>(G) * SS);
    Grow(&sc.qi, static_cast<size_t>(2 * G) * D);
    Grow(&sc.isum, static_cast<size_t>(2 * G) * std::max<int64_t>(D, T));
    Grow(&sc.qtmp, static_cast<size_t>(2 * std::max<int64_t>(D, T)));
    const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
    const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
    const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
    const uint8_t* kc = slot + L.k_codes;
    const uint8_t* vc = slot + L.v_codes;
    pf_.Drain();
    if (bits != 8) {
      // All 64 rows' bytes exist in the slot; rows past nv are masked (keys) or weigh 0 (values).
      const size_t n_codes = static_cast<size_t>(T + tile::kRowSlack) * D;
      Grow(&sc.kc, n_codes);
      Grow(&sc.vc, n_codes);
      const int64_t n_bytes = int64_t{T} * D * bits / 8;
      UnpackBytes(kc, n_bytes, bits, sc.kc.data());
      UnpackBytes(vc, n_bytes, bits, sc.vc.data());
      kc = sc.kc.data();
      vc = sc.vc.data();
    }
    const float mu = static_cast<float>((1 << bits) - 1) * 0.5f;
    const int n16 = (nv + 15) / 16;
#ifdef STRATA_PACKED_VNNI
    Grow(&sc.kt8, static_cast<size_t>(T) * D);
    TransposeKeyCodes(kc, D, n16, sc.kt8.data());
#endif
    // Keys, per time group.
    const int n_tg = (nv + g - 1) / g;
    sc.dq.resize(G);
    sc.dq2.resize(G);
    sc.aq.resize(G);
    float* s = sc.fs.data();
    int32_t* isum = sc.isum.data();
    for (int tg = 0; tg < n_tg; ++tg) {
      float* st = sc.ks.data();
      float* lo = sc.kl.data();
      tile::F16ToF32Row(kst + tg * D, D, st);
      tile::F16ToF32Row(klo + tg * D, D, lo);
      for (int h = 0; h < G; ++h) {
        const float* qh = sc.q.data() + h * Dp_;
        float* qf = sc.qtmp.data();
        VF a = hn::Zero(df);
        for (int64_t c = 0; c < D; c += N) {
          hn::Store(hn::Mul(hn::Load(df, qh + c), hn::Load(df, st + c)), df, qf + c);
          a = hn::MulAdd(hn::Load(df, qh + c), hn::Load(df, lo + c), a);
        }
        float res = 0.f;
        float* qr = qf + D;  // q' - d qi, rounded again: the second piece
        sc.dq[h] = QuantizeInt8T(qf, D, 127, sc.qi.data() + h * D, &res, qr);
        sc.dq2[h] = QuantizeInt8T(qr, D, 127, sc.qi.data() + (G + h) * D, &res);
        sc.aq[h] = hn::GetLane(hn::SumOfLanes(df, a)) + mu * res;
      }
      const int r16a = tg * g / 16, r16b = std::min(n16, (tg + 1) * g / 16);
      for (int r16 = r16a; r16 < r16b; ++r16) {
#ifdef STRATA_PACKED_VNNI
        KeyDots16(sc.kt8.data() + int64_t{r16} * (D / 4) * 64, D, sc.qi.data(), 2 * G, isum,
                  16);
#else
        packed_internal::KeyDotsRows(kc, D, 16 * r16, 16, sc.qi.data(), 2 * G, isum, 16);
#endif
        for (int h = 0; h < G; ++h) {
          const VF dv = hn::Set(df, sc.dq[h]), dv2 = hn::Set(df, sc.dq2[h]);
          const VF av = hn::Set(df, sc.aq[h]);
          const hn::Rebind<int32_t, DF> di;
          float* sh = s + h * SS + 16 * r16;
          for (int i = 0; i < 16; i += static_cast<int>(N)) {
            const VF x = hn::ConvertTo(df, hn::LoadU(di, isum + h * 16 + i));
            const VF x2 = hn::ConvertTo(df, hn::LoadU(di, isum + (G + h) * 16 + i));
            hn::StoreU(hn::MulAdd(dv2, x2, hn::MulAdd(dv, x, av)), df, sh + i);
          }
        }
      }
    }
    if (!Softmax(nv, over)) return;
    // Values, per channel group.
    const int GV = static_cast<int>(D / g);
    ValueScales(vst, vlo, nv, GV);
    Grow(&sc.wi, static_cast<size_t>(GV) * 2 * G * T);
    sc.ve.resize(static_cast<size_t>(GV) * G);
    sc.ve2.resize(static_cast<size_t>(GV) * G);
    sc.vb.resize(static_cast<size_t>(GV) * G);
    float* wf = sc.qtmp.data();
    for (int cg = 0; cg < GV; ++cg) {
      const float* vs = sc.vs.data() + cg * T;
      const float* vl = sc.vl.data() + cg * T;
      for (int h = 0; h < G; ++h) {
        const float* ph = s + h * SS;
        VF ls = hn::Zero(df);
        for (int t = 0; t < T; t += static_cast<int>(N)) {
          const VF p = hn::Load(df, ph + t);
          hn::Store(hn::Mul(p, hn::Load(df, vs + t)), df, wf + t);
          ls = hn::MulAdd(p, hn::Load(df, vl + t), ls);
        }
        float res = 0.f;
        const int at = cg * G + h;
        float* wr = wf + T;
        sc.ve[at] = QuantizeInt8T(wf, T, 127, sc.wi.data() + (int64_t{cg} * 2 * G + h) * T, &res,
                                  wr);
        sc.ve2[at] = QuantizeInt8T(wr, T, 127, sc.wi.data() + (int64_t{cg} * 2 * G + G + h) * T,
                                   &res);
        sc.vb[at] = hn::GetLane(hn::SumOfLanes(df, ls)) + mu * res;
      }
    }
#ifdef STRATA_PACKED_VNNI
    ValueSums(vc, D, g, sc.wi.data(), 2 * G, isum);
#else
    packed_internal::ValueSumsRows(vc, D, g, sc.wi.data(), 2 * G, isum);
#endif
    float* o = sc.o.data();
    const hn::Rebind<int32_t, DF> di;
    for (int h = 0; h < G; ++h) {
      for (int cg = 0; cg < GV; ++cg) {
        const VF ev = hn::Set(df, sc.ve[cg * G + h]), bv = hn::Set(df, sc.vb[cg * G + h]);
        const VF ev2 = hn::Set(df, sc.ve2[cg * G + h]);
        for (int64_t c = int64_t{cg} * g; c < int64_t{cg + 1} * g; c += N) {
          const VF x = hn::ConvertTo(df, hn::LoadU(di, isum + h * D + c));
          const VF x2 = hn::ConvertTo(df, hn::LoadU(di, isum + (G + h) * D + c));
          hn::Store(hn::MulAdd(ev2, x2, hn::MulAdd(ev, x, bv)), df, o + h * Dp_ + c);
        }
      }
    }
    FinishTile(0);
  }

  // Value steps and los of the block as f32 per channel group over the 64 tokens: sc.vs, sc.vl
  // [GV][64] (zeros past nv). Uses sc.fw as scratch.
  void ValueScales(const uint16_t* vst, const uint16_t* vlo, int nv, int GV) {
    Scratch& sc = *sc_;
    const DF df;
    constexpr int T = kBlockTokens;
    const int64_t N = N_;
    (void)df;
    (void)N;
    if (sc.vs.size() < static_cast<size_t>(GV * T)) sc.vs.Resize(GV * T), sc.vl.Resize(GV * T);
    if (GV == 1) {
      tile::F16ToF32Row(vst, nv, sc.vs.data());
      tile::F16ToF32Row(vlo, nv, sc.vl.data());
      std::fill(sc.vs.data() + nv, sc.vs.data() + T, 0.f);
      std::fill(sc.vl.data() + nv, sc.vl.data() + T, 0.f);
#if HWY_TARGET != HWY_SCALAR
    } else if (GV == 2 && N == 16) {
      // [t][cg] f16 -> f32 (zeros past nv), then even / odd lanes are groups 0 / 1.
      Grow(&sc.fw, 4 * T);
      float* tmp = sc.fw.data();
      tile::F16ToF32Row(vst, 2 * nv, tmp);
      tile::F16ToF32Row(vlo, 2 * nv, tmp + 2 * T);
      std::fill(tmp + 2 * nv, tmp + 2 * T, 0.f);
      std::fill(tmp + 2 * T + 2 * nv, tmp + 4 * T, 0.f);
      for (int i = 0; i < 2; ++i) {  // steps, los
        const float* src = tmp + 2 * T * i;
        float* g0 = (i == 0 ? sc.vs : sc.vl).data();
        for (int t = 0; t < T; t += 16) {
          const VF a = hn::Load(df, src + 2 * t), b = hn::Load(df, src + 2 * t + 16);
          hn::Store(hn::ConcatEven(df, b, a), df, g0 + t);
          hn::Store(hn::ConcatOdd(df, b, a), df, g0 + T + t);
        }
      }
#endif
    } else {
      // [t][cg] f16 -> f32, then per channel group over t (zeros past nv).
      // (fw is free until the weights below; it holds 2 x 64 x GV floats here.)
      if (sc.fw.size() < static_cast<size_t>(2 * T * GV)) sc.fw.Resize(2 * T * GV);
      float* tmp = sc.fw.data();
      tile::F16ToF32Row(vst, int64_t{nv} * GV, tmp);
      tile::F16ToF32Row(vlo, int64_t{nv} * GV, tmp + T * GV);
      for (int cg = 0; cg < GV; ++cg) {
        float* vs = sc.vs.data() + cg * T;
        float* vl = sc.vl.data() + cg * T;
        for (int t = 0; t < nv; ++t) {
          vs[t] = tmp[t * GV + cg];
          vl[t] = tmp[T * GV + t * GV + cg];
        }
        for (int t = nv; t < T; ++t) vs[t] = vl[t] = 0.f;
      }
    }
  }

  // Masks rows >= nv and overridden rows of the fast tile's scores and turns them into
  // probabilities (tm, td per head). Returns false when no row is live (nothing to add).
  bool Softmax(int nv, uint64_t over) {
    Scratch& sc = *sc_;
    constexpr int T = kBlockTokens;
    const uint64_t live = pi::ValidMask(nv) & ~over;
    if (live == 0) return false;
    float* s = sc.fs.data();
    for (int h = 0; h < G_; ++h) {
      float* sh = s + h * kScoreStride;
      for (int i = nv; i < T; ++i) sh[i] = pi::kNegInf;
      for (uint64_t m = over; m != 0; m &= m - 1) sh[std::countr_zero(m)] = pi::kNegInf;
      sc.tm[h] = tile::SoftmaxRow(sh, T, &sc.td[h]);
    }
    return true;
  }

  // Merges the tile state (tm, td, o) of every head (o in the given layout).
  void FinishTile(int layout = 0) {
    Scratch& sc = *sc_;
    MergeTiles(sc.o.data(), Dp_, layout);
  }

  static thread_local Scratch scratch_;
  tile::PrefetchQueue pf_;
  bool fast_ = false;
  bool span_ = false;
  bool int8_ = false;
  std::array<bool, kLayouts> used_{};
  std::array<bool, 2> qspan_ready_{};
  const uint8_t* sel_ = nullptr;
  bool record_ = false;
  const PackedHeadView& v_;
  int G_, D_;
  int64_t N_ = 0, Dp_ = 0;
  Scratch* sc_ = nullptr;
};

thread_local Scratch Runner::scratch_;

void PackedInt8KeyDotsImpl(const uint8_t* codes, int64_t D, const int8_t* q, int n_q,
                           int32_t* out) {
#ifdef STRATA_PACKED_VNNI
  AlignedBuffer<uint8_t> tr(static_cast<size_t>(kBlockTokens) * D);
  TransposeKeyCodes(codes, D, 4, tr.data());
  std::vector<int32_t> tmp(static_cast<size_t>(n_q) * 16);
  for (int r16 = 0; r16 < 4; ++r16) {
    KeyDots16(tr.data() + int64_t{r16} * (D / 4) * 64, D, q, n_q, tmp.data(), 16);
    for (int h = 0; h < n_q; ++h) {
      for (int i = 0; i < 16; ++i) out[h * kBlockTokens + 16 * r16 + i] = tmp[h * 16 + i];
    }
  }
#else
  packed_internal::KeyDotsRows(codes, D, 0, kBlockTokens, q, n_q, out, kBlockTokens);
#endif
}

void PackedInt8ValueSumsImpl(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                             int32_t* out) {
#ifdef STRATA_PACKED_VNNI
  ValueSums(codes, D, g, w, n_q, out);
#else
  packed_internal::ValueSumsRows(codes, D, g, w, n_q, out);
#endif
}

void PackedAttendImpl(const PackedHeadView& view, const float* q, int n_q, float scale,
                      const int64_t* blocks, int64_t n_list, SoftmaxStates* st,
                      const PackedBlockIO* io, PackedMath math) {
  Runner r(view, q, n_q, scale, math);
  // Each block's slot is requested while the previous block computes its scores.
  // Block i + 2's slot is requested while block i computes its scores (the first two up front).
  r.NoPrefetch();
  r.Prefetch(blocks ? blocks[0] : 0, /*issue_now=*/true);
  r.NoPrefetch();
  if (n_list > 1) r.Prefetch(blocks ? blocks[1] : 1);
  for (int64_t i = 0; i < n_list; ++i) {
    if (i + 2 < n_list) r.Prefetch(blocks ? blocks[i + 2] : i + 2);
    const int64_t b = blocks ? blocks[i] : i;
    if (io == nullptr) {
      r.Block(b);
    } else {
      const int64_t at = i * n_q;
      r.Block(b, io->head_sel ? io->head_sel + at : nullptr,
              io->block_m ? io->block_m + at : nullptr, io->block_d ? io->block_d + at : nullptr);
    }
  }
  r.Finish(st);
}

}  // namespace HWY_NAMESPACE
}  // namespace strata::geodesia
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::geodesia {

HWY_EXPORT(PackedAttendImpl);
HWY_EXPORT(PackedInt8KeyDotsImpl);
HWY_EXPORT(PackedInt8ValueSumsImpl);

const char* PackedMathName(PackedMath m) { return m == PackedMath::kInt8 ? "int8" : "f32"; }

PackedMath PackedCodesMath(AttnMath m) {
  return m == AttnMath::kInt8 ? PackedMath::kInt8 : PackedMath::kF32;
}

bool PackedInt8Applies(const PackedHeadView& view) {
  return packed_internal::Int8Applies(view.head_dim, view.group_size);
}

float QuantizeInt8(const float* x, int64_t n, int qmax, int8_t* q) {
  if (n <= 0) return 0.f;
  float mx = 0.f;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float d = mx / static_cast<float>(qmax);
  if (!(d > 0.f)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float id = static_cast<float>(qmax) / mx;
  for (int64_t i = 0; i < n; ++i) {
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * id), static_cast<float>(-qmax),
                                          static_cast<float>(qmax)));
  }
  return d;
}

void PackedInt8KeyDots(const uint8_t* codes, int64_t D, const int8_t* q, int n_q, int32_t* out) {
  STRATA_CHECK(D > 0 && D % 64 == 0 && n_q >= 0);
  HWY_DYNAMIC_DISPATCH(PackedInt8KeyDotsImpl)(codes, D, q, n_q, out);
}
void PackedInt8KeyDotsRef(const uint8_t* codes, int64_t D, const int8_t* q, int n_q,
                          int32_t* out) {
  packed_internal::KeyDotsRows(codes, D, 0, kBlockTokens, q, n_q, out, kBlockTokens);
}
void PackedInt8ValueSums(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                         int32_t* out) {
  STRATA_CHECK(D > 0 && D % 64 == 0 && g > 0 && g % 16 == 0 && D % g == 0 && n_q >= 0);
  HWY_DYNAMIC_DISPATCH(PackedInt8ValueSumsImpl)(codes, D, g, w, n_q, out);
}
void PackedInt8ValueSumsRef(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                            int32_t* out) {
  packed_internal::ValueSumsRows(codes, D, g, w, n_q, out);
}

namespace {
namespace pi = packed_internal;

void CheckArgs(const PackedHeadView& view, int n_q, const int64_t* blocks, int64_t n_list,
               const SoftmaxStates* st) {
  STRATA_CHECK(st->n_heads == n_q && st->dv == view.head_dim);
  STRATA_CHECK(view.group_size > 0 && kBlockTokens % view.group_size == 0 &&
               view.head_dim % view.group_size == 0);
  if (blocks == nullptr) STRATA_CHECK(n_list <= view.n_blocks);
  for (int64_t i = 0; blocks && i < n_list; ++i) {
    STRATA_CHECK_MSG(blocks[i] >= 0 && blocks[i] < view.n_blocks, "block %lld of %lld",
                     static_cast<long long>(blocks[i]), static_cast<long long>(view.n_blocks));
  }
}

}  // namespace

void PackedAttend(const PackedHeadView& view, const float* q, int n_q, float scale,
                  const int64_t* blocks, int64_t n_list, SoftmaxStates* st,
                  const PackedBlockIO* io, PackedMath math) {
  CheckArgs(view, n_q, blocks, n_list, st);
  STRATA_CHECK(io == nullptr || (io->block_m == nullptr) == (io->block_d == nullptr));
  if (n_q <= 0 || n_list <= 0) return;
  HWY_DYNAMIC_DISPATCH(PackedAttendImpl)(view, q, n_q, scale, blocks, n_list, st, io, math);
}

void PackedAttendScalar(const PackedHeadView& view, const float* q, int n_q, float scale,
                        const int64_t* blocks, int64_t n_list, SoftmaxStates* st,
                        PackedMath math) {
  CheckArgs(view, n_q, blocks, n_list, st);
  if (n_q <= 0 || n_list <= 0) return;
  const int D = view.head_dim, g = view.group_size, P = kBlockTokens;
  std::vector<float> m(n_q, pi::kNegInf), d(n_q, 0.f), o(static_cast<size_t>(n_q) * D, 0.f);
  std::vector<float> k(P * D), v(P * D), s(P);
  std::vector<float> logw(P);  // log-multiplicity of each row (ln n for a centroid, else 0)
  std::vector<uint8_t> kc(P * D), vc(P * D);
  const bool int8 = math == PackedMath::kInt8 && PackedInt8Applies(view);
  // kInt8 quantized block (PackedMath): per head a block state (tm, td, to) merged like a tile.
  auto int8_block = [&](const uint8_t* slot, int bits, int nv, uint64_t over) {
    const SlotLayout L = GetSlotLayout(bits, D, g);
    UnpackCodes(slot + L.k_codes, int64_t{P} * D, bits, kc.data());
    UnpackCodes(slot + L.v_codes, int64_t{P} * D, bits, vc.data());
    const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
    const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
    const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
    const int GV = D / g;
    const float mu = static_cast<float>((1 << bits) - 1) * 0.5f;
    const uint64_t live = pi::ValidMask(nv) & ~over;
    if (live == 0) return;
    std::vector<float> qs(D), qf(D), qr(D), w(P), wr(P), p(P), to(D);
    std::vector<int8_t> qi(D), qi2(D), wi(P), wi2(P);
    for (int h = 0; h < n_q; ++h) {
      for (int c = 0; c < D; ++c) qs[c] = q[h * D + c] * scale;
      float tm = pi::kNegInf;
      for (int tg = 0; tg * g < nv; ++tg) {
        float a = 0.f, res = 0.f;
        for (int c = 0; c < D; ++c) {
          qf[c] = qs[c] * F16ToF32(kst[tg * D + c]);
          a += qs[c] * F16ToF32(klo[tg * D + c]);
        }
        const float dq = QuantizeInt8(qf.data(), D, 127, qi.data());
        for (int c = 0; c < D; ++c) qr[c] = std::fma(-dq, static_cast<float>(qi[c]), qf[c]);
        const float dq2 = QuantizeInt8(qr.data(), D, 127, qi2.data());
        for (int c = 0; c < D; ++c) res += std::fma(-dq2, static_cast<float>(qi2[c]), qr[c]);
        a += mu * res;
        for (int t = tg * g; t < std::min(nv, (tg + 1) * g); ++t) {
          if (!((live >> t) & 1)) continue;
          int32_t isum = 0, isum2 = 0;
          for (int c = 0; c < D; ++c) {
            isum += qi[c] * static_cast<int32_t>(kc[t * D + c]);
            isum2 += qi2[c] * static_cast<int32_t>(kc[t * D + c]);
          }
          s[t] = std::fma(dq2, static_cast<float>(isum2),
                          std::fma(dq, static_cast<float>(isum), a));
          tm = std::max(tm, s[t]);
        }
      }
      float td = 0.f;
      for (int t = 0; t < P; ++t) {
        p[t] = (live >> t) & 1 ? std::exp(s[t] - tm) : 0.f;
        td += p[t];
      }
      for (int cg = 0; cg < GV; ++cg) {
        float lsum = 0.f, res = 0.f;
        for (int t = 0; t < P; ++t) {
          const float vs = t < nv ? F16ToF32(vst[t * GV + cg]) : 0.f;
          const float vl = t < nv ? F16ToF32(vlo[t * GV + cg]) : 0.f;
          w[t] = p[t] * vs;
          lsum += p[t] * vl;
        }
        const float e = QuantizeInt8(w.data(), P, 127, wi.data());
        for (int t = 0; t < P; ++t) wr[t] = std::fma(-e, static_cast<float>(wi[t]), w[t]);
        const float e2 = QuantizeInt8(wr.data(), P, 127, wi2.data());
        for (int t = 0; t < P; ++t) res += std::fma(-e2, static_cast<float>(wi2[t]), wr[t]);
        const float bias = lsum + mu * res;
        for (int c = cg * g; c < (cg + 1) * g; ++c) {
          int32_t isum = 0, isum2 = 0;
          for (int t = 0; t < P; ++t) {
            isum += wi[t] * static_cast<int32_t>(vc[t * D + c]);
            isum2 += wi2[t] * static_cast<int32_t>(vc[t * D + c]);
          }
          to[c] = std::fma(e2, static_cast<float>(isum2),
                           std::fma(e, static_cast<float>(isum), bias));
        }
      }
      // Merge the block state.
      float* oh = o.data() + h * D;
      const float m_new = std::max(m[h], tm);
      const float f = m[h] == pi::kNegInf ? 0.f : std::exp(m[h] - m_new);
      const float wt = std::exp(tm - m_new);
      d[h] = d[h] * f + wt * td;
      for (int c = 0; c < D; ++c) oh[c] = oh[c] * f + wt * to[c];
      m[h] = m_new;
    }
  };
  for (int64_t i = 0; i < n_list; ++i) {
    const int64_t b = blocks ? blocks[i] : i;
    const int nv = view.n_valid[b];
    if (nv <= 0) continue;
    const int level = view.level[b];
    const uint64_t over = pi::OverrideMask(view, b);
    const uint8_t* slot = pi::SlotPtr(view, b);
    const SlotLayout L = GetSlotLayout(level, D, g);
    // Rows of this block as (k, v, logw), live ones listed in `rows`.
    std::vector<int> rows;
    if (level == 16) {
      const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
      const uint16_t* vr = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
      for (int t = 0; t < nv; ++t) {
        if ((over >> t) & 1) continue;
        for (int c = 0; c < D; ++c) {
          k[t * D + c] = Bf16ToF32(kr[t * D + c]);
          v[t * D + c] = Bf16ToF32(vr[t * D + c]);
        }
        logw[t] = 0.f;
        rows.push_back(t);
      }
    } else if (level == 1) {
      const int n = nv - std::popcount(over);
      if (n > 0) {
        const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot);
        for (int c = 0; c < D; ++c) {
          k[c] = F16ToF32(kr[c]);
          v[c] = F16ToF32(kr[D + c]);
        }
        logw[0] = std::log(static_cast<float>(n));
        rows.push_back(0);
      }
    } else if (int8) {
      int8_block(slot, level, nv, over);
    } else {
      UnpackCodes(slot + L.k_codes, int64_t{P} * D, level, kc.data());
      UnpackCodes(slot + L.v_codes, int64_t{P} * D, level, vc.data());
      const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
      const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
      const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
      const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
      const int GV = D / g;
      for (int t = 0; t < nv; ++t) {
        if ((over >> t) & 1) continue;
        for (int c = 0; c < D; ++c) {
          const int ki = (t / g) * D + c, vi = t * GV + c / g;
          k[t * D + c] = kc[t * D + c] * F16ToF32(kst[ki]) + F16ToF32(klo[ki]);
          v[t * D + c] = vc[t * D + c] * F16ToF32(vst[vi]) + F16ToF32(vlo[vi]);
        }
        logw[t] = 0.f;
        rows.push_back(t);
      }
    }
    // Residual rows of the block follow it (same order as the SIMD kernel).
    std::vector<std::pair<const uint16_t*, const uint16_t*>> res;
    for (uint64_t mm = over; mm != 0; mm &= mm - 1) {
      const int64_t r = pi::ResidualRow(view, b, std::countr_zero(mm));
      res.emplace_back(view.res_k + r * D, view.res_v + r * D);
    }
    auto attend = [&](int n_rows, auto key, auto val, auto lw) {
      if (n_rows == 0) return;
      for (int h = 0; h < n_q; ++h) {
        float tmax = pi::kNegInf;
        for (int r = 0; r < n_rows; ++r) {
          float acc = 0.f;
          for (int c = 0; c < D; ++c) acc += q[h * D + c] * scale * key(r, c);
          s[r] = acc + lw(r);
          tmax = std::max(tmax, s[r]);
        }
        float* oh = o.data() + h * D;
        if (tmax > m[h]) {
          if (m[h] != pi::kNegInf) {
            const float f = std::exp(m[h] - tmax);
            d[h] *= f;
            for (int c = 0; c < D; ++c) oh[c] *= f;
          }
          m[h] = tmax;
        }
        for (int r = 0; r < n_rows; ++r) {
          const float p = std::exp(s[r] - m[h]);
          d[h] += p;
          for (int c = 0; c < D; ++c) oh[c] += p * val(r, c);
        }
      }
    };
    attend(
        static_cast<int>(rows.size()), [&](int r, int c) { return k[rows[r] * D + c]; },
        [&](int r, int c) { return v[rows[r] * D + c]; }, [&](int r) { return logw[rows[r]]; });
    attend(
        static_cast<int>(res.size()), [&](int r, int c) { return Bf16ToF32(res[r].first[c]); },
        [&](int r, int c) { return Bf16ToF32(res[r].second[c]); }, [](int) { return 0.f; });
  }
  SoftmaxStates local;
  local.n_heads = n_q;
  local.dv = D;
  local.m = m.data();
  local.d = d.data();
  local.o = o.data();
  MergeStates(st, local);
}

void PackedAttendSplit(const PackedHeadView& view, const float* q, int n_q, float scale,
                       const int64_t* blocks, int64_t n_list, int n_splits, ThreadPool* pool,
                       SoftmaxStates* st, PackedMath math) {
  STRATA_CHECK(n_splits >= 1);
  std::vector<SoftmaxStateBuffer> parts;
  parts.reserve(n_splits);
  for (int s = 0; s < n_splits; ++s) parts.emplace_back(n_q, view.head_dim);
  auto run = [&](int s) {
    int64_t b0, b1;
    ChunkRange(n_list, 1, s, n_splits, &b0, &b1);
    if (b1 <= b0) return;
    if (blocks) {
      PackedAttend(view, q, n_q, scale, blocks + b0, b1 - b0, &parts[s].states(), nullptr, math);
    } else {
      std::vector<int64_t> ids(b1 - b0);
      for (int64_t i = b0; i < b1; ++i) ids[i - b0] = i;
      PackedAttend(view, q, n_q, scale, ids.data(), b1 - b0, &parts[s].states(), nullptr, math);
    }
  };
  ParallelForEach(pool, n_splits, [&](int64_t s, int) { run(static_cast<int>(s)); });
  for (int s = 0; s < n_splits; ++s) MergeStates(st, parts[s].states());
}

void PackedAttendRef(const PackedHeadView& view, const float* q, int n_q, float scale,
                     const int64_t* blocks, int64_t n_list, double* out) {
  const int D = view.head_dim, P = kBlockTokens;
  // All (logit offset, key, value) rows read, in f64.
  std::vector<double> keys, vals, logw;
  std::vector<double> k(P * D), v(P * D);
  for (int64_t i = 0; i < n_list; ++i) {
    const int64_t b = blocks ? blocks[i] : i;
    const int nv = view.n_valid[b];
    if (nv <= 0) continue;
    const uint64_t over = pi::OverrideMask(view, b);
    ReconstructBlock(view, b, k.data(), v.data());
    if (view.level[b] == 1) {
      const int n = nv - std::popcount(over);
      if (n > 0) {
        keys.insert(keys.end(), k.begin(), k.begin() + D);
        vals.insert(vals.end(), v.begin(), v.begin() + D);
        logw.push_back(std::log(static_cast<double>(n)));
      }
    } else {
      for (int t = 0; t < nv; ++t) {
        if ((over >> t) & 1) continue;
        keys.insert(keys.end(), k.begin() + t * D, k.begin() + (t + 1) * D);
        vals.insert(vals.end(), v.begin() + t * D, v.begin() + (t + 1) * D);
        logw.push_back(0.0);
      }
    }
    for (uint64_t mm = over; mm != 0; mm &= mm - 1) {
      const int64_t r = pi::ResidualRow(view, b, std::countr_zero(mm));
      for (int c = 0; c < D; ++c) keys.push_back(Bf16ToF32(view.res_k[r * D + c]));
      for (int c = 0; c < D; ++c) vals.push_back(Bf16ToF32(view.res_v[r * D + c]));
      logw.push_back(0.0);
    }
  }
  const int64_t n = static_cast<int64_t>(logw.size());
  std::vector<double> s(std::max<int64_t>(n, 1));
  for (int h = 0; h < n_q; ++h) {
    double* oh = out + static_cast<int64_t>(h) * D;
    std::fill(oh, oh + D, 0.0);
    if (n == 0) continue;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < n; ++r) {
      double acc = 0;
      for (int c = 0; c < D; ++c) acc += static_cast<double>(q[h * D + c]) * keys[r * D + c];
      s[r] = acc * scale + logw[r];
      mx = std::max(mx, s[r]);
    }
    double den = 0;
    for (int64_t r = 0; r < n; ++r) {
      const double p = std::exp(s[r] - mx);
      den += p;
      for (int c = 0; c < D; ++c) oh[c] += p * vals[r * D + c];
    }
    for (int c = 0; c < D; ++c) oh[c] /= den;
  }
}

int64_t PackedReadBytes(const PackedHeadView& view, const int64_t* blocks, int64_t n_list) {
  int64_t bytes = 0;
  for (int64_t i = 0; i < n_list; ++i) {
    const int64_t b = blocks ? blocks[i] : i;
    bytes += SlotBytes(view.level[b], view.head_dim, view.group_size);
    if (view.res_mask) bytes += std::popcount(view.res_mask[b]) * int64_t{4} * view.head_dim;
  }
  return bytes;
}

}  // namespace strata::geodesia
#endif  // HWY_ONCE
