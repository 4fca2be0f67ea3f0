// Geodesia-KV observation: block mass and token scores from the prefill observer (§2.1), the
// per-call block mass of the first decode query, and the mass EMA.
//
// Prefill, per KV head h with G query heads: every observed query row (one per query head and
// observed position) contributes its exact softmax weights w_j;
//   block_mass_b  = mean over the rows of sum_{j in b} w_j   (sums to 1 over blocks)
//   token_score_j = sum over the rows of w_j                 (not the mean)
// Decode: m_now_b = mean over the G query heads of sum_{j in b} w_j; the EMA is
//   m_b <- d * m_b + (1 - d) * m_now_b,
// with the prefill prior applied ONCE, at the first update (§11.6: the reference re-applies
// it whenever the state grows by a block; we do not). Blocks that appear later start at 0.
// Sums over the G query heads of a group run in sorted order of the heads' contributions, so
// permuting the query heads of a group changes no bit of the mass (§12.13).
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/policy.h"

namespace strata::geodesia {

class PrefillObserver {
 public:
  // token_scores: also keep per-token scores (the RD residual needs them).
  PrefillObserver(int n_kv_heads, int group, bool token_scores);

  // One observed query (weights [n_q_heads, n_keys]; CHECK that they are present).
  void Add(const PrefillObservation& obs);

  int64_t n_rows(int h) const { return rows_[h]; }
  // block_mass for blocks [0, n_blocks) (zeros when nothing was observed).
  std::vector<double> BlockMass(int h, int64_t n_blocks) const;
  // token_score for positions [0, n) (zeros past what was observed).
  std::vector<double> TokenScore(int h, int64_t n) const;

 private:
  int n_kv_heads_, group_;
  bool token_scores_;
  std::vector<int64_t> rows_;                    // [n_kv] observed rows
  std::vector<std::vector<double>> block_sum_;   // [n_kv][blocks]
  std::vector<std::vector<double>> token_sum_;   // [n_kv][tokens]
};

// Block masses of one call from per-block online-softmax partials of the G query heads of a KV
// head: m[b * G + r], d[b * G + r] (d = 0: the block was not read by head r, e.g. a
// compressed-Quest page it did not select). Returns m_now[b] = mean_r d_br e^{m_br - M_r} / Z_r.
std::vector<double> BlockMassFromStates(const float* m, const float* d, int64_t n_blocks,
                                        int group);

class MassEma {
 public:
  // Sets the prior used at the first Update (prompt blocks; later blocks start at 0).
  void SetPrior(std::vector<double> prior) {
    prior_ = std::move(prior);
    prior_pending_ = true;
  }
  bool prior_pending() const { return prior_pending_; }
  // Grows the state to now.size() blocks (new blocks 0, or the prior on the first call) and
  // applies m <- d m + (1 - d) now.
  void Update(const std::vector<double>& now, double decay);
  const std::vector<double>& mass() const { return m_; }
  double mass(int64_t b) const { return b < static_cast<int64_t>(m_.size()) ? m_[b] : 0.0; }

 private:
  std::vector<double> m_;
  std::vector<double> prior_;
  bool prior_pending_ = false;
};

}  // namespace strata::geodesia
