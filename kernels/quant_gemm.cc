// The integer prefill GEMM of the quantized weight types (see quant_gemm.h).
//
// Version log (2-core AMD EPYC Zen 5 host, AVX-512 VNNI, shared with other work: load 4-6):
//   v1  Lane = segment layout, R x T = 4 x 4 zmm accumulators (AVX3_DL vpdpbusd, AVX3 vpmaddubsw +
//       vpmaddwd), 4 x 2 ymm on AVX2; a last group of at most 8 segments in ymm on AVX-512; rows
//       unpacked by 8-lane gathers once per token tile (~256 KiB of prepared tokens, 16-256); the
//       segment sums turned into block terms 8 blocks at a time in ymm (f32 lane j = accumulator
//       j of quant_dot.h's order; the K-quants 4 super-blocks at a time in xmm). SSE4 and EMU128
//       are not served (MatMul keeps the f32 GEMM there).
//       Predicted (instructions per 32 weights per (row, token), AVX3_DL, large k): integer stage
//       8 vpdpbusd per 16 segments + one load per 2 vpdpbusd = 0.75, plus a store per group; f32
//       stage Q4_0 7 per 8 blocks (load, subtract the offset, convert, 2 multiplies, add) = 0.9,
//       Q4_1 1.1; Q4_K ~1.1 and Q6_K ~1.2 (scale multiplies and the reduction per super-block);
//       so ~1.7-2.0 against the dequantizing GEMM's 3 (2 zmm FMAs + a load per 2 FMAs, in its
//       4 x 4 f32 tiles): ~1.5-1.75x where k is long, less where padding of the 16-lane groups
//       and the 8-block f32 steps (and the per-(row, token) tail) weigh: k = 576 (18 blocks in 24
//       lanes) ~1.1x.
//       Measured (QuantDotBench.DISABLED_Prefill, 2048 tokens, 1 thread, GFLOP/s best of 3, int /
//       dequantizing, 2026-12-07, host load 4-5, +-30 % between runs): k = 2048 Q4_0 190-266 /
//       73-113, Q4_1 144-243 / 67-116, Q5_0 156 / 75, Q8_0 147-253 / 75-113, Q4_K 128-204 /
//       73-113, Q6_K 125-133 / 71-115; k = 768 Q4_0 124-242 / 91-155, Q4_1 82-205 / 93-166,
//       Q4_K 76-108 / 92-169, Q6_K 87-113 / 95-159; k = 576 Q4_0 129-141 / 147-150, Q4_1
//       145-156 / 135-158. Model-level figures: kernels/matmul.cc's version log (v6).
//   v2  The 32-element formats' f32 stage for the whole 4 x 4 tile at once (Epi32): perf of a
//       SmolLM2 Q4_1 prefill (2048 tokens, 1 thread) put 41 % of the time in the one-(row, token)
//       f32 stage, called through a pointer, against 29 % in the integer stage: each call was one
//       exposed latency chain of dependent multiplies and adds. Interleaving the 16 chains (and
//       loading each row's scales and each token's factors once per step) took that prefill from
//       411-439 tok/s (below the dequantizing path's 470-480) to 472-540 (dequantizing 373-436
//       in the same minutes). Same operations per (row, token): results unchanged.
//       QuantDotBench.DISABLED_Prefill after v2 (same host, 2026-12-07, load ~3.3; GFLOP/s int /
//       dequantizing): k = 768 Q4_0 291-315 / 152-155, Q4_1 283 / 139-143, Q5_0 291 / 149-150,
//       Q8_0 292-300 / 146-166, Q4_K 145-161 / 141-171, Q6_K 186-189 / 153-168; k = 2048 Q4_0
//       316 / 96, Q4_1 302 / 107, Q5_0 338 / 103, Q8_0 326 / 112, Q4_K 206-215 / 104-116, Q6_K
//       204 / 113; k = 576 (576 x 576, 1536 x 576) Q4_0 179 / 136-142, Q4_1 130-149 / 142-147,
//       Q5_0 176-178 / 149-150, Q8_0 177-184 / 154-159; k = 1536 (576 x 1536) Q4_0 331 / 122,
//       Q4_1 322 / 126, Q8_0 333 / 130, Q4_K 195 / 146, Q6_K 199 / 128. The K-quants' f32
//       stage is still one (row, token) at a time (EpiEach): the next step for them.
// This file compiles AVX3_DL as kernels/quant_dot.cc does (vpdpbusd).
#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

#include "kernels/quant_gemm.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/buffer.h"
#include "core/check.h"
#include "core/quant.h"
#include "kernels/quant_dot_internal.h"

