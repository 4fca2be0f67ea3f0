// Interval statistics for evaluation reports: Wilson score intervals for pass rates and the paired
// cluster bootstrap (windows resampled with replacement) for NLL differences between two policies.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace strata::eval {

// The normal quantile for a two-sided 95% interval (Phi^-1(0.975)).
inline constexpr double kZ95 = 1.959963984540054;

struct Interval {
  double point = 0;  // the estimate (k / n for a rate)
  double lo = 0;
  double hi = 0;
};

// Wilson score interval for k successes in n trials at normal quantile z. n = 0 gives point 0 and
// the uninformative [0, 1]. CHECKs 0 <= k <= n.
Interval WilsonInterval(int64_t k, int64_t n, double z = kZ95);

// One cluster (an evaluation window) of paired per-token differences delta = nll_a - nll_b.
struct ClusterDelta {
  double sum = 0;     // sum of delta over the window's aligned targets
  int64_t count = 0;  // number of targets (> 0)
};

struct BootstrapResult {
  int64_t n_clusters = 0;
  int draws = 0;
  uint64_t seed = 0;
  double mean_delta = 0;  // pooled: sum of sums / sum of counts
  double delta_lo = 0;    // 2.5% / 97.5% order statistics of the draws
  double delta_hi = 0;
  double ratio = 1;  // exp(mean_delta) = PPL(a) / PPL(b)
  double ratio_lo = 1;
  double ratio_hi = 1;
  int64_t wins_b = 0;  // windows whose mean delta > 0 (b better there)
  int64_t wins_a = 0;  // windows whose mean delta < 0
};

// Paired cluster bootstrap: each of `draws` draws resamples the n clusters with replacement (an
// Rng seeded with `seed`) and takes sum(delta sums) / sum(counts); the draws are sorted and
// lo = draws[floor(0.025 * N)], hi = draws[min(N - 1, floor(0.975 * N))]. Errors: no clusters, a
// cluster with count <= 0, draws < 1.
StatusOr<BootstrapResult> PairedClusterBootstrap(const std::vector<ClusterDelta>& clusters,
                                                 int draws = 20000, uint64_t seed = 0);

}  // namespace strata::eval
