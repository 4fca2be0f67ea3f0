#include "core/dtype.h"

#include <cmath>
#include <string>

#include "core/check.h"
#include "core/quant.h"

namespace strata {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kQ5_0: return "Q5_0";
    case DType::kQ5_1: return "Q5_1";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ2_K: return "Q2_K";
    case DType::kQ3_K: return "Q3_K";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
    case DType::kIQ4_NL: return "IQ4_NL";
    case DType::kIQ4_XS: return "IQ4_XS";
    case DType::kI8: return "I8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

std::string GgmlTypeName(uint32_t t) {
  static const char* kNames[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0",  "Q5_1",
                                 "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",  "Q8_K",
                                 "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
                                 "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
                                 "BF16"};
  if (t < sizeof(kNames) / sizeof(kNames[0])) return kNames[t];
  return "type " + std::to_string(t);
}

bool IsSupportedDType(uint32_t t) {
  switch (static_cast<DType>(t)) {
    case DType::kF32: case DType::kF16: case DType::kQ8_0: case DType::kI8: case DType::kI16:
    case DType::kI32: case DType::kI64: case DType::kF64: case DType::kBF16:
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K:
    case DType::kQ6_K: case DType::kIQ4_NL: case DType::kIQ4_XS:
      return true;
  }
  return false;
}

int64_t DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ4_1: case DType::kQ5_0: case DType::kQ5_1:
    case DType::kQ8_0: case DType::kIQ4_NL:
      return 32;
    case DType::kQ2_K: case DType::kQ3_K: case DType::kQ4_K: case DType::kQ5_K:
    case DType::kQ6_K: case DType::kIQ4_XS:
      return 256;
    default:
      return 1;
  }
}

int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1: return 20;
    case DType::kQ5_0: return 22;
    case DType::kQ5_1: return 24;
    case DType::kQ8_0: return 34;
    case DType::kQ2_K: return 84;
    case DType::kQ3_K: return 110;
    case DType::kQ4_K: return 144;
    case DType::kQ5_K: return 176;
    case DType::kQ6_K: return 210;
    case DType::kIQ4_NL: return 18;
    case DType::kIQ4_XS: return 136;
    case DType::kI8: return 1;
    case DType::kI16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kF64: return 8;
  }
  return 0;
}

int64_t DTypeRowBytes(DType t, int64_t n) {
  const int64_t be = DTypeBlockElems(t);
  STRATA_CHECK_MSG(n % be == 0, "%lld elements of %s is not a whole number of blocks",
                   static_cast<long long>(n), std::string(DTypeName(t)).c_str());
  return n / be * DTypeBlockBytes(t);
}

float F16ToF32Slow(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(1.0 + man / 1024.0, exp - 15);
  }
  return static_cast<float>(sign ? -v : v);
}

uint16_t F32ToF16(float f) {
  const uint32_t u = F32Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = m * 2^(e-150); target units 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (carry may bump the exponent).
  uint32_t v = abs - (112u << 23);
  const uint32_t rem = v & 0x1fffu;
  v >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ++v;
  return static_cast<uint16_t>(sign | v);
}

namespace {
// Next f16 toward -inf / +inf (finite or infinite inputs; NaN is not expected here).
uint16_t F16NextDown(uint16_t h) {
  if (h == 0x0000 || h == 0x8000) return 0x8001;
  return (h & 0x8000) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
uint16_t F16NextUp(uint16_t h) {
  if (h == 0x0000 || h == 0x8000) return 0x0001;
  return (h & 0x8000) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
}  // namespace

uint16_t F16RoundDown(float x) {
  const uint16_t h = F32ToF16(x);  // nearest; +-inf beyond +-65520
  return F16ToF32(h) <= x ? h : F16NextDown(h);
}

uint16_t F16RoundUp(float x) {
  const uint16_t h = F32ToF16(x);
  return F16ToF32(h) >= x ? h : F16NextUp(h);
}

void ToF32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF64: {
      const double* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      STRATA_CHECK_MSG(IsQuantized(t), "ToF32: %s is not a float type",
                       std::string(DTypeName(t)).c_str());
      DequantizeRow(t, src, dst, n);
  }
}

void FromF32(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kQ8_0: {
      STRATA_CHECK(n % 32 == 0);
      BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t j = 0; j < n / 32; ++j) {
        float amax = 0.f;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(src[j * 32 + i]));
        const float d = amax / 127.f;
        const float id = d > 0.f ? 1.f / d : 0.f;
        b[j].d = F32ToF16(d);
        for (int i = 0; i < 32; ++i) {
          b[j].qs[i] = static_cast<int8_t>(std::lround(src[j * 32 + i] * id));
        }
      }
      return;
    }
    case DType::kF64: {
      double* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    default:
      STRATA_CHECK_MSG(false, "FromF32: %s is not a float type", std::string(DTypeName(t)).c_str());
  }
}

}  // namespace strata