#ifndef STRATA_KERNELS_QUANT_GEMM_SHARED_
#define STRATA_KERNELS_QUANT_GEMM_SHARED_
namespace strata {
namespace qgemm {

inline int64_t Up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

inline bool Served(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

// Segments per weight block: 1 for the 32-element formats, 8 sub-blocks of 32 for Q4_K, 16 of
// 16 for Q6_K.
inline int64_t SegsPerBlock(DType t) { return t == DType::kQ4_K ? 8 : t == DType::kQ6_K ? 16 : 1; }

// nb weight blocks, padded to nbp (a multiple of 8: the f32 stage takes 8 blocks at a time);
// nseg segments of E elements, padded to segpad (a multiple of 16 lanes); sstride int32 segment
// sums per (row, token) (room for every segment the f32 stage reads, padding included).
struct Shape {
  int64_t E = 0, nb = 0, nbp = 0, nseg = 0, segpad = 0, sstride = 0;
};

inline Shape GetShape(DType t, int64_t k) {
  Shape s;
  s.E = t == DType::kQ6_K ? 16 : 32;
  s.nb = k / DTypeBlockElems(t);
  s.nbp = Up(s.nb, 8);
  s.nseg = s.nb * SegsPerBlock(t);
  s.segpad = Up(s.nseg, 16);
  s.sstride = Up(std::max(s.segpad, s.nbp * SegsPerBlock(t)), 16);
  return s;
}

// A prepared token (byte offsets; codes at 0, [segpad * E] int8 in the lane layout): dx f32 [nbp];
// off int32 [nbp * SegsPerBlock] (Q4_0: 8 * the block sum; Q8_0: 128 * the block sum under VNNI,
// else 0; Q5_0: 16 * the block sum; Q4_K: the 32-element sub-block sums; Q6_K: 32 * the 16-element
// sums); dxs f32 [nbp] (Q4_1, Q5_1: dx * float(block sum), quant_dot.h's min term factor).
struct TokLayout {
  int64_t dx = 0, off = 0, dxs = 0, bytes = 0;
};

inline TokLayout GetTokLayout(DType t, const Shape& s) {
  TokLayout l;
  int64_t o = Up(s.segpad * s.E, 64);
  l.dx = o;
  o = Up(o + 4 * s.nbp, 64);
  l.off = o;
  o = Up(o + 4 * s.nbp * SegsPerBlock(t), 64);
  l.dxs = o;
  o = Up(o + (t == DType::kQ4_1 || t == DType::kQ5_1 ? 4 * s.nbp : 0), 64);
  l.bytes = o;
  return l;
}

// An unpacked weight row (codes at 0, [segpad * E] bytes in the lane layout): d f32 [nbp] (the
// block or super-block scale); m f32 [nbp] (Q4_1, Q5_1: m; Q4_K: dmin); sc, mn int32 [nbp *
// SegsPerBlock] (Q4_K: the 6-bit scales and mins; Q6_K: the int8 scales).
struct RowLayout {
  int64_t d = 0, m = 0, sc = 0, mn = 0, bytes = 0;
};

inline RowLayout GetRowLayout(DType t, const Shape& s) {
  RowLayout l;
  int64_t o = Up(s.segpad * s.E, 64);
  l.d = o;
  o = Up(o + 4 * s.nbp, 64);
  l.m = o;
  o = Up(o + 4 * s.nbp, 64);
  l.sc = o;
  o = Up(o + 4 * s.nbp * SegsPerBlock(t), 64);
  l.mn = o;
  o = Up(o + 4 * s.nbp * SegsPerBlock(t), 64);
  l.bytes = o;
  return l;
}

}  // namespace qgemm
}  // namespace strata
#endif  // STRATA_KERNELS_QUANT_GEMM_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quant_gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {

using qgemm::RowLayout;
using qgemm::Shape;
using qgemm::TokLayout;

#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
#define STRATA_QGEMM_X86 1

using V8 = __m256i;  // 8 int32 lanes (the f32 stage)

#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
using VI = __m512i;
constexpr int64_t kLanes = 16;
constexpr int kR = 4, kT = 4;  // 16 accumulators + 4 weight columns + 1 token column (of 32)
HWY_INLINE VI LoadI(const uint8_t* p) { return _mm512_loadu_si512(p); }
HWY_INLINE void StoreI(int32_t* p, VI v) { _mm512_storeu_si512(p, v); }
HWY_INLINE VI ZeroI() { return _mm512_setzero_si512(); }
#else
using VI = __m256i;
constexpr int64_t kLanes = 8;
constexpr int kR = 4, kT = 2;  // 8 accumulators + 4 weight columns + 1 token column (of 16)
HWY_INLINE VI LoadI(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const V8*>(p)); }
HWY_INLINE void StoreI(int32_t* p, VI v) { _mm256_storeu_si256(reinterpret_cast<V8*>(p), v); }
HWY_INLINE VI ZeroI() { return _mm256_setzero_si256(); }
#endif

// With vpdpbusd (no int16 saturation) Q8_0's signed codes are stored as c + 128 (unsigned) and
// 128 * sum(q) is taken out in the f32 stage; without it they stay signed and are multiplied as
// |c| times q with c's sign (vpmaddubsw: 2 * 128 * 127 fits int16).
constexpr bool kVnni = HWY_TARGET == HWY_AVX3_DL;

// acc + the 4-byte dot products of unsigned codes u and signed activations q in every int32 lane.
// vpmaddubsw's int16 pair sums are exact for codes < 128 + 1 (Q6_K's are < 64).
HWY_INLINE VI DotAcc(VI acc, VI u, VI q) {
#if HWY_TARGET == HWY_AVX3_DL
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(q));
  return acc;
#elif HWY_TARGET == HWY_AVX3
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, q), _mm512_set1_epi16(1)));
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
#endif
}

