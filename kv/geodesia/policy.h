// GeodesiaPolicy: Geodesia-KV over GQA/MHA layers. The cache of record is a GradedLayer per
// layer (64-token blocks at 16/8/4/2/1 bits, exact residual rows, and key boxes when the
// compressed-Quest gate is on: nothing else reads them, and the reference charges them only then,
// §1.5); a budgeted allocator demotes blocks by observed attention mass (once per KV head
// per call, shared by the group's query heads); reads are the packed kernel over the graded blocks
// (optionally only the compressed-Quest pages) merged with the exact rows of the current block.
// Reference: docs/reference/geodesia-kv.md §1.5, §2, §3, §4, §11 (the § numbers here);
// docs/geodesia.md.
//
// Life of a layer:
//   * before the first compression point (end of the first prefill, or Compress()) the policy is
//     inactive: rows go to the LayerStore AND the graded layer (all exact), reads are ReadPrefix
//     (bit-identical to `full`), and the prefill observer collects block mass / token scores;
//   * at the first compression point: the prefill prior is recorded, and (rd-frac > 0) the RD
//     residual tokens are chosen and copied exactly (once);
//   * a "call" is one forward pass (kv/policy.h; KvCache::BeginCall .. EndCall): every layer
//     appends its rows, then reads its queries. The call's first read is its first query
//     (q_offset; BeginCall marks it pending): it
//     computes the per-block attention mass of that query over the current cache (mean over the
//     group's query heads), updates the EMA (prior applied once), runs the allocator against the
//     layer budget and demotes (levels only go down), then attends over the new representation;
//     later reads of the same call only attend;
//   * a read for a query that sees rows [0, limit) attends the graded blocks that lie wholly
//     below limit through the packed kernel, and rows [64 floor(limit / 64), limit) exactly from
//     the LayerStore (those blocks are hot): queries inside a chunk never see later rows;
//   * LayerStore pages of blocks wholly before the current call's first row are released at
//     BeginCall (a plan the cache applies; their
//     exact form, when they are still at 16 bits, lives in the graded layer), so resident memory is
//     the graded layer plus at most a few pages per head.
// Decisions (§11): prior applied once; boxes refreshed when a block closes (blocks.h);
// bits >= 16 means "everything exact" (the allocator does not run: the reference ratchet would
// demote one step per call even at B = 16); with the compressed-Quest gate and the allocator both
// on, the mass of a call comes from the pages the query really read (unread pages count 0) so that
// the gate keeps its read savings; without prefill observations no RD residual is chosen; the
// group's block mass (decode and prefill) sums the G query heads' contributions in sorted order,
// so that permuting the query heads of a group changes no bit of the state (§12.13).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/packed_attention.h"
#include "kv/geodesia/allocator.h"
#include "kv/geodesia/blocks.h"
#include "kv/geodesia/observer.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata {

struct GeodesiaConfig {
  double bits = 5;             // B, bits per value per layer (`bits`); >= 16: everything exact
  int group = 64;              // g (`group`)
  // `group` not given: Bind sets it to the largest power of two dividing 64 and the head dim
  // (auto_head_dim: the head dim that chose it, for describe()).
  bool group_auto = false;
  int auto_head_dim = 0;
  double decay = 0.5;          // EMA decay d (`decay`)
  int64_t window = 128;        // exact recent window in tokens (`window`)
  int64_t sinks = 4;           // sink tokens: ceil(sinks / 64) blocks stay exact (`sinks`; 0: none)
  double rd_frac = 0;          // f of the RD residual (`rd-frac`); 0: off
  double quest_keep = 1;       // compressed-Quest keep fraction (`quest-keep`); 1: gate off
  geodesia::Ratchet ratchet = geodesia::Ratchet::kReference;     // `ratchet reference|clean`
  geodesia::DemotionMode requant = geodesia::DemotionMode::kOnce;  // `requant once|cascade`
  // `mass exact|compressed` (default compressed; exact costs +8 bits per value resident): where
  // a call's block attention mass comes from. exact (the
  // reference, §2.1): the first query's softmax over the EXACT keys of every row (the policy then
  // keeps a bf16 copy of every key, charged in ResidentBytes as its own part but, like the
  // reference's dense simulation, not in the §1.5 figures); compressed: over the cache as it is
  // stored (dequantized blocks, centroids), no extra copy.
  enum class Mass { kExact, kCompressed };
  Mass mass = Mass::kCompressed;
  // `candidates reference|exact`: the allocator's multiplier list (allocator.h).
  geodesia::Candidates candidates = geodesia::Candidates::kReference;
  double mass_power = 1;       // p (`mass-power`)
  // Retrieval-safe settings (beyond the reference; the struct's defaults are the reference, the
  // `retrieval` profile, geodesia's default, sets them as RetrievalProfile() says):
  // `floor`: the lowest level a block may take (1: the centroid, the reference; 2: every block
  // keeps per-token codes, so every token stays recoverable).
  int floor = 1;
  // `predecessor exact|coded`: the closed block before the query's block is hot (exact; the
  // reference) or graded like any other closed block (with window <= 64, only the query's own
  // block stays exact, as KIVI keeps only its recent rows).
  bool predecessor_exact = true;
  // `salience`: a query-independent share of attention mass mixed into every block's mass,
  // damage = (m_b + salience / nb)^p e_b(L): blocks the prefix queries do not attend still
  // weigh by their own error (key range, centroid radius), so outlier blocks keep codes.
  double salience = 0;
  // `rd-score mass|value`: the RD residual's token score, mass (the reference: prefill
  // attention x value residual^2) or value (the value residual^2 alone: query-independent).
  bool rd_value_score = false;
  double value_weight = 0;     // w_v (`value-weight`)
  // `budget levels|all`: levels (reference) = the budget covers the block levels only, residual
  // rows and boxes (kept only with the Quest gate) come on top; all = they are charged against it
  // too (the resident total meets B).
  bool budget_all = false;
  // Tests only (no setting): the graded layer also keeps the open block's rows in its own exact
  // slot, as v1 did (the open block then resident twice: the LayerStore page and that slot).
  // Off, the LayerStore page is its one copy and the graded layer stores a block when it closes.
  bool graded_open_block = false;
  // Arithmetic of the packed read's quantized blocks (setting attn-math; cache | f32 | int8):
  // math_from_cache (`cache`, the default) takes it from the bound layers' --attn-math at Bind.
  geodesia::PackedMath math = geodesia::PackedMath::kF32;
  bool math_from_cache = false;

