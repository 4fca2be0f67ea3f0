// Shared pieces of the baseline policies: the matched-budget rule, per-KV-head exact row reads
// and deterministic top-k.
//
// Budget rule (every baseline, so they compare with VestigeKV's "4 sinks + tail + m rows"):
//   m = max(1, round(n_prefix / ratio)), n_prefix = the rows held at the compression point.
// How each policy spends m is documented in its header and in docs/baselines.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kv/policy.h"
#include "kv/registry.h"
#include "kv/store.h"

namespace strata::baselines {

// m = max(1, round(n / ratio)), or 0 when n == 0.
int64_t BudgetRows(int64_t n, double ratio);

// Indices of the k largest scores (ties: lower index first), ascending. k is clamped to n.
std::vector<int64_t> TopK(const double* score, int64_t n, int64_t k);

// Exact attention over one row set per KV head: sets[h] (ascending, distinct, each < store rows)
// for the G query heads of KV head h. sets.size() == 1 means one set shared by every KV head (it
// then goes through ReadRows, the same call the other row policies use). KV heads run in parallel
// on the pool; they write disjoint head slices, so no merge is involved. Counts rows and bytes
// (a row of one KV head = 2 * (k_dim + v_dim) bytes; MLA: the latent row, 2 * k_dim).
void ReadHeadSets(const LayerStore& store, const float* q,
                  const std::vector<std::vector<int64_t>>& sets, ThreadPool* pool,
                  SoftmaxStates* st, ReadStats* stats);

// Bytes one row of one KV head occupies in the store (bf16 K and V; MLA: the latent row).
inline int64_t RowBytesPerHead(const LayerGeometry& g) {
  return g.bytes_per_token() / g.n_kv_heads;
}

}  // namespace strata::baselines
