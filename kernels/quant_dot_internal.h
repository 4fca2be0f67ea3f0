// Shared by kernels/quant_dot.cc and kernels/quant_gemm.cc: the activation buffer layout, the
// block term formulas and the scalar reference of the quantized dot products (see quant_dot.h).
// Include only from files compiled with -ffp-contract=off (kernels/CMakeLists.txt): the f32
// block terms must not be fused.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/quant.h"

namespace strata {
namespace qdot {

inline int64_t Up64(int64_t v) { return (v + 63) & ~int64_t{63}; }

// Activation buffer layout (byte offsets from its start): q int8 [k] at 0, then d f32 [k / be],
// then (256-element blocks only) int32 sums of every 16 elements [k / 16], then int32 sums of every
// 32 elements [k / 32], each section starting at a multiple of 64 bytes.
struct Layout {
  int64_t d = 0, s16 = 0, s32 = 0, bytes = 0;
};

inline int64_t ActBlock(DType t) {
  switch (t) {
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K:
    case DType::kQ6_K: case DType::kIQ4_XS:
      return 256;
    default:
      return 32;
  }
}

inline Layout GetLayout(DType t, int64_t k) {
  const int64_t be = ActBlock(t);
  Layout l;
  l.d = Up64(k);
  int64_t o = Up64(l.d + 4 * (k / be));
  if (be == 256) {
    l.s16 = o;
    o = Up64(o + 4 * (k / 16));
  }
  l.s32 = o;
  l.bytes = Up64(o + 4 * (k / 32));
  return l;
}

// A read-only view of quantized activations; fields are read with memcpy (no alignment needed).
struct Act {
  const int8_t* q;
  const uint8_t* d;
  const uint8_t* s16;
  const uint8_t* s32;
};

inline Act MakeAct(DType t, const void* p, int64_t k) {
  const Layout l = GetLayout(t, k);
  const uint8_t* b = static_cast<const uint8_t*>(p);
  return {reinterpret_cast<const int8_t*>(b), b + l.d, b + l.s16, b + l.s32};
}

inline float LdF32(const uint8_t* p, int64_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}
inline int32_t LdI32(const uint8_t* p, int64_t i) {
  int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}
inline uint16_t LdU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LdU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LdF16(const uint8_t* p) { return F16ToF32(LdU16(p)); }

// The shared f32 order: block b into accumulator b % 8, then a fixed tree.
inline float Tree8(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// The block terms (every operation rounded on its own: kernels/CMakeLists.txt builds this file with
// -ffp-contract=off, since GCC would otherwise fuse them differently inside and outside the SIMD
// targets, and no std::fma is used).
inline float Term(float dw, float dx, int32_t isum) {
  return (dw * dx) * static_cast<float>(isum);
}
inline float TermMin(float dw, float mw, float dx, int32_t isum, int32_t s) {
  return (dw * dx) * static_cast<float>(isum) + mw * (dx * static_cast<float>(s));
}
inline float TermK(float d, float dx, int32_t isum) { return (d * dx) * static_cast<float>(isum); }
inline float TermKMin(float d, float dmin, float dx, int32_t isum, int32_t msum) {
  return (d * dx) * static_cast<float>(isum) - (dmin * dx) * static_cast<float>(msum);
}

// ---- Scalar reference: the formats' value formulas, written directly (codes minus their
// offset, times q), so the SIMD offset and reduction tricks are checked against plain sums. ----

inline float RefQ4_0(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ4_0);
    const uint8_t* qs = p + 2;
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      s += ((qs[j] & 0xf) - 8) * q[j] + ((qs[j] >> 4) - 8) * q[j + 16];
    }
    acc[b & 7] = acc[b & 7] + Term(LdF16(p), LdF32(a.d, b), s);
  }
  return Tree8(acc);
}

inline float RefQ4_1(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ4_1);
    const uint8_t* qs = p + 4;
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += (qs[j] & 0xf) * q[j] + (qs[j] >> 4) * q[j + 16];
    acc[b & 7] = acc[b & 7] + TermMin(LdF16(p), LdF16(p + 2), LdF32(a.d, b), s, LdI32(a.s32, b));
  }
  return Tree8(acc);
}

