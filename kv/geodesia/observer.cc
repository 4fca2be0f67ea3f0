// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/observer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

namespace {

// Sum of x[0, n) in ascending order (sorts x): independent of the order the values came in.
double SortedSum(double* x, int n) {
  std::sort(x, x + n);
  double s = 0;
  for (int i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

PrefillObserver::PrefillObserver(int n_kv_heads, int group, bool token_scores)
    : n_kv_heads_(n_kv_heads),
      group_(group),
      token_scores_(token_scores),
      rows_(n_kv_heads, 0),
      block_sum_(n_kv_heads),
      token_sum_(n_kv_heads) {}

void PrefillObserver::Add(const PrefillObservation& obs) {
  STRATA_CHECK(obs.weights != nullptr);
  STRATA_CHECK(obs.n_q_heads == n_kv_heads_ * group_);
  const int64_t n = obs.n_keys;
  const int64_t nb = (n + kBlockTokens - 1) / kBlockTokens;
  // The G query heads' contributions to a block (or token) are summed in sorted order, so the
  // state does not depend on the order of the heads in the group (§12.13).
  std::vector<double> per(static_cast<size_t>(nb) * group_);  // [b][r]
  std::vector<double> tok(group_);
  for (int h = 0; h < n_kv_heads_; ++h) {
    auto& bs = block_sum_[h];
    if (static_cast<int64_t>(bs.size()) < nb) bs.resize(nb, 0.0);
    auto& ts = token_sum_[h];
    if (token_scores_ && static_cast<int64_t>(ts.size()) < n) ts.resize(n, 0.0);
    const float* w0 = obs.weights + static_cast<int64_t>(h) * group_ * n;
    for (int r = 0; r < group_; ++r) {
      const float* w = w0 + static_cast<int64_t>(r) * n;
      for (int64_t b = 0; b < nb; ++b) {
        double s = 0;
        const int64_t e = std::min(n, (b + 1) * kBlockTokens);
        for (int64_t j = b * kBlockTokens; j < e; ++j) s += w[j];
        per[b * group_ + r] = s;
      }
      ++rows_[h];
    }
    for (int64_t b = 0; b < nb; ++b) bs[b] += SortedSum(per.data() + b * group_, group_);
    if (token_scores_) {
      for (int64_t j = 0; j < n; ++j) {
        for (int r = 0; r < group_; ++r) tok[r] = w0[static_cast<int64_t>(r) * n + j];
        ts[j] += SortedSum(tok.data(), group_);
      }
    }
  }
}

std::vector<double> PrefillObserver::BlockMass(int h, int64_t n_blocks) const {
  std::vector<double> m(n_blocks, 0.0);
  if (rows_[h] == 0) return m;
  const auto& bs = block_sum_[h];
  for (int64_t b = 0; b < n_blocks && b < static_cast<int64_t>(bs.size()); ++b) {
    m[b] = bs[b] / static_cast<double>(rows_[h]);
  }
  return m;
}

std::vector<double> PrefillObserver::TokenScore(int h, int64_t n) const {
  std::vector<double> s(n, 0.0);
  const auto& ts = token_sum_[h];
  for (int64_t j = 0; j < n && j < static_cast<int64_t>(ts.size()); ++j) s[j] = ts[j];
  return s;
}

std::vector<double> BlockMassFromStates(const float* m, const float* d, int64_t n_blocks,
                                        int group) {
  // Each head's share of each block, then per block the G shares summed in sorted order: the
  // result does not depend on the order of the heads in the group (§12.13).
  std::vector<double> share(static_cast<size_t>(n_blocks) * group, 0.0);  // [b][r]
  for (int r = 0; r < group; ++r) {
    double mx = -INFINITY;
    for (int64_t b = 0; b < n_blocks; ++b) {
      if (d[b * group + r] > 0) mx = std::max(mx, static_cast<double>(m[b * group + r]));
    }
    if (mx == -INFINITY) continue;
    double z = 0;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const double db = d[b * group + r];
      if (db > 0) z += db * std::exp(m[b * group + r] - mx);
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
      const double db = d[b * group + r];
      if (db > 0) share[b * group + r] = db * std::exp(m[b * group + r] - mx) / z / group;
    }
  }
  std::vector<double> now(n_blocks, 0.0);
  for (int64_t b = 0; b < n_blocks; ++b) now[b] = SortedSum(share.data() + b * group, group);
  return now;
}

void MassEma::Update(const std::vector<double>& now, double decay) {
  const size_t nb = now.size();
  if (prior_pending_) {
    m_.assign(nb, 0.0);
    for (size_t b = 0; b < nb && b < prior_.size(); ++b) m_[b] = prior_[b];
    prior_pending_ = false;
    prior_.clear();
  }
  if (m_.size() < nb) m_.resize(nb, 0.0);
  for (size_t b = 0; b < nb; ++b) m_[b] = decay * m_[b] + (1.0 - decay) * now[b];
}

}  // namespace strata::geodesia
