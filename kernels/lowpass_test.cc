#include "kernels/lowpass.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"

namespace strata {
namespace {

// float64 direct DFT low-pass residual (independent of the basis table): sigma_u over C channels.
std::vector<double> SigmaF64(const std::vector<float>& x, int64_t ldx, int64_t n, int C,
                             int kappa) {
  std::vector<double> acc(n, 0.0), a(kappa), b(kappa);
  for (int c = 0; c < C; ++c) {
    for (int k = 0; k < kappa; ++k) {
      a[k] = b[k] = 0;
      for (int64_t u = 0; u < n; ++u) {
        const double t = 2 * M_PI * static_cast<double>((k * u) % n) / n;
        a[k] += x[u * ldx + c] * std::cos(t);
        b[k] += x[u * ldx + c] * std::sin(t);
      }
    }
    for (int64_t u = 0; u < n; ++u) {
      double low = a[0];
      for (int k = 1; k < kappa; ++k) {
        const double t = 2 * M_PI * static_cast<double>((k * u) % n) / n;
        low += 2 * (a[k] * std::cos(t) + b[k] * std::sin(t));
      }
      low /= n;
      const double e = x[u * ldx + c] - low;
      acc[u] += e * e;
    }
  }
  for (auto& v : acc) v = std::sqrt(v);
  return acc;
}

// Fast path and scalar reference vs float64 on random blocks: every channel count from 1 to past
// two full register tiles (partial vectors, partial tiles), odd row counts of 4-row tiles, and the
// shipped shape (n 4096, kappa 16, 64 channels). Tolerance: both compute Y by n-term f32 sums
// (error <= ~n eps max|x| per bin in the worst case, ~sqrt(n) eps typically) and low from 2 kappa
// terms; 1e-4 absolute on O(1) data, as the selector's bar (kv/vestige/selector_test.cc).
TEST(LowpassTest, MatchesFloat64AndReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Case {
    int64_t n;
    int C, kappa;
  };
  std::vector<Case> cases = {{4096, 64, 16}, {64, 1, 1}, {66, 7, 3}, {130, 17, 16},
                             {256, 40, 5},   {4, 3, 1},  {128, 72, 63}, {4096, 33, 1}};
  for (int t = 0; t < 4; ++t) {
    const int64_t n = 2 * (2 + rng.Below(150));
    cases.push_back({n, 1 + static_cast<int>(rng.Below(80)),
                     1 + static_cast<int>(rng.Below(std::min<int64_t>(64, n / 2 - 1)))});
  }
  std::vector<float> scratch;
  for (const Case& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " C " + std::to_string(c.C) + " kappa " +
                 std::to_string(c.kappa));
    const int64_t ld = (c.C + kLowpassPad - 1) / kLowpassPad * kLowpassPad;
    std::vector<float> x(c.n * ld, 0.f);
    for (int64_t u = 0; u < c.n; ++u) {
      for (int ch = 0; ch < c.C; ++ch) x[u * ld + ch] = static_cast<float>(rng.Normal());
    }
    const std::vector<float> basis = LowpassBasis(c.n, c.kappa);
    std::vector<float> fast(c.n), ref(c.n);
    LowpassResidualNorms(x.data(), ld, c.n, c.C, basis.data(), c.kappa, &scratch, fast.data());
    LowpassResidualNormsRef(x.data(), ld, c.n, c.C, basis.data(), c.kappa, ref.data());
    const std::vector<double> f64 = SigmaF64(x, ld, c.n, c.C, c.kappa);
    for (int64_t u = 0; u < c.n; ++u) {
      const double tol = 1e-4 * std::max(1.0, f64[u]);
      ASSERT_NEAR(fast[u], f64[u], tol) << "row " << u;
      ASSERT_NEAR(ref[u], f64[u], tol) << "row " << u;
    }
    // Deterministic: a second call (scratch reused) gives the same bits.
    std::vector<float> again(c.n);
    LowpassResidualNorms(x.data(), ld, c.n, c.C, basis.data(), c.kappa, &scratch, again.data());
    EXPECT_EQ(fast, again);
  }
}

// Bins below kappa pass untouched: a sum of sinusoids of bins < kappa has sigma ~ 0, one of bin
// kappa is kept whole (sigma_u = |x_u| for one channel).
TEST(LowpassTest, PassAndStopBands) {
  const int64_t n = 512;
  const int kappa = 16;
  const int64_t ld = kLowpassPad;
  // Channel 0 only; the padding columns stay zero (the kernel's contract).
  std::vector<float> x(n * ld, 0.f), stop(n * ld, 0.f);
  for (int64_t u = 0; u < n; ++u) {
    const double t = 2 * M_PI * static_cast<double>(u) / n;
    x[u * ld] = static_cast<float>(0.5 + std::cos(3 * t) - 2 * std::sin(15 * t));
    stop[u * ld] = static_cast<float>(std::cos(kappa * t + 0.3));
  }
  std::vector<float> basis = LowpassBasis(n, kappa), scratch, sigma(n);
  LowpassResidualNorms(x.data(), ld, n, 1, basis.data(), kappa, &scratch, sigma.data());
  for (int64_t u = 0; u < n; ++u) ASSERT_NEAR(sigma[u], 0.0, 1e-5) << "row " << u;
  LowpassResidualNorms(stop.data(), ld, n, 1, basis.data(), kappa, &scratch, sigma.data());
  for (int64_t u = 0; u < n; ++u) ASSERT_NEAR(sigma[u], std::fabs(stop[u * ld]), 1e-5);
}

}  // namespace
}  // namespace strata
