#include "eval/stats.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"
#include "core/rng.h"

namespace strata::eval {

Interval WilsonInterval(int64_t k, int64_t n, double z) {
  STRATA_CHECK_MSG(k >= 0 && k <= n, "Wilson interval of %lld successes in %lld trials",
                   static_cast<long long>(k), static_cast<long long>(n));
  if (n == 0) return {0.0, 0.0, 1.0};
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(k) / nn;
  const double z2 = z * z;
  const double denom = 1.0 + z2 / nn;
  const double center = (p + z2 / (2.0 * nn)) / denom;
  const double half = z * std::sqrt(p * (1.0 - p) / nn + z2 / (4.0 * nn * nn)) / denom;
  // At k = 0 (k = n) the exact lower (upper) bound is 0 (1); set it so rounding cannot move it.
  const double lo = k == 0 ? 0.0 : std::max(0.0, center - half);
  const double hi = k == n ? 1.0 : std::min(1.0, center + half);
  return {p, lo, hi};
}

StatusOr<BootstrapResult> PairedClusterBootstrap(const std::vector<ClusterDelta>& clusters,
                                                 int draws, uint64_t seed) {
  if (clusters.empty()) return InvalidArgument("paired bootstrap over 0 windows");
  if (draws < 1)
    return InvalidArgument("bootstrap draws must be >= 1, got " + std::to_string(draws));
  double total_sum = 0;
  int64_t total_count = 0;
  BootstrapResult r;
  for (size_t i = 0; i < clusters.size(); ++i) {
    if (clusters[i].count <= 0) {
      return InvalidArgument("paired bootstrap: window " + std::to_string(i) + " has " +
                             std::to_string(clusters[i].count) + " targets");
    }
    total_sum += clusters[i].sum;
    total_count += clusters[i].count;
    const double m = clusters[i].sum / static_cast<double>(clusters[i].count);
    if (m > 0) r.wins_b++;
    if (m < 0) r.wins_a++;
  }
  const int64_t n = static_cast<int64_t>(clusters.size());
  r.n_clusters = n;
  r.draws = draws;
  r.seed = seed;
  r.mean_delta = total_sum / static_cast<double>(total_count);
  Rng rng(seed);
  std::vector<double> d(draws);
  for (int b = 0; b < draws; ++b) {
    double s = 0;
    int64_t c = 0;
    for (int64_t j = 0; j < n; ++j) {
      const ClusterDelta& w = clusters[rng.Below(static_cast<uint64_t>(n))];
      s += w.sum;
      c += w.count;
    }
    d[b] = s / static_cast<double>(c);
  }
  std::sort(d.begin(), d.end());
  const int64_t lo_i = static_cast<int64_t>(std::floor(0.025 * draws));
  const int64_t hi_i =
      std::min<int64_t>(draws - 1, static_cast<int64_t>(std::floor(0.975 * draws)));
  r.delta_lo = d[lo_i];
  r.delta_hi = d[hi_i];
  r.ratio = std::exp(r.mean_delta);
  r.ratio_lo = std::exp(r.delta_lo);
  r.ratio_hi = std::exp(r.delta_hi);
  return r;
}

}  // namespace strata::eval
