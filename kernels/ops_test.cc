#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

constexpr double kEps = 1.1920928955078125e-07;  // f32 machine epsilon

std::vector<float> RandomVec(Rng& rng, int64_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

TEST(OpsTest, DotAndAxpyMatchFloat64OnOddSizesAndMisalignment) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (int it = 0; it < 200; ++it) {
      const int64_t n = it < 70 ? it : 1 + static_cast<int64_t>(rng.Below(5000));
      const int oa = static_cast<int>(rng.Below(4)), ob = static_cast<int>(rng.Below(4));
      std::vector<float> a = RandomVec(rng, n + 4), b = RandomVec(rng, n + 4);
      const float* pa = a.data() + oa;
      float* pb = b.data() + ob;
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(pa[i]) * pb[i];
        mag += std::fabs(static_cast<double>(pa[i]) * pb[i]);
      }
      // Random-sign rounding error: well under 8 sqrt(n) eps sum|a b|.
      ASSERT_NEAR(Dot(pa, pb, n), ref, 8 * std::sqrt(double(n) + 1) * kEps * mag + 1e-30)
          << "n=" << n;
      ASSERT_NEAR(DotAcc2(pa, pb, n), ref, 8 * std::sqrt(double(n) + 1) * kEps * mag + 1e-30)
          << "n=" << n;

      const float alpha = static_cast<float>(rng.Normal());
      std::vector<float> before(pb, pb + n);
      const float guard = b[ob + n];
      Axpy(alpha, pa, pb, n);
      for (int64_t i = 0; i < n; ++i) {
        // One fused or unfused multiply-add: at most 2 roundings.
        const double want = before[i] + static_cast<double>(alpha) * pa[i];
        ASSERT_NEAR(pb[i], want, 2 * kEps * (std::fabs(before[i]) + std::fabs(alpha * pa[i])))
            << "n=" << n << " i=" << i;
      }
      ASSERT_EQ(b[ob + n], guard) << "Axpy wrote past n";
    }
  });
}

TEST(OpsTest, RmsNormMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int it = 0; it < 50; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(3000));
    std::vector<float> x = RandomVec(rng, n), w = RandomVec(rng, n), y(n);
    const float eps = 1e-5f;
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    RmsNorm(x.data(), w.data(), n, eps, y.data());
    for (int64_t i = 0; i < n; ++i) {
      // Three f32 roundings (inv, x*inv, *w): 4 eps relative.
      const double want = x[i] * inv * w[i];
      ASSERT_NEAR(y[i], want, 4 * kEps * std::fabs(want) + 1e-30) << i;
    }
    // Aliasing and null weight.
    std::vector<float> z = x;
    RmsNorm(z.data(), nullptr, n, eps, z.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(z[i], x[i] * inv, 3 * kEps * std::fabs(x[i] * inv));
  }
}

// Double-precision reference of Rope, written independently (angle via pow).
void RopeRef(std::vector<double>& x, int dim, int64_t pos, RopeStyle style, const RopeParams& p) {
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    double theta = static_cast<double>(pos) *
                   std::pow(static_cast<double>(p.freq_base), -2.0 * i / dim) * p.freq_scale;
    if (p.freq_factors) theta /= p.freq_factors[i];
    const double c = std::cos(theta) * p.attn_factor, s = std::sin(theta) * p.attn_factor;
    const int i0 = style == RopeStyle::kNorm ? 2 * i : i;
    const int i1 = style == RopeStyle::kNorm ? 2 * i + 1 : i + half;
    const double a = x[i0], b = x[i1];
    x[i0] = a * c - b * s;
    x[i1] = a * s + b * c;
  }
}

TEST(OpsTest, RopeMatchesFloat64BothStyles) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    for (int it = 0; it < 200; ++it) {
      const int dim = 2 * (1 + static_cast<int>(rng.Below(80)));
      const int64_t pos = it % 4 == 0 ? 100000 + static_cast<int64_t>(rng.Below(1000000))
                                      : static_cast<int64_t>(rng.Below(5000));
      std::vector<float> factors(dim / 2);
      for (auto& f : factors) f = 1.f + static_cast<float>(rng.Uniform()) * 7.f;
      RopeParams p;
      p.freq_base = it % 2 ? 10000.f : 500000.f;
      p.freq_scale = it % 3 == 0 ? 0.25f : 1.f;
      p.freq_factors = it % 5 == 0 ? factors.data() : nullptr;
      p.attn_factor = it % 7 == 0 ? 1.2f : 1.f;
      std::vector<float> x = RandomVec(rng, dim);
      std::vector<double> ref(x.begin(), x.end());
      double norm = 0;
      for (float v : x) norm += static_cast<double>(v) * v;
      Rope(x.data(), dim, pos, style, p);
      RopeRef(ref, dim, pos, style, p);
      double norm_after = 0;
      for (int i = 0; i < dim; ++i) {
        // cos/sin rounded to f32 then two products and a sum: a few eps of |x| scale; the angle
        // is exact to ~1e-16 * theta even at position 1e6 because it is formed in double.
        ASSERT_NEAR(x[i], ref[i], 8 * kEps * (std::sqrt(norm) + 1e-3) * p.attn_factor)
            << "dim=" << dim << " pos=" << pos << " i=" << i;
        norm_after += static_cast<double>(x[i]) * x[i];
      }
      // Rotation preserves the norm (scaled by attn_factor^2).
      const double af2 = static_cast<double>(p.attn_factor) * p.attn_factor;
      ASSERT_NEAR(norm_after, norm * af2, 1e-5 * norm * af2 + 1e-30);
    }
  }
}

