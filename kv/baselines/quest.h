// Quest baseline: query-aware page selection over the exact cache (which stays resident).
//
// Pages are the store's 64-row pages. When a page fills, the per-channel min and max of its exact
// (bf16) keys are stored per KV head as f16 rounded outward (min down, max up), so the bound
//   U_b(q) = scale * sum_c max(q_c kmin_c, q_c kmax_c) >= scale * q . k_j  for every row j of b
// holds exactly. A key beyond the f16 range gives an infinite edge (core/dtype.h F16RoundUp), so
// the bound is +inf for a query pointing at it, never below the true score; channels with q_c = 0
// are skipped, so 0 * inf does not make it NaN. From the first compression point on (prefill is
// exact), a query at position pos scores the boxes of the closed pages up to its own, and reads
// the top k candidate pages (pages entirely before its own page, b < floor(pos / 64); ties:
// higher bound, then lower index) plus its own page's rows [floor(pos / 64) * 64, pos].
// Unselected pages get no weight.
//
// Budget, k pages of the n_cand candidates:
//   --quest-pages K   k = min(K, n_cand);
//   --quest-keep F    k = min(n_cand, max(1, ceil(F * n_cand)))   (keep_frac, 0 < F <= 1);
//   otherwise --ratio R: k = min(n_cand, max(1, round(n_cand / R)))  (m / 64 pages of the prefix).
// Heads (--quest-heads): `shared` (default) selects per KV head by the max over its query heads
// of U_b (MLA: one selection for all heads), and all heads of the group read the same pages;
// `each` selects per query head (the Quest paper), and a KV head's bytes are the union of its
// heads' pages. With k >= n_cand the read is exact and identical to `full`.
//
// Accounting: bytes read = rows read x row bytes + every box scanned (2 * k_dim f16 per page per
// KV head); resident = the store + the boxes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

struct QuestConfig {
  double ratio = 32;
  int64_t pages = 0;  // > 0: fixed page count
  double keep = 0;    // > 0: fraction of candidates
  bool each = false;  // per-query-head selection
  static StatusOr<QuestConfig> FromSpec(const PolicySpec& spec);
  // The number of candidate pages read for n_cand candidates.
  int64_t KeepPages(int64_t n_cand) const;
};

class QuestPolicy final : public Policy {
 public:
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new QuestPolicy(*this));
  }
  explicit QuestPolicy(QuestConfig cfg) : cfg_(cfg) {}
  std::string name() const override { return "quest"; }
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  Status OnAppend(int layer, const LayerStore& store) override;
  Status OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                    ThreadPool* pool) override {
    layers_[layer].active = true;
    return OkStatus();
  }
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                       ReadStats* stats) override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // The store's pages plus a box (2 k_dim f16) per closed page and KV head.
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override {
    return FullPageBytes(g, n_rows) +
           n_rows / LayerStore::kPageRows * g.n_kv_heads * 2 * g.k_dim * 2;
  }
  // Pages are chosen per query (no kept row set): compressed = a query at the end of the cache
  // would read fewer candidate pages than there are (KeepPages, the plan Read follows).
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  const QuestConfig& config() const { return cfg_; }
  // Box of closed page p of KV head h: [k_dim] f16 min and max.
  const uint16_t* box_min(int layer, int h, int64_t p) const;
  const uint16_t* box_max(int layer, int h, int64_t p) const;
  int64_t n_boxes(int layer) const { return layers_[layer].n_boxes; }
  // The candidate pages selected by the last read of KV head h (shared) or query head h (each).
  const std::vector<int64_t>& last_selection(int layer, int h) const {
    return layers_[layer].sel[h];
  }
  // U_b(q) of page p for one query head (qh: [k_dim]) against KV head h.
  float Bound(int layer, int h, int64_t p, const float* qh) const;

 private:
  struct Layer {
    LayerGeometry g;
    bool active = false;
    int64_t n_boxes = 0;
    std::vector<std::vector<uint16_t>> lo, hi;  // [n_kv][n_boxes * k_dim] f16
    std::vector<std::vector<int64_t>> sel;      // [n_kv or n_q][pages] last selection
    std::vector<std::vector<int64_t>> sets;     // read scratch
  };
  QuestConfig cfg_;
  std::vector<Layer> layers_;
};

// quest's declared settings; defaults are QuestConfig's initial values.
PolicySettings QuestSettings();
StatusOr<std::unique_ptr<Policy>> MakeQuestPolicy(const PolicySpec& spec);

}  // namespace strata::baselines
