#include "kv/cache.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"
#include "core/scratch.h"
#include "kernels/ops.h"

namespace strata {

StatusOr<std::unique_ptr<KvCache>> KvCache::Create(std::vector<LayerGeometry> layers,
                                                   std::unique_ptr<Policy> policy,
                                                   RecurrentGeometry recurrent) {
  if (!policy) return InvalidArgument("KvCache::Create: no policy");
  if (recurrent.n_layers < 0 || recurrent.state_floats < 0 || recurrent.conv_floats < 0 ||
      (recurrent.n_layers > 0 && recurrent.state_floats + recurrent.conv_floats <= 0) ||
      (recurrent.n_layers > 0 &&
       recurrent.state_floats + recurrent.conv_floats > (int64_t{1} << 40) / recurrent.n_layers)) {
    return InvalidArgument("KvCache::Create: bad recurrent state geometry (" +
                           std::to_string(recurrent.n_layers) + " layers x (" +
                           std::to_string(recurrent.state_floats) + " + " +
                           std::to_string(recurrent.conv_floats) + ") floats)");
  }
  if (layers.empty()) return InvalidArgument("KvCache::Create: model has no attention layers");
  // Every layer carries its model number from here on, so that the policies (which see the
  // global layers only) and every message name the model's layer.
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].model_layer < 0) layers[l].model_layer = static_cast<int>(l);
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    if (g.n_kv_heads <= 0 || g.n_q_heads <= 0 || g.n_q_heads % g.n_kv_heads != 0 ||
        g.k_dim <= 0 || g.v_dim <= 0) {
      return InvalidArgument(LayerName(g, l) + ": bad cache geometry " + g.ToString());
    }
  }
  std::vector<LayerGeometry> global;
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    if (g.window < 0 || (g.window > 0 && g.kind != AttnKind::kGqa)) {
      return InvalidArgument(LayerName(g, l) + ": a sliding window of " +
                             std::to_string(g.window) + " rows (GQA layers only, > 0)");
    }
    if (g.window == 0) global.push_back(g);
  }
  if (global.empty() && policy->name() != "full") {
    return InvalidArgument("policy '" + policy->name() + "' governs a model's global layers, and "
                           "every layer of this model is a sliding-window layer (" +
                           std::to_string(layers.size()) + " layers, window " +
                           std::to_string(layers[0].window) + "); use --policy full");
  }
  for (const LayerGeometry& g : layers) {
    if (g.kv_type != DType::kBF16 && g.kv_type != DType::kF16 && g.kv_type != DType::kF32) {
      return InvalidArgument("KV cache type " + KvTypeName(g.kv_type) +
                             ": the cache stores bf16, f16 or f32 rows");
    }
    if (!policy->SupportsKvType(g.kv_type)) {
      return InvalidArgument("policy '" + policy->name() + "' reads bf16 KV rows only (its " +
                             "formats are defined over bf16), not --kv-type " +
                             KvTypeName(g.kv_type) +
                             "; use --kv-type bf16, or the full policy for f32/f16 rows");
    }
  }
  RETURN_IF_ERROR(policy->Bind(global).WithContext("policy '" + policy->name() + "'"));
  return std::unique_ptr<KvCache>(
      new KvCache(std::move(layers), std::move(policy), recurrent));
}

KvCache::KvCache(std::vector<LayerGeometry> layers, std::unique_ptr<Policy> policy,
                 RecurrentGeometry recurrent)
    : policy_(std::move(policy)),
      recurrent_(recurrent),
      recurrent_buf_(static_cast<size_t>(recurrent.n_layers) *
                         static_cast<size_t>(recurrent.state_floats + recurrent.conv_floats),
                     0.f) {
  int max_heads = 0, max_dv = 0, n_global = 0;
  for (const auto& g : layers) {
    stores_.emplace_back(g);
    policy_layer_.push_back(g.window > 0 ? -1 : n_global++);
    window_floor_.push_back(0);
    max_heads = std::max(max_heads, g.n_q_heads);
    max_dv = std::max(max_dv, g.v_dim);
  }
  scratch_ = SoftmaxStateBuffer(max_heads, max_dv);
}