// Signed codes c (Q8_0 without VNNI): |c| times q with c's sign.
HWY_INLINE VI DotAccSigned(VI acc, VI c, VI q) {
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
  const VI qs = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(c), _mm512_setzero_si512(), q);
  return DotAcc(acc, _mm512_abs_epi8(c), qs);
#else
  return DotAcc(acc, _mm256_abs_epi8(c), _mm256_sign_epi8(q, c));
#endif
}

// 8 lanes (ymm) of the same products, for a last group of at most 8 segments on AVX-512: the
// low half of every column.
HWY_INLINE V8 DotAcc8(V8 acc, V8 u, V8 q) {
#if HWY_TARGET == HWY_AVX3_DL
  // The EVEX encoding (AVX-512 VNNI), written out as kernels/quant_dot.cc's DotU8 does.
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(q));
  return acc;
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
#endif
}
HWY_INLINE V8 DotAcc8Signed(V8 acc, V8 c, V8 q) {
  return DotAcc8(acc, _mm256_abs_epi8(c), _mm256_sign_epi8(q, c));
}

// One group at byte offset `base` of the lane layout: the kR x kT accumulators of kW lanes (kW =
// kLanes, or 8 for the low half of a last group), stored at lane offset `lane0` of S.
template <int kC, bool kSigned, bool kHalf>
HWY_INLINE void IntGroup(const uint8_t* const* w, const uint8_t* const* a, int64_t base, int32_t* s,
                         int64_t sstride, int64_t lane0) {
  using VW = std::conditional_t<kHalf, V8, VI>;
  auto load = [](const uint8_t* p) HWY_ATTR -> VW {
    if constexpr (kHalf) {
      return _mm256_loadu_si256(reinterpret_cast<const V8*>(p));
    } else {
      return LoadI(p);
    }
  };
  VW acc[kR][kT];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < kT; ++t) {
      if constexpr (kHalf) {
        acc[r][t] = _mm256_setzero_si256();
      } else {
        acc[r][t] = ZeroI();
      }
    }
#pragma GCC unroll 8
  for (int c = 0; c < kC; ++c) {
    const int64_t o = base + c * 4 * kLanes;
    VW wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = load(w[r] + o);
    for (int t = 0; t < kT; ++t) {
      const VW av = load(a[t] + o);
      for (int r = 0; r < kR; ++r) {
        if constexpr (kHalf && kSigned) {
          acc[r][t] = DotAcc8Signed(acc[r][t], wv[r], av);
        } else if constexpr (kHalf) {
          acc[r][t] = DotAcc8(acc[r][t], wv[r], av);
        } else if constexpr (kSigned) {
          acc[r][t] = DotAccSigned(acc[r][t], wv[r], av);
        } else {
          acc[r][t] = DotAcc(acc[r][t], wv[r], av);
        }
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) {
      int32_t* dst = s + (r * kT + t) * sstride + lane0;
      if constexpr (kHalf) {
        _mm256_storeu_si256(reinterpret_cast<V8*>(dst), acc[r][t]);
      } else {
        StoreI(dst, acc[r][t]);
      }
    }
  }
}

// ---- The integer stage: S[r][t][seg] = sum over segment seg of code * q, for kR rows (w: their
// codes in the lane layout) and kT tokens (a: their codes), over the nseg segments in groups of
// kLanes with kC columns each (a last group of at most 8 segments in ymm on AVX-512). ----
template <int kC, bool kSigned>
HWY_INLINE void IntTile(const uint8_t* const* w, const uint8_t* const* a, int64_t nseg, int32_t* s,
                        int64_t sstride) {
  const int64_t ngroups = (nseg + kLanes - 1) / kLanes;
  for (int64_t g = 0; g < ngroups; ++g) {
    const int64_t base = g * kLanes * 4 * kC;
    if (kLanes == 16 && nseg - g * kLanes <= 8) {
      IntGroup<kC, kSigned, true>(w, a, base, s, sstride, g * kLanes);
    } else {
      IntGroup<kC, kSigned, false>(w, a, base, s, sstride, g * kLanes);
    }
  }
}

