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

namespace {

// The top QuestKeepCount of pages [0, n_cand) by their bounds u (ascending page order).
std::vector<int64_t> TopPages(const double* u, int64_t n_cand, double keep_frac) {
  const int64_t k = QuestKeepCount(n_cand, keep_frac);
  std::vector<int64_t> sel;
  if (k == 0) return sel;
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

}  // namespace

std::vector<int64_t> SelectPages(const GradedLayer& layer, int h, const float* q, float scale,
                                 int64_t n_cand, double keep_frac) {
  std::vector<std::vector<int64_t>> out;
  SelectPagesGroup(layer, h, q, 1, scale, n_cand, keep_frac, &out);
  return std::move(out[0]);
}

void SelectPagesGroup(const GradedLayer& layer, int h, const float* q, int n_q, float scale,
                      int64_t n_cand, double keep_frac, std::vector<std::vector<int64_t>>* out) {
  STRATA_CHECK(n_cand <= layer.n_closed_blocks() && n_q >= 0);
  const int D = layer.head_dim();
  // u[r * n_cand + b]: each page's box is read once for all heads.
  std::vector<double> u(static_cast<size_t>(n_q) * std::max<int64_t>(n_cand, 0));
  std::vector<double> ub(n_q);
  for (int64_t b = 0; b < n_cand; ++b) {
    BoxUpperBounds(layer.box_min(h, b), layer.box_max(h, b), q, n_q, D, scale, ub.data());
    for (int r = 0; r < n_q; ++r) u[r * n_cand + b] = ub[r];
  }
  out->resize(n_q);
  for (int r = 0; r < n_q; ++r) (*out)[r] = TopPages(u.data() + r * n_cand, n_cand, keep_frac);
}

}  // namespace strata::geodesia