StatusOr<std::unique_ptr<KvCache>> KvCache::Fork() const {
  if (in_call_) {
    return InvalidArgument("KvCache::Fork inside a forward call (fork between calls)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, policy_->Clone());
  std::unique_ptr<KvCache> c(new KvCache());
  c->stores_.reserve(stores_.size());
  for (const LayerStore& s : stores_) c->stores_.push_back(s.Clone());
  c->policy_layer_ = policy_layer_;
  c->window_floor_ = window_floor_;
  c->policy_ = std::move(policy);
  c->recurrent_ = recurrent_;
  c->recurrent_buf_ = recurrent_buf_;
  c->scratch_ = SoftmaxStateBuffer(scratch_.states().n_heads, scratch_.states().dv);
  c->counters_ = counters_;
  c->status_ = status_;
  c->in_call_ = false;
  c->call_ = call_;
  c->call_pool_ = nullptr;
  c->appended_ = appended_;
  c->sealed_ = sealed_;
  c->obs_first_ = obs_first_;
  c->obs_end_ = obs_end_;
  c->obs_stride_ = obs_stride_;
  c->obs_w_ = obs_w_;
  return c;
}

Status KvCache::Fail(const Status& s, int layer, const char* event) {
  Status e = layer >= 0
                 ? s.WithContext(LayerName(stores_[layer].geometry(), layer) + ", " + event)
                 : s.WithContext(event);
  e = e.WithContext("policy '" + policy_->name() + "'");
  if (status_.ok()) status_ = e;
  return e;
}

Status KvCache::Apply(int layer, const CachePlan& plan, int64_t floor, const char* event) {
  LayerStore& store = stores_[layer];
  const LayerGeometry& g = store.geometry();
  for (const CachePlan::Page& p : plan.release) {
    // A policy bug, reported instead of aborting: the plan is checked before anything is freed.
    const int64_t end = (p.page + 1) * LayerStore::kPageRows;
    if (p.head < 0 || p.head >= g.n_kv_heads || p.page < 0 || end > store.n_rows() ||
        end > floor || !store.page_resident(p.head, p.page)) {
      return Fail(Internal("plan releases page " + std::to_string(p.page) + " of KV head " +
                           std::to_string(p.head) + " (rows [" +
                           std::to_string(p.page * LayerStore::kPageRows) + ", " +
                           std::to_string(end) + ")), which is not a resident closed page below "
                           "row " + std::to_string(std::min(floor, store.n_rows()))),
                  layer, event);
    }
  }
  for (const CachePlan::Page& p : plan.release) store.ReleasePage(p.head, p.page);
  return OkStatus();
}

Status KvCache::BeginCall(int64_t n_new, CallKind kind, ThreadPool* pool) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(!in_call_, "BeginCall inside a call");
  STRATA_CHECK(n_new >= 0);
  in_call_ = true;
  call_ = CacheCall{n_tokens(), n_tokens() + n_new, kind};
  call_pool_ = pool;
  appended_.assign(n_layers(), 0);
  sealed_.assign(n_layers(), 0);
  counters_.last_step = ReadStats();
  counters_.calls++;
  for (int l = 0; l < n_layers(); ++l) {
    if (is_local(l)) {
      if (n_new == 0) sealed_[l] = 1;
      continue;
    }
    CachePlan plan;
    Status s = policy_->BeginCall(policy_layer(l), stores_[l], call_, &plan);
    if (!s.ok()) return Fail(s, l, "call start");
    // Before the call's rows exist: a released page lies wholly below its first row.
    RETURN_IF_ERROR(Apply(l, plan, call_.first, "call start"));
    if (n_new == 0) RETURN_IF_ERROR(Seal(l));  // no rows to wait for
  }
  return OkStatus();
}

Status KvCache::Append(int layer, const float* k, const float* v) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(in_call_, "Append outside a call (BeginCall first)");
  STRATA_CHECK_MSG(!sealed_[layer], "Append to layer %d after its first query of the call", layer);
  STRATA_CHECK_MSG(appended_[layer] < call_.n_rows(), "layer %d: more rows than the call's %lld",
                   layer, static_cast<long long>(call_.n_rows()));
  stores_[layer].Append(k, v);
  appended_[layer]++;
  if (is_local(layer)) {
    if (appended_[layer] == call_.n_rows()) sealed_[layer] = 1;
    return OkStatus();
  }
  Status s = policy_->OnAppend(policy_layer(layer), stores_[layer]);
  if (!s.ok()) return Fail(s, layer, "append");
  // The call's last row of this layer: the causal point before its first query.
  if (appended_[layer] == call_.n_rows()) return Seal(layer);
  return OkStatus();
}

