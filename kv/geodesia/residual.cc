#include "kv/geodesia/residual.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"

namespace strata::geodesia {

int64_t ResidualCapacity(int64_t prompt_len, const ResidualSelectOptions& o) {
  const int64_t w = std::min(o.tail, prompt_len);
  // ceil(f * P) as the reference computes it: + 0.999999, then truncation.
  const int64_t c = static_cast<int64_t>(o.frac * static_cast<double>(prompt_len) + 0.999999);
  return std::min(prompt_len, std::max(w, c));
}

std::vector<int64_t> SelectResidualTokens(const std::vector<double>& token_score,
                                          const std::vector<double>& vres, int64_t prompt_len,
                                          const ResidualSelectOptions& o) {
  STRATA_CHECK(static_cast<int64_t>(token_score.size()) >= prompt_len);
  STRATA_CHECK(static_cast<int64_t>(vres.size()) >= prompt_len);
  STRATA_CHECK(o.pool_kernel >= 1 && o.pool_kernel % 2 == 1);
  const int64_t w = std::min(o.tail, prompt_len);
  const int64_t n_rank = prompt_len - w;  // candidates [0, n_rank)
  const int64_t cap = ResidualCapacity(prompt_len, o);
  const int64_t n_pick = std::min(n_rank, cap - w);
  std::vector<int64_t> keep;
  if (n_pick > 0) {
    double mean = 0;
    for (int64_t i = 0; i < n_rank; ++i) mean += std::max(vres[i], 1e-8);
    mean /= static_cast<double>(n_rank);
    std::vector<double> s(n_rank);
    for (int64_t j = 0; j < n_rank; ++j) {
      const double ratio = std::max(vres[j], 1e-8) / mean;
      s[j] = token_score[j] * (o.value_power == 2 ? ratio * ratio : std::pow(ratio, o.value_power));
    }
    const int half = o.pool_kernel / 2;
    std::vector<double> pooled(n_rank);
    for (int64_t j = 0; j < n_rank; ++j) {
      double acc = 0;
      for (int64_t i = j - half; i <= j + half; ++i) {
        if (i >= 0 && i < n_rank) acc += s[i];
      }
      pooled[j] = acc / o.pool_kernel;
    }
    std::vector<int64_t> order(n_rank);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_pick, order.end(),
                      [&](int64_t a, int64_t b) {
                        if (pooled[a] != pooled[b]) return pooled[a] > pooled[b];
                        return a < b;
                      });
    keep.assign(order.begin(), order.begin() + n_pick);
  }
  for (int64_t j = prompt_len - w; j < prompt_len; ++j) keep.push_back(j);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::vector<double> ValueResiduals(const std::function<const uint16_t*(int64_t)>& value_row,
                                   int64_t prompt_len, int D) {
  std::vector<double> res(prompt_len, 0.0);
  std::vector<double> mean(D);
  std::vector<float> row(D);
  for (int64_t b0 = 0; b0 < prompt_len; b0 += 64) {
    const int64_t b1 = std::min(prompt_len, b0 + 64);
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int64_t j = b0; j < b1; ++j) {
      const uint16_t* v = value_row(j);
      for (int c = 0; c < D; ++c) mean[c] += Bf16ToF32(v[c]);
    }
    // Padding rows repeat the last real row.
    const uint16_t* last = value_row(b1 - 1);
    for (int c = 0; c < D; ++c) mean[c] += (64 - (b1 - b0)) * static_cast<double>(Bf16ToF32(last[c]));
    for (int c = 0; c < D; ++c) mean[c] /= 64.0;
    for (int64_t j = b0; j < b1; ++j) {
      const uint16_t* v = value_row(j);
      double s = 0;
      for (int c = 0; c < D; ++c) {
        const double d = Bf16ToF32(v[c]) - mean[c];
        s += d * d;
      }
      res[j] = std::sqrt(s);
    }
  }
  return res;
}

}  // namespace strata::geodesia
