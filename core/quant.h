// GGML block-quantized weight formats: the block layouts, exact dequantization and quantization.
//
// Layouts follow ggml's on-disk blocks (all little-endian; f16 fields are IEEE half bits):
//   32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (core/dtype.h), IQ4_NL.
//   256-element super-blocks (QK_K): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
// DequantizeRow reproduces ggml's reference dequantization bit for bit in f32 (the same operations in
// the same order), so a file written by llama.cpp decodes to the same floats in both engines.
// QuantizeRow is Strata's own quantizer (no importance matrix); its algorithms and per-type error
// bounds are documented in core/quant_encode.cc and tested in core/quant_encode_test.cc.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace strata {

// Blocks sit at any byte offset in a file or a row (18- and 22-byte blocks put every other one at an
// odd address), so their f16 fields are read through byte-aligned (packed) types.

constexpr int kQK = 32;    // elements per block of the 32-element formats
constexpr int kQK_K = 256;  // elements per K-quant super-block

// value = d * (q - 8), q in [0, 15]; element i < 16 in the low nibble of qs[i], i >= 16 in the high
// nibble of qs[i - 16].
struct STRATA_PACKED BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// value = d * q + m, q in [0, 15]; nibble order as Q4_0.
struct STRATA_PACKED BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// value = d * (q - 16), q in [0, 31]: low 4 bits as Q4_0, bit 4 of element i is bit i of qh
// (little-endian u32).
struct STRATA_PACKED BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// value = d * q + m, q in [0, 31]; bits as Q5_0.
struct STRATA_PACKED BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 16 sub-blocks of 16: scales[j] low nibble = scale, high nibble = min; 2-bit codes in qs (see the
// element order in quant.cc); value = d * scale * q - dmin * min.
struct STRATA_PACKED BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16 with 6-bit signed scales (packed in 12 bytes); 2 low bits in qs, the high
// bit in hmask; value = d * (scale - 32) * (q - (high bit ? 0 : 4)).
struct STRATA_PACKED BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes; value = d * sc * q - dmin * m.
struct STRATA_PACKED BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit per element in qh.
struct STRATA_PACKED BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16 with int8 scales; 6-bit codes (4 low bits in ql, 2 high in qh);
// value = d * scale * (q - 32).
struct STRATA_PACKED BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// value = d * kIq4nlValues[q], nibble order as Q4_0.
struct STRATA_PACKED BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// 8 sub-blocks of 32 with 6-bit scales (low 4 bits in scales_l, high 2 in scales_h);
// value = d * (ls - 32) * kIq4nlValues[q], nibble order per sub-block as Q4_0.
struct STRATA_PACKED BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// The non-linear 4-bit code book of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// True for the block-quantized weight types (Q4_0 ... IQ4_XS, Q8_0).
bool IsQuantized(DType t);

// Decodes n elements (a whole number of blocks) of quantized type t into f32, bit for bit as ggml's
// reference dequantization. Also accepts F32/F16/BF16 (same as ToF32).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Encodes n elements (a whole number of blocks) of f32 into type t (a block type, or F32/F16/BF16
// as FromF32). NaN or Inf input is refused with an error naming the first bad element and its value
// (dst is then unspecified); so are an n that is not a whole number of blocks and a t that is not a
// float or block type. Every finite input encodes (scales beyond f16 are clamped, see
// core/quant_encode.cc).
Status QuantizeRow(DType t, const float* src, void* dst, int64_t n);

}  // namespace strata
