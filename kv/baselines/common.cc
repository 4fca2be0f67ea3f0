#include "kv/baselines/common.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace strata::baselines {

int64_t BudgetRows(int64_t n, double ratio) {
  if (n <= 0) return 0;
  return std::max<int64_t>(1, std::llround(static_cast<double>(n) / ratio));
}

std::vector<int64_t> TopK(const double* score, int64_t n, int64_t k) {
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int64_t a, int64_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

void ReadHeadSets(const LayerStore& store, const float* q,
                  const std::vector<std::vector<int64_t>>& sets, ThreadPool* pool,
                  SoftmaxStates* st, ReadStats* stats) {
  const LayerGeometry& g = store.geometry();
  STRATA_CHECK(sets.size() == 1 || static_cast<int>(sets.size()) == g.n_kv_heads);
  if (sets.size() == 1) {
    ReadRows(store, q, sets[0].data(), static_cast<int64_t>(sets[0].size()), pool, st, stats);
    return;
  }
  const int G = g.group_size();
  auto run = [&](int64_t hb, int64_t he, int) {
    std::vector<int64_t> local;
    for (int64_t h = hb; h < he; ++h) {
      const std::vector<int64_t>& rows = sets[h];
      SoftmaxStates sub = HeadSlice(*st, static_cast<int>(h) * G, G);
      const float* qh = q + h * G * g.k_dim;
      size_t i = 0;
      while (i < rows.size()) {
        const int64_t p = rows[i] / LayerStore::kPageRows;
        local.clear();
        for (; i < rows.size() && rows[i] / LayerStore::kPageRows == p; ++i) {
          STRATA_CHECK_MSG(local.empty() || rows[i] > rows[i - 1],
                           "ReadHeadSets needs ascending, distinct rows");
          local.push_back(rows[i] - p * LayerStore::kPageRows);
        }
        AttendStream(qh, G, g.scale, store.PageView(static_cast<int>(h), p), local.data(),
                     static_cast<int64_t>(local.size()), &sub);
      }
    }
  };
  ParallelForOrInline(pool, g.n_kv_heads, 1, run);
  if (stats) {
    int64_t n = 0;
    for (const auto& s : sets) n += static_cast<int64_t>(s.size());
    stats->rows_attended += n;
    stats->bytes_read += n * RowBytesPerHead(g);
  }
}

}  // namespace strata::baselines
