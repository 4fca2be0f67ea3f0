// Exact dequantization of the ggml block formats (see core/quant.h). Every expression keeps ggml's
// reference operation order and types (int codes promoted to float, then f32 products and sums, no
// fused multiply-add: this file is built without contraction), so the floats equal ggml's bit for
// bit; tested against fixtures written by llama.cpp (io/quant_fixture_test.cc).
#include "core/quant.h"

#include <cstring>
#include <string>

#include "core/check.h"

namespace strata {

bool IsQuantized(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kQ8_0: case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K:
    case DType::kQ5_K: case DType::kQ6_K: case DType::kIQ4_NL: case DType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

namespace {

void DequantQ4_0(const BlockQ4_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (b[i].qs[j] & 0x0f) - 8;
      const int x1 = (b[i].qs[j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

void DequantQ4_1(const BlockQ4_1* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    const float m = F16ToF32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = b[i].qs[j] & 0x0f;
      const int x1 = b[i].qs[j] >> 4;
      y[j] = static_cast<float>(x0) * d + m;
      y[j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

// Bit 4 of the 5-bit codes: element j (< 16) takes bit j of qh, element j + 16 takes bit j + 16.
template <class B>
void Q5Codes(const B& b, int j, int* x0, int* x1) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
  const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
  *x0 = (b.qs[j] & 0x0f) | h0;
  *x1 = (b.qs[j] >> 4) | h1;
}

void DequantQ5_0(const BlockQ5_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      int x0, x1;
      Q5Codes(b[i], j, &x0, &x1);
      y[j] = static_cast<float>(x0 - 16) * d;
      y[j + kQK / 2] = static_cast<float>(x1 - 16) * d;
    }
  }
}

void DequantQ5_1(const BlockQ5_1* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    const float m = F16ToF32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      int x0, x1;
      Q5Codes(b[i], j, &x0, &x1);
      y[j] = static_cast<float>(x0) * d + m;
      y[j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void DequantQ8_0(const BlockQ8_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// Element order of Q2_K (and the 2 low bits of Q3_K): the 256 values are two halves of 128; in
// half h, value 32 * s + l (s = shift step 0..3, l < 32) is bits [2 s, 2 s + 2) of qs[32 h + l], and
// its 16-value sub-block is 8 h + 2 s + l / 16.
void DequantQ2_K(const BlockQ2_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xf);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
          }
        }
      }
    }
  }
}

// The 16 6-bit scales of Q3_K: scale j has its low 4 bits in nibble j of bytes [0, 8) (low nibbles
// for j < 8, high for j >= 8) and its high 2 bits in bits [2 (j / 4) ... ) of byte 8 + j % 4.
void Q3KScales(const uint8_t* packed, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (packed[j] & 0xf) : (packed[j - 8] >> 4);
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>(lo | (hi << 4));
  }
}

void DequantQ3_K(const BlockQ3_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    int8_t scales[16];
    Q3KScales(b[i].scales, scales);
    const uint8_t* q = b[i].qs;
    const uint8_t* hm = b[i].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d * static_cast<float>(scales[is++] - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int code = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(code);
          }
        }
      }
    }
  }
}

// Scale and min j (of 8) of Q4_K/Q5_K: j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 has its
// low 4 bits in byte j + 4 (scale: low nibble, min: high nibble) and its high 2 bits in the top bits
// of bytes j - 4 (scale) and j (min).
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void DequantQ4_K(const BlockQ4_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, mn;
      ScaleMinK4(is, b[i].scales, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      ScaleMinK4(is + 1, b[i].scales, &sc, &mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantQ5_K(const BlockQ5_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    unsigned u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, mn;
      ScaleMinK4(is, b[i].scales, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      ScaleMinK4(is + 1, b[i].scales, &sc, &mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      }
    }
  }
}

// Q6_K: in each half of 128, value 32 k + l (k < 4, l < 32) has its low nibble in ql[l + 32 (k % 2)]
// (low nibble for k < 2, high for k >= 2), its 2 high bits at bits [2 k, 2 k + 2) of qh[l], and the
// scale of sub-block 8 half + 2 k + l / 16. value = (d * scale) * (code - 32).
void DequantQ6_K(const BlockQ6_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void DequantIQ4_NL(const BlockIQ4_NL* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xf]);
      y[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]);
    }
  }
}

void DequantIQ4_XS(const BlockIQ4_XS* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < kQK_K / 32; ++ib, y += 32, qs += 16) {
      const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
                     (((b[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xf]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

}  // namespace

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  const int64_t be = DTypeBlockElems(t);
  STRATA_CHECK_MSG(n % be == 0, "DequantizeRow: %lld elements of %s is not a whole number of blocks",
                   static_cast<long long>(n), std::string(DTypeName(t)).c_str());
  const int64_t nb = n / be;
  switch (t) {
    case DType::kQ4_0: return DequantQ4_0(static_cast<const BlockQ4_0*>(src), nb, dst);
    case DType::kQ4_1: return DequantQ4_1(static_cast<const BlockQ4_1*>(src), nb, dst);
    case DType::kQ5_0: return DequantQ5_0(static_cast<const BlockQ5_0*>(src), nb, dst);
    case DType::kQ5_1: return DequantQ5_1(static_cast<const BlockQ5_1*>(src), nb, dst);
    case DType::kQ8_0: return DequantQ8_0(static_cast<const BlockQ8_0*>(src), nb, dst);
    case DType::kQ2_K: return DequantQ2_K(static_cast<const BlockQ2_K*>(src), nb, dst);
    case DType::kQ3_K: return DequantQ3_K(static_cast<const BlockQ3_K*>(src), nb, dst);
    case DType::kQ4_K: return DequantQ4_K(static_cast<const BlockQ4_K*>(src), nb, dst);
    case DType::kQ5_K: return DequantQ5_K(static_cast<const BlockQ5_K*>(src), nb, dst);
    case DType::kQ6_K: return DequantQ6_K(static_cast<const BlockQ6_K*>(src), nb, dst);
    case DType::kIQ4_NL: return DequantIQ4_NL(static_cast<const BlockIQ4_NL*>(src), nb, dst);
    case DType::kIQ4_XS: return DequantIQ4_XS(static_cast<const BlockIQ4_XS*>(src), nb, dst);
    default:
      return ToF32(t, src, dst, n);
  }
}

}  // namespace strata
