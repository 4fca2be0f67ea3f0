// Geodesia-KV attention error certificate (§5): a bound on ||o - o_hat||_2 for one
// query head, where o is exact dense attention and o_hat attention over the compressed cache.
//
//   bound = sum_b a_b delta_b + min(2, M+/M- - M-/M+) * max_j ||v_j||_2,
//   M+- = sum_b a_b exp(+-eps_b),  a_b = compressed attention mass of block b,
// with eps_b >= |s_j - s_hat_j| for every token of block b (s = scale q.k) and delta_b >=
// ||v_j - v_hat_j||. The l1 term is computed in log space (logsumexp, exponents clamped to
// +-20) and clamped to [0, 2]; a block with eps_b = +inf (a hard mask) drives it to 2.
// Production eps_b = scale * ||q||_2 * ek_b, delta_b = ev_b (the accumulated re-encode errors of
// GradedLayer); exact residual tokens do not tighten the bound (they keep their block's terms).
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

// The bound from per-block inputs (all [n_blocks]).
double CertificateBound(const double* mass, const double* eps, const double* delta,
                        int64_t n_blocks, double max_v_norm);

// Everything for one query head q ([head_dim] f32) against KV head h of `layer`:
// mass a_b from an f64 attention over the compressed cache (residual overlay included, blocks
// outside `selected` masked; selected = null: all blocks), eps_b = scale * q_norm * ek_b (+inf for
// masked blocks), delta_b = ev_b, max_v_norm = max over blocks of v_norm_max (the open block's
// exact values included). q_norm: pass ||q||_2, or the max over the call's queries (production).
struct CertificateTerms {
  std::vector<double> mass, eps, delta;  // [n_blocks]
  double max_v_norm = 0;
  double value_term = 0;  // sum_b a_b delta_b
  double l1_term = 0;     // min(2, M+/M- - M-/M+)
  double bound = 0;
};
CertificateTerms CertifyHead(const GradedLayer& layer, int h, const float* q, float scale,
                             double q_norm, const int64_t* selected, int64_t n_selected);

}  // namespace strata::geodesia