  bool quest() const { return quest_keep < 1; }
  bool allocate() const { return bits < 16; }
  // Observed prompt queries: 64 with the RD residual on, else 32 (§2.1).
  int n_obs() const { return rd_frac > 0 ? 64 : 32; }
  std::string ToString() const;
  // cquest: Compressed-Quest defaults (bits 16 = an exact cache, quest-keep 0.125).
  static StatusOr<GeodesiaConfig> FromSpec(const PolicySpec& spec, bool cquest);
  // `profile retrieval|reference`: the defaults of bits, floor, sinks, window and predecessor.
  // reference = this struct's initial values (the paper's method: centroids allowed, a sink block,
  // a 128-token exact window and the predecessor block hot, 5 bits); retrieval = RetrievalProfile()
  // (geodesia's default since issue 18: every closed block keeps per-token codes, only the
  // query's own block exact, 3.4 bits; docs/geodesia.md has the tables that chose it). A setting
  // given explicitly overrides its profile's value.
  enum class Profile { kRetrieval, kReference };
  Profile profile = Profile::kReference;
  // The retrieval profile applied to `c` (the five settings above; nothing else changes).
  static GeodesiaConfig RetrievalProfile(GeodesiaConfig c);
};

// Counters of the reference rate accounting (§1.5), summed over reads (queries), layers and
// query heads. bpv = bits / values.
struct GeodesiaStats {
  int64_t calls = 0;             // allocator calls (first queries of a call, per layer; each
                                 // runs the allocator once per KV head)
  int64_t demotions = 0;         // block re-encodes
  double values = 0;             // sum of 2 T D per (read, query head)
  double resident_bits = 0;      // closed form per (read, query head): levels + residual + boxes
  double read_bits = 0;          // reference: per query head's own page set (dense = resident)
  double read_bits_union = 0;    // engine: per KV head, the union its query heads read, charged
                                 // once per query head (bits actually fetched x G)
  double resident_bpv() const { return values > 0 ? resident_bits / values : 0; }
  double read_bpv() const { return values > 0 ? read_bits / values : 0; }
  double read_bpv_union() const { return values > 0 ? read_bits_union / values : 0; }
};

// The declared settings of geodesia (cquest: Compressed-Quest, whose bits and quest-keep
// defaults differ); the other defaults are GeodesiaConfig's initial values.
PolicySettings GeodesiaSettings(bool cquest);

class GeodesiaPolicy final : public Policy {
 public:
  explicit GeodesiaPolicy(GeodesiaConfig config, std::string name = "geodesia");
  ~GeodesiaPolicy() override;

