// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/observer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

namespace strata::geodesia {
namespace {

// Random softmax rows of n keys.
std::vector<float> SoftmaxRows(Rng& rng, int rows, int64_t n) {
  std::vector<float> w(rows * n);
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    std::vector<double> e(n);
    for (int64_t j = 0; j < n; ++j) s += e[j] = std::exp(3 * rng.Normal());
    for (int64_t j = 0; j < n; ++j) w[r * n + j] = static_cast<float>(e[j] / s);
  }
  return w;
}

// §2.1 / §12.12: block mass = mean over the group's observed rows of per-block sums (sums to
// 1), token score = the sum over the rows.
TEST(GeodesiaObserverTest, PrefillMassAndTokenScore) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int n_kv = 2, G = 3, Hq = n_kv * G;
  const int64_t P = 150;
  PrefillObserver obs(n_kv, G, true);
  std::vector<std::vector<float>> all;
  std::vector<int64_t> nkeys;
  for (int64_t pos = P - 5; pos < P; ++pos) {
    all.push_back(SoftmaxRows(rng, Hq, pos + 1));
    nkeys.push_back(pos + 1);
    PrefillObservation o{pos, Hq, 8, nullptr, pos + 1, all.back().data()};
    obs.Add(o);
  }
  const int64_t nb = 3;
  for (int h = 0; h < n_kv; ++h) {
    EXPECT_EQ(obs.n_rows(h), 5 * G);
    std::vector<double> mass(nb, 0), score(P, 0);
    for (size_t i = 0; i < all.size(); ++i) {
      for (int r = 0; r < G; ++r) {
        for (int64_t j = 0; j < nkeys[i]; ++j) {
          const double w = all[i][(h * G + r) * nkeys[i] + j];
          mass[j / 64] += w / (5.0 * G);
          score[j] += w;
        }
      }
    }
    const std::vector<double> m = obs.BlockMass(h, nb);
    const std::vector<double> s = obs.TokenScore(h, P);
    double sum = 0;
    for (int64_t b = 0; b < nb; ++b) {
      EXPECT_NEAR(m[b], mass[b], 1e-6);
      sum += m[b];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (int64_t j = 0; j < P; ++j) EXPECT_NEAR(s[j], score[j], 1e-6);
  }
}

// §12.12: one call of current mass m1 on a prior m0 gives d m0 + (1 - d) m1; the prior is
// applied once (a later call that grows the state does not re-apply it; new blocks start at 0).
TEST(GeodesiaObserverTest, EmaArithmetic) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double d = rng.Uniform();
  MassEma ema;
  std::vector<double> m0 = {0.5, 0.3, 0.2};
  ema.SetPrior(m0);
  std::vector<double> m1 = {rng.Uniform(), rng.Uniform(), rng.Uniform(), rng.Uniform()};
  ema.Update(m1, d);
  for (int b = 0; b < 3; ++b) EXPECT_DOUBLE_EQ(ema.mass(b), d * m0[b] + (1 - d) * m1[b]);
  EXPECT_DOUBLE_EQ(ema.mass(3), (1 - d) * m1[3]);  // a block not in the prompt starts at 0
  std::vector<double> m2 = {0.1, 0.2, 0.3, 0.25, 0.15};
  std::vector<double> prev = ema.mass();
  ema.Update(m2, d);
  for (int b = 0; b < 4; ++b) EXPECT_DOUBLE_EQ(ema.mass(b), d * prev[b] + (1 - d) * m2[b]);
  EXPECT_DOUBLE_EQ(ema.mass(4), (1 - d) * m2[4]);
  EXPECT_FALSE(ema.prior_pending());
}

// The per-call mass from per-block online-softmax partials equals the mean over heads of the
// per-block sums of an f64 softmax; it sums to 1; unread blocks (d = 0) get 0.
TEST(GeodesiaObserverTest, BlockMassFromStates) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int G = 4;
  const int64_t nb = 7, n = nb * 64;
  std::vector<double> s(G * n);
  for (auto& x : s) x = 4 * rng.Normal();
  std::vector<float> m(nb * G), d(nb * G);
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < G; ++r) {
      double mx = -1e300, z = 0;
      for (int64_t j = b * 64; j < (b + 1) * 64; ++j) mx = std::max(mx, s[r * n + j]);
      for (int64_t j = b * 64; j < (b + 1) * 64; ++j) z += std::exp(s[r * n + j] - mx);
      m[b * G + r] = static_cast<float>(mx);
      d[b * G + r] = static_cast<float>(z);
    }
  }
  const std::vector<double> now = BlockMassFromStates(m.data(), d.data(), nb, G);
  std::vector<double> want(nb, 0);
  for (int r = 0; r < G; ++r) {
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[r * n + j]);
    for (int64_t j = 0; j < n; ++j) z += std::exp(s[r * n + j] - mx);
    for (int64_t j = 0; j < n; ++j) want[j / 64] += std::exp(s[r * n + j] - mx) / z / G;
  }
  double sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    EXPECT_NEAR(now[b], want[b], 1e-5);  // f32 partials
    sum += now[b];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  for (int r = 0; r < G; ++r) d[2 * G + r] = 0;
  EXPECT_EQ(BlockMassFromStates(m.data(), d.data(), nb, G)[2], 0.0);
}

}  // namespace
}  // namespace strata::geodesia
