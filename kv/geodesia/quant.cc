// Geodesia-KV scalar quantizer and bit packing (see quant.h).
#include "kv/geodesia/quant.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace strata::geodesia {

QuantParams MakeQuantParams(float min, float max, int bits) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  STRATA_CHECK(min <= max);
  const float levels = static_cast<float>((1 << bits) - 1);
  QuantParams p;
  p.lo = F32ToF16(min);
  p.step = F32ToF16((max - min) / levels);
  return p;
}

uint8_t QuantizeValue(float x, QuantParams p, int bits) {
  const float step = F16ToF32(p.step);
  if (!(step > 0.f)) return 0;  // constant group (or a step below the f16 range): code 0
  const float lo = F16ToF32(p.lo);
  const float t = std::nearbyint((x - lo) / step);  // round half to even (default FP mode)
  const float top = static_cast<float>((1 << bits) - 1);
  return static_cast<uint8_t>(std::clamp(t, 0.f, top));
}

void QuantizeRun(const float* x, int n, int stride, QuantParams p, int bits, uint8_t* out,
                 int out_stride) {
  const float step = F16ToF32(p.step);
  if (!(step > 0.f)) {
    for (int i = 0; i < n; ++i) out[i * out_stride] = 0;
    return;
  }
  const float lo = F16ToF32(p.lo);
  const float top = static_cast<float>((1 << bits) - 1);
  // Round half to even by the 1.5 * 2^23 trick (exact for |y| < 2^22, where the sum's ulp is 1;
  // default rounding mode, as nearbyint): larger values and NaN take nearbyint itself.
  constexpr float kMagic = 12582912.f;
  for (int i = 0; i < n; ++i) {
    const float y = (x[i * stride] - lo) / step;
    const float t = std::fabs(y) < 4194304.f ? (y + kMagic) - kMagic : std::nearbyint(y);
    out[i * out_stride] = static_cast<uint8_t>(std::clamp(t, 0.f, top));
  }
}

float DequantizeValue(uint8_t code, QuantParams p) {
  return static_cast<float>(code) * F16ToF32(p.step) + F16ToF32(p.lo);
}

}  // namespace strata::geodesia