  std::string name() const override { return name_; }
  std::string describe() const override { return name_ + ": " + c_.ToString(); }
  // Every layer copied (graded blocks, observer, EMA, residual, scratch of its own), the read
  // scratch fresh; a pending test failure (FailNextDemotionForTesting) is copied too.
  StatusOr<std::unique_ptr<Policy>> Clone() const override;
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  int64_t observation_queries(int64_t prompt_len) const override;
  Status OnPrefillStats(int layer, const LayerStore& store, const PrefillObservation& obs) override;
  Status BeginCall(int layer, const LayerStore& store, const CacheCall& call,
                   CachePlan* plan) override;
  Status OnAppend(int layer, const LayerStore& store) override;
  Status OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  // Until the layer's compression point Read is ReadPrefix with no other effect, so a prefill
  // chunk's reads are granted in bulk (model/gqa_prefill.h), exactly as `full`'s.
  bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                       ReadStats* stats) override;
  // Until the compression point a prompt is held twice: in the LayerStore pages and, block by
  // block as they close, in the graded layer's exact slots (2x full); `mass exact` adds its bf16
  // key copy (+0.5x) and the Quest gate its f16 key boxes (2 k_dim f16 per 64 rows and KV head:
  // at most 1/32 of a full row pair), and rd-frac's exact residual rows with their overlay
  // index up to 2 rd-frac (measured 1.56 rd-frac at D = 128). Tested in
  // kv/geodesia/policy_test.cc (PeakResidentWithinDeclaredFactor) and kv/conformance_test.cc.
  double peak_resident_factor() const {
    return 2.0 + (c_.mass == GeodesiaConfig::Mass::kExact && c_.allocate() ? 0.5 : 0.0) +
           (c_.quest() ? 1.0 / 32 : 0.0) + 2.0 * c_.rd_frac;
  }
  // peak_resident_factor() times the full pages of n_rows.
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override {
    return static_cast<int64_t>(
        std::ceil(peak_resident_factor() * static_cast<double>(FullPageBytes(g, n_rows))));
  }
  // LayerStore pages still held + the graded layer's live bytes (payload, scales, boxes, residual
  // rows). The slabs' free capacity between compactions is GradedLayer::allocated_bytes().
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // No row selection; blocks = closed 64-token blocks x KV heads; compressed = some block is
  // below 16 bits, or (Quest gate) the last read of the layer skipped a closed block.
  PolicySummary Summary(int layer, const LayerStore& store) const override;
  // Levels 16, 8, 4, 2, 1; per KV head the level of every block of the graded layer.
  bool BlockLevels(int layer, std::vector<int>* levels,
                   std::vector<std::vector<int>>* per_head) const override;

  // For benchmarks that fill a cache synthetically (no prefill, no queries), between calls: runs
  // the allocator on the current EMA (no mass update) as a call whose first query sits at
  // n_rows - 1 (n_rows = the layer's rows now); the next call then releases the LayerStore pages
  // of the blocks before its first row. The layer must be active (Compress() first).
  Status Maintain(int layer, int64_t n_rows, ThreadPool* pool = nullptr);
  // Tests: the next block demotion fails with `s` (as GradedLayer::Demote does on a block it
  // cannot re-encode), so that tests can check the error reaches the caller.
  void FailNextDemotionForTesting(Status s);

  const GeodesiaConfig& config() const { return c_; }
  const GeodesiaStats& stats() const { return stats_; }
  bool active(int layer) const;
  const geodesia::GradedLayer& graded(int layer) const;
  // The EMA mass of KV head h (blocks beyond the state read 0).
  const std::vector<double>& mass(int layer, int h) const;
  // Positions of the RD residual of KV head h (ascending; empty when off).
  const std::vector<int64_t>& residual_positions(int layer, int h) const;
  // Allocator runs for KV head h of `layer` so far: one per call (the call's first query) and
  // per Maintain, shared by the head's G query heads (§12.13).
  int64_t allocator_runs(int layer, int h) const;
  // Blocks read by query head r at the last read of `layer` (graded blocks, ascending; the exact
  // tail rows are not listed). For tests of the compressed-Quest gate.
  const std::vector<int64_t>& last_read_blocks(int layer, int r) const;

 private:
  struct Layer;
  struct ReadScratch;
  Status Activate(int layer, const LayerStore& store);
  Status RunAllocator(int layer, int64_t q_offset, std::vector<char>* changed, ThreadPool* pool);
  // Plans the release of the LayerStore pages of blocks [released_upto, upto_block).
  void ReleasePages(int layer, const LayerStore& store, int64_t upto_block, CachePlan* plan);

  GeodesiaConfig c_;
  std::string name_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<ReadScratch> scratch_;  // shared by the layers' reads
  bool any_active_ = false;
  GeodesiaStats stats_;
  Status fail_next_demotion_;
};

StatusOr<std::unique_ptr<Policy>> MakeGeodesiaPolicy(const PolicySpec& spec, bool cquest);

}  // namespace strata