Status KvCache::Seal(int layer) {
  sealed_[layer] = 1;
  CachePlan plan;
  Status s = policy_->OnAppended(policy_layer(layer), stores_[layer], call_, &plan, call_pool_);
  if (!s.ok()) return Fail(s, layer, "block close");
  // The call's queries are still to come: nothing of the call may be released.
  return Apply(layer, plan, call_.first, "block close");
}

void KvCache::CheckSealed(int layer, const char* what) const {
  STRATA_CHECK_MSG(sealed_[layer], "layer %d: %s after %lld of the call's %lld rows", layer, what,
                   static_cast<long long>(appended_[layer]),
                   static_cast<long long>(call_.n_rows()));
}

Status KvCache::Attend(int layer, const float* q, int64_t pos, ThreadPool* pool, float* out) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(in_call_, "Attend outside a call (BeginCall first)");
  LayerStore& store = stores_[layer];
  STRATA_CHECK_MSG(pos >= 0 && pos < store.n_rows(), "query at %lld but %lld rows",
                   static_cast<long long>(pos), static_cast<long long>(store.n_rows()));
  CheckSealed(layer, "query");
  if (query_tap_) query_tap_(layer, pos, q);
  const LayerGeometry& g = store.geometry();
  SoftmaxStates st = scratch_.states();
  st.n_heads = g.n_q_heads;
  st.dv = g.v_dim;
  st.Reset();
  ReadStats stats;
  int64_t visible = pos + 1;
  if (is_local(layer)) {
    ReadWindow(layer, q, pos, pool, &st, &stats);
    visible = std::min<int64_t>(pos + 1, g.window);
  } else {
    Status s = policy_->Read(policy_layer(layer), store, q, pos + 1, pool, &st, &stats);
    if (!s.ok()) {
      return Fail(s.WithContext("query at position " + std::to_string(pos)), layer, "read");
    }
  }
  FinalizeStates(st, out);
  counters_.reads++;
  counters_.bytes_read_total += stats.bytes_read;
  counters_.rows_attended_total += stats.rows_attended;
  counters_.rows_fetched_total += stats.rows_fetched;
  counters_.fallbacks_total += stats.fallbacks;
  counters_.rows_visible_total += visible * g.n_kv_heads;
  counters_.full_bytes_read_total += visible * g.bytes_per_token();
  counters_.last_step.bytes_read += stats.bytes_read;
  counters_.last_step.rows_attended += stats.rows_attended;
  counters_.last_step.rows_fetched += stats.rows_fetched;
  counters_.last_step.fallbacks += stats.fallbacks;
  return OkStatus();
}

bool KvCache::ClaimDenseReads(int layer, int64_t first_pos, int m) {
  return ClaimReads(layer, first_pos, m, nullptr);
}

bool KvCache::ClaimStagedReads(int layer, int64_t first_pos, int m, StagedPrefixPlan* plan) {
  return ClaimReads(layer, first_pos, m, plan);
}

void KvCache::StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                              float* values) const {
  STRATA_CHECK_MSG(!is_local(layer), "layer %d: staged rows of a sliding-window layer", layer);
  policy_->StagePrefixRows(policy_layer(layer), h, s0, sn, keys, values);
}

void KvCache::ReadWindow(int layer, const float* q, int64_t pos, ThreadPool* pool,
                         SoftmaxStates* st, ReadStats* stats) const {
  const LayerStore& store = stores_[layer];
  const LayerGeometry& g = store.geometry();
  const int G = g.group_size();
  const int64_t P = LayerStore::kPageRows;
  const int64_t lo = std::max<int64_t>(0, pos - g.window + 1), n = pos + 1 - lo;
  const int64_t p0 = lo / P, n_pages = pos / P - p0 + 1;
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = lo - p0 * P + i;
  std::vector<const uint16_t*> kp(n_pages), vp(n_pages);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    KvStreamView v = store.PageView(h, p0);
    for (int64_t j = 0; j < n_pages; ++j) {
      const KvStreamView pv = store.PageView(h, p0 + j);
      kp[j] = pv.keys;
      vp[j] = pv.vals;
    }
    v.keys = v.vals = nullptr;
    v.key_pages = kp.data();
    v.val_pages = vp.data();
    v.page_shift = std::countr_zero(static_cast<uint64_t>(P));
    v.math = g.attn_math;
    SoftmaxStates sub = HeadSlice(*st, h * G, G);
    AttendStream(q + static_cast<int64_t>(h) * G * g.k_dim, G, g.scale, v, rows.data(), n, &sub);
  }
  (void)pool;  // a window of <= a few hundred rows per KV head: one thread
  stats->rows_attended += n * g.n_kv_heads;
  stats->bytes_read += n * g.bytes_per_token();
}

