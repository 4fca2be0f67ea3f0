// Integer dot products of the ggml block formats with int8 activation blocks (see quant_dot.h).
//
// Version log (2-core AMD EPYC Zen 5 host, AVX-512 VNNI, shared with other builds: load 6-8):
//   v1  One row kernel per type. x86 (AVX2, AVX3, AVX3_DL): each 32-element group of weight codes
//       is unpacked in registers to unsigned bytes (or signed bytes for Q8_0/IQ4 with the
//       abs/sign trick; biased by 128 under VNNI) and multiplied with the int8 activations by
//       vpdpbusd (AVX3_DL) or vpmaddubsw + vpmaddwd (AVX2/AVX3), 8 int32 partial sums per group;
//       8 groups are reduced to 8 exact group sums by a vphaddd tree; the code offsets (Q4_0's
//       8 ...) are taken out as offset * sum(q) from the activation block sums; 32-element formats
//       then apply the block scales 8 blocks at a time in f32 lanes (lane j = accumulator j of
//       the shared order), the K-quants multiply the group sums by their integer scales and apply
//       d, dmin once per 256. Other targets (SSE4, EMU128) run the scalar reference, which gives
//       the same floats. The activation quantizer is Highway code (division, nearest-even).
//       Instructions in the hot loop (objdump, AVX3_DL; per 8 blocks of 32 or per 256-block):
//       Q4_0 95 (0.66 per weight byte), Q4_1 113 (0.71), Q5_0 135 (0.77), Q5_1 153 (0.80),
//       Q8_0 73 (0.27), IQ4_NL 103 (0.72), Q2_K 103 (1.23), Q3_K 134 (1.22), Q4_K 115 (0.80),
//       Q5_K 131 (0.74), Q6_K 103 (0.49), IQ4_XS 114 (0.84); F16's f32 loop is ~0.1 per byte.
//       In-cache ceiling (QuantDotBench.DISABLED_MatVecInCache, thread CPU time, 64 x 2048):
//       ns per 256 weights F16 9.1, Q4_0 8.8, Q4_1 9.9, Q5_0 11.0, Q5_1 12.7, Q8_0 7.3, Q2_K 9.6,
//       Q3_K 10.3, Q4_K 9.2, Q5_K 10.7, Q6_K 9.6, IQ4_NL 9.4, IQ4_XS 10.1 (~23-33 cycles at 2.6
//       GHz: 4-5 instructions per cycle, i.e. instruction-throughput bound), so GB/s of weight
//       bytes from cache: F16 56, Q8_0 37, Q6_K 22, Q4_0/Q4_1/Q5_0/Q4_K/Q5_K 15-16, IQ4_XS 13,
//       Q3_K 11, Q2_K 9: below a ~40 GB/s one-core read bandwidth for every type but Q8_0.
//   v2  AVX3/AVX3_DL nibbles by one broadcast load + vpsrlvw (3 instructions instead of 4), the
//       K-quants' two block sums in one reduction (HSum2), d/dmin by one f16 conversion, and the
//       Q4_K/Q5_K scales and mins unpacked in SIMD. Hot loops now: Q4_0 87, Q4_1 105, Q5_0 128,
//       Q5_1 146, IQ4_NL 95, Q2_K 93, Q4_K 90, Q5_K 106, IQ4_XS 107 (others unchanged). The 2-vCPU
//       host (SMT siblings under a hypervisor) varies by +-50 % between runs even in thread CPU
//       time, so the 8-20 % fewer instructions are not resolved by timing; results are
//       bit-identical (same integer sums).
//   v3  Q4_K, Q5_K, Q6_K on AVX3_DL and AVX3 in 512-bit vectors (DotQ45_K_512, DotQ6_K_512): the
//       codes of 64 consecutive elements are built in activation order (Q4_K/Q5_K: one 32-byte
//       chunk broadcast to both halves and shifted 0 / 4 per half; Q6_K: 64 ql bytes and
//       [qh | qh >> 2]), multiplied by vpmaddubsw into int16 pair sums, and the sub-block scales are
//       applied by vpmaddwd / vpdpwssd against scale words placed by one vpermb (vpermw) per 64
//       elements: no per-sub-block reduction tree and no int32 multiplies of group sums. The
//       per-super-block integer totals and f32 operations are unchanged (the term in xmm lanes), so
//       results are bit-identical to v2 and to the reference. AVX2 keeps the v2 kernels. Q4_K/Q5_K
//       take two super-blocks per iteration so that their two reductions and f32 terms share
//       instructions (one vphaddd, [d0, dmin0, d1, dmin1] in one vcvtph2ps).
//       Hot loop (objdump, AVX3_DL, per super-block): Q4_K 90 -> 60.5, Q5_K 106 -> 76, Q6_K
//       103 -> 70 (AVX3: Q4_K 66 before the pairing, Q6_K 72). Measured against the v2 binary,
//       interleaved in the same minutes (host load ~4):
//       QuantDotBench.DISABLED_MatVecInCache GB/s Q4_K 17.3 -> 23.3, Q5_K 18.4 -> 25.4, Q6_K
//       25.2 -> 33.6 (ns per 256 weights 8.4 -> 6.2, 9.7 -> 7.0, 8.6 -> 6.4; before the pairing
//       Q4_K was 21.0 against 16.6 for v2);
//       DISABLED_MatVecBandwidth (streamed from DRAM, 56-82 MB) Q4_K 18.2 -> 23.1 GB/s (0.47 ->
//       0.65 of the probe), Q6_K 26.0 -> 33.7 (0.70 -> 0.85), Q5_K 19.6 -> 24.1. Decode of the 125M
//       llama, 1 thread, ctx 0, 128 tokens (strata bench decode vs llama-bench -n 128 -t 1,
//       interleaved, 5 rounds, medians; host noise is +-20 %): Q4_K_M v2 227, v3 354, llama.cpp
//       282 tok/s (0.80x -> 1.26x; per-round ratios 1.21-1.32); Q6_K v3 304-351 vs 234-243.
// This file compiles one more Highway target than the rest of the project, AVX3_DL (AVX-512 VNNI,
// for vpdpbusd); dispatch tables are per translation unit, so the others are unaffected.
#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif

#include "kernels/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "core/quant.h"
#include "kernels/quant_dot_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quant_dot.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {

using qdot::Act;

// Software prefetch distance for the streamed weight rows (as kernels/matmul.cc's kPrefetchBytes).
constexpr int64_t kPrefetchBytes = 8192;

HWY_INLINE void PrefetchSpan(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) hwy::Prefetch(p + kPrefetchBytes + i);
}

#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
#define STRATA_QDOT_X86 1

using V = __m256i;

// f16 -> f32 by F16C (exact, the same value as F16ToF32).
HWY_INLINE float F16(const uint8_t* p) { return _cvtsh_ss(qdot::LdU16(p)); }