// ---- The lane layout: 8 consecutive segments s0..s0+7 (s0 a multiple of 8) of column c. ----
HWY_INLINE uint8_t* ColumnAt(uint8_t* codes, const Shape& s, int64_t s0, int c) {
  return codes + (s0 / kLanes) * kLanes * s.E + c * 4 * kLanes + 4 * (s0 % kLanes);
}
HWY_INLINE void StoreCol(uint8_t* codes, const Shape& s, int64_t s0, int c, V8 v) {
  _mm256_storeu_si256(reinterpret_cast<V8*>(ColumnAt(codes, s, s0, c)), v);
}
HWY_INLINE V8 Gather(const uint8_t* base, V8 idx) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), idx, 1);
}
HWY_INLINE V8 GatherMasked(const uint8_t* base, V8 idx, V8 mask) {
  return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(base),
                                     idx, mask, 1);
}
HWY_INLINE V8 Iota8() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
HWY_INLINE V8 Bcast32(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

HWY_INLINE float F16At(const uint8_t* p) { return F16ToF32(qdot::LdU16(p)); }

// ---- Per type: the row unpacking (codes in the lane layout and the scales of RowLayout) and the
// f32 stage (one (row, token) result from its segment sums). ----

// The 32-element formats with 4-bit codes (Q4_0: offset 8; Q4_1: min).
template <bool kMin>
struct K4Bit {
  static constexpr int64_t kBytes = kMin ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  static constexpr int64_t kCodes = kMin ? 4 : 2;
  static constexpr int kC = 8;
  static constexpr bool kSigned = false;
  static void Unpack(const uint8_t* row, const Shape& s, const RowLayout& l, uint8_t* out) {
    const V8 m4 = Bcast32(0x0f0f0f0fu);
    for (int64_t s0 = 0; s0 < s.nseg; s0 += 8) {
      const V8 lane = _mm256_add_epi32(Bcast32(static_cast<uint32_t>(s0)), Iota8());
      const V8 idx = _mm256_mullo_epi32(lane, Bcast32(kBytes));
      const V8 valid = _mm256_cmpgt_epi32(Bcast32(static_cast<uint32_t>(s.nseg)), lane);
      for (int c = 0; c < 4; ++c) {
        const V8 raw = GatherMasked(row + kCodes + 4 * c, idx, valid);
        StoreCol(out, s, s0, c, _mm256_and_si256(raw, m4));
        StoreCol(out, s, s0, c + 4, _mm256_and_si256(_mm256_srli_epi32(raw, 4), m4));
      }
    }
    float* d = reinterpret_cast<float*>(out + l.d);
    float* m = reinterpret_cast<float*>(out + l.m);
    for (int64_t b = 0; b < s.nb; ++b) {
      d[b] = F16At(row + b * kBytes);
      if constexpr (kMin) m[b] = F16At(row + b * kBytes + 2);
    }
  }
};

// Q5_0 / Q5_1: the 4-bit codes as K4Bit plus bit j of the 32-bit qh as bit 4 of element j's code
// (Q5_0: offset 16; Q5_1: min).
template <bool kMin>
struct K5Bit {
  static constexpr int64_t kBytes = kMin ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  static constexpr int64_t kHigh = kMin ? 4 : 2;  // qh
  static constexpr int64_t kCodes = kHigh + 4;
  static constexpr int kC = 8;
  static constexpr bool kSigned = false;
  static void Unpack(const uint8_t* row, const Shape& s, const RowLayout& l, uint8_t* out) {
    const V8 m4 = Bcast32(0x0f0f0f0fu);
    // Bits 0-3 of x to bit 0 of bytes 0-3: x * (1 + 2^7 + 2^14 + 2^21) puts bit i at 8 i (the
    // four shifted copies do not overlap, so nothing carries).
    const V8 spread = Bcast32(0x00204081u), ones = Bcast32(0x01010101u);
    for (int64_t s0 = 0; s0 < s.nseg; s0 += 8) {
      const V8 lane = _mm256_add_epi32(Bcast32(static_cast<uint32_t>(s0)), Iota8());
      const V8 idx = _mm256_mullo_epi32(lane, Bcast32(kBytes));
      const V8 valid = _mm256_cmpgt_epi32(Bcast32(static_cast<uint32_t>(s.nseg)), lane);
      const V8 qh = GatherMasked(row + kHigh, idx, valid);
      for (int c = 0; c < 4; ++c) {
        const V8 raw = GatherMasked(row + kCodes + 4 * c, idx, valid);
        auto high = [&](int e0) HWY_ATTR {  // bit 4 of elements e0 .. e0 + 3
          const V8 x = _mm256_and_si256(_mm256_srli_epi32(qh, e0), Bcast32(0xf));
          return _mm256_slli_epi32(_mm256_and_si256(_mm256_mullo_epi32(x, spread), ones), 4);
        };
        StoreCol(out, s, s0, c, _mm256_or_si256(_mm256_and_si256(raw, m4), high(4 * c)));
        StoreCol(
            out, s, s0, c + 4,
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(raw, 4), m4), high(16 + 4 * c)));
      }
    }
    float* d = reinterpret_cast<float*>(out + l.d);
    float* m = reinterpret_cast<float*>(out + l.m);
    for (int64_t b = 0; b < s.nb; ++b) {
      d[b] = F16At(row + b * kBytes);
      if constexpr (kMin) m[b] = F16At(row + b * kBytes + 2);
    }
  }
};

struct K8Bit {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kC = 8;
  static constexpr bool kSigned = !kVnni;
  static void Unpack(const uint8_t* row, const Shape& s, const RowLayout& l, uint8_t* out) {
    const V8 bias = Bcast32(kVnni ? 0x80808080u : 0u);
    for (int64_t s0 = 0; s0 < s.nseg; s0 += 8) {
      const V8 lane = _mm256_add_epi32(Bcast32(static_cast<uint32_t>(s0)), Iota8());
      const V8 idx = _mm256_mullo_epi32(lane, Bcast32(kBytes));
      const V8 valid = _mm256_cmpgt_epi32(Bcast32(static_cast<uint32_t>(s.nseg)), lane);
      for (int c = 0; c < 8; ++c) {
        StoreCol(out, s, s0, c, _mm256_xor_si256(GatherMasked(row + 2 + 4 * c, idx, valid), bias));
      }
    }
    float* d = reinterpret_cast<float*>(out + l.d);
    for (int64_t b = 0; b < s.nb; ++b) d[b] = F16At(row + b * kBytes);
  }
};

