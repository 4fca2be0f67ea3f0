#include "kv/cache.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/ops.h"

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
    : policy_(std::move(policy)) {
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
  counters_.rows_visible_total += (pos + 1) * g.n_kv_heads;
  counters_.full_bytes_read_total += (pos + 1) * g.bytes_per_token();
  counters_.last_step.bytes_read += stats.bytes_read;
  counters_.last_step.rows_attended += stats.rows_attended;
  counters_.last_step.rows_fetched += stats.rows_fetched;
}

void KvCache::BeginPrefill(int64_t first, int64_t end) {
  const int64_t n_obs = policy_->observation_queries(end - first);
  obs_end_ = end;
  obs_first_ = std::max(first, end - n_obs);
  if (n_obs <= 0) obs_first_ = obs_end_;
}

namespace {

// Exact causal softmax weights of one observed query over rows [0, n) for every query head:
// w [n_q_heads, n]. Scores are f32 SIMD dot products of the f32 query with the bf16 keys, each
// key page converted to f32 once and shared by the G heads of its KV head; the max and the
// normalising sum are float64. Memory: the caller's w plus one page of f32 keys.
void ObservationWeights(const LayerStore& store, const float* q, int64_t n,
                        std::vector<float>* kbuf, float* w) {
  const LayerGeometry& g = store.geometry();
  const int G = g.group_size();
  const int64_t P = LayerStore::kPageRows;
  kbuf->resize(static_cast<size_t>(P) * g.k_dim);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    for (int64_t p0 = 0; p0 < n; p0 += P) {
      const int64_t rows = std::min(P, n - p0);
      for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* k = store.key_row(h, p0 + i);
        float* dst = kbuf->data() + i * g.k_dim;
        for (int c = 0; c < g.k_dim; ++c) dst[c] = Bf16ToF32(k[c]);
      }
      for (int r = 0; r < G; ++r) {
        const int64_t hq = static_cast<int64_t>(h) * G + r;
        const float* qh = q + hq * g.k_dim;
        float* wh = w + hq * n + p0;
        for (int64_t i = 0; i < rows; ++i) {
          wh[i] = g.scale * Dot(qh, kbuf->data() + i * g.k_dim, g.k_dim);
        }
      }
    }
  }
  for (int hq = 0; hq < g.n_q_heads; ++hq) {
    float* wh = w + static_cast<int64_t>(hq) * n;
    double mx = -INFINITY;
    for (int64_t u = 0; u < n; ++u) mx = std::max(mx, static_cast<double>(wh[u]));
    double sum = 0;
    for (int64_t u = 0; u < n; ++u) sum += std::exp(wh[u] - mx);
    const double inv = 1.0 / sum;
    for (int64_t u = 0; u < n; ++u) wh[u] = static_cast<float>(std::exp(wh[u] - mx) * inv);
  }
}

}  // namespace

void KvCache::ObserveQuery(int layer, int64_t pos, const float* q) {
  if (pos < obs_first_ || pos >= obs_end_) return;
  // Delivered at once: every row the query may see ([0, pos]) is already appended, so nothing is
  // recorded and memory stays one [n_q_heads, pos + 1] weight buffer whatever the prompt length.
  const LayerStore& store = stores_[layer];
  const LayerGeometry& g = store.geometry();
  PrefillObservation obs{pos, g.n_q_heads, g.k_dim, q, pos + 1, nullptr};
  if (policy_->observation_needs_weights()) {
    obs_w_.resize(static_cast<size_t>(g.n_q_heads) * (pos + 1));
    ObservationWeights(store, q, pos + 1, &obs_kbuf_, obs_w_.data());
    obs.weights = obs_w_.data();
  }
  policy_->OnPrefillStats(layer, store, obs);
}

void KvCache::EndPrefill(ThreadPool* pool) { Compress(); }

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

int64_t KvCache::FullResidentBytes() const {
  int64_t b = 0;
  for (const auto& s : stores_) b += s.full_resident_bytes();
  return b;
}

PolicySummary KvCache::Summary() const {
  PolicySummary sum = PolicySummary::Identity();
  for (int l = 0; l < n_layers(); ++l) sum.Add(policy_->Summary(l, stores_[l]));
  return sum;
}

}  // namespace strata
