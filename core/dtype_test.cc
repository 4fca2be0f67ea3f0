#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/rng.h"

namespace strata {
namespace {

TEST(DTypeTest, F16ToF32ExactForAllCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float fast = F16ToF32(static_cast<uint16_t>(h));
    const float slow = F16ToF32Slow(static_cast<uint16_t>(h));
    if (std::isnan(slow)) {
      EXPECT_TRUE(std::isnan(fast)) << h;
    } else {
      EXPECT_EQ(F32Bits(fast), F32Bits(slow)) << h;
    }
  }
}

TEST(DTypeTest, F16RoundTripAllFiniteCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << h;
  }
}

// F32 -> F16 rounds to nearest, ties to even: compare against a float64 reference that picks
// the nearest representable f16 by exhaustive neighbourhood search.
TEST(DTypeTest, F32ToF16RoundsToNearestEven) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const float f = static_cast<float>(std::ldexp(rng.Normal(), static_cast<int>(rng.Below(40)) - 28));
    const uint16_t h = F32ToF16(f);
    const double got = F16ToF32(h);
    const double err = std::fabs(got - static_cast<double>(f));
    // Neighbours of h must not be strictly closer.
    for (int d : {-1, 1}) {
      const uint16_t n = static_cast<uint16_t>(h + d);
      const float nf = F16ToF32(n);
      if (std::isnan(nf) || std::isinf(nf) || ((n ^ h) & 0x8000)) continue;
      const double nerr = std::fabs(static_cast<double>(nf) - f);
      ASSERT_TRUE(err < nerr || (err == nerr && (h & 1) == 0))
          << "seed " << seed << " f=" << f << " h=" << h << " n=" << n;
    }
  }
  EXPECT_EQ(F32ToF16(65520.f), 0x7c00);  // overflow to Inf
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_EQ(F32ToF16(0.f), 0);
  EXPECT_EQ(F32ToF16(-0.f), 0x8000);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(F32ToBf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  EXPECT_EQ(F32ToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (int i = 0; i < 100000; ++i) {
    const float f = static_cast<float>(rng.Normal() * 100);
    const float back = Bf16ToF32(F32ToBf16(f));
    ASSERT_LE(std::fabs(back - f), std::fabs(f) * 0x1p-8f) << "seed " << seed;
  }
}

TEST(DTypeTest, Q8_0RoundTripWithinHalfStep) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  std::vector<float> x(256), y(256);
  for (auto& v : x) v = static_cast<float>(rng.Normal());
  std::vector<BlockQ8_0> q(8);
  FromF32(DType::kQ8_0, x.data(), q.data(), 256);
  ToF32(DType::kQ8_0, q.data(), y.data(), 256);
  for (int b = 0; b < 8; ++b) {
    const float d = F16ToF32(q[b].d);
    for (int i = 0; i < 32; ++i) {
      // Codes are chosen with the unrounded scale, decoded with its f16 rounding (relative error
      // <= 2^-11), so the error is half a step plus |q| <= 127 times the scale's rounding.
      ASSERT_LE(std::fabs(x[b * 32 + i] - y[b * 32 + i]), d * (0.5f + 127.f * 0x1p-11f) * 1.0001f)
          << "seed " << seed;
    }
  }
  EXPECT_EQ(DTypeRowBytes(DType::kQ8_0, 64), 68);
  EXPECT_EQ(GgmlTypeName(12), "Q4_K");
  EXPECT_EQ(GgmlTypeName(999), "type 999");
  EXPECT_TRUE(IsSupportedDType(12));
  EXPECT_FALSE(IsSupportedDType(16));  // IQ2_XXS: not implemented
}

// Half an f16 ulp of |x| (f16 has 10 mantissa bits; subnormal spacing 2^-24).
double HalfUlpF16(double x) {
  const double a = std::fabs(x);
  if (a < 6.103515625e-05) return std::ldexp(1.0, -25);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 11);
}

TEST(DTypeTest, F16DirectedRounding) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int i = 0; i < 20000; ++i) {
    const float x =
        static_cast<float>(rng.Normal() * std::exp(std::clamp(rng.Normal() * 4, -15.0, 9.0)));
    const float dn = F16ToF32(F16RoundDown(x)), up = F16ToF32(F16RoundUp(x));
    ASSERT_LE(dn, x);
    ASSERT_GE(up, x);
    ASSERT_LE(up - dn, 2 * HalfUlpF16(x) * 2 + 1e-30);  // at most one f16 step apart
  }
  EXPECT_EQ(F16ToF32(F16RoundDown(0.f)), 0.f);
  EXPECT_EQ(F16ToF32(F16RoundUp(0.f)), 0.f);
  // Beyond the finite f16 range the outward answer is the infinity on that side (a clamp to
  // +-65504 would lie inside the value and break any box bound built on it).
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float x : {1e6f, 65505.f, 65519.f, 65520.f, 3e38f}) {
    EXPECT_EQ(F16ToF32(F16RoundUp(x)), kInf) << x;
    EXPECT_EQ(F16ToF32(F16RoundDown(x)), 65504.f) << x;
    EXPECT_EQ(F16ToF32(F16RoundDown(-x)), -kInf) << x;
    EXPECT_EQ(F16ToF32(F16RoundUp(-x)), -65504.f) << x;
  }
  EXPECT_EQ(F16ToF32(F16RoundUp(65504.f)), 65504.f);
  EXPECT_EQ(F16ToF32(F16RoundDown(-65504.f)), -65504.f);
  EXPECT_EQ(F16ToF32(F16RoundUp(kInf)), kInf);
  EXPECT_EQ(F16ToF32(F16RoundDown(-kInf)), -kInf);
  // Between 0 and the smallest subnormal: outward to it.
  EXPECT_EQ(F16RoundUp(1e-9f), 0x0001);
  EXPECT_EQ(F16RoundDown(1e-9f), 0x0000);
  EXPECT_EQ(F16RoundDown(-1e-9f), 0x8001);
}

}  // namespace
}  // namespace strata
