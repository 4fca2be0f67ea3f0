#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

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
  EXPECT_FALSE(IsSupportedDType(12));
}

}  // namespace
}  // namespace strata