HWY_INLINE V Bcast8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
HWY_INLINE V Ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
HWY_INLINE __m128i Ld128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// 8 int32 partial sums of u (unsigned bytes) times q (signed bytes): lane j = bytes 4j..4j+3.
// maddubs adds byte pairs into saturating int16: exact while 2 * u * |q| <= 32767, i.e. u <= 128
// for |q| <= 127, which every caller keeps (unpacked codes are < 64; signed codes go through
// DotS8, whose |c| <= 128).
HWY_INLINE V DotU8(V u, V q) {
#if HWY_TARGET == HWY_AVX3_DL
  // The EVEX (AVX-512 VNNI) encoding, written out: Highway 1.0.3's AVX3_DL target enables AVX-VNNI
  // too, so GCC would emit the VEX form of _mm256_dpbusd_epi32, which CPUs with AVX-512 VNNI but
  // no AVX-VNNI (Ice Lake, Zen 4) lack; Highway's runtime check for AVX3_DL is AVX-512 VNNI.
  V acc = _mm256_setzero_si256();
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(q));
  return acc;
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
}

// Signed codes c times q: |c| times q with c's sign.
HWY_INLINE V DotS8(V c, V q) { return DotU8(_mm256_abs_epi8(c), _mm256_sign_epi8(q, c)); }

HWY_INLINE int32_t HSum(V v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// (sum of the lanes of a, sum of the lanes of b) in one reduction.
HWY_INLINE void HSum2(V a, V b, int32_t* sa, int32_t* sb) {
  const V h = _mm256_hadd_epi32(a, b);  // [a01 a23 b01 b23 | a45 a67 b45 b67]
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  x = _mm_hadd_epi32(x, x);  // [sum a, sum b, sum a, sum b]
  *sa = _mm_cvtsi128_si32(x);
  *sb = _mm_extract_epi32(x, 1);
}

// The two f16 fields at p (d) and p + 2 (dmin or m), as f32 by one conversion.
HWY_INLINE void F16Pair(const uint8_t* p, float* a, float* b) {
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(qdot::LdU32(p))));
  *a = _mm_cvtss_f32(f);
  *b = _mm_cvtss_f32(_mm_movehdup_ps(f));
}

// Lane j = the sum of the 8 lanes of v[j].
HWY_INLINE V Reduce8(const V* v) {
  const V t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const V t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20),
                          _mm256_permute2x128_si256(t0, t1, 0x31));
}

// For 4 vectors each covering two 16-element groups (lanes 0-3, 4-7): the 8 group sums in the
// order [g0, g2, g4, g6, g1, g3, g5, g7] (g0, g1 from v[0], ...).
HWY_INLINE V Reduce4Halves(const V* v) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
}

// Nibbles of 16 bytes: low nibbles in bytes 0-15, high nibbles in bytes 16-31 (the element order
// of the 32-element formats and of an IQ4_XS sub-block).
HWY_INLINE V Nibbles16(const uint8_t* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // One broadcast load and a per-half shift (AVX-512BW vpsrlvw): 3 instructions instead of 4.
  const V x = _mm256_broadcastsi128_si256(Ld128(p));
  const V sh = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  return _mm256_and_si256(_mm256_srlv_epi16(x, sh), Bcast8(0xf));
#else
  const __m128i x = Ld128(p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), Bcast8(0xf));
#endif
}

// Byte i = 0xff where bit i of m is set.
HWY_INLINE V BitsToBytes(uint32_t m) {
  const V v = _mm256_set1_epi32(static_cast<int>(m));
  const V shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                  2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const V bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shuf), bit), bit);
}

// Bit `from` of every byte moved to bit `to` (other bits cleared). 16-bit shifts: the selected bit
// stays within its byte for |from - to| <= 4 as used here.
template <int kFrom, int kTo>
HWY_INLINE V BitTo(V v) {
  const V m = Bcast8(1 << kTo);
  if constexpr (kFrom < kTo) return _mm256_and_si256(_mm256_slli_epi16(v, kTo - kFrom), m);
  if constexpr (kFrom > kTo) return _mm256_and_si256(_mm256_srli_epi16(v, kFrom - kTo), m);
  return _mm256_and_si256(v, m);
}

HWY_INLINE V Iq4Table() {
  const __m128i t = Ld128(kIq4nlValues);
  return _mm256_set_m128i(t, t);
}

// With vpdpbusd (no int16 saturation) the signed codes are multiplied as unsigned c + 128 and
// 128 * sum(q) is taken out afterwards: one xor (or none: a biased table) instead of abs + sign.
#if HWY_TARGET == HWY_AVX3_DL
constexpr bool kBiasSigned = true;
#else
constexpr bool kBiasSigned = false;
#endif

HWY_INLINE V Iq4TableBiased() {
  return _mm256_xor_si256(Iq4Table(), Bcast8(0x80));
}

// Signed codes c times q, in the form the offset of K::kOffShift expects.
HWY_INLINE V DotSigned(V c_or_biased, V q) {
  if constexpr (kBiasSigned) return DotU8(c_or_biased, q);
  return DotS8(c_or_biased, q);
}

