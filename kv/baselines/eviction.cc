#include "kv/baselines/eviction.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"
#include "kv/baselines/common.h"

namespace strata::baselines {

const char* EvictionName(EvictionKind kind) {
  switch (kind) {
    case EvictionKind::kStreaming:
      return "streaming";
    case EvictionKind::kH2o:
      return "h2o";
    case EvictionKind::kH2oRecent:
      return "h2o-recent";
    case EvictionKind::kSnapKv:
      return "snapkv";
    case EvictionKind::kRandom:
      return "random";
  }
  return "?";
}

PolicySettings EvictionSettings(EvictionKind kind) {
  const EvictionConfig c;
  PolicySettings p;
  p.policy = EvictionName(kind);
  p.budget = "ratio";
  p.settings.push_back(
      SettingDecl::Real("ratio", c.ratio, "row budget R: keep m = prefix/R rows").Min(1).Shared());
  switch (kind) {
    case EvictionKind::kStreaming:
      p.settings.push_back(
          SettingDecl::Int("sinks", c.sinks, "always-kept first rows").Min(0).Max(1024).Shared());
      break;
    case EvictionKind::kH2o:
    case EvictionKind::kH2oRecent:
      p.settings.push_back(SettingDecl::Int("h2o-queries", c.h2o_queries,
                                            "observe the last N prompt queries (0: all of them)")
                               .Min(0));
      break;
    case EvictionKind::kSnapKv:
      p.settings.push_back(
          SettingDecl::Int("snap-window", c.snap_window, "observation window: last prompt rows")
              .Min(1));
      p.settings.push_back(
          SettingDecl::Int("snap-kernel", c.snap_kernel, "pooling kernel width over the scores")
              .Min(1)
              .Max(1025)
              .Constraint("odd"));
      break;
    case EvictionKind::kRandom:
      p.settings.push_back(SettingDecl::Int("seed", static_cast<int64_t>(c.seed),
                                            "seed of the random row choice"));
      break;
  }
  return p;
}

StatusOr<EvictionConfig> EvictionConfig::FromSpec(const PolicySpec& spec, EvictionKind kind) {
  const PolicySettings decl = EvictionSettings(kind);
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(decl, spec.settings));
  EvictionConfig c;
  c.kind = kind;
  c.ratio = s.Real("ratio");  // declared >= 1 and finite
  // Each kind reads its own settings; the others keep EvictionConfig's initial values (their
  // declared defaults), as before.
  if (decl.Takes("sinks")) c.sinks = static_cast<int>(s.Int("sinks"));
  if (decl.Takes("h2o-queries")) c.h2o_queries = s.Int("h2o-queries");
  if (decl.Takes("snap-window")) c.snap_window = s.Int("snap-window");
  if (decl.Takes("snap-kernel")) {
    const int64_t kernel = s.Int("snap-kernel");
    if (kernel % 2 == 0) {
      return InvalidArgument("--snap-kernel = " + std::to_string(kernel) +
                             " must be an odd number in [1, 1025]");
    }
    c.snap_kernel = static_cast<int>(kernel);
  }
  if (decl.Takes("seed")) c.seed = static_cast<uint64_t>(s.Int("seed"));
  return c;
}

bool EvictionPolicy::per_head(const LayerGeometry& g) const {
  return g.n_kv_heads > 1 &&
         (cfg_.kind == EvictionKind::kH2o || cfg_.kind == EvictionKind::kH2oRecent ||
          cfg_.kind == EvictionKind::kSnapKv);
}

Status EvictionPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    const int n_sets = per_head(L.g) ? L.g.n_kv_heads : 1;
    L.kept.resize(n_sets);
    L.read.resize(n_sets);
    L.score.resize(L.g.n_kv_heads);
  }
  return OkStatus();
}

int64_t EvictionPolicy::observation_queries(int64_t prompt_len) const {
  switch (cfg_.kind) {
    case EvictionKind::kH2o:
    case EvictionKind::kH2oRecent:
      return cfg_.h2o_queries > 0 ? std::min(prompt_len, cfg_.h2o_queries) : prompt_len;
    case EvictionKind::kSnapKv:
      return std::min(prompt_len, cfg_.snap_window);
    default:
      return 0;
  }
}

Status EvictionPolicy::OnPrefillStats(int layer, const LayerStore& store,
                                    const PrefillObservation& obs) {
  if (obs.weights == nullptr) return OkStatus();
  Layer& L = layers_[layer];
  const int G = L.g.group_size();
  for (int h = 0; h < L.g.n_kv_heads; ++h) {
    std::vector<double>& s = L.score[h];
    if (static_cast<int64_t>(s.size()) < obs.n_keys) s.resize(obs.n_keys, 0.0);
    for (int r = 0; r < G; ++r) {
      const float* w = obs.weights + static_cast<int64_t>(h * G + r) * obs.n_keys;
      for (int64_t u = 0; u < obs.n_keys; ++u) s[u] += w[u];
    }
  }
  ++L.n_obs;
  return OkStatus();
}