// Q4_K: segment 8 b + g is sub-block g of super-block b, nibble g % 2 of qs[32 (g / 2) + l].
struct KQ4K {
  static constexpr int64_t kBytes = sizeof(BlockQ4_K);
  static constexpr int kC = 8;
  static constexpr bool kSigned = false;
  static void Unpack(const uint8_t* row, const Shape& s, const RowLayout& l, uint8_t* out) {
    const V8 m4 = Bcast32(0x0f0f0f0fu);
    const V8 sub = _mm256_setr_epi32(0, 0, 32, 32, 64, 64, 96, 96);
    const V8 shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    for (int64_t b = 0; b < s.nb; ++b) {
      const uint8_t* qs = row + b * kBytes + 16;
      for (int c = 0; c < 8; ++c) {
        const V8 raw = Gather(qs + 4 * c, sub);
        StoreCol(out, s, 8 * b, c, _mm256_and_si256(_mm256_srlv_epi32(raw, shift), m4));
      }
    }
    float* d = reinterpret_cast<float*>(out + l.d);
    float* dmin = reinterpret_cast<float*>(out + l.m);
    int32_t* sc = reinterpret_cast<int32_t*>(out + l.sc);
    int32_t* mn = reinterpret_cast<int32_t*>(out + l.mn);
    for (int64_t b = 0; b < s.nb; ++b) {
      const uint8_t* p = row + b * kBytes;
      d[b] = F16At(p);
      dmin[b] = F16At(p + 2);
      for (int g = 0; g < 8; ++g) {
        int scv, mnv;
        qdot::K4ScaleMin(p + 4, g, &scv, &mnv);
        sc[8 * b + g] = scv;
        mn[8 * b + g] = mnv;
      }
    }
  }
};

// Q6_K: segment 16 b + g is elements 16 g .. 16 g + 15 of super-block b; with g = 8 h + j, the low
// nibbles are nibble j / 4 of ql[64 h + 32 ((j / 2) % 2) + 16 (j % 2) + i] and the high two bits
// bits 2 (j / 2) of qh[32 h + 16 (j % 2) + i], i = 0..15 (qdot::RefQ6_K's element formula).
struct KQ6K {
  static constexpr int64_t kBytes = sizeof(BlockQ6_K);
  static constexpr int kC = 4;
  static constexpr bool kSigned = false;
  static void Unpack(const uint8_t* row, const Shape& s, const RowLayout& l, uint8_t* out) {
    const V8 m4 = Bcast32(0x0f0f0f0fu), m2 = Bcast32(0x03030303u);
    const V8 lo_off = _mm256_setr_epi32(0, 16, 32, 48, 0, 16, 32, 48);
    const V8 lo_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const V8 hi_off = _mm256_setr_epi32(128, 144, 128, 144, 128, 144, 128, 144);
    const V8 hi_shift = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    for (int64_t b = 0; b < s.nb; ++b) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = row + b * kBytes;
        for (int c = 0; c < 4; ++c) {
          const V8 lo =
              _mm256_and_si256(_mm256_srlv_epi32(Gather(p + 64 * h + 4 * c, lo_off), lo_shift), m4);
          const V8 hi =
              _mm256_and_si256(_mm256_srlv_epi32(Gather(p + 32 * h + 4 * c, hi_off), hi_shift), m2);
          StoreCol(out, s, 16 * b + 8 * h, c, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)));
        }
      }
    }
    float* d = reinterpret_cast<float*>(out + l.d);
    int32_t* sc = reinterpret_cast<int32_t*>(out + l.sc);
    for (int64_t b = 0; b < s.nb; ++b) {
      const uint8_t* p = row + b * kBytes;
      d[b] = F16At(p + 208);
      for (int g = 0; g < 16; ++g) sc[16 * b + g] = static_cast<int8_t>(p[192 + g]);
    }
  }
};

// ---- The f32 stage. ----
HWY_INLINE V8 LdV8(const void* p) { return _mm256_loadu_si256(static_cast<const V8*>(p)); }
HWY_INLINE __m256 LdF8(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }

// acc + t in the lanes of blocks that exist (n_valid of the 8 from here on).
HWY_INLINE __m256 AddValid(__m256 acc, __m256 t, int64_t n_valid) {
  const __m256 sum = _mm256_add_ps(acc, t);
  if (n_valid >= 8) return sum;
  const __m256 valid = _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n_valid)), Iota8()));
  return _mm256_blendv_ps(acc, sum, valid);
}

// qdot::Tree8 of the 8 lanes in registers: [a0 + a4, a1 + a5, a2 + a6, a3 + a7], then
// (a0 + a4) + (a2 + a6) and (a1 + a5) + (a3 + a7), then their sum: the same additions in the same
// order.
HWY_INLINE float Finish(__m256 acc) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

