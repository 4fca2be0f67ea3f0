#include "kv/geodesia/quest.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace strata::geodesia {

int64_t QuestKeepCount(int64_t n_cand, double keep_frac) {
  if (n_cand <= 0) return 0;
  const int64_t k = static_cast<int64_t>(std::ceil(keep_frac * static_cast<double>(n_cand)));
  return std::min(n_cand, std::max<int64_t>(1, k));
}

std::vector<int64_t> SelectPages(const GradedLayer& layer, int h, const float* q, float scale,
                                 int64_t n_cand, double keep_frac) {
  STRATA_CHECK(n_cand <= layer.n_closed_blocks());
  const int64_t k = QuestKeepCount(n_cand, keep_frac);
  std::vector<int64_t> sel;
  if (k == 0) return sel;
  const int D = layer.head_dim();
  std::vector<double> u(n_cand);
  for (int64_t b = 0; b < n_cand; ++b) {
    u[b] = BoxUpperBound(layer.box_min(h, b), layer.box_max(h, b), q, D, scale);
  }
  sel.resize(n_cand);
  std::iota(sel.begin(), sel.end(), 0);
  if (k < n_cand) {
    std::nth_element(sel.begin(), sel.begin() + (k - 1), sel.end(), [&](int64_t a, int64_t b) {
      if (u[a] != u[b]) return u[a] > u[b];
      return a < b;
    });
    sel.resize(k);
  }
  std::sort(sel.begin(), sel.end());
  return sel;
}

}  // namespace strata::geodesia
