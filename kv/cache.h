// KvCache: the per-layer stores of one sequence, the policy that reads and compresses them, and
// the counters every report is built from.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kv/geometry.h"
#include "kv/policy.h"
#include "kv/store.h"

namespace strata {

struct CacheCounters {
  int64_t reads = 0;               // queries read (per layer summed)
  int64_t bytes_read_total = 0;
  int64_t rows_attended_total = 0;
  int64_t rows_fetched_total = 0;
  int64_t fallbacks_total = 0;     // reads that took an exact fallback
  int64_t calls = 0;               // forward calls
  // What the full cache's read of the same queries touches (every visible row of every KV head):
  // the reference the reports compare bytes_read_total and rows_attended_total with.
  int64_t rows_visible_total = 0;
  int64_t full_bytes_read_total = 0;
  ReadStats last_step;             // summed over layers for the most recent call
};

// The fixed-size per-sequence state of a model's recurrent layers (kimi-linear's KDA layers):
// per layer an f32 recurrent state and an f32 short-conv tail. It has no rows, so no policy ever
// sees it; it lives in the sequence's KvCache so that resident bytes, reports and a new sequence
// (a new cache: zeroed) cover it.
struct RecurrentGeometry {
  int n_layers = 0;          // recurrent layers, in model order
  int64_t state_floats = 0;  // per layer: e.g. KDA heads x d_k x d_v
  int64_t conv_floats = 0;   // per layer: e.g. 3 (q, k, v) x channels x (kernel - 1)
  int64_t bytes_per_sequence() const {
    return int64_t{n_layers} * (state_floats + conv_floats) * static_cast<int64_t>(sizeof(float));
  }
  bool operator==(const RecurrentGeometry&) const = default;
};

// Sliding-window (local) layers (LayerGeometry::window > 0, e.g. gemma3's): the cache holds each
// such layer's last `window` rows itself (pages wholly older than the next query's window are
// released at the end of each call, so its memory does not grow with the context), reads them
// exactly, and never shows them to the policy: the policy is bound to the global layers alone,
// in model order, and its layer indices count global layers only (policy_layer()). Accounting
// counts both: resident and read bytes include the local layers' rows (as the full cache's do).
class KvCache {
 public:
  // Binds the policy to the global layers; errors from Bind are returned as they are. A model
  // whose every layer is local is refused for any policy but full. `recurrent`: the model's
  // recurrent layers (none by default), allocated zeroed.
  static StatusOr<std::unique_ptr<KvCache>> Create(std::vector<LayerGeometry> layers,
                                                   std::unique_ptr<Policy> policy,
                                                   RecurrentGeometry recurrent = {});
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // A deep copy of the cache between calls (e.g. after a compression point, to answer several
  // continuations of one compressed context): the stores' pages, the recurrent state, the
  // counters, the status, the observation window and a clone of the policy (Policy::Clone). The
  // fork's later calls give bit for bit what this cache's would, and the two share no mutable
  // state. Errors: inside a call (InvalidArgument), or a policy that cannot be cloned (its error).
  StatusOr<std::unique_ptr<KvCache>> Fork() const;

  int n_layers() const { return static_cast<int>(stores_.size()); }
  const LayerGeometry& geometry(int layer) const { return stores_[layer].geometry(); }
  const LayerStore& store(int layer) const { return stores_[layer]; }
  // The policy's index of model layer `layer` (global layers counted in order), or -1 for a
  // sliding-window layer, which the policy never sees.
  int policy_layer(int layer) const { return policy_layer_[layer]; }
  bool is_local(int layer) const { return policy_layer_[layer] < 0; }
  int n_local_layers() const;
  Policy& policy() { return *policy_; }
  const Policy& policy() const { return *policy_; }
  // Rows appended to layer 0 (every layer holds the same tokens).
  int64_t n_tokens() const { return stores_.empty() ? 0 : stores_[0].n_rows(); }

