#include "eval/stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace strata::eval {
namespace {

// Expected values from the closed forms of the Wilson interval (float64), and the 4-decimal
// textbook values for n = 10 at 95%: 0/10 -> [0, 0.2775], 5/10 -> [0.2366, 0.7634],
// 10/10 -> [0.7225, 1].
TEST(WilsonTest, KnownValuesAtNinetyFivePercent) {
  const double z = 1.959963984540054, z2 = z * z, n = 10;
  const Interval zero = WilsonInterval(0, 10);
  EXPECT_EQ(zero.point, 0.0);
  EXPECT_EQ(zero.lo, 0.0);
  EXPECT_NEAR(zero.hi, z2 / (n + z2), 1e-12);  // k = 0: hi = z^2 / (n + z^2)
  EXPECT_NEAR(zero.hi, 0.2775, 5e-5);

  const Interval all = WilsonInterval(10, 10);
  EXPECT_EQ(all.point, 1.0);
  EXPECT_NEAR(all.lo, n / (n + z2), 1e-12);  // k = n: lo = n / (n + z^2)
  EXPECT_NEAR(all.lo, 0.7225, 5e-5);
  EXPECT_EQ(all.hi, 1.0);

  const Interval half = WilsonInterval(5, 10);
  const double h = z * std::sqrt(0.25 / n + z2 / (4 * n * n)) / (1 + z2 / n);
  EXPECT_NEAR(half.lo, 0.5 - h, 1e-12);  // symmetric about 1/2
  EXPECT_NEAR(half.hi, 0.5 + h, 1e-12);
  EXPECT_NEAR(half.lo, 0.2366, 5e-5);
  EXPECT_NEAR(half.hi, 0.7634, 5e-5);
}

TEST(WilsonTest, EmptyIsUninformativeAndRandomCountsAreOrdered) {
  const Interval e = WilsonInterval(0, 0);
  EXPECT_EQ(e.lo, 0.0);
  EXPECT_EQ(e.hi, 1.0);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int it = 0; it < 200; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(500));
    const int64_t k = static_cast<int64_t>(rng.Below(n + 1));
    const Interval w = WilsonInterval(k, n);
    EXPECT_LE(w.lo, w.point);
    EXPECT_GE(w.hi, w.point);
    EXPECT_GE(w.lo, 0.0);
    EXPECT_LE(w.hi, 1.0);
    // Mirror symmetry: k successes and n - k failures give mirrored intervals.
    const Interval m = WilsonInterval(n - k, n);
    EXPECT_NEAR(w.lo, 1 - m.hi, 1e-12);
  }
}

TEST(BootstrapTest, ConstantNegativeDeltaExcludesZero) {
  std::vector<ClusterDelta> c;
  for (int i = 0; i < 6; ++i) c.push_back({-0.5 * 63, 63});
  auto r = PairedClusterBootstrap(c, 20000, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->mean_delta, -0.5);
  EXPECT_DOUBLE_EQ(r->delta_lo, -0.5);
  EXPECT_DOUBLE_EQ(r->delta_hi, -0.5);
  EXPECT_LT(r->delta_hi, 0.0);
  EXPECT_LT(r->ratio_hi, 1.0);
  EXPECT_NEAR(r->ratio, std::exp(-0.5), 1e-15);
  EXPECT_EQ(r->wins_a, 6);
  EXPECT_EQ(r->wins_b, 0);
  EXPECT_EQ(r->n_clusters, 6);
}

TEST(BootstrapTest, AlternatingDeltaContainsZero) {
  std::vector<ClusterDelta> c;
  for (int i = 0; i < 6; ++i) c.push_back({(i % 2 ? 0.5 : -0.5) * 10, 10});
  auto r = PairedClusterBootstrap(c, 20000, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->mean_delta, 0.0, 1e-15);
  EXPECT_LT(r->delta_lo, 0.0);
  EXPECT_GT(r->delta_hi, 0.0);
  EXPECT_LT(r->ratio_lo, 1.0);
  EXPECT_GT(r->ratio_hi, 1.0);
  EXPECT_EQ(r->wins_a, 3);
  EXPECT_EQ(r->wins_b, 3);
  // The draws are means of 6 values of +-0.5: the 2.5% quantile is at most -1/6.
  EXPECT_LE(r->delta_lo, -1.0 / 6 + 1e-12);
}

TEST(BootstrapTest, FixedSeedGivesIdenticalBoundsAndWeightsByCount) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<ClusterDelta> c;
  for (int i = 0; i < 7; ++i) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(64));
    c.push_back({rng.Normal() * n, n});
  }
  auto a = PairedClusterBootstrap(c, 5000, seed);
  auto b = PairedClusterBootstrap(c, 5000, seed);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->delta_lo, b->delta_lo);
  EXPECT_EQ(a->delta_hi, b->delta_hi);
  EXPECT_LE(a->delta_lo, a->delta_hi);
  // The pooled mean weights windows by their target counts.
  double s = 0;
  int64_t n = 0;
  for (const auto& x : c) s += x.sum, n += x.count;
  EXPECT_NEAR(a->mean_delta, s / n, 1e-12);
}

TEST(BootstrapTest, RejectsEmptyAndEmptyWindows) {
  EXPECT_FALSE(PairedClusterBootstrap({}, 100, 0).ok());
  auto r = PairedClusterBootstrap({{1.0, 0}}, 100, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("window 0"), std::string::npos);
  EXPECT_FALSE(PairedClusterBootstrap({{1.0, 1}}, 0, 0).ok());
}

}  // namespace
}  // namespace strata::eval