// The 32-element formats: isum = S - off (the code offset times the activation sum), then
// quant_dot.h's Term / TermMin in lane b % 8, for a whole kR x kT tile at once: the same
// operations per (row, token), with the
// kR * kT independent accumulator chains interleaved (one (row, token) at a time left the f32
// latency chain exposed) and each row's scales and each token's factors loaded once per step.
template <bool kOff, bool kMin>
struct Epi32 {
  HWY_INLINE static void Tile(const int32_t* sums, int64_t sstride, const uint8_t* const* rows,
                              const RowLayout& rl, const uint8_t* const* toks, const TokLayout& tl,
                              int64_t nb, float (*out)[kT]) {
    __m256 acc[kR][kT];
    for (int r = 0; r < kR; ++r)
      for (int t = 0; t < kT; ++t) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 8) {
      __m256 dx[kT], dxs[kT];
      V8 off[kT];
      for (int t = 0; t < kT; ++t) {
        dx[t] = LdF8(toks[t] + tl.dx + 4 * b);
        if constexpr (kMin) dxs[t] = LdF8(toks[t] + tl.dxs + 4 * b);
        if constexpr (kOff) off[t] = LdV8(toks[t] + tl.off + 4 * b);
      }
      for (int r = 0; r < kR; ++r) {
        const __m256 dw = LdF8(rows[r] + rl.d + 4 * b);
        __m256 m;
        if constexpr (kMin) m = LdF8(rows[r] + rl.m + 4 * b);
        for (int t = 0; t < kT; ++t) {
          V8 isum = LdV8(sums + (r * kT + t) * sstride + b);
          if constexpr (kOff) isum = _mm256_sub_epi32(isum, off[t]);
          __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, dx[t]), _mm256_cvtepi32_ps(isum));
          if constexpr (kMin) v = _mm256_add_ps(v, _mm256_mul_ps(m, dxs[t]));
          acc[r][t] = AddValid(acc[r][t], v, nb - b);
        }
      }
    }
    for (int r = 0; r < kR; ++r)
      for (int t = 0; t < kT; ++t) out[r][t] = Finish(acc[r][t]);
  }
};

// The K-quants take 4 super-blocks per step: lane j of the xmm term is super-block b + j, whose
// accumulator (b + j) % 8 is lane j of acc[(b / 4) % 2] (b a multiple of 4).
HWY_INLINE __m128 AddValid4(__m128 acc, __m128 t, int64_t n_valid) {
  const __m128 sum = _mm_add_ps(acc, t);
  if (n_valid >= 4) return sum;
  const __m128 valid = _mm_castsi128_ps(
      _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(n_valid)), _mm_setr_epi32(0, 1, 2, 3)));
  return _mm_blendv_ps(acc, sum, valid);
}
HWY_INLINE __m128 LdF4(const void* p) { return _mm_loadu_ps(static_cast<const float*>(p)); }

// Lanes [sum v0, sum v1, sum v2, sum v3 | the same halves] before the final add: the 8-lane sums of
// v[0..3] as lanes 0-3 of low + high.
HWY_INLINE V8 Hadd4(const V8* v) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
}

// Q4_K: isum = sum_g sc_g S_g, msum = sum_g mn_g s32_g per super-block, then TermKMin.
HWY_INLINE float EpilogueQ4K(const int32_t* sums, const uint8_t* row, const RowLayout& rl,
                             const uint8_t* tok, const TokLayout& tl, int64_t nb) {
  __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
  const int32_t* sc = reinterpret_cast<const int32_t*>(row + rl.sc);
  const int32_t* mn = reinterpret_cast<const int32_t*>(row + rl.mn);
  const uint8_t* s32 = tok + tl.off;
  for (int64_t b = 0; b < nb; b += 4) {
    V8 vi[4], vm[4];
    const int64_t nj = std::min<int64_t>(4, nb - b);
    for (int j = 0; j < 4; ++j) {
      if (j >= nj) {  // past the last super-block: its lane is not added
        vi[j] = vm[j] = _mm256_setzero_si256();
        continue;
      }
      const int64_t o = 8 * (b + j);
      vi[j] = _mm256_mullo_epi32(LdV8(sums + o), LdV8(sc + o));
      vm[j] = _mm256_mullo_epi32(LdV8(mn + o), LdV8(s32 + 4 * o));
    }
    const V8 ti = Hadd4(vi), tm = Hadd4(vm);
    // [isum b..b+3 | msum b..b+3]
    const V8 both = _mm256_add_epi32(_mm256_permute2x128_si256(ti, tm, 0x20),
                                     _mm256_permute2x128_si256(ti, tm, 0x31));
    const __m256 dd = _mm256_set_m128(LdF4(row + rl.m + 4 * b), LdF4(row + rl.d + 4 * b));
    const __m128 dx4 = LdF4(tok + tl.dx + 4 * b);
    const __m256 t =
        _mm256_mul_ps(_mm256_mul_ps(dd, _mm256_set_m128(dx4, dx4)), _mm256_cvtepi32_ps(both));
    const __m128 term = _mm_sub_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128& a = acc[(b / 4) & 1];
    a = AddValid4(a, term, nb - b);
  }
  return Finish(_mm256_set_m128(acc[1], acc[0]));
}