// ---- 32-element formats: K::Partials(block, q) gives the 8 int32 partials of sum(code * q) with
// unsigned codes (before the offset) or signed codes. ----
struct KQ4_0 {
  static constexpr int64_t kBytes = sizeof(BlockQ4_0);
  static constexpr int kOffShift = 3;  // code offset 8
  static constexpr bool kMin = false;
  HWY_INLINE static V Codes(const uint8_t* p) { return Nibbles16(p + 2); }
  HWY_INLINE static V Mul(V c, V q) { return DotU8(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};
struct KQ4_1 {
  static constexpr int64_t kBytes = sizeof(BlockQ4_1);
  static constexpr int kOffShift = -1;
  static constexpr bool kMin = true;
  HWY_INLINE static V Codes(const uint8_t* p) { return Nibbles16(p + 4); }
  HWY_INLINE static V Mul(V c, V q) { return DotU8(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};
struct KQ5_0 {
  static constexpr int64_t kBytes = sizeof(BlockQ5_0);
  static constexpr int kOffShift = 4;  // code offset 16
  static constexpr bool kMin = false;
  HWY_INLINE static V Codes(const uint8_t* p) {
    const V hi = _mm256_and_si256(BitsToBytes(qdot::LdU32(p + 2)), Bcast8(0x10));
    return _mm256_or_si256(Nibbles16(p + 6), hi);
  }
  HWY_INLINE static V Mul(V c, V q) { return DotU8(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};
struct KQ5_1 {
  static constexpr int64_t kBytes = sizeof(BlockQ5_1);
  static constexpr int kOffShift = -1;
  static constexpr bool kMin = true;
  HWY_INLINE static V Codes(const uint8_t* p) {
    const V hi = _mm256_and_si256(BitsToBytes(qdot::LdU32(p + 4)), Bcast8(0x10));
    return _mm256_or_si256(Nibbles16(p + 8), hi);
  }
  HWY_INLINE static V Mul(V c, V q) { return DotU8(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};
struct KQ8_0 {
  static constexpr int64_t kBytes = sizeof(BlockQ8_0);
  static constexpr int kOffShift = kBiasSigned ? 7 : -1;
  static constexpr bool kMin = false;
  HWY_INLINE static V Codes(const uint8_t* p) {
    const V c = Ld256(p + 2);
    return kBiasSigned ? _mm256_xor_si256(c, Bcast8(0x80)) : c;
  }
  HWY_INLINE static V Mul(V c, V q) { return DotSigned(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};
struct KIQ4_NL {
  static constexpr int64_t kBytes = sizeof(BlockIQ4_NL);
  static constexpr int kOffShift = kBiasSigned ? 7 : -1;
  static constexpr bool kMin = false;
  HWY_INLINE static V Codes(const uint8_t* p) {
    const V tbl = kBiasSigned ? Iq4TableBiased() : Iq4Table();
    return _mm256_shuffle_epi8(tbl, Nibbles16(p + 2));
  }
  HWY_INLINE static V Mul(V c, V q) { return DotSigned(c, q); }
  HWY_INLINE static V Partials(const uint8_t* p, const int8_t* q) { return Mul(Codes(p), Ld256(q)); }
};

// 8 f16 fields at byte offset `off` of 8 consecutive blocks, as f32.
template <int64_t kBytes>
HWY_INLINE __m256 Halfs8(const uint8_t* p) {
  using qdot::LdU16;
  const __m128i h = _mm_setr_epi16(
      static_cast<short>(LdU16(p)), static_cast<short>(LdU16(p + kBytes)),
      static_cast<short>(LdU16(p + 2 * kBytes)), static_cast<short>(LdU16(p + 3 * kBytes)),
      static_cast<short>(LdU16(p + 4 * kBytes)), static_cast<short>(LdU16(p + 5 * kBytes)),
      static_cast<short>(LdU16(p + 6 * kBytes)), static_cast<short>(LdU16(p + 7 * kBytes)));
  return _mm256_cvtph_ps(h);
}

template <class K>
HWY_INLINE float Dot32(const uint8_t* row, const Act& a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const uint8_t* p = row + b * K::kBytes;
    PrefetchSpan(p, 8 * K::kBytes);
    V v[8];
    for (int j = 0; j < 8; ++j) v[j] = K::Partials(p + j * K::kBytes, a.q + 32 * (b + j));
    V isum = Reduce8(v);
    const V s = Ld256(a.s32 + 4 * b);
    if constexpr (K::kOffShift >= 0) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(s, K::kOffShift));
    const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float*>(a.d + 4 * b));
    __m256 t = _mm256_mul_ps(_mm256_mul_ps(Halfs8<K::kBytes>(p), dx), _mm256_cvtepi32_ps(isum));
    if constexpr (K::kMin) {
      t = _mm256_add_ps(t, _mm256_mul_ps(Halfs8<K::kBytes>(p + 2),
                                         _mm256_mul_ps(dx, _mm256_cvtepi32_ps(s))));
    }
    acc = _mm256_add_ps(acc, t);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (; b < nb; ++b) {
    const uint8_t* p = row + b * K::kBytes;
    const int32_t s = qdot::LdI32(a.s32, b);
    int32_t isum = HSum(K::Partials(p, a.q + 32 * b));
    if constexpr (K::kOffShift >= 0) isum -= s << K::kOffShift;
    const float dx = qdot::LdF32(a.d, b);
    float t;
    if constexpr (K::kMin) {
      t = qdot::TermMin(F16(p), F16(p + 2), dx, isum, s);
    } else {
      t = qdot::Term(F16(p), dx, isum);
    }
    lanes[b & 7] = lanes[b & 7] + t;
  }
  return qdot::Tree8(lanes);
}

// Dot32 for kT token activation sets at once (MatVecBatch, QuantMatMulRows): each 8-block group
// of the row is unpacked once (K::Codes, the scales once) and multiplied with every token's
// blocks; per token the integer sums, the f32 operations and their order are Dot32's, so
// out[t] == Dot32(row, a[t], nb) bit for bit.
template <class K, int kT>
HWY_INLINE void Dot32Tokens(const uint8_t* row, const Act* a, int64_t nb, float* out) {
  __m256 acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const uint8_t* p = row + b * K::kBytes;
    PrefetchSpan(p, 8 * K::kBytes);
    V c[8];
    for (int j = 0; j < 8; ++j) c[j] = K::Codes(p + j * K::kBytes);
    const __m256 dw = Halfs8<K::kBytes>(p);
    for (int t = 0; t < kT; ++t) {
      V v[8];
      for (int j = 0; j < 8; ++j) v[j] = K::Mul(c[j], Ld256(a[t].q + 32 * (b + j)));
      V isum = Reduce8(v);
      const V s = Ld256(a[t].s32 + 4 * b);
      if constexpr (K::kOffShift >= 0) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(s, K::kOffShift));
      const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float*>(a[t].d + 4 * b));
      __m256 tt = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
      if constexpr (K::kMin) {
        tt = _mm256_add_ps(tt, _mm256_mul_ps(Halfs8<K::kBytes>(p + 2),
                                             _mm256_mul_ps(dx, _mm256_cvtepi32_ps(s))));
      }
      acc[t] = _mm256_add_ps(acc[t], tt);
    }
  }
  for (int t = 0; t < kT; ++t) {
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[t]);
    for (int64_t bb = b; bb < nb; ++bb) {
      const uint8_t* p = row + bb * K::kBytes;
      const int32_t s = qdot::LdI32(a[t].s32, bb);
      int32_t isum = HSum(K::Partials(p, a[t].q + 32 * bb));
      if constexpr (K::kOffShift >= 0) isum -= s << K::kOffShift;
      const float dx = qdot::LdF32(a[t].d, bb);
      float tt;
      if constexpr (K::kMin) {
        tt = qdot::TermMin(F16(p), F16(p + 2), dx, isum, s);
      } else {
        tt = qdot::Term(F16(p), dx, isum);
      }
      lanes[bb & 7] = lanes[bb & 7] + tt;
    }
    out[t] = qdot::Tree8(lanes);
  }
}

// ---- K-quants: one super-block of 256 at a time; block term in scalar f32. ----

// 16 int8 scales (natural order) -> the two int32 vectors in Reduce4Halves order.
HWY_INLINE void ScalesHalvesOrder(__m128i sc, V* a, V* b) {
  const __m128i perm = _mm_shuffle_epi8(
      sc, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  *a = _mm256_cvtepi8_epi32(perm);
  *b = _mm256_cvtepi8_epi32(_mm_srli_si128(perm, 8));
}

// sum_g sc_g * s16_g over the 16 groups of super-block b (sc: 16 int8 in natural order).
HWY_INLINE V ScaledSums16(__m128i sc, const Act& a, int64_t b) {
  const V s0 = Ld256(a.s16 + 64 * b), s1 = Ld256(a.s16 + 64 * b + 32);
  return _mm256_add_epi32(_mm256_mullo_epi32(s0, _mm256_cvtepi8_epi32(sc)),
                          _mm256_mullo_epi32(s1, _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
}

// Group sums of 8 vectors of two 16-element groups each, times their scales (sc natural order).
HWY_INLINE V Scaled16(const V* v, __m128i sc) {
  V sa, sb;
  ScalesHalvesOrder(sc, &sa, &sb);
  return _mm256_add_epi32(_mm256_mullo_epi32(Reduce4Halves(v), sa),
                          _mm256_mullo_epi32(Reduce4Halves(v + 4), sb));
}

HWY_INLINE float DotQ2_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ2_K);
    PrefetchSpan(p, sizeof(BlockQ2_K));
    const int8_t* q = a.q + 256 * b;
    V v[8];
    for (int h = 0; h < 2; ++h) {
      const V x = Ld256(p + 16 + 32 * h);
      const V m3 = Bcast8(3);
      v[4 * h + 0] = DotU8(_mm256_and_si256(x, m3), Ld256(q + 128 * h));
      v[4 * h + 1] = DotU8(_mm256_and_si256(_mm256_srli_epi16(x, 2), m3), Ld256(q + 128 * h + 32));
      v[4 * h + 2] = DotU8(_mm256_and_si256(_mm256_srli_epi16(x, 4), m3), Ld256(q + 128 * h + 64));
      v[4 * h + 3] = DotU8(_mm256_and_si256(_mm256_srli_epi16(x, 6), m3), Ld256(q + 128 * h + 96));
    }
    const __m128i sc = Ld128(p);
    const __m128i lo = _mm_and_si128(sc, _mm_set1_epi8(0xf));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xf));
    int32_t isum, msum;
    HSum2(Scaled16(v, lo), ScaledSums16(hi, a, b), &isum, &msum);
    float d, dmin;
    F16Pair(p + 80, &d, &dmin);
    acc[b & 7] = acc[b & 7] + qdot::TermKMin(d, dmin, qdot::LdF32(a.d, b), isum, msum);
  }
  return qdot::Tree8(acc);
}

// The 16 Q3_K scales minus 32, as int8 in natural order (see qdot::Q3Scale).
HWY_INLINE __m128i Q3Scales(const uint8_t* s) {
  const uint32_t a0 = qdot::LdU32(s), a1 = qdot::LdU32(s + 4), a2 = qdot::LdU32(s + 8);
  const uint32_t k4 = 0x0f0f0f0fu, k2 = 0x03030303u;
  const uint32_t w0 = (a0 & k4) | ((a2 & k2) << 4);
  const uint32_t w1 = (a1 & k4) | (((a2 >> 2) & k2) << 4);
  const uint32_t w2 = ((a0 >> 4) & k4) | (((a2 >> 4) & k2) << 4);
  const uint32_t w3 = ((a1 >> 4) & k4) | (((a2 >> 6) & k2) << 4);
  const __m128i u = _mm_setr_epi32(static_cast<int>(w0), static_cast<int>(w1),
                                   static_cast<int>(w2), static_cast<int>(w3));
  return _mm_sub_epi8(u, _mm_set1_epi8(32));
}

template <int kS>
HWY_INLINE V Q3Codes(V x, V hm, int h) {
  const V low = _mm256_and_si256(_mm256_srli_epi16(x, 2 * kS), Bcast8(3));
  const V high = h == 0 ? BitTo<kS, 2>(hm) : BitTo<4 + kS, 2>(hm);
  return _mm256_or_si256(low, high);
}

HWY_INLINE float DotQ3_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ3_K);
    PrefetchSpan(p, sizeof(BlockQ3_K));
    const int8_t* q = a.q + 256 * b;
    const V hm = Ld256(p);
    V v[8];
    for (int h = 0; h < 2; ++h) {
      const V x = Ld256(p + 32 + 32 * h);
      v[4 * h + 0] = DotU8(Q3Codes<0>(x, hm, h), Ld256(q + 128 * h));
      v[4 * h + 1] = DotU8(Q3Codes<1>(x, hm, h), Ld256(q + 128 * h + 32));
      v[4 * h + 2] = DotU8(Q3Codes<2>(x, hm, h), Ld256(q + 128 * h + 64));
      v[4 * h + 3] = DotU8(Q3Codes<3>(x, hm, h), Ld256(q + 128 * h + 96));
    }
    const __m128i sc = Q3Scales(p + 96);
    // Codes are (value + 4): subtract 4 * sum_g sc_g * s16_g.
    const V t = _mm256_sub_epi32(Scaled16(v, sc), _mm256_slli_epi32(ScaledSums16(sc, a, b), 2));
    acc[b & 7] = acc[b & 7] + qdot::TermK(F16(p + 108), qdot::LdF32(a.d, b), HSum(t));
  }
  return qdot::Tree8(acc);
}