Status EvictionPolicy::OnPrefillColumnSums(int layer, const LayerStore& store,
                                           const PrefillColumnSums& sums) {
  Layer& L = layers_[layer];
  for (int h = 0; h < L.g.n_kv_heads; ++h) {
    std::vector<double>& s = L.score[h];
    if (static_cast<int64_t>(s.size()) < sums.n_keys) s.resize(sums.n_keys, 0.0);
    const double* c = sums.sums + static_cast<int64_t>(h) * sums.n_keys;
    for (int64_t u = 0; u < sums.n_keys; ++u) s[u] += c[u];
  }
  L.n_obs += sums.end_query - sums.first_query;
  return OkStatus();
}

std::vector<int64_t> EvictionPolicy::Select(Layer& L, int layer, int s,
                                            const std::vector<int64_t>& cand, int64_t n,
                                            int64_t m) {
  const int64_t nc = static_cast<int64_t>(cand.size());
  if (m >= nc) return cand;
  // Score of candidate i for set s (per KV head, or summed over KV heads when shared).
  auto score_of = [&](int64_t u) {
    double v = 0;
    const int h0 = L.kept.size() == 1 ? 0 : s;
    const int h1 = L.kept.size() == 1 ? L.g.n_kv_heads : s + 1;
    for (int h = h0; h < h1; ++h) {
      if (u < static_cast<int64_t>(L.score[h].size())) v += L.score[h][u];
    }
    return v;
  };
  std::vector<int64_t> out;
  switch (cfg_.kind) {
    case EvictionKind::kH2o: {
      std::vector<double> sc(nc);
      for (int64_t i = 0; i < nc; ++i) sc[i] = score_of(cand[i]);
      for (int64_t i : TopK(sc.data(), nc, m)) out.push_back(cand[i]);
      break;
    }
    case EvictionKind::kH2oRecent: {
      const int64_t r = m / 2;
      const int64_t rest = nc - r;  // candidates [0, rest) compete, [rest, nc) are the recent
      std::vector<double> sc(rest);
      for (int64_t i = 0; i < rest; ++i) sc[i] = score_of(cand[i]);
      for (int64_t i : TopK(sc.data(), rest, m - r)) out.push_back(cand[i]);
      out.insert(out.end(), cand.begin() + rest, cand.end());
      break;
    }
    case EvictionKind::kSnapKv: {
      // The observation window (the rows of the observed queries) is kept; the others compete
      // on pooled column sums over positions [0, n - w).
      const int64_t w = std::min(L.n_obs, n);
      const int64_t lim = n - w;
      int64_t n_win = 0;
      while (n_win < nc && cand[nc - 1 - n_win] >= lim) ++n_win;
      const int64_t rest = nc - n_win;
      std::vector<double> col(lim, 0.0), pooled(rest);
      for (int64_t u = 0; u < lim; ++u) col[u] = score_of(u);
      // Prefix sums for the pool: sum over [u - k/2, u + k/2] ∩ [0, lim), divided by k.
      std::vector<double> pre(lim + 1, 0.0);
      for (int64_t u = 0; u < lim; ++u) pre[u + 1] = pre[u] + col[u];
      const int64_t half = cfg_.snap_kernel / 2;
      for (int64_t i = 0; i < rest; ++i) {
        const int64_t u = cand[i];
        const int64_t a = std::max<int64_t>(0, u - half), b = std::min(lim, u + half + 1);
        pooled[i] = (pre[b] - pre[a]) / cfg_.snap_kernel;
      }
      for (int64_t i : TopK(pooled.data(), rest, m)) out.push_back(cand[i]);
      out.insert(out.end(), cand.begin() + rest, cand.end());
      break;
    }
    case EvictionKind::kRandom: {
      Rng rng(cfg_.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(layer) * 1000003u +
              static_cast<uint64_t>(L.compressions));
      std::vector<int64_t> idx(nc);
      std::iota(idx.begin(), idx.end(), 0);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t j = i + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(nc - i)));
        std::swap(idx[i], idx[j]);
      }
      idx.resize(m);
      std::sort(idx.begin(), idx.end());
      for (int64_t i : idx) out.push_back(cand[i]);
      break;
    }
    case EvictionKind::kStreaming:
      STRATA_CHECK(false);
  }
  return out;
}

Status EvictionPolicy::OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                          ThreadPool* pool) {
  Layer& L = layers_[layer];
  const int64_t n = store.n_rows();
  if (n == 0) return OkStatus();
  const int64_t m = BudgetRows(n, cfg_.ratio);
  if (cfg_.kind == EvictionKind::kStreaming) {
    L.window = m;
  } else {
    L.all_kept = true;
    for (size_t s = 0; s < L.kept.size(); ++s) {
      std::vector<int64_t> cand;
      if (L.compressed) cand = L.kept[s];
      const int64_t from = L.compressed ? L.boundary : 0;
      for (int64_t u = from; u < n; ++u) cand.push_back(u);
      L.kept[s] = Select(L, layer, static_cast<int>(s), cand, n, m);
      if (static_cast<int64_t>(L.kept[s].size()) != n) L.all_kept = false;
    }
  }
  L.boundary = n;
  L.compressed = true;
  L.n_obs = 0;
  ++L.compressions;
  return OkStatus();
}

