// Test helpers shared by the baseline policy tests: geometries, random caches, f64 references.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/cache.h"
#include "kv/registry.h"

namespace strata::baselines::testing {

inline LayerGeometry MlaGeometry(int heads = 4) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = heads;
  g.n_kv_heads = 1;
  g.k_dim = 40;
  g.v_dim = 32;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.3f;
  return g;
}

inline LayerGeometry GqaGeometry(int q_heads = 6, int kv_heads = 2, int dim = 16) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = q_heads;
  g.n_kv_heads = kv_heads;
  g.k_dim = dim;
  g.v_dim = dim;
  g.rope_dim = dim;
  g.scale = 0.25f;
  return g;
}

inline std::unique_ptr<KvCache> NewCache(const LayerGeometry& g, const PolicySpec& spec) {
  auto p = MakePolicy(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto c = KvCache::Create({g}, std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Deterministic random rows: row u of layer 0 from (seed, u); `bump` is added to every value.
inline void RowAt(const LayerGeometry& g, uint64_t seed, int64_t u, float bump,
                  std::vector<float>* k, std::vector<float>* v) {
  Rng rng(seed * 1000003u + static_cast<uint64_t>(u));
  k->resize(static_cast<size_t>(g.n_kv_heads) * g.k_dim);
  v->resize(static_cast<size_t>(g.n_kv_heads) * g.v_dim);
  for (auto& x : *k) x = static_cast<float>(rng.Normal()) + bump;
  for (auto& x : *v) x = static_cast<float>(rng.Normal()) + bump;
}

inline std::vector<float> RandomQuery(const LayerGeometry& g, Rng& rng, float sd = 1.f) {
  std::vector<float> q(static_cast<size_t>(g.n_q_heads) * g.k_dim);
  for (auto& x : q) x = sd * static_cast<float>(rng.Normal());
  return q;
}

// Prefill of rows [0, n0) as one call with every position observed (queries from `seed`), the
// compression point, then rows [n0, n) appended in one more call that stays open for the
// caller's queries (a KvCache may be destroyed with a call open). Rows after `perturb_after`
// get +10.
inline void Build(KvCache* c, uint64_t seed, int64_t n0, int64_t n, int64_t perturb_after = -1,
                  ThreadPool* pool = nullptr) {
  const LayerGeometry& g = c->geometry(0);
  std::vector<float> k, v;
  Rng qrng(seed ^ 0xabcdef);
  c->BeginPrefill(0, n0);
  ASSERT_OK(c->BeginCall(n0, CallKind::kPrefill, pool));
  for (int64_t u = 0; u < n0; ++u) {
    RowAt(g, seed, u, (perturb_after >= 0 && u > perturb_after) ? 10.f : 0.f, &k, &v);
    ASSERT_OK(c->Append(0, k.data(), v.data()));
  }
  for (int64_t u = 0; u < n0; ++u) {
    const std::vector<float> q = RandomQuery(g, qrng);
    ASSERT_OK(c->ObserveQuery(0, u, q.data(), pool));
  }
  ASSERT_OK(c->EndCall());
  ASSERT_OK(c->EndPrefill(pool));
  ASSERT_OK(c->BeginCall(n - n0, CallKind::kDecode, pool));
  for (int64_t u = n0; u < n; ++u) {
    RowAt(g, seed, u, (perturb_after >= 0 && u > perturb_after) ? 10.f : 0.f, &k, &v);
    ASSERT_OK(c->Append(0, k.data(), v.data()));
  }
}

// f64 attention of q over explicit key/value rows (f32) for every query head.
inline std::vector<double> RefAttention(const LayerGeometry& g, const float* q,
                                        const std::vector<std::vector<float>>& keys_by_head,
                                        const std::vector<std::vector<float>>& vals_by_head,
                                        const std::vector<std::vector<int64_t>>& rows_by_head) {
  std::vector<double> out(static_cast<size_t>(g.n_q_heads) * g.v_dim, 0.0);
  const int G = g.group_size();
  for (int hq = 0; hq < g.n_q_heads; ++hq) {
    const int h = hq / G;
    const auto& rows = rows_by_head[rows_by_head.size() == 1 ? 0 : h];
    std::vector<double> s(rows.size());
    double mx = -1e300;
    for (size_t i = 0; i < rows.size(); ++i) {
      double a = 0;
      const float* k = keys_by_head[h].data() + rows[i] * g.k_dim;
      for (int c = 0; c < g.k_dim; ++c) a += static_cast<double>(q[hq * g.k_dim + c]) * k[c];
      s[i] = a * g.scale;
      mx = std::max(mx, s[i]);
    }
    double z = 0;
    for (double x : s) z += std::exp(x - mx);
    for (size_t i = 0; i < rows.size(); ++i) {
      const double w = std::exp(s[i] - mx) / z;
      const float* v = vals_by_head[h].data() + rows[i] * g.v_dim;
      for (int c = 0; c < g.v_dim; ++c) out[hq * g.v_dim + c] += w * v[c];
    }
  }
  return out;
}

// Checks that attention over the decoded rows (`out`) is within the bound the rows' own errors
// give of attention over the exact ones (`exact`, RefAttention of keys/vals): with every score
// moved by at most D = max |scale q.(k' - k)|, each softmax weight moves by at most a factor
// e^(2D), so per output channel |o' - o| <= max |v' - v| + (e^(2D) - 1) max |v| (per query
// head, over its KV head's rows); and, in practice well inside it, the mean absolute difference
// over every output value within `mean_within`. Returns the largest bound.
inline double ExpectWithinQuantizedAttentionBound(
    const LayerGeometry& g, const float* q, const std::vector<std::vector<float>>& dec_keys,
    const std::vector<std::vector<float>>& dec_vals, const std::vector<std::vector<float>>& keys,
    const std::vector<std::vector<float>>& vals, int64_t n, const std::vector<float>& out,
    const std::vector<double>& exact, double mean_within) {
  double largest = 0;
  for (int hq = 0; hq < g.n_q_heads; ++hq) {
    const int h = hq / g.group_size();
    double d = 0, dv = 0, vmax = 0;
    for (int64_t u = 0; u < n; ++u) {
      double ds = 0;
      for (int c = 0; c < g.k_dim; ++c) {
        ds += static_cast<double>(q[hq * g.k_dim + c]) *
              (dec_keys[h][u * g.k_dim + c] - keys[h][u * g.k_dim + c]);
      }
      d = std::max(d, std::abs(ds * g.scale));
      for (int c = 0; c < g.v_dim; ++c) {
        const double v = vals[h][u * g.v_dim + c];
        dv = std::max(dv, std::abs(dec_vals[h][u * g.v_dim + c] - v));
        vmax = std::max(vmax, std::abs(v));
      }
    }
    const double bound = dv + std::expm1(2 * d) * vmax;
    largest = std::max(largest, bound);
    for (int c = 0; c < g.v_dim; ++c) {
      EXPECT_LE(std::abs(out[hq * g.v_dim + c] - exact[hq * g.v_dim + c]), bound + 1e-5)
          << "query head " << hq << " channel " << c;
    }
  }
  double mean = 0;
  for (size_t i = 0; i < out.size(); ++i) mean += std::abs(out[i] - exact[i]);
  EXPECT_LT(mean / static_cast<double>(out.size()), mean_within);
  return largest;
}

// The store's rows as f32, per KV head: keys [n, k_dim], values [n, v_dim].
inline void StoreRows(const LayerStore& s, std::vector<std::vector<float>>* keys,
                      std::vector<std::vector<float>>* vals) {
  const LayerGeometry& g = s.geometry();
  keys->assign(g.n_kv_heads, {});
  vals->assign(g.n_kv_heads, {});
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t u = 0; u < s.n_rows(); ++u) {
      const uint16_t* k = s.key_row(h, u);
      const uint16_t* v = s.val_row(h, u);
      for (int c = 0; c < g.k_dim; ++c) (*keys)[h].push_back(Bf16ToF32(k[c]));
      for (int c = 0; c < g.v_dim; ++c) (*vals)[h].push_back(Bf16ToF32(v[c]));
    }
  }
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Every registered policy but the reference and the two methods (and their variants): a new
// baseline is covered by registering it.
inline const std::vector<std::string>& AllBaselines() {
  static const std::vector<std::string> names = [] {
    const std::vector<std::string> not_baselines = {"full", "vestige", "fullrow", "geodesia",
                                                    "cquest"};
    std::vector<std::string> v;
    for (const PolicyInfo& p : Policies()) {
      if (std::find(not_baselines.begin(), not_baselines.end(), p.name) == not_baselines.end()) {
        v.push_back(p.name);
      }
    }
    return v;
  }();
  return names;
}

}  // namespace strata::baselines::testing
