// Geodesia-KV rate-distortion exact-token residual (§3): which prompt tokens keep an
// exact K/V copy that overrides their block's reconstruction.
//
// Run once, after prefill, from the prefill statistics only (target-free):
//   s_j = token_score_j * (max(vres_j, 1e-8) / mean_{i < P - w} max(vres_i, 1e-8))^value_power,
//   vres_j = ||v_j - mean_{block(j)} v||_2 (the block mean over the 64-row block, a partial last
//   prompt block padded by repeating its last row, as the reference does);
// s over positions [0, P - w) is smoothed by an average pool (kernel k, stride 1, zero padding
// k / 2, the padding counted in the denominator: every output divides by k); the last
// w = min(tail, P) prompt tokens are always kept, plus the top (capacity - w) pooled scores,
// capacity = min(P, max(w, ceil(f * P))) with ceil as the reference computes it (+0.999999,
// truncate). Ties: higher score first, then lower position. Continuation tokens never qualify.
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace strata::geodesia {

struct ResidualSelectOptions {
  double frac = 0;          // f (`rd-frac`)
  int64_t tail = 64;        // w: last prompt tokens always kept
  int pool_kernel = 5;      // odd
  double value_power = 2;   // alpha_v
};

// capacity = min(P, max(w, ceil(f P))).
int64_t ResidualCapacity(int64_t prompt_len, const ResidualSelectOptions& o);

// Selected positions, ascending. token_score, vres: [prompt_len].
std::vector<int64_t> SelectResidualTokens(const std::vector<double>& token_score,
                                          const std::vector<double>& vres, int64_t prompt_len,
                                          const ResidualSelectOptions& o);

// vres_j for j < prompt_len; value_row(j) returns the bf16 value row of token j ([head_dim]).
std::vector<double> ValueResiduals(const std::function<const uint16_t*(int64_t)>& value_row,
                                   int64_t prompt_len, int head_dim);

}  // namespace strata::geodesia