void KvCache::SlideWindow(int layer) {
  LayerStore& store = stores_[layer];
  const LayerGeometry& g = store.geometry();
  // The next query (at n_rows or later) reads rows >= n_rows - window + 1.
  const int64_t keep_from = store.n_rows() - g.window + 1;
  const int64_t P = LayerStore::kPageRows;
  int64_t& p = window_floor_[layer];
  for (; (p + 1) * P <= keep_from; ++p) {
    for (int h = 0; h < g.n_kv_heads; ++h) {
      if (store.page_resident(h, p)) store.ReleasePage(h, p);
    }
  }
}

bool KvCache::ClaimReads(int layer, int64_t first_pos, int m, StagedPrefixPlan* plan) {
  if (!status_.ok() || m <= 0) return false;
  STRATA_CHECK_MSG(in_call_, "reads claimed outside a call (BeginCall first)");
  LayerStore& store = stores_[layer];
  STRATA_CHECK_MSG(first_pos >= 0 && first_pos + m <= store.n_rows(),
                   "queries at [%lld, %lld) but %lld rows", static_cast<long long>(first_pos),
                   static_cast<long long>(first_pos + m), static_cast<long long>(store.n_rows()));
  CheckSealed(layer, "query");
  if (is_local(layer)) return false;  // read per query through the window (Attend)
  ReadStats stats;
  const bool claimed =
      plan == nullptr
          ? policy_->ClaimDenseReads(policy_layer(layer), store, first_pos + 1, m, &stats)
          : policy_->ClaimStagedReads(policy_layer(layer), store, first_pos + 1, m, &stats, plan);
  if (!claimed) return false;
  const LayerGeometry& g = store.geometry();
  const int64_t rows = int64_t{m} * (first_pos + 1) + int64_t{m} * (m - 1) / 2;  // sum of limits
  counters_.reads += m;
  counters_.bytes_read_total += stats.bytes_read;
  counters_.rows_attended_total += stats.rows_attended;
  counters_.rows_fetched_total += stats.rows_fetched;
  counters_.fallbacks_total += stats.fallbacks;
  counters_.rows_visible_total += rows * g.n_kv_heads;
  counters_.full_bytes_read_total += rows * g.bytes_per_token();
  counters_.last_step.bytes_read += stats.bytes_read;
  counters_.last_step.rows_attended += stats.rows_attended;
  counters_.last_step.rows_fetched += stats.rows_fetched;
  counters_.last_step.fallbacks += stats.fallbacks;
  return true;
}

Status KvCache::EndCall() {
  call_pool_ = nullptr;
  if (!status_.ok()) {  // a failed call may end without its rows: the cache is done
    in_call_ = false;
    return status_;
  }
  STRATA_CHECK_MSG(in_call_, "EndCall outside a call");
  in_call_ = false;
  for (int l = 0; l < n_layers(); ++l) {
    CheckSealed(l, "call end");
    if (is_local(l)) {
      SlideWindow(l);
      continue;
    }
    CachePlan plan;
    Status s = policy_->EndCall(policy_layer(l), stores_[l], call_, &plan);
    if (!s.ok()) return Fail(s, l, "call end");
    // Every query of the call has read: any closed page may go.
    RETURN_IF_ERROR(Apply(l, plan, stores_[l].n_rows(), "call end"));
  }
  return OkStatus();
}

void KvCache::BeginPrefill(int64_t first, int64_t end) {
  const int64_t n_obs = policy_->observation_queries(end - first);
  obs_end_ = end;
  obs_first_ = std::max(first, end - n_obs);
  if (n_obs <= 0) obs_first_ = obs_end_;
  obs_stride_ = 1;
  if (obs_end_ > obs_first_) {
    obs_stride_ = policy_->observation_stride(obs_end_ - obs_first_);
    STRATA_CHECK_MSG(obs_stride_ >= 1, "%s: observation stride %lld < 1", policy_->name().c_str(),
                     static_cast<long long>(obs_stride_));
    STRATA_CHECK_MSG(obs_stride_ == 1 || !policy_->observation_needs_weights(),
                     "%s: an observation stride with weights", policy_->name().c_str());
  }
}