// 5-bit code of element j of a Q5 block (qh = the 32 high bits, qs = the nibbles).
inline int Q5Code(uint32_t qh, const uint8_t* qs, int j) {
  const int lo = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
  return lo | static_cast<int>(((qh >> j) & 1) << 4);
}

inline float RefQ5_0(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ5_0);
    const uint32_t qh = LdU32(p + 2);
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += (Q5Code(qh, p + 6, j) - 16) * q[j];
    acc[b & 7] = acc[b & 7] + Term(LdF16(p), LdF32(a.d, b), s);
  }
  return Tree8(acc);
}

inline float RefQ5_1(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ5_1);
    const uint32_t qh = LdU32(p + 4);
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += Q5Code(qh, p + 8, j) * q[j];
    acc[b & 7] = acc[b & 7] + TermMin(LdF16(p), LdF16(p + 2), LdF32(a.d, b), s, LdI32(a.s32, b));
  }
  return Tree8(acc);
}

inline float RefQ8_0(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ8_0);
    const int8_t* w = reinterpret_cast<const int8_t*>(p + 2);
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += w[j] * q[j];
    acc[b & 7] = acc[b & 7] + Term(LdF16(p), LdF32(a.d, b), s);
  }
  return Tree8(acc);
}

inline float RefIQ4_NL(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockIQ4_NL);
    const uint8_t* qs = p + 2;
    const int8_t* q = a.q + 32 * b;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      s += kIq4nlValues[qs[j] & 0xf] * q[j] + kIq4nlValues[qs[j] >> 4] * q[j + 16];
    }
    acc[b & 7] = acc[b & 7] + Term(LdF16(p), LdF32(a.d, b), s);
  }
  return Tree8(acc);
}

// Q2_K and the low bits of Q3_K: element e = 128 h + 32 s + l has bits [2 s, 2 s + 2) of
// qs[32 h + l]; its 16-element sub-block is e / 16.
inline int Q2Bits(const uint8_t* qs, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  return (qs[32 * h + l] >> (2 * s)) & 3;
}

inline float RefQ2_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ2_K);
    const uint8_t* sc = p;
    const uint8_t* qs = p + 16;
    const int8_t* q = a.q + 256 * b;
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) s += Q2Bits(qs, e) * q[e];
      isum += (sc[g] & 0xf) * s;
      msum += (sc[g] >> 4) * LdI32(a.s16, 16 * b + g);
    }
    acc[b & 7] = acc[b & 7] + TermKMin(LdF16(p + 80), LdF16(p + 82), LdF32(a.d, b), isum, msum);
  }
  return Tree8(acc);
}

// The 16 signed 6-bit scales of Q3_K (value - 32), as in core/quant.cc.
inline int Q3Scale(const uint8_t* packed, int j) {
  const int lo = j < 8 ? (packed[j] & 0xf) : (packed[j - 8] >> 4);
  const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

inline float RefQ3_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ3_K);
    const uint8_t* hm = p;
    const uint8_t* qs = p + 32;
    const int8_t* q = a.q + 256 * b;
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int h = e / 128, sh = (e % 128) / 32, l = e % 32;
        const int high = (hm[l] >> (4 * h + sh)) & 1;
        s += (Q2Bits(qs, e) - (high ? 0 : 4)) * q[e];
      }
      isum += Q3Scale(p + 96, g) * s;
    }
    acc[b & 7] = acc[b & 7] + TermK(LdF16(p + 108), LdF32(a.d, b), isum);
  }
  return Tree8(acc);
}

