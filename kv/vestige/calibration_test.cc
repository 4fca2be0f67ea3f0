// Tests of the recall-tier calibration rules: basis fit (vs a float64 subspace-iteration
// reference), quantiles, the entropy gate, the conformal order statistic and the prefix ladder.
#include "kv/vestige/calibration.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace strata {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows x [n, d] = sum_k a_k s_k e_k + noise, with a planted spectrum along a random orthonormal
// frame e (returned [d, d] f64, rows = directions), plus a common mean offset (must be removed).
std::vector<float> PlantedQueries(Rng& rng, int64_t n, int d, int strong, std::vector<double>* e) {
  e->assign(static_cast<size_t>(d) * d, 0.0);
  for (auto& v : *e) v = rng.Normal();
  for (int i = 0; i < d; ++i) {  // Gram-Schmidt (twice for stability)
    double* vi = e->data() + static_cast<size_t>(i) * d;
    for (int pass = 0; pass < 2; ++pass) {
      for (int j = 0; j < i; ++j) {
        const double* vj = e->data() + static_cast<size_t>(j) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += vi[c] * vj[c];
        for (int c = 0; c < d; ++c) vi[c] -= dot * vj[c];
      }
    }
    double nrm = 0;
    for (int c = 0; c < d; ++c) nrm += vi[c] * vi[c];
    for (int c = 0; c < d; ++c) vi[c] /= std::sqrt(nrm);
  }
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> row(d, 3.0);  // mean offset
    for (int k = 0; k < d; ++k) {
      const double sd = k < strong ? 10.0 / (1.0 + 0.1 * k) : 0.3;
      const double a = sd * rng.Normal();
      const double* ek = e->data() + static_cast<size_t>(k) * d;
      for (int c = 0; c < d; ++c) row[c] += a * ek[c];
    }
    for (int c = 0; c < d; ++c) x[i * d + c] = static_cast<float>(row[c]);
  }
  return x;
}

// float64 reference: top-r eigenspace of the centred Gram by subspace iteration with
// Gram-Schmidt. The subspace converges fast with the planted gap; each vector only at the rate
// (ev[k+1] / ev[k])^iterations, and two planted variances 100 and 83 sampled 600 times can lie
// within a few percent (seed 9717065158866504352: 200 iterations left the leading vector 5e-3
// off), hence 4000. Returns [r, d] orthonormal rows.
constexpr int kReferenceIterations = 4000;
std::vector<double> ReferenceBasis(const std::vector<float>& x, int64_t n, int d, int r) {
  std::vector<double> mean(d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) mean[c] += x[i * d + c];
  for (auto& m : mean) m /= n;
  std::vector<double> g(static_cast<size_t>(d) * d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) g[a * d + b] += (x[i * d + a] - mean[a]) * (x[i * d + b] - mean[b]);
  std::vector<double> v(static_cast<size_t>(r) * d, 0.0), w(v.size());
  for (int k = 0; k < r; ++k) v[k * d + (k * 7) % d] = 1.0, v[k * d + (k * 3 + 1) % d] += 0.5;
  for (int it = 0; it < kReferenceIterations; ++it) {
    for (int k = 0; k < r; ++k)
      for (int a = 0; a < d; ++a) {
        double s = 0;
        for (int b = 0; b < d; ++b) s += g[a * d + b] * v[k * d + b];
        w[k * d + a] = s;
      }
    for (int k = 0; k < r; ++k) {
      double* wk = w.data() + k * d;
      for (int pass = 0; pass < 2; ++pass)
        for (int j = 0; j < k; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += wk[c] * w[j * d + c];
          for (int c = 0; c < d; ++c) wk[c] -= dot * w[j * d + c];
        }
      double nrm = 0;
      for (int c = 0; c < d; ++c) nrm += wk[c] * wk[c];
      for (int c = 0; c < d; ++c) wk[c] /= std::sqrt(nrm);
    }
    v.swap(w);
  }
  return v;
}