// Q6_K: isum = sum_g sc_g (S_g - 32 s16_g) per super-block, then TermK.
HWY_INLINE float EpilogueQ6K(const int32_t* sums, const uint8_t* row, const RowLayout& rl,
                             const uint8_t* tok, const TokLayout& tl, int64_t nb) {
  __m128 acc[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
  const int32_t* sc = reinterpret_cast<const int32_t*>(row + rl.sc);
  const uint8_t* off = tok + tl.off;
  for (int64_t b = 0; b < nb; b += 4) {
    V8 v[4];
    const int64_t nj = std::min<int64_t>(4, nb - b);
    for (int j = 0; j < 4; ++j) {
      if (j >= nj) {  // past the last super-block: its lane is not added
        v[j] = _mm256_setzero_si256();
        continue;
      }
      const int64_t o = 16 * (b + j);
      const V8 s0 = _mm256_sub_epi32(LdV8(sums + o), LdV8(off + 4 * o));
      const V8 s1 = _mm256_sub_epi32(LdV8(sums + o + 8), LdV8(off + 4 * o + 32));
      v[j] = _mm256_add_epi32(_mm256_mullo_epi32(s0, LdV8(sc + o)),
                              _mm256_mullo_epi32(s1, LdV8(sc + o + 8)));
    }
    const V8 h = Hadd4(v);
    const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128 term = _mm_mul_ps(_mm_mul_ps(LdF4(row + rl.d + 4 * b), LdF4(tok + tl.dx + 4 * b)),
                                   _mm_cvtepi32_ps(isum));
    __m128& a = acc[(b / 4) & 1];
    a = AddValid4(a, term, nb - b);
  }
  return Finish(_mm256_set_m128(acc[1], acc[0]));
}

// The K-quants' epilogues over a tile, one (row, token) after another.
template <float (*kEpi)(const int32_t*, const uint8_t*, const RowLayout&, const uint8_t*,
                        const TokLayout&, int64_t)>
struct EpiEach {
  HWY_INLINE static void Tile(const int32_t* sums, int64_t sstride, const uint8_t* const* rows,
                              const RowLayout& rl, const uint8_t* const* toks, const TokLayout& tl,
                              int64_t nb, float (*out)[kT]) {
    for (int r = 0; r < kR; ++r)
      for (int t = 0; t < kT; ++t)
        out[r][t] = kEpi(sums + (r * kT + t) * sstride, rows[r], rl, toks[t], tl, nb);
  }
};

// ---- The tiled product. ----

// Tokens per tile: each row is unpacked once per tile, and the tile's prepared tokens (about k
// bytes each) stay in L2 while every row group passes over them: about 256 KiB of them, 16 to 256
// tokens.
HWY_INLINE int64_t TokTile(int64_t token_bytes) {
  return std::clamp<int64_t>((256 * 1024) / std::max<int64_t>(token_bytes, 1), 16, 256) / kT * kT;
}

template <class K, class Epi>
void GemmT(const TensorView& w, const uint8_t* toks, int64_t tstride, int64_t n_tok, float* y,
           int64_t y_stride, int64_t r0, int64_t r1) {
  const DType t = w.dtype;
  const Shape s = qgemm::GetShape(t, w.cols());
  const RowLayout rl = qgemm::GetRowLayout(t, s);
  const TokLayout tl = qgemm::GetTokLayout(t, s);
  thread_local AlignedBuffer<uint8_t> rowbuf;
  thread_local AlignedBuffer<int32_t> sbuf;
  if (rowbuf.size() < static_cast<size_t>(kR * rl.bytes)) rowbuf.Resize(kR * rl.bytes);
  if (sbuf.size() < static_cast<size_t>(kR * kT * s.sstride)) sbuf.Resize(kR * kT * s.sstride);
  const uint8_t* wp[kR];
  for (int i = 0; i < kR; ++i) wp[i] = rowbuf.data() + i * rl.bytes;
  const int64_t tile = TokTile(tl.bytes);
  for (int64_t t0 = 0; t0 < n_tok; t0 += tile) {
    const int64_t t1 = std::min(n_tok, t0 + tile);
    for (int64_t ra = r0; ra < r1; ra += kR) {
      const int nr = static_cast<int>(std::min<int64_t>(kR, r1 - ra));
      // Rows past r1 keep whatever codes the buffer holds: their sums are never read.
      for (int i = 0; i < nr; ++i) K::Unpack(w.row(ra + i), s, rl, rowbuf.data() + i * rl.bytes);
      for (int64_t tt = t0; tt < t1; tt += kT) {
        const int nt = static_cast<int>(std::min<int64_t>(kT, t1 - tt));
        const uint8_t* ap[kT];
        for (int j = 0; j < kT; ++j) ap[j] = toks + (tt + std::min(j, nt - 1)) * tstride;
        IntTile<K::kC, K::kSigned>(wp, ap, s.nseg, sbuf.data(), s.sstride);
        float out[kR][kT];
        Epi::Tile(sbuf.data(), s.sstride, wp, rl, ap, tl, s.nb, out);
        for (int r = 0; r < nr; ++r) {
          for (int j = 0; j < nt; ++j) y[(tt + j) * y_stride + ra + r] = out[r][j];
        }
      }
    }
  }
}

bool HasQuantGemmImpl(DType t) { return qgemm::Served(t); }

void PrepareTokenImpl(DType t, const void* act, int64_t k, void* out) {
  const Shape s = qgemm::GetShape(t, k);
  const TokLayout l = qgemm::GetTokLayout(t, s);
  const qdot::Act a = qdot::MakeAct(t, act, k);
  uint8_t* o = static_cast<uint8_t*>(out);
  std::memset(o, 0, l.bytes);
  const int64_t cols = s.E / 4;
  for (int64_t seg = 0; seg < s.nseg; ++seg) {
    const int8_t* q = a.q + seg * s.E;
    uint8_t* dst = o + (seg / kLanes) * kLanes * s.E + 4 * (seg % kLanes);
    for (int64_t c = 0; c < cols; ++c) std::memcpy(dst + c * 4 * kLanes, q + 4 * c, 4);
  }
  std::memcpy(o + l.dx, a.d, 4 * s.nb);
  int32_t* off = reinterpret_cast<int32_t*>(o + l.off);
  switch (t) {
    case DType::kQ4_0:
      for (int64_t b = 0; b < s.nb; ++b) off[b] = qdot::LdI32(a.s32, b) * 8;
      break;
    case DType::kQ8_0:
      for (int64_t b = 0; b < s.nb; ++b) off[b] = kVnni ? qdot::LdI32(a.s32, b) * 128 : 0;
      break;
    case DType::kQ5_0:
      for (int64_t b = 0; b < s.nb; ++b) off[b] = qdot::LdI32(a.s32, b) * 16;
      break;
    case DType::kQ4_1:
    case DType::kQ5_1: {
      float* dxs = reinterpret_cast<float*>(o + l.dxs);
      for (int64_t b = 0; b < s.nb; ++b) {
        dxs[b] = qdot::LdF32(a.d, b) * static_cast<float>(qdot::LdI32(a.s32, b));
      }
      break;
    }
    case DType::kQ4_K:
      for (int64_t g = 0; g < 8 * s.nb; ++g) off[g] = qdot::LdI32(a.s32, g);
      break;
    case DType::kQ6_K:
      for (int64_t g = 0; g < 16 * s.nb; ++g) off[g] = 32 * qdot::LdI32(a.s16, g);
      break;
    default:
      STRATA_CHECK(false);
  }
}

void GemmRowsImpl(const TensorView& w, const uint8_t* toks, int64_t tstride, int64_t n_tok,
                  float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::kQ4_0:
      return GemmT<K4Bit<false>, Epi32<true, false>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ4_1:
      return GemmT<K4Bit<true>, Epi32<false, true>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ5_0:
      return GemmT<K5Bit<false>, Epi32<true, false>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ5_1:
      return GemmT<K5Bit<true>, Epi32<false, true>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ8_0:
      return GemmT<K8Bit, Epi32<kVnni, false>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ4_K:
      return GemmT<KQ4K, EpiEach<&EpilogueQ4K>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    case DType::kQ6_K:
      return GemmT<KQ6K, EpiEach<&EpilogueQ6K>>(w, toks, tstride, n_tok, y, y_stride, r0, r1);
    default:
      STRATA_CHECK(false);
  }
}