namespace {

// Exact causal softmax weights of one observed query over rows [0, n) for every query head:
// w [n_q_heads, n]. Scores are f32 SIMD dot products of the f32 query with the bf16 keys, each
// key page converted to f32 once and shared by the G heads of its KV head; the max and the
// normalising sum are float64 (each exponential computed once, kept in float64 until the
// division). Tasks: (KV head, page) for the scores, query heads for the softmax, over the pool;
// every weight is computed by one task in a fixed order, so w does not depend on the pool.
// Memory: the caller's w plus, per task, one page of f32 keys or n doubles (scratch arenas).
void ObservationWeights(const LayerStore& store, const float* q, int64_t n, ThreadPool* pool,
                        float* w) {
  const LayerGeometry& g = store.geometry();
  const int G = g.group_size();
  const int64_t P = LayerStore::kPageRows;
  const int64_t n_pages = (n + P - 1) / P;
  ParallelForOrInline(pool, g.n_kv_heads * n_pages, 1, [&](int64_t tb, int64_t te, int) {
    ScratchScope ws;
    std::span<float> kbuf = ws.FloatsUnset(static_cast<size_t>(P) * g.k_dim);
    for (int64_t t = tb; t < te; ++t) {
      const int h = static_cast<int>(t / n_pages);
      const int64_t p0 = (t % n_pages) * P;
      const int64_t rows = std::min(P, n - p0);
      for (int64_t i = 0; i < rows; ++i) store.KeyRowF32(h, p0 + i, kbuf.data() + i * g.k_dim);
      for (int r = 0; r < G; ++r) {
        const int64_t hq = static_cast<int64_t>(h) * G + r;
        const float* qh = q + hq * g.k_dim;
        float* wh = w + hq * n + p0;
        for (int64_t i = 0; i < rows; ++i) {
          wh[i] = g.scale * Dot(qh, kbuf.data() + i * g.k_dim, g.k_dim);
        }
      }
    }
  });
  ParallelForOrInline(pool, g.n_q_heads, 1, [&](int64_t hb, int64_t he, int) {
    ScratchScope ws;
    std::span<double> ex = ws.DoublesUnset(n);
    for (int64_t hq = hb; hq < he; ++hq) {
      float* wh = w + hq * n;
      double mx = -INFINITY;
      for (int64_t u = 0; u < n; ++u) mx = std::max(mx, static_cast<double>(wh[u]));
      double sum = 0;
      for (int64_t u = 0; u < n; ++u) {
        ex[u] = std::exp(wh[u] - mx);
        sum += ex[u];
      }
      const double inv = 1.0 / sum;
      for (int64_t u = 0; u < n; ++u) wh[u] = static_cast<float>(ex[u] * inv);
    }
  });
}

}  // namespace

Status KvCache::ObserveQuery(int layer, int64_t pos, const float* q, ThreadPool* pool) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(in_call_, "ObserveQuery outside a call");
  CheckSealed(layer, "observed query");
  if (!observes(pos) || is_local(layer)) return OkStatus();
  // Delivered at once: every row the query may see ([0, pos]) is already appended, so nothing is
  // recorded and memory stays one [n_q_heads, pos + 1] weight buffer whatever the prompt length.
  const LayerStore& store = stores_[layer];
  const LayerGeometry& g = store.geometry();
  PrefillObservation obs{pos, g.n_q_heads, g.k_dim, q, pos + 1, nullptr};
  if (policy_->observation_needs_weights()) {
    obs_w_.resize(static_cast<size_t>(g.n_q_heads) * (pos + 1));
    ObservationWeights(store, q, pos + 1, pool, obs_w_.data());
    obs.weights = obs_w_.data();
  }
  Status s = policy_->OnPrefillStats(policy_layer(layer), store, obs);
  if (!s.ok()) return Fail(s, layer, "prefill statistics");
  return OkStatus();
}

bool KvCache::takes_column_sums() const {
  return policy_->observation_needs_weights() && policy_->observation_takes_column_sums();
}