  // Forward calls (kv/policy.h): BeginCall announces that rows [n_tokens(), n_tokens() + n_new)
  // are about to be appended to every layer; inside the call each layer appends all of them
  // (Append; the last one delivers OnAppended) before its first query (ObserveQuery, Attend);
  // EndCall follows the last query.
  // n_new may be 0 (queries over the rows already held). Breaking that order is a programmer
  // error (CHECK). Every event's error names the layer and the cause; after one, the cache is
  // failed: every later call returns the same error (the sequence cannot continue exactly).
  // `pool` (may be null) is lent to the policy's call-boundary work (Policy::OnAppended).
  Status BeginCall(int64_t n_new, CallKind kind, ThreadPool* pool = nullptr);
  // Appends one token's row(s) (see LayerStore::Append) and notifies the policy.
  Status Append(int layer, const float* k, const float* v);
  // Attention of one query at position `pos` (it sees rows [0, pos]) through the policy.
  // q: [n_q_heads, k_dim]; out: [n_q_heads, v_dim]. The token at pos must already be appended.
  Status Attend(int layer, const float* q, int64_t pos, ThreadPool* pool, float* out);
  // Dense reads in bulk (Policy::ClaimDenseReads): whether the policy lets the caller compute
  // the attention of the call's m queries at positions first_pos .. first_pos + m - 1 (each
  // reading rows [0, pos]) from store(layer)'s rows itself; true counts them as m Attend calls.
  // False: read each with Attend. Their tokens must already be appended.
  bool ClaimDenseReads(int layer, int64_t first_pos, int m);
  // Staged reads in bulk (Policy::ClaimStagedReads): as ClaimDenseReads, but each query at
  // position pos reads rows [0, plan->Split(pos + 1)) as StagePrefixRows gives them and the rest
  // of [0, pos] from store(layer). True counts them as m Attend calls.
  bool ClaimStagedReads(int layer, int64_t first_pos, int m, StagedPrefixPlan* plan);
  // After ClaimStagedReads: rows [s0, s0 + sn) of KV head h as the policy reads them (f32 keys
  // [sn, k_dim], values [sn, v_dim] unless null).
  void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                       float* values) const;
  Status EndCall();
  bool in_call() const { return in_call_; }
  const CacheCall& call() const { return call_; }

  // Prefill observation. BeginPrefill announces that positions [first, end) are about to be
  // prefilled (in one or more calls of kind kPrefill); the model then offers every prompt query
  // through ObserveQuery (after the query's own row is appended), which delivers those among the
  // policy's last observation_queries() at once, with their exact causal weights: memory is one
  // [n_q_heads, pos + 1] buffer, never n_obs x T. EndPrefill, after the last call, is the
  // compression point: it calls OnCompress on every layer.
  void BeginPrefill(int64_t first, int64_t end);
  // The weights are computed on `pool` (none: this thread); the result does not depend on it.
  Status ObserveQuery(int layer, int64_t pos, const float* q, ThreadPool* pool = nullptr);
  // Whether ObserveQuery delivers a query at pos (its position is in the observed window, on the
  // policy's observation stride).
  bool observes(int64_t pos) const {
    return pos >= obs_first_ && pos < obs_end_ && (pos - obs_first_) % obs_stride_ == 0;
  }
  // Whether the policy takes observed weights as column sums (Policy::
  // observation_takes_column_sums): then a model may deliver the observed queries of a run
  // through ObserveColumnSums (sums as PrefillColumnSums lays them out) instead of ObserveQuery.
  // Every position in [first_query, end_query) must be observed, and none of them offered
  // through ObserveQuery as well.
  bool takes_column_sums() const;
  Status ObserveColumnSums(int layer, int64_t first_query, int64_t end_query, const double* sums);
  Status EndPrefill(ThreadPool* pool);
  // An explicit compression point without observations (outside a call).
  Status Compress(ThreadPool* pool = nullptr);

  // The first error of an event (OK while none): the cache refuses every call after it.
  const Status& status() const { return status_; }
  const CacheCounters& counters() const { return counters_; }
  // The recurrent layers' state (RecurrentGeometry): recurrent_state(i) is layer i's
  // [state_floats] f32, recurrent_conv(i) its [conv_floats] f32 (i counts recurrent layers only).
  // Written by the model inside a call; zero in a new cache.
  const RecurrentGeometry& recurrent() const { return recurrent_; }
  float* recurrent_state(int i) { return &recurrent_buf_[Slot(i)]; }
  float* recurrent_conv(int i) { return &recurrent_buf_[Slot(i) + recurrent_.state_floats]; }
  const float* recurrent_state(int i) const { return &recurrent_buf_[Slot(i)]; }
  const float* recurrent_conv(int i) const {
    return &recurrent_buf_[Slot(i) + recurrent_.state_floats];
  }
  // Bytes of the recurrent state (fixed per sequence, independent of the context).
  int64_t RecurrentBytes() const { return recurrent_.bytes_per_sequence(); }

