#include "kv/cache.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace strata {

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(std::vector<LayerGeometry> layers,
                                                   std::unique_ptr<Policy> policy) {
  if (!policy) return InvalidArgument("KvCache::Create: no policy");
  if (layers.empty()) return InvalidArgument("KvCache::Create: model has no attention layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    if (g.n_kv_heads <= 0 || g.n_q_heads <= 0 || g.n_q_heads % g.n_kv_heads != 0 ||
        g.k_dim <= 0 || g.v_dim <= 0) {
      return InvalidArgument("layer " + std::to_string(l) + ": bad cache geometry " + g.ToString());
    }
  }
  RETURN_IF_ERROR(policy->Bind(layers).WithContext("policy '" + policy->name() + "'"));
  return std::unique_ptr<KvCache>(new KvCache(std::move(layers), std::move(policy)));
}

KvCache::KvCache(std::vector<LayerGeometry> layers, std::unique_ptr<Policy> policy)
    : policy_(std::move(policy)), recorded_(layers.size()) {
  int max_heads = 0, max_dv = 0;
  for (const auto& g : layers) {
    stores_.emplace_back(g);
    max_heads = std::max(max_heads, g.n_q_heads);
    max_dv = std::max(max_dv, g.v_dim);
  }
  scratch_ = SoftmaxStateBuffer(max_heads, max_dv);
}

void KvCache::Append(int layer, const float* k, const float* v) {
  stores_[layer].Append(k, v);
  policy_->OnAppend(layer, stores_[layer]);
}

void KvCache::Attend(int layer, const float* q, int64_t pos, ThreadPool* pool, float* out) {
  LayerStore& store = stores_[layer];
  STRATA_CHECK_MSG(pos >= 0 && pos < store.n_rows(), "query at %lld but %lld rows",
                   static_cast<long long>(pos), static_cast<long long>(store.n_rows()));
  const LayerGeometry& g = store.geometry();
  SoftmaxStates st = scratch_.states();
  st.n_heads = g.n_q_heads;
  st.dv = g.v_dim;
  st.Reset();
  ReadStats stats;
  policy_->Read(layer, store, q, pos + 1, pool, &st, &stats);
  FinalizeStates(st, out);
  counters_.reads++;
  counters_.bytes_read_total += stats.bytes_read;
  counters_.rows_attended_total += stats.rows_attended;
  counters_.rows_fetched_total += stats.rows_fetched;
  counters_.last_step.bytes_read += stats.bytes_read;
  counters_.last_step.rows_attended += stats.rows_attended;
  counters_.last_step.rows_fetched += stats.rows_fetched;
}

void KvCache::BeginPrefill(int64_t first, int64_t end) {
  const int64_t n_obs = policy_->observation_queries(end - first);
  obs_end_ = end;
  obs_first_ = std::max(first, end - n_obs);
  if (n_obs <= 0) obs_first_ = obs_end_;
  for (auto& r : recorded_) r.clear();
}

void KvCache::ObserveQuery(int layer, int64_t pos, const float* q) {
  if (pos < obs_first_ || pos >= obs_end_) return;
  const LayerGeometry& g = stores_[layer].geometry();
  recorded_[layer].push_back({pos, std::vector<float>(q, q + int64_t{g.n_q_heads} * g.k_dim)});
}

void KvCache::EndPrefill(ThreadPool* pool) {
  for (int l = 0; l < n_layers(); ++l) {
    const LayerStore& store = stores_[l];
    const LayerGeometry& g = store.geometry();
    std::vector<float> w;
    const bool need_weights = policy_->observation_needs_weights();
    for (const Recorded& r : recorded_[l]) {
      if (!need_weights) {
        PrefillObservation obs{r.pos, g.n_q_heads, g.k_dim, r.q.data(), r.pos + 1, nullptr};
        policy_->OnPrefillStats(l, store, obs);
        continue;
      }
      // Exact causal softmax weights of this query over rows [0, pos] (bf16 rows, f64 sums).
      const int64_t n = r.pos + 1;
      w.assign(static_cast<size_t>(g.n_q_heads) * n, 0.f);
      const int G = g.group_size();
      for (int h = 0; h < g.n_q_heads; ++h) {
        const float* qh = r.q.data() + static_cast<int64_t>(h) * g.k_dim;
        float* wh = w.data() + static_cast<int64_t>(h) * n;
        double mx = -INFINITY;
        for (int64_t u = 0; u < n; ++u) {
          const uint16_t* k = store.key_row(h / G, u);
          double s = 0;
          for (int c = 0; c < g.k_dim; ++c) s += static_cast<double>(qh[c]) * Bf16ToF32(k[c]);
          s *= g.scale;
          wh[u] = static_cast<float>(s);
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int64_t u = 0; u < n; ++u) sum += std::exp(wh[u] - mx);
        for (int64_t u = 0; u < n; ++u) wh[u] = static_cast<float>(std::exp(wh[u] - mx) / sum);
      }
      PrefillObservation obs{r.pos, g.n_q_heads, g.k_dim, r.q.data(), n, w.data()};
      policy_->OnPrefillStats(l, store, obs);
    }
    recorded_[l].clear();
  }
  Compress();
}

void KvCache::Compress() {
  for (int l = 0; l < n_layers(); ++l) policy_->OnCompress(l, stores_[l]);
}

int64_t KvCache::ResidentBytes() const {
  int64_t b = 0;
  for (int l = 0; l < n_layers(); ++l) b += policy_->ResidentBytes(l, stores_[l]);
  return b;
}

int64_t KvCache::FullBytesPerToken() const {
  int64_t b = 0;
  for (const auto& s : stores_) b += s.geometry().bytes_per_token();
  return b;
}

}  // namespace strata
