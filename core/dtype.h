// Element types and exact bf16/f16 <-> f32 conversion (round to nearest even, NaN and Inf kept).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata {

// Storage types a tensor may have. Values match GGML's type ids so GGUF files map directly.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

std::string_view DTypeName(DType t);
// Name of a GGML type id, known or not ("Q4_K", "type 99").
std::string GgmlTypeName(uint32_t ggml_type);
bool IsSupportedDType(uint32_t ggml_type);
// Elements per block (32 for Q4_0..Q8_0 and IQ4_NL, 256 for the K-quants and IQ4_XS, 1 for
// scalar types) and bytes per block.
int64_t DTypeBlockElems(DType t);
int64_t DTypeBlockBytes(DType t);
// Bytes for n elements; n must be a multiple of the block size.
int64_t DTypeRowBytes(DType t, int64_t n);

// Q8_0 block: 32 int8 codes with one f16 scale, value = d * q.
// Packed: blocks sit at any byte offset (see core/quant.h).
#define STRATA_PACKED __attribute__((packed))
struct STRATA_PACKED BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsF32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float Bf16ToF32(uint16_t h) { return BitsF32(static_cast<uint32_t>(h) << 16); }

inline uint16_t F32ToBf16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float F16ToF32Slow(uint16_t h);
uint16_t F32ToF16(float f);

// Table-free f16 -> f32 through the float exponent trick (exact for all 65536 inputs; tested).
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsF32(sign | 0x7f800000u | (man << 13));  // Inf/NaN
  if (exp == 0) {
    // subnormal or zero: man * 2^-24
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return BitsF32(sign | ((exp + 112u) << 23) | (man << 13));
}

// Directed rounding to f16 (bits): the largest f16 <= x (RoundDown) and the smallest f16 >= x
// (RoundUp), the outward rounding that keeps a box of keys sound. Beyond the finite f16 range the
// answer is the infinity on that side (RoundUp(1e6) = +inf, RoundDown(-1e6) = -inf), never a clamp
// to +-65504, which would put the bound inside the box. -0 and +0 round to themselves; a value
// between 0 and the smallest subnormal rounds outward to it (RoundUp(1e-9) = 2^-24). x: not NaN.
uint16_t F16RoundDown(float x);
uint16_t F16RoundUp(float x);

// Converts n values into f32 (any float or block-quantized storage type; see core/quant.h).
void ToF32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values into storage type t (F32, F16, BF16, F64 or a block type of core/quant.h;
// block types go through QuantizeRow and abort on NaN/Inf, so callers with untrusted data use that).
void FromF32(DType t, const float* src, void* dst, int64_t n);

}  // namespace strata