TEST(OpsTest, RopePositionZeroIsIdentity) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    const int dim = 128;
    std::vector<float> x = RandomVec(rng, dim), y = x;
    Rope(y.data(), dim, 0, style, RopeParams{});
    for (int i = 0; i < dim; ++i) ASSERT_EQ(x[i], y[i]) << i;  // cos 0 = 1, sin 0 = 0: exact
  }
}

TEST(OpsTest, RopeStylesPairTheRightElements) {
  // Only pair 0 rotates at frequency 1; with dim=4 and x = e_0 the rotated mass must land on
  // x[1] (kNorm) or x[2] (kNeox).
  RopeParams p;
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    float x[4] = {1, 0, 0, 0};
    Rope(x, 4, 1, style, p);
    EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
    EXPECT_NEAR(x[style == RopeStyle::kNorm ? 1 : 2], std::sin(1.0), 1e-6);
    EXPECT_EQ(x[style == RopeStyle::kNorm ? 2 : 1], 0.f);
  }
}

TEST(OpsTest, SoftmaxSumsToOneAndMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int it = 0; it < 100; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(2000));
    std::vector<float> x = RandomVec(rng, n);
    for (auto& v : x) v *= 10.f;
    if (n > 2) x[1] = -std::numeric_limits<float>::infinity();  // a masked entry
    std::vector<double> ref(n);
    double m = -INFINITY, sum = 0;
    for (float v : x) m = std::max(m, static_cast<double>(v));
    for (int64_t i = 0; i < n; ++i) sum += ref[i] = std::exp(x[i] - m);
    const std::vector<float> x0 = x;
    Softmax(x.data(), n);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      total += x[i];
      // f32 exp (a few ulp), an f32 running sum (n eps worst case), and the f32 rounding of the
      // exponent x - m (eps |x - m| absolute, i.e. relative in the result).
      if (std::isinf(x0[i])) continue;  // masked: checked to be exactly 0 below
      const double rel = (8 + n) * kEps + kEps * std::fabs(x0[i] - m);
      ASSERT_NEAR(x[i], ref[i] / sum, rel * ref[i] / sum + 1e-30) << i;
    }
    if (n > 2) {
      ASSERT_EQ(x[1], 0.f);
    }
    ASSERT_NEAR(total, 1.0, (8 + 2 * n) * kEps);
  }
  float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
  Softmax(all_masked, 3);
  for (float v : all_masked) EXPECT_EQ(v, 0.f);
}

TEST(OpsTest, SwiGluMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int64_t n = 1000;
  std::vector<float> x = RandomVec(rng, n), y = RandomVec(rng, n), x0 = x;
  for (auto& v : x) v *= 8.f;
  x0 = x;
  SwiGlu(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = x0[i];
    const double want = g / (1 + std::exp(-g)) * y[i];
    ASSERT_NEAR(x[i], want, 8 * kEps * std::fabs(want) + 1e-30) << i;  // f32 exp, div, mul
  }
}

TEST(OpsTest, GeluTanhGluMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int64_t n = 1000;
  std::vector<float> x = RandomVec(rng, n), y = RandomVec(rng, n);
  for (auto& v : x) v *= 8.f;  // both tails and the bend
  const std::vector<float> x0 = x;
  GeluTanhGlu(x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = x0[i];
    const double inner = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
    const double want = 0.5 * g * (1.0 + std::tanh(inner)) * y[i];
    // f32 tanh (a few ulp) of an argument rounded in f32, times |g| up to 8: an absolute error
    // of a few ulp of |g y| near the bend, relative elsewhere.
    ASSERT_NEAR(x[i], want, 16 * kEps * std::fabs(g * y[i]) + 1e-30) << i << " g " << g;
  }
}

}  // namespace
}  // namespace strata