bool EvictionPolicy::ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit,
                                     int m, ReadStats* stats) {
  const Layer& L = layers_[layer];
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // Read's dense branches
    const bool dense = !L.compressed || (L.all_kept && limit >= L.boundary) ||
                       (cfg_.kind == EvictionKind::kStreaming && limit <= cfg_.sinks + L.window);
    if (!dense) return false;
  }
  CountDenseReads(store.geometry(), first_limit, m, stats);
  return true;
}

Status EvictionPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                          ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  Layer& L = layers_[layer];
  if (!L.compressed || (L.all_kept && limit >= L.boundary)) {
    ReadPrefix(store, q, limit, pool, st, stats);
    return OkStatus();
  }
  if (cfg_.kind == EvictionKind::kStreaming) {
    const int64_t sinks = cfg_.sinks;
    if (limit <= sinks + L.window) {
      ReadPrefix(store, q, limit, pool, st, stats);
      return OkStatus();
    }
    std::vector<int64_t>& rows = L.read[0];
    rows.clear();
    for (int64_t u = 0; u < sinks; ++u) rows.push_back(u);
    for (int64_t u = limit - L.window; u < limit; ++u) rows.push_back(u);
    ReadRows(store, q, rows.data(), static_cast<int64_t>(rows.size()), pool, st, stats);
    return OkStatus();
  }
  for (size_t s = 0; s < L.kept.size(); ++s) {
    std::vector<int64_t>& rows = L.read[s];
    rows.clear();
    for (int64_t u : L.kept[s]) {
      if (u >= limit) break;
      rows.push_back(u);
    }
    for (int64_t u = L.boundary; u < limit; ++u) rows.push_back(u);
  }
  ReadHeadSets(store, q, L.read, pool, st, stats);
  return OkStatus();
}

int64_t EvictionPolicy::PeakResidentBytes(int layer, const LayerGeometry& g,
                                          int64_t n_rows) const {
  // Kept rows per set: m = BudgetRows(rows) (snapkv: + its observation window).
  const int64_t sets = static_cast<int64_t>(layers_[layer].kept.size());
  const int64_t heads = static_cast<int64_t>(layers_[layer].score.size());
  const int64_t kept = std::min(n_rows, BudgetRows(n_rows, cfg_.ratio) + cfg_.snap_window);
  return FullPageBytes(g, n_rows) + static_cast<int64_t>(sizeof(double)) * n_rows * heads +
         static_cast<int64_t>(sizeof(int64_t)) * kept * sets;
}

int64_t EvictionPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  int64_t b = store.resident_bytes();
  for (const auto& k : L.kept) b += static_cast<int64_t>(k.size() * sizeof(int64_t));
  for (const auto& s : L.score) b += static_cast<int64_t>(s.size() * sizeof(double));
  return b;
}

PolicySummary EvictionPolicy::Summary(int layer, const LayerStore& store) const {
  const Layer& L = layers_[layer];
  PolicySummary s = Policy::Summary(layer, store);
  const int64_t n = store.n_rows();
  const int64_t heads = L.g.n_kv_heads;
  s.rows_kept = s.rows_visible;
  s.compressed = false;
  if (!L.compressed) {
    s.note = "no compression point yet (the prefill is exact)";
  } else if (cfg_.kind == EvictionKind::kStreaming) {
    s.rows_kept = std::min(n, cfg_.sinks + L.window) * heads;
    s.compressed = s.rows_kept < s.rows_visible;
    if (!s.compressed) {
      s.note = "every row kept: " + std::to_string(n) + " rows <= sinks " +
               std::to_string(cfg_.sinks) + " + window " + std::to_string(L.window);
    }
  } else {
    // One set shared by every KV head counts once per head, as ReadHeadSets reads it.
    const int64_t per_set = L.kept.size() == 1 ? heads : 1;
    s.rows_kept = 0;
    for (const auto& k : L.kept) {
      s.rows_kept += (static_cast<int64_t>(k.size()) + (n - L.boundary)) * per_set;
    }
    s.compressed = s.rows_kept < s.rows_visible;
    if (!s.compressed) {
      s.note = "every row kept: the budget covers all " + std::to_string(L.boundary) +
               " rows at the compression point";
    }
  }
  return s;
}

StatusOr<std::unique_ptr<Policy>> MakeEvictionPolicy(const PolicySpec& spec, EvictionKind kind) {
  ASSIGN_OR_RETURN(EvictionConfig c, EvictionConfig::FromSpec(spec, kind));
  return std::unique_ptr<Policy>(new EvictionPolicy(c));
}

}  // namespace strata::baselines