#else  // Not served on this target.

bool HasQuantGemmImpl(DType) { return false; }
void PrepareTokenImpl(DType, const void*, int64_t, void*) { STRATA_CHECK(false); }
void GemmRowsImpl(const TensorView&, const uint8_t*, int64_t, int64_t, float*, int64_t, int64_t,
                  int64_t) {
  STRATA_CHECK(false);
}

#endif

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(HasQuantGemmImpl);
HWY_EXPORT(PrepareTokenImpl);
HWY_EXPORT(GemmRowsImpl);

bool HasQuantGemm(DType t, int64_t k) {
  if (!qgemm::Served(t) || k <= 0 || k % DTypeBlockElems(t) != 0) return false;
  return HWY_DYNAMIC_DISPATCH(HasQuantGemmImpl)(t);
}

int64_t QuantGemmTokenBytes(DType t, int64_t k) {
  STRATA_CHECK_MSG(qgemm::Served(t) && k > 0 && k % DTypeBlockElems(t) == 0,
                   "quantized GEMM: %lld elements of %s", static_cast<long long>(k),
                   std::string(DTypeName(t)).c_str());
  return qgemm::GetTokLayout(t, qgemm::GetShape(t, k)).bytes;
}

void PrepareQuantGemmToken(DType t, const void* act, int64_t k, void* out) {
  STRATA_CHECK_MSG(HasQuantGemm(t, k), "quantized GEMM: %s with %lld columns is not served",
                   std::string(DTypeName(t)).c_str(), static_cast<long long>(k));
  HWY_DYNAMIC_DISPATCH(PrepareTokenImpl)(t, act, k, out);
}

void QuantGemmRows(const TensorView& w, const uint8_t* tokens, int64_t token_stride, int64_t n_tok,
                   float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  STRATA_CHECK_MSG(HasQuantGemm(w.dtype, w.cols()),
                   "quantized GEMM: %s with %lld columns is not served",
                   std::string(DTypeName(w.dtype)).c_str(), static_cast<long long>(w.cols()));
  if (n_tok <= 0 || r1 <= r0) return;
  HWY_DYNAMIC_DISPATCH(GemmRowsImpl)(w, tokens, token_stride, n_tok, y, y_stride, r0, r1);
}

}  // namespace strata
#endif  // HWY_ONCE
