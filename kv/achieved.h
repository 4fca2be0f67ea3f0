// The compression a policy actually achieved on a run, measured by the cache's own counters
// beside what the full cache holds and reads for the same rows and queries, and the one check
// every report (eval, demo, generate, bench) uses to warn when a label promises more than that.
#pragma once

#include <cstdint>
#include <string>

#include "kv/cache.h"
#include "kv/policy.h"

namespace strata {

// Block levels of a graded policy (Policy::BlockLevels) at the end of a run: blocks per level per
// (layer, KV head), summed over runs. Empty `levels`: the policy has no graded blocks.
struct LevelHistograms {
  std::vector<int> levels;                                 // e.g. 16, 8, 4, 2, 1
  std::vector<std::vector<std::vector<int64_t>>> counts;   // [layer][KV head][level index]
  bool empty() const { return levels.empty(); }
  // Adds counts element-wise (an empty side takes the other's shape).
  void Add(const LevelHistograms& other);
  // Summed over heads: [layer][level index]; over everything: [level index].
  std::vector<std::vector<int64_t>> PerLayer() const;
  std::vector<int64_t> Total() const;
};
// The level of every block, [layer][KV head][block] (levels: as above); false when the policy
// has no graded blocks.
bool CacheBlockLevels(const KvCache& cache, std::vector<int>* levels,
                      std::vector<std::vector<std::vector<int>>>* blocks);
LevelHistograms CacheLevelHistograms(const KvCache& cache);

// Measured figures of one run, or a sum of runs (trials, windows: Add). Bytes are summed over
// layers; reads cover the measured queries only (e.g. the needle's question, a window's scored
// steps), resident bytes are taken at the end of the run.
struct AchievedCompression {
  int64_t resident_bytes = 0;       // KvCache::ResidentBytes()
  int64_t full_resident_bytes = 0;  // KvCache::FullResidentBytes()
  int64_t bytes_read = 0;           // CacheCounters::bytes_read_total over the measured queries
  int64_t full_bytes_read = 0;      // CacheCounters::full_bytes_read_total over them
  int64_t rows_read = 0;            // CacheCounters::rows_attended_total over them
  int64_t rows_visible_read = 0;    // CacheCounters::rows_visible_total over them
  int64_t reads = 0;                // CacheCounters::reads over them (0: no read measured)
  int64_t fallbacks = 0;            // CacheCounters::fallbacks_total over them (exact dense steps)
  PolicySummary policy = PolicySummary::Identity();  // KvCache::Summary() at the end
  // Where the resident bytes are at the end (KvCache::ResidentBreakdown), and archive file bytes.
  ResidentParts resident_parts;
  // The same resident bytes by layer kind: "mla" / "gqa" (the attention layers: their rows and
  // whatever the policy keeps for them) and "kda" (kimi-linear's recurrent state, fixed per
  // sequence; the only recurrent kind), in that order, present only where the model has them.
  // The parts add up to resident_bytes.
  ResidentParts resident_by_kind;
  int64_t runs = 0;  // how many runs this sums (MeasureAchieved: 1); means = figure / runs
  // Policy::recovered_error() at the end ("" when none; a sum keeps the first): an error the
  // policy recovered from exactly, e.g. a failed archive write that left the rows in RAM.
  std::string recovered;
  // Graded block levels at the end (summed over runs; empty for other policies).
  LevelHistograms levels;

  void Add(const AchievedCompression& other);
  // resident / full resident, read / full read; 0 when the full figure is 0.
  double resident_vs_full() const;
  double read_vs_full() const;
  // rows_kept / rows_visible of the policy's state, or -1 when it does not select rows.
  double kept_fraction() const;
};

// KvCache::ResidentBytes by layer kind (AchievedCompression::resident_by_kind).
ResidentParts ResidentByLayerKind(const KvCache& cache);

// The cache's figures now, with the reads counted since `since` (the counters at the start of
// the measured queries; a default CacheCounters: every read of the run).
AchievedCompression MeasureAchieved(const KvCache& cache, const CacheCounters& since = {});

// The verdict on one configuration's achieved figures.
struct CompressionCheck {
  // The policy changed something on this run and holds or reads fewer bytes than full (false for
  // the reference itself).
  bool compressed = false;
  // Empty, or one line naming `label` and everything wrong: it compressed nothing (and why), it
  // holds / reads more bytes than full (with the ratios), or it recovered from an error with an
  // exact fallback (and which). Printed after "warning: ".
  std::string warning;
};
CompressionCheck CheckAchieved(const std::string& label, const AchievedCompression& a);
// A policy with a bits-per-value budget below 16 (PolicySummary::budget_bits) that ends a run
// more than this many bits per value away from it (either way) gets a warning: e.g. Geodesia at
// 450 tokens, where the exact sink and recent blocks alone take ~5 bits per value.
inline constexpr double kBudgetMarginBits = 0.5;

}  // namespace strata