// Q4_K/Q5_K scales and mins (see qdot::K4ScaleMin) as int32 vectors, from the 12 packed bytes
// as u32 words w0, w1, w2: scales 0-3 = w0 & 0x3f.., mins 0-3 = w1 & 0x3f..; scales 4-7 =
// (w2 & 0x0f..) | (w0 >> 6 & 0x03..) << 4, mins 4-7 = (w2 >> 4 & 0x0f..) | (w1 >> 6 & 0x03..) << 4.
// As bytes [sc 0-7, mn 0-7] (K4ScaleBytes) or int32 vectors (K4Scales). The 16-byte load reads 4 bytes of the codes
// that follow the scales in the block (ignored).
HWY_INLINE __m128i K4ScaleBytes(const uint8_t* s) {
  const __m128i w = Ld128(s);
  const __m128i x = _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0)),
                                   _mm_setr_epi32(0, 0, 0, 4));  // [w0, w2, w1, w2 >> 4]
  const __m128i low = _mm_and_si128(
      x, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i y = _mm_srli_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)), 6);
  const __m128i high = _mm_slli_epi32(_mm_and_si128(y, _mm_setr_epi32(0, 0x03030303, 0,
                                                                      0x03030303)), 4);
  return _mm_or_si128(low, high);
}

HWY_INLINE void K4Scales(const uint8_t* s, V* sc, V* mn) {
  const __m128i u = K4ScaleBytes(s);
  *sc = _mm256_cvtepu8_epi32(u);
  *mn = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(u, u));
}