// Scale and min j of Q4_K/Q5_K (6 bits each, packed in 12 bytes), as in core/quant.cc.
inline void K4ScaleMin(const uint8_t* q, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K/Q5_K element e = 64 c + 32 h + l: nibble h of qs[32 c + l], fifth bit 2 c + h of qh[l];
// sub-block e / 32.
inline float RefQ45_K(const uint8_t* row, const Act& a, int64_t nb, bool five) {
  const int64_t bytes = five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * bytes;
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + (five ? 48 : 16);
    const int8_t* q = a.q + 256 * b;
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 8; ++g) {
      int sc, mn;
      K4ScaleMin(p + 4, g, &sc, &mn);
      int32_t s = 0;
      for (int e = 32 * g; e < 32 * g + 32; ++e) {
        const int c = e / 64, h = (e % 64) / 32, l = e % 32;
        int code = (qs[32 * c + l] >> (4 * h)) & 0xf;
        if (five) code |= ((qh[l] >> (2 * c + h)) & 1) << 4;
        s += code * q[e];
      }
      isum += sc * s;
      msum += mn * LdI32(a.s32, 8 * b + g);
    }
    acc[b & 7] = acc[b & 7] + TermKMin(LdF16(p), LdF16(p + 2), LdF32(a.d, b), isum, msum);
  }
  return Tree8(acc);
}

// Q6_K element e = 128 h + 32 k + l: low nibble of ql[64 h + l + 32 (k % 2)] (low for k < 2,
// high otherwise), high 2 bits at bits [2 k, 2 k + 2) of qh[32 h + l]; scale of sub-block e / 16.
inline float RefQ6_K(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockQ6_K);
    const uint8_t* ql = p;
    const uint8_t* qh = p + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    const int8_t* q = a.q + 256 * b;
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int lo = (ql[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xf;
        const int hi = (qh[32 * h + l] >> (2 * k)) & 3;
        s += ((lo | (hi << 4)) - 32) * q[e];
      }
      isum += sc[g] * s;
    }
    acc[b & 7] = acc[b & 7] + TermK(LdF16(p + 208), LdF32(a.d, b), isum);
  }
  return Tree8(acc);
}

inline int Iq4xsScale(const uint8_t* p, int ib) {
  const int lo = (p[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
  const int hi = (LdU16(p + 2) >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

inline float RefIQ4_XS(const uint8_t* row, const Act& a, int64_t nb) {
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * sizeof(BlockIQ4_XS);
    const int8_t* q = a.q + 256 * b;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = p + 8 + 16 * ib;
      const int8_t* qb = q + 32 * ib;
      int32_t s = 0;
      for (int j = 0; j < 16; ++j) {
        s += kIq4nlValues[qs[j] & 0xf] * qb[j] + kIq4nlValues[qs[j] >> 4] * qb[j + 16];
      }
      isum += Iq4xsScale(p, ib) * s;
    }
    acc[b & 7] = acc[b & 7] + TermK(LdF16(p), LdF32(a.d, b), isum);
  }
  return Tree8(acc);
}

inline float DotRef(DType t, const uint8_t* row, const Act& a, int64_t k) {
  const int64_t nb = k / DTypeBlockElems(t);
  switch (t) {
    case DType::kQ4_0: return RefQ4_0(row, a, nb);
    case DType::kQ4_1: return RefQ4_1(row, a, nb);
    case DType::kQ5_0: return RefQ5_0(row, a, nb);
    case DType::kQ5_1: return RefQ5_1(row, a, nb);
    case DType::kQ8_0: return RefQ8_0(row, a, nb);
    case DType::kQ2_K: return RefQ2_K(row, a, nb);
    case DType::kQ3_K: return RefQ3_K(row, a, nb);
    case DType::kQ4_K: return RefQ45_K(row, a, nb, false);
    case DType::kQ5_K: return RefQ45_K(row, a, nb, true);
    case DType::kQ6_K: return RefQ6_K(row, a, nb);
    case DType::kIQ4_NL: return RefIQ4_NL(row, a, nb);
    case DType::kIQ4_XS: return RefIQ4_XS(row, a, nb);
    default:
      STRATA_CHECK_MSG(false, "QuantDot: %s is not a block-quantized type",
                       std::string(DTypeName(t)).c_str());
  }
  return 0.f;
}

}  // namespace qdot
}  // namespace strata