  // Resident bytes over all layers as the policy accounts them, plus the recurrent state.
  int64_t ResidentBytes() const;
  // ResidentBytes by part, summed over the layers (Policy::ResidentBreakdown), and the
  // recurrent state as its own part ("recurrent state") when the model has one.
  ResidentParts ResidentBreakdown() const;
  // The policy's bound of ResidentBytes while the cache holds at most n_rows rows
  // (Policy::PeakResidentBytes summed over the layers), plus the recurrent state.
  int64_t PeakResidentBytes(int64_t n_rows) const;
  // Bytes per token of the full (uncompressed) cache, summed over the global layers (a local
  // layer's bytes do not grow with the context: see LocalResidentBytes).
  int64_t FullBytesPerToken() const;
  // Resident bytes the full cache would hold for the same rows (LayerStore::full_resident_bytes),
  // plus the recurrent state (which every policy holds alike).
  int64_t FullResidentBytes() const;
  // Bytes the sliding-window layers hold now (every policy holds them alike).
  int64_t LocalResidentBytes() const;
  // The policy's summaries of every global layer, summed (PolicySummary::Add).
  PolicySummary Summary() const;

  // Sees every query Attend serves (model layer, position, q as Attend takes it) before it is
  // read: benchmarks capture a model's own decode queries with it. Empty (the default): none.
  // A fork starts without one.
  using QueryTap = std::function<void(int layer, int64_t pos, const float* q)>;
  void set_query_tap(QueryTap tap) { query_tap_ = std::move(tap); }

 private:
  KvCache(std::vector<LayerGeometry> layers, std::unique_ptr<Policy> policy,
          RecurrentGeometry recurrent);
  KvCache() = default;
  size_t Slot(int i) const {
    STRATA_CHECK_MSG(i >= 0 && i < recurrent_.n_layers, "recurrent layer out of range");
    return static_cast<size_t>(i) * (recurrent_.state_floats + recurrent_.conv_floats);
  }
  // Applies a policy's plan to a layer; `floor` is the first row no released page may hold.
  Status Apply(int layer, const CachePlan& plan, int64_t floor, const char* event);
  // OnAppended for a layer whose rows of the call are all in, once per call (at its last row).
  Status Seal(int layer);
  // CHECKs that the layer's rows of the call are all appended (queries and EndCall need it).
  void CheckSealed(int layer, const char* what) const;
  // ClaimDenseReads (plan null) and ClaimStagedReads.
  bool ClaimReads(int layer, int64_t first_pos, int m, StagedPrefixPlan* plan);
  // A local layer's exact read of rows [pos - window + 1, pos] into st.
  void ReadWindow(int layer, const float* q, int64_t pos, ThreadPool* pool, SoftmaxStates* st,
                  ReadStats* stats) const;
  // Releases a local layer's pages that no query at position >= n_rows() reads.
  void SlideWindow(int layer);
  // Records the first error (with the layer and event as context) and returns it.
  Status Fail(const Status& s, int layer, const char* event);

  std::vector<LayerStore> stores_;
  std::vector<int> policy_layer_;       // [n_layers] the policy's layer index, -1 when local
  std::vector<int64_t> window_floor_;   // [n_layers] local layers: pages below this are released
  std::unique_ptr<Policy> policy_;
  RecurrentGeometry recurrent_;
  std::vector<float> recurrent_buf_;  // [n_layers, state_floats + conv_floats] f32
  SoftmaxStateBuffer scratch_;
  CacheCounters counters_;
  Status status_;
  QueryTap query_tap_;
  // The running call.
  bool in_call_ = false;
  CacheCall call_;
  ThreadPool* call_pool_ = nullptr;
  std::vector<int64_t> appended_;  // [n_layers] rows of the call appended so far
  std::vector<uint8_t> sealed_;    // [n_layers] OnAppended done for the call
  // Observation window: queries at positions [obs_first_, obs_end_) are delivered, every
  // obs_stride_-th from obs_first_ (Policy::observation_stride).
  int64_t obs_first_ = 0, obs_end_ = 0, obs_stride_ = 1;
  std::vector<float> obs_w_;
};

}  // namespace strata
