// Attention over a contiguous run of rows a policy holds in its own (quantized) form: the rows
// are dequantized to f32 in chunks of 64 per KV head and attended with online softmax, chunks
// spread over the pool with per-worker states merged in worker order (the same result on any
// number of threads up to f32 merge order). Used by the kivi (groups of 32 rows), llamacpp_kv,
// turboquant and coldfp4 baselines.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kv/geometry.h"

namespace strata::baselines {

// Rows [r0, r1) of every KV head: fill(h, u0, n, kt, vt) writes rows [u0, u0 + n) of KV head h
// as f32 keys [n, k_dim] and values [n, v_dim], n <= kChunk (chunks start at r0 + i kChunk).
// q: [n_q_heads, k_dim]; merged into *st.
template <int64_t kChunk = 64, class Fill>
void AttendRowRange(const LayerGeometry& g, const float* q, int64_t r0, int64_t r1,
                    ThreadPool* pool, SoftmaxStates* st, const Fill& fill) {
  if (r1 <= r0) return;
  const int G = g.group_size();
  const int D = g.k_dim, DV = g.v_dim;
  const int64_t n_chunks = (r1 - r0 + kChunk - 1) / kChunk;
  const int T = pool ? pool->size() : 1;
  std::vector<SoftmaxStateBuffer> part;
  part.reserve(T);
  for (int i = 0; i < T; ++i) part.emplace_back(g.n_q_heads, DV);
  auto run = [&](int64_t b, int64_t e, int k) {
    SoftmaxStates& ps = part[k].states();
    std::vector<float> kt(static_cast<size_t>(kChunk) * D), vt(static_cast<size_t>(kChunk) * DV);
    float s[kChunk];
    for (int64_t t = b; t < e; ++t) {
      const int h = static_cast<int>(t / n_chunks);
      const int64_t u0 = r0 + (t % n_chunks) * kChunk, n = std::min(kChunk, r1 - u0);
      fill(h, u0, n, kt.data(), vt.data());
      for (int r = 0; r < G; ++r) {
        const int hq = h * G + r;
        const float* qh = q + static_cast<int64_t>(hq) * D;
        float tmax = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          s[i] = g.scale * Dot(qh, kt.data() + i * D, D);
          tmax = std::max(tmax, s[i]);
        }
        float* o = ps.o + static_cast<int64_t>(hq) * DV;
        if (tmax > ps.m[hq]) {
          if (ps.m[hq] != -std::numeric_limits<float>::infinity()) {
            const float f = std::exp(ps.m[hq] - tmax);
            ps.d[hq] *= f;
            for (int c = 0; c < DV; ++c) o[c] *= f;
          }
          ps.m[hq] = tmax;
        }
        for (int64_t i = 0; i < n; ++i) {
          const float p = std::exp(s[i] - ps.m[hq]);
          ps.d[hq] += p;
          Axpy(p, vt.data() + i * DV, o, DV);
        }
      }
    }
  };
  ParallelForOrInline(pool, n_chunks * g.n_kv_heads, 1, run);
  for (int i = 0; i < T; ++i) MergeStates(st, part[i].states());
}

}  // namespace strata::baselines