template <bool kFive>
HWY_INLINE float DotQ45_K(const uint8_t* row, const Act& a, int64_t nb) {
  constexpr int64_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * kBytes;
    PrefetchSpan(p, kBytes);
    const int8_t* q = a.q + 256 * b;
    const uint8_t* qs = p + (kFive ? 48 : 16);
    V v[8];
    [[maybe_unused]] const V qh = kFive ? Ld256(p + 16) : _mm256_setzero_si256();
    auto chunk = [&](auto c_tag) {
      constexpr int c = decltype(c_tag)::value;
      const V x = Ld256(qs + 32 * c);
      V lo = _mm256_and_si256(x, Bcast8(0xf));
      V hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), Bcast8(0xf));
      if constexpr (kFive) {
        lo = _mm256_or_si256(lo, BitTo<2 * c, 4>(qh));
        hi = _mm256_or_si256(hi, BitTo<2 * c + 1, 4>(qh));
      }
      v[2 * c] = DotU8(lo, Ld256(q + 64 * c));
      v[2 * c + 1] = DotU8(hi, Ld256(q + 64 * c + 32));
    };
    chunk(std::integral_constant<int, 0>());
    chunk(std::integral_constant<int, 1>());
    chunk(std::integral_constant<int, 2>());
    chunk(std::integral_constant<int, 3>());
    V sc, mn;
    K4Scales(p + 4, &sc, &mn);
    int32_t isum, msum;
    HSum2(_mm256_mullo_epi32(Reduce8(v), sc), _mm256_mullo_epi32(Ld256(a.s32 + 32 * b), mn), &isum,
          &msum);
    float d, dmin;
    F16Pair(p, &d, &dmin);
    acc[b & 7] = acc[b & 7] + qdot::TermKMin(d, dmin, qdot::LdF32(a.d, b), isum, msum);
  }
  return qdot::Tree8(acc);
}

#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
// acc + 512-bit vpdpwssd (int16 pairs times int16 pairs into int32), written out: Highway 1.0.3's
// AVX3_DL target string has no avx512vnni (see DotU8), so the intrinsic does not inline; zmm
// operands are EVEX-only anyway.
// On AVX3 (no VNNI): vpmaddwd + vpaddd, the same exact int32 sums.
HWY_INLINE __m512i Dpwssd512(__m512i acc, __m512i a, __m512i b) {
#if HWY_TARGET == HWY_AVX3_DL
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// Q4_K/Q5_K on AVX-512 (v3; AVX3 and AVX3_DL), 64 elements per step. Chunk c (qs[32 c ..
// 32 c + 31]) holds sub-blocks 2 c (low nibbles) and 2 c + 1 (high nibbles): broadcast to both
// 256-bit halves and shifted by 0 / 4 per half (vpsrlvw), it is elements 64 c .. 64 c + 63 in
// activation order. Q5_K's fifth bits (bit 2 c / 2 c + 1 of qh[l]) are one vptestmb against the
// broadcast qh and a masked add of 16. vpmaddubsw with the 64 activation bytes gives 32 int16
// pair sums (16 per sub-block, exact: |v| <= 2 * 31 * 127), and vpmaddwd / vpdpwssd against the
// sub-block scales placed in the matching words (one masked vpermb each; vpermw on AVX3)
// accumulates sum_s sc_s * dot_s in int32 lanes without a reduction per sub-block. The integer
// totals isum and msum, and all f32 operations, are those of RefQ45_K.
template <bool kFive>
HWY_INLINE float DotQ45_K_512(const uint8_t* row, const Act& a, int64_t nb) {
  constexpr int64_t kBytes = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  float acc[8] = {};
  const __m512i m4 = _mm512_set1_epi8(0xf);
  const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 0x0004000400040004ll, 0x0004000400040004ll,
                                          0x0004000400040004ll, 0x0004000400040004ll);
  // Word w of scale vector c holds the index of the scale of word w of product c.
  const __m512i i0 = _mm512_setr_epi64(0, 0, 0, 0, 0x0001000100010001ll, 0x0001000100010001ll,
                                       0x0001000100010001ll, 0x0001000100010001ll);
  const __m512i two = _mm512_set1_epi16(2);
  [[maybe_unused]] constexpr __mmask64 kLow = 0x5555555555555555ull;  // byte 0 of every word
  // Super-block b's integer totals as [i0, i1, m0, m1] (isum = i0 + i1, msum = m0 + m1).
  auto sums_of = [&](int64_t b) HWY_ATTR {
    const uint8_t* p = row + b * kBytes;
    PrefetchSpan(p, kBytes);
    const int8_t* q = a.q + 256 * b;
    const uint8_t* qs = p + (kFive ? 48 : 16);
    [[maybe_unused]] __m512i qh;
    if constexpr (kFive) qh = _mm512_broadcast_i64x4(Ld256(p + 16));
    const __m128i u = K4ScaleBytes(p + 4);
#if HWY_TARGET == HWY_AVX3_DL
    const __m512i uz = _mm512_castsi128_si512(u);
#else
    const __m512i uz = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(u));  // for vpermw
#endif
    __m512i t[2];
    __m512i idx = i0;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i code = _mm512_and_si512(
          _mm512_srlv_epi16(_mm512_broadcast_i64x4(Ld256(qs + 32 * c)), shift), m4);
      if constexpr (kFive) {
        const __m512i bit = _mm512_setr_epi64(
            0x0101010101010101ll << (2 * c), 0x0101010101010101ll << (2 * c),
            0x0101010101010101ll << (2 * c), 0x0101010101010101ll << (2 * c),
            0x0101010101010101ll << (2 * c + 1), 0x0101010101010101ll << (2 * c + 1),
            0x0101010101010101ll << (2 * c + 1), 0x0101010101010101ll << (2 * c + 1));
        code = _mm512_mask_add_epi8(code, _mm512_test_epi8_mask(qh, bit), code,
                                    _mm512_set1_epi8(16));
      }
      // Byte pairs into int16 (|v| <= 2 * 31 * 127, no saturation), then scale * pair sums.
      const __m512i v = _mm512_maddubs_epi16(code, _mm512_loadu_si512(q + 64 * c));
#if HWY_TARGET == HWY_AVX3_DL
      const __m512i sv = _mm512_maskz_permutexvar_epi8(kLow, idx, uz);  // AVX512-VBMI
#else
      const __m512i sv = _mm512_permutexvar_epi16(idx, uz);
#endif
      if (c < 2) {
        t[c] = _mm512_madd_epi16(v, sv);
      } else {
        t[c - 2] = Dpwssd512(t[c - 2], v, sv);
      }
      idx = _mm512_add_epi16(idx, two);
    }
    const __m512i ts = _mm512_add_epi32(t[0], t[1]);
    const V t8 = _mm256_add_epi32(_mm512_castsi512_si256(ts), _mm512_extracti64x4_epi64(ts, 1));
    const V mn = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(u, u));
    const V h = _mm256_hadd_epi32(t8, _mm256_mullo_epi32(Ld256(a.s32 + 32 * b), mn));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  };
  // qdot::TermKMin in xmm lanes: [d, dmin] * dx * [float(isum), float(msum)], then lane 0 - lane
  // 1 (and lane 2 - lane 3 for the second super-block of a pair): the same f32 operations.
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m128i sums = _mm_hadd_epi32(sums_of(b), sums_of(b + 1));  // [is0, ms0, is1, ms1]
    const uint8_t* p = row + b * kBytes;
    const __m128 dd = _mm_cvtph_ps(_mm_insert_epi32(
        _mm_cvtsi32_si128(static_cast<int>(qdot::LdU32(p))),
        static_cast<int>(qdot::LdU32(p + kBytes)), 1));  // [d0, dmin0, d1, dmin1]
    // Two f32 scales (8 bytes, any alignment: _mm_loadl_epi64 reads through an unaligned type).
    const __m128 dx2 =
        _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.d + 4 * b)));
    const __m128 tt = _mm_mul_ps(_mm_mul_ps(dd, _mm_unpacklo_ps(dx2, dx2)), _mm_cvtepi32_ps(sums));
    const __m128 r = _mm_sub_ps(tt, _mm_movehdup_ps(tt));
    acc[b & 7] = acc[b & 7] + _mm_cvtss_f32(r);
    acc[(b + 1) & 7] = acc[(b + 1) & 7] + _mm_cvtss_f32(_mm_movehl_ps(r, r));
  }
  if (b < nb) {
    const __m128i x = sums_of(b);
    const __m128i sums = _mm_hadd_epi32(x, x);
    const uint8_t* p = row + b * kBytes;
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(qdot::LdU32(p))));
    const __m128 tt = _mm_mul_ps(_mm_mul_ps(dd, _mm_set1_ps(qdot::LdF32(a.d, b))),
                                 _mm_cvtepi32_ps(sums));
    acc[b & 7] = acc[b & 7] + _mm_cvtss_f32(_mm_sub_ss(tt, _mm_movehdup_ps(tt)));
  }
  return qdot::Tree8(acc);
}

