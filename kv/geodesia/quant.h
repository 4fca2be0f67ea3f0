// Geodesia-KV scalar quantizer (asymmetric min/max, f16 lo and step) and LSB-first bit packing.
//
// Reference: docs/reference/geodesia-kv.md §1.2, packed/kernel path. For a group G of floats:
//   lo16 = f16(min G), step16 = f16((max G - min G) / (2^L - 1)),
//   code = clamp(round_half_even((x - lo16) / step16), 0, 2^L - 1), x_hat = code * step16 + lo16,
// with lo and step rounded to f16 FIRST and the codes computed from the rounded values (the kernel
// path of the reference). The reference's 1e-8 step floor underflows to 0 in f16 and would give
// 0/0; here step16 == 0 (a constant group, or a range below the f16 subnormal step) means every
// code is 0 and x_hat = lo16, never NaN.
//
// Error bound (tested): for x in [min G, max G],
//   |x - x_hat| <= step16 / 2 + |min G - lo16| + (2^L - 1) * |step - step16|  (+ f32 rounding),
// where step = (max - min) / (2^L - 1) in f32. The last two terms are the f16 rounding of lo and
// step (each at most half an f16 ulp of the value); the first is the usual half step.
//
// Inputs must lie within the f16 range (|x| < 65504): lo and step are stored as f16.
#pragma once

#include <cstdint>

#include "kernels/geodesia_format.h"  // PackCodes / UnpackCodes (bit packing)

namespace strata::geodesia {

// Quantization parameters of one group, both stored as f16 bits.
struct QuantParams {
  uint16_t lo = 0;    // f16(min)
  uint16_t step = 0;  // f16((max - min) / (2^bits - 1)); 0 for a constant group
};

// lo/step for a group with the given min and max (bits in {2, 4, 8}).
QuantParams MakeQuantParams(float min, float max, int bits);
// The code of x under p (see the header comment; step 0 -> 0).
uint8_t QuantizeValue(float x, QuantParams p, int bits);
// QuantizeValue over n values x[i * stride] into out[i * out_stride], the same codes bit for bit
// (lo and step converted once, the rounding inlined: what block encoding uses).
void QuantizeRun(const float* x, int n, int stride, QuantParams p, int bits, uint8_t* out,
                 int out_stride);
// code * step + lo in f32 (the kernel's dequantization).
float DequantizeValue(uint8_t code, QuantParams p);

}  // namespace strata::geodesia
