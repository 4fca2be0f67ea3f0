// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/residual.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/dtype.h"
#include "core/rng.h"

namespace strata::geodesia {
namespace {

// A direct transcription of the scoring rule of §3: candidates ranked by the
// k-window mean of s (windows clipped at the ends, always divided by k).
std::set<int64_t> DirectSelection(const std::vector<double>& score, const std::vector<double>& vres,
                                  int64_t P, double f, int64_t tail, int k) {
  const int64_t w = std::min(tail, P);
  const int64_t cap = std::min(P, std::max(w, static_cast<int64_t>(std::ceil(f * P - 1e-9))));
  const int64_t n = P - w;
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += std::max(vres[i], 1e-8) / n;
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t i = std::max<int64_t>(0, j - k / 2); i <= std::min(n - 1, j + k / 2); ++i) {
      acc += score[i] * std::pow(std::max(vres[i], 1e-8) / mean, 2);
    }
    ranked.push_back({-acc / k, j});
  }
  std::sort(ranked.begin(), ranked.end());
  std::set<int64_t> out;
  for (int64_t i = 0; i < std::min(n, cap - w); ++i) out.insert(ranked[i].second);
  for (int64_t j = P - w; j < P; ++j) out.insert(j);
  return out;
}

// §12.15: the count is max(64, ceil(f P)), the last 64 prompt tokens are in, and the set
// equals a direct evaluation of the scoring rule.
TEST(GeodesiaResidualTest, SelectionMatchesDirectRule) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t P = 1 + static_cast<int64_t>(rng.Below(2000));
    const double f = rng.Uniform() * 0.2;
    std::vector<double> score(P), vres(P);
    for (auto& x : score) x = std::exp(2 * rng.Normal());
    for (auto& x : vres) x = std::exp(rng.Normal());
    ResidualSelectOptions o;
    o.frac = f;
    const std::vector<int64_t> sel = SelectResidualTokens(score, vres, P, o);
    const int64_t want_n =
        std::min(P, std::max<int64_t>(std::min<int64_t>(64, P),
                                      static_cast<int64_t>(std::ceil(f * P - 1e-9))));
    SCOPED_TRACE("P " + std::to_string(P) + " f " + std::to_string(f));
    EXPECT_EQ(static_cast<int64_t>(sel.size()), want_n);
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    for (int64_t j = std::max<int64_t>(0, P - 64); j < P; ++j) {
      EXPECT_TRUE(std::binary_search(sel.begin(), sel.end(), j)) << j;
    }
    const std::set<int64_t> direct = DirectSelection(score, vres, P, f, 64, 5);
    EXPECT_EQ(std::set<int64_t>(sel.begin(), sel.end()), direct);
  }
}

// §12.15: a token with a 100x value residual and the same mass as its neighbours is selected
// (kernel 1, tail 1, f = 2/64: exactly that token plus the tail).
TEST(GeodesiaResidualTest, OutlierValueIsSelected) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t P = 64;
  const int64_t hit = static_cast<int64_t>(rng.Below(P - 1));
  std::vector<double> score(P, 1.0), vres(P);
  for (auto& x : vres) x = 1.0 + 0.1 * rng.Uniform();
  vres[hit] *= 100;
  ResidualSelectOptions o;
  o.frac = 2.0 / 64;
  o.tail = 1;
  o.pool_kernel = 1;
  EXPECT_EQ(SelectResidualTokens(score, vres, P, o), (std::vector<int64_t>{hit, P - 1}));
}

// vres_j = ||v_j - mean of its 64-row block||, the partial last block padded with its last row.
TEST(GeodesiaResidualTest, ValueResiduals) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int D = 8;
  const int64_t P = 100;
  std::vector<uint16_t> rows(P * D);
  for (auto& x : rows) x = F32ToBf16(static_cast<float>(rng.Normal()));
  auto row = [&](int64_t j) { return rows.data() + j * D; };
  const std::vector<double> r = ValueResiduals(row, P, D);
  for (int64_t j = 0; j < P; ++j) {
    const int64_t b0 = j / 64 * 64;
    double s = 0;
    for (int c = 0; c < D; ++c) {
      double m = 0;
      for (int64_t u = b0; u < b0 + 64; ++u) m += Bf16ToF32(row(std::min(u, P - 1))[c]) / 64.0;
      s += std::pow(Bf16ToF32(row(j)[c]) - m, 2);
    }
    EXPECT_NEAR(r[j], std::sqrt(s), 1e-9);
  }
}

}  // namespace
}  // namespace strata::geodesia
