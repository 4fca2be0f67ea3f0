// Tests of the Geodesia-KV scalar quantizer (bit packing: kernels/geodesia_format_test.cc; outward
// f16 rounding: core/dtype_test.cc).
#include "kv/geodesia/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace strata::geodesia {
namespace {

// Half an f16 ulp of |x| (f16 has 10 mantissa bits; subnormal spacing 2^-24).
double HalfUlpF16(double x) {
  const double a = std::fabs(x);
  if (a < 6.103515625e-05) return std::ldexp(1.0, -25);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 11);
}

TEST(GeodesiaQuant, CodeRangeAndErrorBound) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int bits = (trial % 3 == 0) ? 2 : (trial % 3 == 1 ? 4 : 8);
    const int n = 1 + static_cast<int>(rng.Below(128));
    const double scale = std::exp(std::clamp(rng.Normal() * 2, -6.0, 4.0));
    const double shift = rng.Normal() * scale * 4;
    std::vector<float> x(n);
    float lo = 1e30f, hi = -1e30f;
    for (auto& v : x) {
      v = static_cast<float>(shift + scale * rng.Normal());
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const QuantParams p = MakeQuantParams(lo, hi, bits);
    const double lo16 = F16ToF32(p.lo), step16 = F16ToF32(p.step);
    const double step32 = (static_cast<double>(hi) - lo) / ((1 << bits) - 1);
    // Stated bound: half a step plus the f16 rounding of lo and of step (the latter multiplied by
    // the top code), plus f32 rounding of the reconstruction (2^-22 relative).
    const double bound = step16 / 2 + std::fabs(lo - lo16) +
                         ((1 << bits) - 1) * std::fabs(step32 - step16) +
                         std::ldexp(std::max(std::fabs(lo), std::fabs(hi)), -21);
    EXPECT_LE(std::fabs(lo - lo16), HalfUlpF16(lo));
    for (float v : x) {
      const uint8_t c = QuantizeValue(v, p, bits);
      ASSERT_LT(c, 1u << bits);
      const double r = DequantizeValue(c, p);
      ASSERT_TRUE(std::isfinite(r));
      ASSERT_LE(std::fabs(v - r), bound) << "bits " << bits << " x " << v << " lo " << lo
                                         << " hi " << hi;
    }
  }
}

TEST(GeodesiaQuant, ConstantGroupHasNoNaN) {
  for (int bits : {2, 4, 8}) {
    for (float c : {0.f, 1.5f, -3.25f, 1e-3f, 700.f}) {
      const QuantParams p = MakeQuantParams(c, c, bits);
      EXPECT_EQ(p.step, 0);
      EXPECT_EQ(QuantizeValue(c, p, bits), 0);
      const float r = DequantizeValue(0, p);
      EXPECT_FALSE(std::isnan(r));
      EXPECT_EQ(r, F16ToF32(F32ToF16(c)));
    }
    // A range below the f16 step resolution: step underflows to 0; still no NaN.
    const QuantParams p = MakeQuantParams(1e-3f, 1e-3f + 1e-9f, bits);
    EXPECT_EQ(p.step, 0);
    EXPECT_EQ(QuantizeValue(1e-3f + 1e-9f, p, bits), 0);
    EXPECT_FALSE(std::isnan(DequantizeValue(0, p)));
  }
}

TEST(GeodesiaQuant, RoundHalfToEven) {
  // lo = 0, step = 1 (exact in f16): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  QuantParams p;
  p.lo = F32ToF16(0.f);
  p.step = F32ToF16(1.f);
  EXPECT_EQ(QuantizeValue(0.5f, p, 4), 0);
  EXPECT_EQ(QuantizeValue(1.5f, p, 4), 2);
  EXPECT_EQ(QuantizeValue(2.5f, p, 4), 2);
  EXPECT_EQ(QuantizeValue(99.f, p, 4), 15);
  EXPECT_EQ(QuantizeValue(-9.f, p, 4), 0);
}

// QuantizeRun (the encoder's loop) gives QuantizeValue's codes bit for bit: random groups, exact
// ties, values far outside the range (|y| >= 2^22 takes nearbyint), tiny steps, a zero step.
TEST(GeodesiaQuant, RunEqualsValue) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<float> x(256);
  std::vector<uint8_t> got(2 * x.size());
  for (int trial = 0; trial < 600; ++trial) {
    const int bits = (trial % 3 == 0) ? 2 : (trial % 3 == 1 ? 4 : 8);
    const float top = static_cast<float>((1 << bits) - 1);
    const double scale = std::ldexp(1.0, static_cast<int>(rng.Below(40)) - 30);
    float mn = 1e30f, mx = -1e30f;
    for (float& v : x) {
      v = static_cast<float>(rng.Normal() * scale);
      mn = std::min(mn, v), mx = std::max(mx, v);
    }
    QuantParams p = MakeQuantParams(mn, mx, bits);
    if (trial % 7 == 0) {  // exact ties: lo + (k + 1/2) step, and far outside the range
      p.lo = F32ToF16(0.f);
      p.step = F32ToF16(trial % 2 ? 1.f : 6e-8f);
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = i % 5 == 0 ? 1e9f * (i % 2 ? 1.f : -1.f)
                          : (static_cast<float>(i % 40) - 10.f + 0.5f) * F16ToF32(p.step);
      }
    }
    if (trial % 11 == 0) p.step = 0;
    const int n = static_cast<int>(x.size()) / 2;
    QuantizeRun(x.data(), n, 2, p, bits, got.data(), 3);
    for (int i = 0; i < n; ++i) {
      const uint8_t want = QuantizeValue(x[2 * i], p, bits);
      ASSERT_EQ(got[3 * i], want) << "x " << x[2 * i] << " bits " << bits << " trial " << trial;
      ASSERT_LE(got[3 * i], top);
    }
  }
}

}  // namespace
}  // namespace strata::geodesia
