#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/ops.h"

namespace strata {

void RouteExperts(const RouteParams& p, float* logits, int* ids, float* w) {
  const int E = p.n_experts;
  if (p.gating == 2) {
    for (int e = 0; e < E; ++e) logits[e] = 1.f / (1.f + std::exp(-logits[e]));
  } else {
    Softmax(logits, E);
  }
  std::vector<float> key(E);
  for (int e = 0; e < E; ++e) key[e] = logits[e] + (p.bias ? p.bias[e] : 0.f);
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + p.n_used, order.end(), [&](int a, int b) {
    return key[a] != key[b] ? key[a] > key[b] : a < b;
  });
  double sum = 0;
  for (int k = 0; k < p.n_used; ++k) sum += logits[order[k]];
  for (int k = 0; k < p.n_used; ++k) {
    const int e = order[k];
    float wk = logits[e];  // the unbiased score
    if (p.renormalize && sum > 0) wk = static_cast<float>(wk / sum);
    ids[k] = e;
    w[k] = wk * p.scale;
  }
}

}  // namespace strata
