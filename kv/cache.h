// KvCache: the per-layer stores of one sequence, the policy that reads and compresses them, and
// the counters every report is built from.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

class KvCache {
 public:
  // Binds the policy to the layers; errors from Bind are returned as they are.
  static StatusOr<std::unique_ptr<KvCache>> Create(std::vector<LayerGeometry> layers,
                                                   std::unique_ptr<Policy> policy);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_layers() const { return static_cast<int>(stores_.size()); }
  const LayerGeometry& geometry(int layer) const { return stores_[layer].geometry(); }
  const LayerStore& store(int layer) const { return stores_[layer]; }
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
  Status BeginCall(int64_t n_new, CallKind kind);
  // Appends one token's row(s) (see LayerStore::Append) and notifies the policy.
  Status Append(int layer, const float* k, const float* v);
  // Attention of one query at position `pos` (it sees rows [0, pos]) through the policy.
  // q: [n_q_heads, k_dim]; out: [n_q_heads, v_dim]. The token at pos must already be appended.
  Status Attend(int layer, const float* q, int64_t pos, ThreadPool* pool, float* out);
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
  Status ObserveQuery(int layer, int64_t pos, const float* q);
  Status EndPrefill(ThreadPool* pool);
  // An explicit compression point without observations (outside a call).
  Status Compress();

  // The first error of an event (OK while none): the cache refuses every call after it.
  const Status& status() const { return status_; }
  const CacheCounters& counters() const { return counters_; }
  // Resident bytes over all layers as the policy accounts them.
  int64_t ResidentBytes() const;
  // ResidentBytes by part, summed over the layers (Policy::ResidentBreakdown).
  ResidentParts ResidentBreakdown() const;
  // Bytes per token of the full (uncompressed) cache, summed over layers.
  int64_t FullBytesPerToken() const;
  // Resident bytes the full cache would hold for the same rows (LayerStore::full_resident_bytes).
  int64_t FullResidentBytes() const;
  // The policy's summaries of every layer, summed (PolicySummary::Add).
  PolicySummary Summary() const;

 private:
  KvCache(std::vector<LayerGeometry> layers, std::unique_ptr<Policy> policy);
  // Applies a policy's plan to a layer; `floor` is the first row no released page may hold.
  Status Apply(int layer, const CachePlan& plan, int64_t floor, const char* event);
  // OnAppended for a layer whose rows of the call are all in, once per call (at its last row).
  Status Seal(int layer);
  // CHECKs that the layer's rows of the call are all appended (queries and EndCall need it).
  void CheckSealed(int layer, const char* what) const;
  // Records the first error (with the layer and event as context) and returns it.
  Status Fail(const Status& s, int layer, const char* event);

  std::vector<LayerStore> stores_;
  std::unique_ptr<Policy> policy_;
  SoftmaxStateBuffer scratch_;
  CacheCounters counters_;
  Status status_;
  // The running call.
  bool in_call_ = false;
  CacheCall call_;
  std::vector<int64_t> appended_;  // [n_layers] rows of the call appended so far
  std::vector<uint8_t> sealed_;    // [n_layers] OnAppended done for the call
  // Observation window: queries at positions [obs_first_, obs_end_) are delivered.
  int64_t obs_first_ = 0, obs_end_ = 0;
  std::vector<float> obs_w_, obs_kbuf_;
};

}  // namespace strata
