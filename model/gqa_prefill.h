// GQA prefill chunks in the staged form: a chunk of one sequence whose reads the cache grants in
// bulk (KvCache::ClaimDenseReads: full, the eviction baselines before their compression point,
// quest while it keeps every page; KvCache::ClaimStagedReads: KIVI, see model/staged_prefix.h) reads the cache's rows once per KV head and segment, as f32
// (keys transposed), and its n x G query heads attend them through AttendStaged
// (kernels/attention_many.h) instead of n AttendStream calls, each of which converts every row
// again. Observed queries of such a chunk (H2O, SnapKV: Policy::observation_takes_column_sums)
// are delivered as column sums of their final weights, kept by the attention pass
// (AttendStagedObserved; beyond kGqaObservedRows rows a second pass over the staged keys,
// StagedColumnSums), instead of one weight pass per query.
//
// Arithmetic: f32 FMAs on the rows as stored (bf16, f16 or f32) and the scaled f32 query, under
// every --attn-math (as MLA's expanded prefill); the same attention as AttendStream's up to f32
// rounding. A query's result depends on its own query, its position and the rows only: not on
// the chunk's other queries, the chunk boundaries (segments start at multiples of
// kGqaSegmentRows), or the pool and its size, bit for bit.
#pragma once

#include <cstdint>
#include <functional>

#include "core/thread_pool.h"
#include "kv/policy.h"
#include "kv/store.h"
#include "model/staged_prefix.h"

namespace strata {

// Rows staged at once per KV head: bounds the scratch at kGqaSegmentRows x (k_dim + v_dim) x 4
// bytes (1 MiB at head_dim 64) whatever the context.
inline constexpr int64_t kGqaSegmentRows = 2048;

// Observed queries' column sums come from the attention pass itself (AttendStagedObserved: each
// KV head's rows staged whole, and each observed query head's weights kept per tile) up to this
// many rows: scratch n_rows x (k_dim + v_dim) x 4 bytes for the rows (16 MiB at head_dim 64) and
// n_rows x 4 bytes per 64 query heads. Longer contexts take a second pass over the keys
// (StagedColumnSums), which computes the scores again.
inline constexpr int64_t kGqaObservedRows = 32768;

// Whether a prefill chunk of n queries reads cheaper staged than one AttendStream call per query.
bool GqaStagedPays(int64_t n);

// The attention of a chunk's n queries at positions p0 .. p0 + n - 1 (query i reads rows
// [0, p0 + i]) over store's rows, all resident. q: [n, n_q_heads, k_dim] as the model forms it
// (not scaled); att: [n, n_q_heads, v_dim]. With obs_b > obs_a: col[h * (p0 + obs_b) + u]
// (zeroed by the caller, [n_kv_heads, p0 + obs_b]) gets the sum, over the chunk's queries
// [obs_a, obs_b) and the query heads of KV head h, of the final softmax weight on row u.
void GqaStagedAttention(const LayerStore& store, int64_t p0, int n, const float* q,
                        ThreadPool* pool, float* att, int64_t obs_a = 0, int64_t obs_b = 0,
                        double* col = nullptr);


// GqaStagedAttention's reads for a claimed staged prefix: per KV head the prefix's segments
// (each query up to its split), then the exact rows after the smallest split staged once from
// the store and read by each run of queries with the same split from there to its limit. The
// same attention as the policy's Read up to f32 rounding (the two parts merge in one online
// softmax). No observation (the policies that claim staged reads observe nothing).
void GqaStagedPrefixAttention(const LayerStore& store, const StagedPrefix& prefix, int64_t p0,
                              int n, const float* q, ThreadPool* pool, float* att);

namespace gqa_internal {
// Tests: the smallest prefill chunk read in the staged form; 0 (the default) lets GqaStagedPays
// decide, a negative value turns the staged form off. Returns the previous value.
int64_t SetStagedMinRowsForTest(int64_t rows);
}  // namespace gqa_internal

}  // namespace strata