// Q6_K on AVX-512 (v3; AVX3 and AVX3_DL). For half h, the low nibbles of ql[64 h .. 64 h + 63]
// are elements 128 h + 0..63 in order and the high nibbles 128 h + 64..127; their top two bits are
// bits 0-1 / 2-3 (resp. 4-5 / 6-7) of qh[32 h .. 32 h + 31], so [qh | qh >> 2] serves both 64-byte
// halves. vpmaddubsw gives int16 pair sums (exact: |v| <= 2 * 63 * 127), 8 words per 16-element
// group; vpmaddwd / vpdpwssd against the group's int8 scales placed in the matching words (vpermw)
// sums them into int32 lanes; the code offset 32 is taken out as 32 * sum_g sc_g * s16_g. Same
// integer total and f32 operations as RefQ6_K.
HWY_INLINE float DotQ6_K_512(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  const __m512i m4 = _mm512_set1_epi8(0xf), m30 = _mm512_set1_epi8(0x30);
  // Word w of scale vector k: the scale of word w of product k (group 4 k + w / 8).
  const __m512i i0 = _mm512_setr_epi64(0, 0, 0x0001000100010001ll, 0x0001000100010001ll,
                                       0x0002000200020002ll, 0x0002000200020002ll,
                                       0x0003000300030003ll, 0x0003000300030003ll);
  const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(4));
  const __m512i i2 = _mm512_add_epi16(i0, _mm512_set1_epi16(8));
  const __m512i i3 = _mm512_add_epi16(i0, _mm512_set1_epi16(12));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ6_K);
    PrefetchSpan(p, sizeof(BlockQ6_K));
    const int8_t* q = a.q + 256 * b;
    __m512i r[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_loadu_si512(p + 64 * h);
      const V hh = Ld256(p + 128 + 32 * h);
      const __m512i hs =
          _mm512_inserti64x4(_mm512_castsi256_si512(hh), _mm256_srli_epi16(hh, 2), 1);
      // (l & 0x0f) | hi, by one ternary-logic op: C ? B : A bitwise with C = 0x0f (the
      // overwritten operand is the temporary A, so the mask needs no copy).
      const __m512i c0 = _mm512_ternarylogic_epi32(
          _mm512_and_si512(_mm512_slli_epi16(hs, 4), m30), l, m4, 0xd8);
      const __m512i c1 = _mm512_ternarylogic_epi32(_mm512_and_si512(hs, m30),
                                                   _mm512_srli_epi16(l, 4), m4, 0xd8);
      // Byte pairs into int16: |v| <= 2 * 63 * 127, no saturation.
      r[2 * h] = _mm512_maddubs_epi16(c0, _mm512_loadu_si512(q + 128 * h));
      r[2 * h + 1] = _mm512_maddubs_epi16(c1, _mm512_loadu_si512(q + 128 * h + 64));
    }
    const __m128i sc8 = Ld128(p + 192);
    const __m512i sw = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    const __m512i t = _mm512_add_epi32(
        Dpwssd512(_mm512_madd_epi16(r[0], _mm512_permutexvar_epi16(i0, sw)), r[1],
                  _mm512_permutexvar_epi16(i1, sw)),
        Dpwssd512(_mm512_madd_epi16(r[2], _mm512_permutexvar_epi16(i2, sw)), r[3],
                  _mm512_permutexvar_epi16(i3, sw)));
    const __m512i off = _mm512_mullo_epi32(_mm512_loadu_si512(a.s16 + 64 * b),
                                           _mm512_cvtepi8_epi32(sc8));
    const int32_t isum = _mm512_reduce_add_epi32(_mm512_sub_epi32(t, _mm512_slli_epi32(off, 5)));
    acc[b & 7] = acc[b & 7] + qdot::TermK(F16(p + 208), qdot::LdF32(a.d, b), isum);
  }
  return qdot::Tree8(acc);
}
#endif