TEST(CalibBasis, OrthonormalAndMatchesFloat64Reference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int d = 48, r = 8, strong = 8;
  const int64_t n = 600;
  std::vector<double> e;
  std::vector<float> x = PlantedQueries(rng, n, d, strong, &e);
  std::vector<float> v(static_cast<size_t>(r) * d);
  std::vector<double> ev;
  ASSERT_TRUE(FitRecallBasis(x.data(), n, d, r, v.data(), &ev).ok());
  // V V^T = I: f32 rounding of unit vectors of length 48 gives ~1e-7 per entry.
  for (int a = 0; a < r; ++a)
    for (int b = 0; b < r; ++b) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(v[a * d + c]) * v[b * d + c];
      EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5) << a << "," << b;
    }
  // Descending eigenvalues.
  for (int k = 1; k < r; ++k) EXPECT_GE(ev[k - 1], ev[k]);
  // Subspace agreement: all principal-angle cosines ~ 1 <=> ||P_ref - P_V||_F small. The planted
  // gap (>= 10x) makes the eigenspace well conditioned; 1e-4 covers f32 storage of V.
  std::vector<double> ref = ReferenceBasis(x, n, d, r);
  double diff = 0;
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b) {
      double p1 = 0, p2 = 0;
      for (int k = 0; k < r; ++k) {
        p1 += ref[k * d + a] * ref[k * d + b];
        p2 += static_cast<double>(v[k * d + a]) * v[k * d + b];
      }
      diff += (p1 - p2) * (p1 - p2);
    }
  EXPECT_LT(std::sqrt(diff), 1e-4);
  // Each basis vector is an eigenvector of the centred Gram: its Rayleigh quotient is ev[k] and
  // the leading one matches the reference's leading direction up to sign.
  // The reference's leading vector is off by at most ~(ev[1] / ev[0])^iterations in angle.
  double c0 = 0;
  for (int c = 0; c < d; ++c) c0 += ref[c] * v[c];
  const double lag = std::pow(ev[1] / ev[0], kReferenceIterations);
  EXPECT_NEAR(std::fabs(c0), 1.0, 1e-5 + lag * lag);
}

TEST(CalibBasis, DeterministicSignAndErrors) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<double> e;
  std::vector<float> x = PlantedQueries(rng, 100, 16, 4, &e);
  std::vector<float> v1(4 * 16), v2(4 * 16);
  ASSERT_TRUE(FitRecallBasis(x.data(), 100, 16, 4, v1.data()).ok());
  ThreadPool pool(2);  // the Gram's rows split over two threads: the same basis
  ASSERT_TRUE(FitRecallBasis(x.data(), 100, 16, 4, v2.data(), nullptr, &pool).ok());
  EXPECT_EQ(v1, v2);
  for (int k = 0; k < 4; ++k) {
    const float* vk = v1.data() + k * 16;
    const float* m = std::max_element(vk, vk + 16, [](float a, float b) {
      return std::fabs(a) < std::fabs(b);
    });
    EXPECT_GT(*m, 0.f);
  }
  Status s = FitRecallBasis(x.data(), 100, 16, 17, v1.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("17"), std::string::npos) << s.message();
  EXPECT_FALSE(FitRecallBasis(x.data(), 0, 16, 4, v1.data()).ok());
}

