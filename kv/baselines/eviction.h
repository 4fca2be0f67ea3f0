// Row-eviction baselines: StreamingLLM, H2O, H2O+recent, SnapKV and uniform random rows.
//
// All of them are exact until the first compression point (the end of a prefill call): the
// prefill itself is classic attention, as in the compression-before-query protocol. At a
// compression point with n rows held, m = max(1, round(n / ratio)) and each policy keeps
//   streaming   sinks [0, 4) + a sliding window of the last m rows of every query (the window
//               includes the query itself and slides during decode: StreamingLLM proper);
//   h2o         the top m rows by accumulated attention (column sums of the exact softmax weights
//               of the observed prompt queries, all of them by default: --h2o-queries);
//   h2o-recent  the last floor(m / 2) rows + the top m - floor(m / 2) of the others by H2O score;
//   snapkv      the observation window (the last 32 prompt rows, --snap-window) + the top m of
//               the rows before it by column sums of the window's queries, average-pooled over
//               positions (kernel 7, stride 1, zero padding 3, divided by 7: avg_pool1d);
//   random      m rows drawn uniformly without replacement (--seed; the same rows for every
//               KV head);
// and every row appended after the compression point (generated tokens) is read too, except by
// streaming, whose window covers them. A later compression point chooses again among the rows
// still kept and the rows appended since, with m from the new row count.
//
// Heads: MLA layers have one latent stream, so one row set is shared by all query heads. GQA
// layers: h2o, h2o-recent and snapkv select per KV head from the summed scores of the G query
// heads of its group (each KV head reads its own rows); streaming and random use one set for all
// KV heads.
//
// Memory: evicted rows are not read but stay in the LayerStore (the policy keeps the cache of
// record, like vestige --archive ram); ResidentBytes counts them, plus the policy's tables.
// The comparison figure is bytes read per step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

enum class EvictionKind { kStreaming, kH2o, kH2oRecent, kSnapKv, kRandom };

struct EvictionConfig {
  EvictionKind kind = EvictionKind::kStreaming;
  double ratio = 32;
  int sinks = 4;            // streaming: --sinks
  int64_t h2o_queries = 0;  // h2o, h2o-recent: observe the last N prompt queries (0: all)
  int64_t snap_window = 32; // snapkv: --snap-window
  int snap_kernel = 7;      // snapkv: --snap-kernel (odd)
  uint64_t seed = 1;        // random: --seed

  static StatusOr<EvictionConfig> FromSpec(const PolicySpec& spec, EvictionKind kind);
};

const char* EvictionName(EvictionKind kind);

class EvictionPolicy final : public Policy {
 public:
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new EvictionPolicy(*this));
  }
  explicit EvictionPolicy(EvictionConfig cfg) : cfg_(cfg) {}

  std::string name() const override { return EvictionName(cfg_.kind); }
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  int64_t observation_queries(int64_t prompt_len) const override;
  bool observation_needs_weights() const override { return true; }
  Status OnPrefillStats(int layer, const LayerStore& store, const PrefillObservation& obs) override;
  bool observation_takes_column_sums() const override { return true; }
  Status OnPrefillColumnSums(int layer, const LayerStore& store,
                             const PrefillColumnSums& sums) override;
  Status OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                       ReadStats* stats) override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // The store's pages (evicted rows stay there), the score columns (one double per row and KV
  // head, kept from the first observation on) and the kept-row lists (at most m rows per set).
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override;
  // Rows kept = the rows a query at the end reads (kept rows + rows since the compression point;
  // streaming: sinks + window), per KV head; compressed = some visible row is not read.
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  const EvictionConfig& config() const { return cfg_; }
  // State after the last compression point (for tests and reports).
  bool compressed(int layer) const { return layers_[layer].compressed; }
  // Rows held at the last compression point; rows at or after it are always read (not streaming).
  int64_t boundary(int layer) const { return layers_[layer].boundary; }
  // The kept rows below boundary() of row set s (s: KV head, or 0 when shared), ascending.
  const std::vector<int64_t>& kept(int layer, int s) const { return layers_[layer].kept[s]; }
  int n_sets(int layer) const { return static_cast<int>(layers_[layer].kept.size()); }
  // streaming: the window length m.
  int64_t window(int layer) const { return layers_[layer].window; }
  // h2o / snapkv: the accumulated column sums of KV head h (summed over its query heads).
  const std::vector<double>& scores(int layer, int h) const { return layers_[layer].score[h]; }
  // Observed queries delivered to the layer since its last compression point.
  int64_t observed(int layer) const { return layers_[layer].n_obs; }

 private:
  struct Layer {
    LayerGeometry g;
    bool compressed = false;
    bool all_kept = false;        // every row below boundary is kept: read like `full`
    int64_t boundary = 0;
    int64_t window = 0;           // streaming
    int64_t n_obs = 0;            // observations since the last compression
    int64_t compressions = 0;
    std::vector<std::vector<int64_t>> kept;   // [n_sets][rows]
    std::vector<std::vector<double>> score;   // [n_kv_heads][n_keys] column sums
    std::vector<std::vector<int64_t>> read;   // read scratch
  };
  bool per_head(const LayerGeometry& g) const;
  std::vector<int64_t> Select(Layer& L, int layer, int s, const std::vector<int64_t>& cand,
                              int64_t n, int64_t m);

  EvictionConfig cfg_;
  std::vector<Layer> layers_;
};

// The declared settings of one eviction baseline (each kind declares only the settings it
// reads); defaults are EvictionConfig's initial values.
PolicySettings EvictionSettings(EvictionKind kind);
StatusOr<std::unique_ptr<Policy>> MakeEvictionPolicy(const PolicySpec& spec, EvictionKind kind);

}  // namespace strata::baselines