HWY_INLINE float DotQ6_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ6_K);
    PrefetchSpan(p, sizeof(BlockQ6_K));
    const int8_t* q = a.q + 256 * b;
    V v[8];
    const V m4 = Bcast8(0xf), m30 = Bcast8(0x30);
    for (int h = 0; h < 2; ++h) {
      const V l0 = Ld256(p + 64 * h), l1 = Ld256(p + 64 * h + 32), hh = Ld256(p + 128 + 32 * h);
      const V u0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hh, 4), m30));
      const V u1 = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hh, 2), m30));
      const V u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(hh, m30));
      const V u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hh, 2), m30));
      v[4 * h + 0] = DotU8(u0, Ld256(q + 128 * h));
      v[4 * h + 1] = DotU8(u1, Ld256(q + 128 * h + 32));
      v[4 * h + 2] = DotU8(u2, Ld256(q + 128 * h + 64));
      v[4 * h + 3] = DotU8(u3, Ld256(q + 128 * h + 96));
    }
    const __m128i sc = Ld128(p + 192);
    // Codes are (value + 32).
    const V t = _mm256_sub_epi32(Scaled16(v, sc), _mm256_slli_epi32(ScaledSums16(sc, a, b), 5));
    acc[b & 7] = acc[b & 7] + qdot::TermK(F16(p + 208), qdot::LdF32(a.d, b), HSum(t));
  }
  return qdot::Tree8(acc);
}

HWY_INLINE float DotIQ4_XS(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  const V tbl = kBiasSigned ? Iq4TableBiased() : Iq4Table();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockIQ4_XS);
    PrefetchSpan(p, sizeof(BlockIQ4_XS));
    const int8_t* q = a.q + 256 * b;
    V v[8];
    for (int ib = 0; ib < 8; ++ib) {
      v[ib] = DotSigned(_mm256_shuffle_epi8(tbl, Nibbles16(p + 8 + 16 * ib)), Ld256(q + 32 * ib));
    }
    V sub = Reduce8(v);
    if constexpr (kBiasSigned) {
      sub = _mm256_sub_epi32(sub, _mm256_slli_epi32(Ld256(a.s32 + 32 * b), 7));
    }
    // Scale ib: nibble ib of scales_l (4 ib bits in), 2 bits at 2 ib of scales_h; minus 32.
    const V lo = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qdot::LdU32(p + 4))),
                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        _mm256_set1_epi32(0xf));
    const V hi = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(qdot::LdU16(p + 2)),
                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        _mm256_set1_epi32(3));
    const V sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                  _mm256_set1_epi32(32));
    const int32_t isum = HSum(_mm256_mullo_epi32(sub, sc));
    acc[b & 7] = acc[b & 7] + qdot::TermK(F16(p), qdot::LdF32(a.d, b), isum);
  }
  return qdot::Tree8(acc);
}

// Row kernels: f(row, activations, weight blocks).
using RowFn = float (*)(const uint8_t*, const Act&, int64_t);

HWY_INLINE RowFn GetRowFn(DType t) {
  switch (t) {
    case DType::kQ4_0: return &Dot32<KQ4_0>;
    case DType::kQ4_1: return &Dot32<KQ4_1>;
    case DType::kQ5_0: return &Dot32<KQ5_0>;
    case DType::kQ5_1: return &Dot32<KQ5_1>;
    case DType::kQ8_0: return &Dot32<KQ8_0>;
    case DType::kIQ4_NL: return &Dot32<KIQ4_NL>;
    case DType::kQ2_K: return &DotQ2_K;
    case DType::kQ3_K: return &DotQ3_K;
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
    case DType::kQ4_K: return &DotQ45_K_512<false>;
#else
    case DType::kQ4_K: return &DotQ45_K<false>;
#endif
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
    case DType::kQ5_K: return &DotQ45_K_512<true>;
#else
    case DType::kQ5_K: return &DotQ45_K<true>;
#endif
#if HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX3
    case DType::kQ6_K: return &DotQ6_K_512;
#else
    case DType::kQ6_K: return &DotQ6_K;
#endif
    case DType::kIQ4_XS: return &DotIQ4_XS;
    default:
      STRATA_CHECK_MSG(false, "QuantDot: %s is not a block-quantized type",
                       std::string(DTypeName(t)).c_str());
  }
  return nullptr;
}

// 4-token row kernels (Dot32Tokens) where one exists: the 32-element formats; null otherwise.
constexpr int kRowTokens = 4;
using Row4Fn = void (*)(const uint8_t*, const Act*, int64_t, float*);
HWY_INLINE Row4Fn GetRow4Fn(DType t) {
  switch (t) {
    case DType::kQ4_0: return &Dot32Tokens<KQ4_0, kRowTokens>;
    case DType::kQ4_1: return &Dot32Tokens<KQ4_1, kRowTokens>;
    case DType::kQ5_0: return &Dot32Tokens<KQ5_0, kRowTokens>;
    case DType::kQ5_1: return &Dot32Tokens<KQ5_1, kRowTokens>;
    case DType::kQ8_0: return &Dot32Tokens<KQ8_0, kRowTokens>;
    case DType::kIQ4_NL: return &Dot32Tokens<KIQ4_NL, kRowTokens>;
    default: return nullptr;
  }
}

#else  // not x86 AVX2+: the scalar reference (same floats).

using RowFn = float (*)(const uint8_t*, const Act&, int64_t);

template <DType kT>
float RefRowT(const uint8_t* row, const Act& a, int64_t nb) {
  return qdot::DotRef(kT, row, a, nb * DTypeBlockElems(kT));
}

HWY_INLINE RowFn GetRowFn(DType t) {
  switch (t) {
    case DType::kQ4_0: return &RefRowT<DType::kQ4_0>;
    case DType::kQ4_1: return &RefRowT<DType::kQ4_1>;
    case DType::kQ5_0: return &RefRowT<DType::kQ5_0>;
    case DType::kQ5_1: return &RefRowT<DType::kQ5_1>;
    case DType::kQ8_0: return &RefRowT<DType::kQ8_0>;
    case DType::kIQ4_NL: return &RefRowT<DType::kIQ4_NL>;
    case DType::kQ2_K: return &RefRowT<DType::kQ2_K>;
    case DType::kQ3_K: return &RefRowT<DType::kQ3_K>;
    case DType::kQ4_K: return &RefRowT<DType::kQ4_K>;
    case DType::kQ5_K: return &RefRowT<DType::kQ5_K>;
    case DType::kQ6_K: return &RefRowT<DType::kQ6_K>;
    case DType::kIQ4_XS: return &RefRowT<DType::kIQ4_XS>;
    default:
      STRATA_CHECK_MSG(false, "QuantDot: %s is not a block-quantized type",
                       std::string(DTypeName(t)).c_str());
  }
  return nullptr;
}

constexpr int kRowTokens = 4;
using Row4Fn = void (*)(const uint8_t*, const Act*, int64_t, float*);
HWY_INLINE Row4Fn GetRow4Fn(DType) { return nullptr; }

#endif

