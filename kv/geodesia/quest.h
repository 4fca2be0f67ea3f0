// Geodesia-KV compressed-Quest page selection (§4, `query_gate = box_sparse`).
//
// Per query head: the candidates are the closed pages before the call's first query
// ((b + 1) * 64 <= q_offset); n_keep = min(n_cand, max(1, ceil(keep_frac * n_cand))) of them with
// the largest box bound U_b(q) = scale * sum_c max(q_c kmin_c, q_c kmax_c) (f16 boxes of the exact
// keys, rounded outward by GradedLayer) are read, plus every page from the current one
// (floor(q_offset / 64)) on. Sinks and the recent window are not forced. Unselected pages get no
// weight. Ties: higher bound first, then lower page index.
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

// min(n_cand, max(1, ceil(keep_frac * n_cand))); 0 when n_cand = 0.
int64_t QuestKeepCount(int64_t n_cand, double keep_frac);

// The selected candidate pages (ascending) of one query head q ([head_dim] f32) against KV head
// h: the top QuestKeepCount(n_cand) of pages [0, n_cand) by U_b(q).
std::vector<int64_t> SelectPages(const GradedLayer& layer, int h, const float* q, float scale,
                                 int64_t n_cand, double keep_frac);
// The same for n_q query heads at once (q: [n_q, head_dim]; each page's box is read once):
// (*out)[r] == SelectPages(layer, h, q + r * head_dim, ...).
void SelectPagesGroup(const GradedLayer& layer, int h, const float* q, int n_q, float scale,
                      int64_t n_cand, double keep_frac, std::vector<std::vector<int64_t>>* out);

}  // namespace strata::geodesia