Status KvCache::ObserveColumnSums(int layer, int64_t first_query, int64_t end_query,
                                  const double* sums) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(in_call_, "ObserveColumnSums outside a call");
  CheckSealed(layer, "observed column sums");
  STRATA_CHECK_MSG(takes_column_sums(), "ObserveColumnSums: %s does not take them",
                   policy_->name().c_str());
  STRATA_CHECK_MSG(first_query < end_query && first_query >= obs_first_ && end_query <= obs_end_ &&
                       first_query >= call_.first && end_query <= call_.end,
                   "ObserveColumnSums: queries [%lld, %lld) outside the observed window of the call",
                   static_cast<long long>(first_query), static_cast<long long>(end_query));
  if (is_local(layer)) return OkStatus();
  const PrefillColumnSums cs{first_query, end_query, end_query, sums};
  Status s = policy_->OnPrefillColumnSums(policy_layer(layer), stores_[layer], cs);
  if (!s.ok()) return Fail(s, layer, "prefill statistics");
  return OkStatus();
}

Status KvCache::EndPrefill(ThreadPool* pool) { return Compress(pool); }

Status KvCache::Compress(ThreadPool* pool) {
  RETURN_IF_ERROR(status_);
  STRATA_CHECK_MSG(!in_call_, "Compress inside a call");
  for (int l = 0; l < n_layers(); ++l) {
    if (is_local(l)) continue;
    CachePlan plan;
    Status s = policy_->OnCompress(policy_layer(l), stores_[l], &plan, pool);
    if (!s.ok()) return Fail(s, l, "compression point");
    RETURN_IF_ERROR(Apply(l, plan, stores_[l].n_rows(), "compression point"));
  }
  return OkStatus();
}

int KvCache::n_local_layers() const {
  int n = 0;
  for (int l = 0; l < n_layers(); ++l) n += is_local(l);
  return n;
}

int64_t KvCache::LocalResidentBytes() const {
  int64_t b = 0;
  for (int l = 0; l < n_layers(); ++l) {
    if (is_local(l)) b += stores_[l].resident_bytes();
  }
  return b;
}

int64_t KvCache::ResidentBytes() const {
  int64_t b = 0;
  for (int l = 0; l < n_layers(); ++l) {
    if (!is_local(l)) b += policy_->ResidentBytes(policy_layer(l), stores_[l]);
  }
  return b + LocalResidentBytes() + RecurrentBytes();
}

ResidentParts KvCache::ResidentBreakdown() const {
  ResidentParts sum;
  for (int l = 0; l < n_layers(); ++l) {
    if (!is_local(l)) sum.Add(policy_->ResidentBreakdown(policy_layer(l), stores_[l]));
  }
  if (n_local_layers() > 0) {
    ResidentParts local;
    local.parts.push_back({"sliding-window layers", LocalResidentBytes()});
    sum.Add(local);
  }
  if (recurrent_.n_layers > 0) {
    ResidentParts rec;
    rec.parts.push_back({"recurrent state", RecurrentBytes()});
    sum.Add(rec);
  }
  return sum;
}

int64_t KvCache::PeakResidentBytes(int64_t n_rows) const {
  int64_t b = 0;
  for (int l = 0; l < n_layers(); ++l) {
    const LayerGeometry& g = stores_[l].geometry();
    if (!is_local(l)) {
      b += policy_->PeakResidentBytes(policy_layer(l), g, n_rows);
      continue;
    }
    // The window, the partial page below it, and the rows of a call (up to one prefill chunk:
    // counted as one more window) before the call's end slides it.
    const int64_t P = LayerStore::kPageRows;
    const int64_t rows = std::min(n_rows, (g.window + 2 * P - 1) / P * P + g.window);
    b += rows * g.bytes_per_token();
  }
  return b + RecurrentBytes();
}

int64_t KvCache::FullBytesPerToken() const {
  int64_t b = 0;
  for (const auto& s : stores_) {
    if (s.geometry().window == 0) b += s.geometry().bytes_per_token();
  }
  return b;
}

int64_t KvCache::FullResidentBytes() const {
  int64_t b = 0;
  for (const auto& s : stores_) {
    if (s.geometry().window == 0) b += s.full_resident_bytes();
  }
  return b + LocalResidentBytes() + RecurrentBytes();
}

PolicySummary KvCache::Summary() const {
  PolicySummary sum = PolicySummary::Identity();
  for (int l = 0; l < n_layers(); ++l) {
    if (!is_local(l)) sum.Add(policy_->Summary(policy_layer(l), stores_[l]));
  }
  return sum;
}

}  // namespace strata