// Activation blocks of be elements (see QuantizeActivations): d = max|x| / 127,
// q = nearest-even(x / d), all IEEE-exact or correctly rounded operations, so every target writes
// the same bytes. A block with Inf or NaN gets d = NaN and q = 0.
void QuantizeBlocksImpl(int64_t be, const float* x, int64_t k, int8_t* q, uint8_t* d_out) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));  // divides 32
  for (int64_t b = 0; b < k / be; ++b) {
    const float* xb = x + b * be;
    int8_t* qb = q + b * be;
    auto vmax = hn::Zero(df);
    auto nonfinite = hn::Zero(df);  // x * 0 is NaN exactly for Inf and NaN
    for (int64_t i = 0; i < be; i += n) {
      const auto v = hn::LoadU(df, xb + i);
      vmax = hn::Max(vmax, hn::Abs(v));
      nonfinite = hn::Add(nonfinite, hn::Mul(v, hn::Zero(df)));
    }
    float d = hn::GetLane(hn::MaxOfLanes(df, vmax)) / 127.f;
    if (!hn::AllFalse(df, hn::IsNaN(nonfinite))) d = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(d_out + 4 * b, &d, 4);
    if (!(d > 0.f)) {  // zero block, or non-finite
      std::memset(qb, 0, be);
      continue;
    }
    const auto dv = hn::Set(df, d);
    const auto lo = hn::Set(di, -127), hi = hn::Set(di, 127);
    for (int64_t i = 0; i < be; i += n) {
      const auto r = hn::NearestInt(hn::Div(hn::LoadU(df, xb + i), dv));
      hn::StoreU(hn::DemoteTo(d8, hn::Min(hn::Max(r, lo), hi)), d8, qb + i);
    }
  }
}

float QuantDotImpl(DType t, const void* row, const void* act, int64_t k) {
  return GetRowFn(t)(static_cast<const uint8_t*>(row), qdot::MakeAct(t, act, k),
                     k / DTypeBlockElems(t));
}

void QuantDotRowsImpl(DType t, const void* rows, int64_t row_bytes, const void* act, int64_t k,
                      float* y, int64_t n_rows) {
  const Act a = qdot::MakeAct(t, act, k);
  const RowFn f = GetRowFn(t);
  const int64_t nb = k / DTypeBlockElems(t);
  const uint8_t* row = static_cast<const uint8_t*>(rows);
  for (int64_t r = 0; r < n_rows; ++r, row += row_bytes) y[r] = f(row, a, nb);
}

// Tokens per tile: a tile's activations (~1.1 k bytes per token at k = 1024) stay in L2 while each
// weight row of the range is read once per tile and reused from L1 for every token.
constexpr int64_t kTokTile = 64;

void QuantMatMulRowsImpl(const TensorView& w, const uint8_t* acts, int64_t act_stride,
                         int64_t n_tok, float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  const DType t = w.dtype;
  const int64_t k = w.cols();
  const RowFn f = GetRowFn(t);
  const Row4Fn f4 = GetRow4Fn(t);  // 4 tokens per weight-row pass (the 32-element formats)
  const int64_t nb = k / DTypeBlockElems(t);
  Act a[kTokTile];
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
    const int64_t nt = std::min(kTokTile, n_tok - t0);
    for (int64_t j = 0; j < nt; ++j) a[j] = qdot::MakeAct(t, acts + (t0 + j) * act_stride, k);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.row(r);
      float* yr = y + t0 * y_stride + r;
      int64_t j = 0;
      if (f4 != nullptr) {
        for (; j + kRowTokens <= nt; j += kRowTokens) {
          float o[kRowTokens];
          f4(row, a + j, nb, o);
          for (int i = 0; i < kRowTokens; ++i) yr[(j + i) * y_stride] = o[i];
        }
      }
      for (; j < nt; ++j) yr[j * y_stride] = f(row, a[j], nb);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(QuantDotImpl);
HWY_EXPORT(QuantDotRowsImpl);
HWY_EXPORT(QuantMatMulRowsImpl);
HWY_EXPORT(QuantizeBlocksImpl);

bool HasQuantDot(DType t) { return IsQuantized(t); }

int64_t ActivationBlockElems(DType weight_type) { return qdot::ActBlock(weight_type); }

namespace {
void CheckK(DType t, int64_t k) {
  STRATA_CHECK_MSG(IsQuantized(t), "quantized dot: %s is not a block-quantized type",
                   std::string(DTypeName(t)).c_str());
  STRATA_CHECK_MSG(k >= 0 && k % DTypeBlockElems(t) == 0,
                   "quantized dot: %lld elements of %s is not a whole number of blocks",
                   static_cast<long long>(k), std::string(DTypeName(t)).c_str());
}

}  // namespace

int64_t ActivationBytes(DType weight_type, int64_t k) {
  CheckK(weight_type, k);
  return qdot::GetLayout(weight_type, k).bytes;
}

void QuantizeActivations(DType weight_type, const float* x, int64_t k, void* out) {
  CheckK(weight_type, k);
  const qdot::Layout l = qdot::GetLayout(weight_type, k);
  uint8_t* base = static_cast<uint8_t*>(out);
  int8_t* q = reinterpret_cast<int8_t*>(base);
  const int64_t be = qdot::ActBlock(weight_type);
  HWY_DYNAMIC_DISPATCH(QuantizeBlocksImpl)(be, x, k, q, base + l.d);
  if (be == 256) {
    for (int64_t g = 0; g < k / 16; ++g) {
      int32_t s = 0;
      for (int i = 0; i < 16; ++i) s += q[16 * g + i];
      std::memcpy(base + l.s16 + 4 * g, &s, 4);
    }
  }
  for (int64_t g = 0; g < k / 32; ++g) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += q[32 * g + i];
    std::memcpy(base + l.s32 + 4 * g, &s, 4);
  }
}

float QuantDot(DType t, const void* row, const void* act, int64_t k) {
  CheckK(t, k);
  return HWY_DYNAMIC_DISPATCH(QuantDotImpl)(t, row, act, k);
}

float QuantDotRef(DType t, const void* row, const void* act, int64_t k) {
  CheckK(t, k);
  return qdot::DotRef(t, static_cast<const uint8_t*>(row), qdot::MakeAct(t, act, k), k);
}

void QuantDotRows(DType t, const void* rows, int64_t row_bytes, const void* act, int64_t k,
                  float* y, int64_t n_rows) {
  CheckK(t, k);
  HWY_DYNAMIC_DISPATCH(QuantDotRowsImpl)(t, rows, row_bytes, act, k, y, n_rows);
}

void QuantMatMulRows(const TensorView& w, const uint8_t* acts, int64_t act_stride, int64_t n_tok,
                     float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  CheckK(w.dtype, w.cols());
  HWY_DYNAMIC_DISPATCH(QuantMatMulRowsImpl)(w, acts, act_stride, n_tok, y, y_stride, r0, r1);
}

}  // namespace strata
#endif  // HWY_ONCE