TEST(CalibQuantile, LinearInterpolation) {
  EXPECT_DOUBLE_EQ(QuantileLinear({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(QuantileLinear({4, 1, 3, 2}, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(QuantileLinear({4, 1, 3, 2}, 1.0), 4.0);
  // 21 values 0..20: the 0.05 quantile sits at position 1.0 -> 1; 0.03 at 0.6 -> 0.6.
  std::vector<double> v;
  for (int i = 20; i >= 0; --i) v.push_back(i);
  EXPECT_DOUBLE_EQ(QuantileLinear(v, 0.05), 1.0);
  EXPECT_NEAR(QuantileLinear(v, 0.03), 0.6, 1e-12);
}

TEST(CalibGate, QuantileMinimumAndAutoOff) {
  std::vector<double> hard;
  for (int i = 0; i < 18; ++i) hard.push_back(1.0 + i);  // 1..18
  // All rows: 100 rows, only 10 above the threshold -> gate on.
  std::vector<double> all(90, 0.5);
  for (int i = 0; i < 10; ++i) all.push_back(5.0);
  GateFit g = FitGate(hard, all, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  // 0.05 * 17 = 0.85 -> 1 + 0.85.
  EXPECT_FALSE(g.off);
  EXPECT_FLOAT_EQ(g.thr, 1.85f);
  EXPECT_EQ(g.n_hard, 18);
  // 17 hard rows: below the minimum -> always scan.
  std::vector<double> few(hard.begin(), hard.begin() + 17);
  g = FitGate(few, all, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  EXPECT_EQ(g.thr, -kInf);
  EXPECT_FALSE(g.off);
  // Prefix form: more than 5 hard rows suffice (6), 0.03 quantile.
  std::vector<double> six = {3, 1, 2, 6, 5, 4};
  g = FitGate(six, all, kRecallGateAlphaPrefix, kRecallMinHardPrefix);
  EXPECT_NEAR(g.thr, 1.0 + 0.03 * 5, 1e-6);
  g = FitGate({1, 2, 3, 4, 5}, all, kRecallGateAlphaPrefix, kRecallMinHardPrefix);
  EXPECT_EQ(g.thr, -kInf);
  // Auto-off: 61 of 100 rows above the threshold -> off; exactly 60 -> on (strictly more).
  std::vector<double> many(39, 0.5);
  many.insert(many.end(), 61, 5.0);
  g = FitGate(hard, many, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  EXPECT_TRUE(g.off);
  EXPECT_EQ(g.thr, -kInf);
  std::vector<double> sixty(40, 0.5);
  sixty.insert(sixty.end(), 60, 5.0);
  g = FitGate(hard, sixty, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  EXPECT_FALSE(g.off);
  EXPECT_FLOAT_EQ(g.thr, 1.85f);
}

TEST(CalibConformal, OrderStatisticOnKnownInputs) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  // n = 37: k = ceil(38 * 18/19 - 1e-9) = 36 (an exact integer before the epsilon).
  std::vector<double> z;
  for (int i = 1; i <= 37; ++i) z.push_back(0.1 * i);
  for (size_t i = z.size() - 1; i > 0; --i) std::swap(z[i], z[rng.Below(i + 1)]);
  ConformalFit f = FitConformalZ(z, RecallZFloor::kZero);
  EXPECT_EQ(f.n, 37);
  EXPECT_EQ(f.k, 36);
  EXPECT_FLOAT_EQ(f.z, 3.6f);
  EXPECT_FALSE(f.clamped);
  // n = 18 (the minimum): k = ceil(19 * 18/19) = 18, the largest.
  std::vector<double> z18;
  for (int i = 0; i < 18; ++i) z18.push_back(i * 0.25);
  f = FitConformalZ(z18, RecallZFloor::kZero);
  EXPECT_EQ(f.k, 18);
  EXPECT_FLOAT_EQ(f.z, 17 * 0.25f);
  // n = 100: k = ceil(101 * 18/19) = ceil(95.68) = 96.
  std::vector<double> z100;
  for (int i = 0; i < 100; ++i) z100.push_back(i * 0.01);
  f = FitConformalZ(z100, RecallZFloor::kZero);
  EXPECT_EQ(f.k, 96);
  EXPECT_FLOAT_EQ(f.z, 0.95f);
  // n < 18: Z_MAX, whatever the values.
  f = FitConformalZ(std::vector<double>(17, -1.0), RecallZFloor::kNone);
  EXPECT_EQ(f.z, kRecallZMax);
  EXPECT_EQ(f.k, 0);
  // Never above Z_MAX.
  f = FitConformalZ(std::vector<double>(40, 30.0), RecallZFloor::kZero);
  EXPECT_EQ(f.z, kRecallZMax);
  EXPECT_TRUE(f.clamped);
}

TEST(CalibConformal, ZFloorBothSettings) {
  std::vector<double> z;
  for (int i = 0; i < 40; ++i) z.push_back(-3.0 + 0.01 * i);  // all negative
  const ConformalFit none = FitConformalZ(z, RecallZFloor::kNone);
  const ConformalFit zero = FitConformalZ(z, RecallZFloor::kZero);
  // k = ceil(41 * 18/19) = 39 -> z_(39) = -3 + 0.38.
  EXPECT_EQ(none.k, 39);
  EXPECT_FLOAT_EQ(none.z, static_cast<float>(-3.0 + 0.38));
  EXPECT_FALSE(none.clamped);
  EXPECT_EQ(zero.z, 0.f);
  EXPECT_TRUE(zero.clamped);
  // A positive statistic is untouched by either floor.
  for (double& v : z) v += 5.0;
  EXPECT_FLOAT_EQ(FitConformalZ(z, RecallZFloor::kNone).z, FitConformalZ(z, RecallZFloor::kZero).z);
}

TEST(CalibLadder, FirstRungReachingTarget) {
  EXPECT_EQ(FitLadderZ({}, 0.f), kRecallZNoHard);
  // 10 hard rows; row i needs z > i/2 (idx = 0, cert = 1, max1 = i/2 - tiny); recall at z is
  // #{i : z > i/2}; 0.9 needs 9 rows -> z > 4 -> first rung 4.5? Not a rung: 5.
  std::vector<LadderRow> rows;
  for (int i = 0; i < 10; ++i) rows.push_back({0.f, 1.f, 0.5f * i - 1e-3f, true});
  // z = 4: rows i with 4 > 0.5 i - 1e-3 -> i <= 8 -> 9 rows = 0.9 -> 4.
  EXPECT_EQ(FitLadderZ(rows, 0.f), 4.f);
  // A closed gate on 2 rows caps recall at 0.8: no rung reaches 0.9 -> 8.
  rows[0].gate_open = rows[1].gate_open = false;
  EXPECT_EQ(FitLadderZ(rows, 0.f), kRecallZMax);
  // Strictness: idx + z * cert == max1 is not a hit.
  std::vector<LadderRow> eq(10, LadderRow{1.f, 1.f, 1.f, true});
  EXPECT_EQ(FitLadderZ(eq, 0.f), 0.5f);
  // A margin lowers the threshold: z = 0 already fires.
  EXPECT_EQ(FitLadderZ(eq, 0.25f), 0.f);
}

TEST(CalibZRequirement, ClampsCertificate) {
  EXPECT_DOUBLE_EQ(ZRequirement(3.0, 1.f, 0.5f), 4.0);
  EXPECT_DOUBLE_EQ(ZRequirement(1.0, 1.f, 0.f), 0.0);
  EXPECT_GT(ZRequirement(2.0, 1.f, 0.f), 1e11);
}

}  // namespace
}  // namespace strata
