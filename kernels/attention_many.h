// Dense causal attention of many query heads over staged rows: a prefill chunk's queries, each
// reading rows [0, limit) of a stream whose keys and values the caller has staged as f32.
//
// AttendStream reads a stream once per query through a kernel shaped for one query. For a prefill
// chunk the caller stages a segment of rows once (keys transposed to f32 columns, values as f32
// rows; MLA prefill: the decompressed per-head keys and values, model/mla.cc) and this kernel
// runs, per 64-row tile, two register-blocked products for blocks of 4 query heads (scores: 4
// heads x 64 rows; values: 4 heads x 4 vectors of outputs), with an online softmax between them.
// Tasks own runs of query blocks and walk the tiles outermost, so a tile is read once per task
// while it is in L2.
//
// Arithmetic: f32 FMAs on the staged f32 rows and the query as given (already scaled). A query
// head's result is fixed by its own query, its limit and the rows: it does not depend on the
// other query heads of the call, their number, or the pool and its size, bit for bit (up to the
// sign of an exact zero output entry; kernels/attention_many_test.cc). It differs from a float64
// evaluation of the same inputs by f32 rounding only (tested there).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace strata {

// Rows [r0, r0 + n) of one stream, staged by the caller.
//   Keys in up to two parts of columns (e.g. MLA's decompressed no-position part of a head and the
//   rope branch all heads share): part p holds kd[p] key entries per row, transposed: entry c of
//   row r0 + i at kt[p][c * k_stride + i]. A query's dims are part 0's then part 1's.
//   k_stride >= n rounded up to 64 (entries past n are read but never used).
//   Values: row r0 + i at v + i * v_stride, dvp entries (dv rounded up to whole SIMD vectors; the
//   entries past dv are accumulated into outputs past dv, which the caller ignores).
struct StagedRows {
  int64_t r0 = 0, n = 0;
  const float* kt[2] = {nullptr, nullptr};
  int64_t kd[2] = {0, 0};
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
};

// One query head: q (kd[0] + kd[1] entries, scaled as the scores need) reads rows [0, limit) of
// the stream; its online-softmax state m (running max, -inf when empty), d (sum of weights) and
// o (unnormalised output, dvp entries) carries over between segments.
struct StagedQuery {
  const float* q = nullptr;
  int64_t limit = 0;
  float* m = nullptr;
  float* d = nullptr;
  float* o = nullptr;
};

// Merges rows [r0, r0 + n) ∩ [0, limit) of `rows` into each of the nq query heads' states.
// dvp: the value width (a multiple of StagedValueAlign()). Consecutive query heads are blocked
// by 4 (best when their limits are equal or close).
void AttendStaged(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                  ThreadPool* pool);

// Column sums of the final softmax weights (the H2O observation of MLA's expanded prefill):
// after AttendStaged has merged every row [0, limit) of each query head into its state, for each
// staged row r0 + i below a head's limit, col[i] += exp(q . k_{r0+i} - m) / d summed over the nq
// heads (m, d: the head's final state; o is not read; rows.v is not read). The scores are
// AttendStaged's own (the same blocks, so every weight is <= 1). Each 64-row tile is one task:
// its heads are summed in f32 in runs of 64 heads, and the runs in float64, so col does not
// depend on the pool or its size, bit for bit; the error vs float64 is f32 rounding of the
// scores and of <= 64-term sums (kernels/attention_many_test.cc).
void StagedColumnSums(const StagedRows& rows, const StagedQuery* qs, int64_t nq, double* col,
                      ThreadPool* pool);

// AttendStaged over every row its query heads read, in one call (rows.r0 == 0, each limit <=
// rows.n, every state fresh: m = -inf, d = 0, o = 0), which also adds to col[u] (u below the
// observed heads' largest limit) the final softmax weights of query heads [obs_b, obs_e) on row
// u, summed over those heads: the
// column sums StagedColumnSums would give after AttendStaged, without computing the scores again.
// Each task keeps its observed heads' weights exp(s - m_t) of every tile with the running maximum
// m_t they were taken at, and once its heads are final adds w = exp(s - m_t) * exp(m_t - m) / d
// (m, d final) into its own f32 sums (heads in order); the tasks' sums go into col in float64 in
// task order, so col does not depend on the pool or its size, bit for bit. The outputs are
// AttendStaged's, bit for bit. Scratch: kTaskHeads (64) x rows.n floats per pool thread, and
// rows.n floats per 64 observed heads.
void AttendStagedObserved(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                          int64_t obs_b, int64_t obs_e, double* col, ThreadPool* pool);

// The value widths AttendStaged takes are multiples of this (the widest SIMD vector's floats).
int64_t StagedValueAlign();

// The key stride to stage n rows with: n rounded up to 64, plus 16 floats, so that consecutive
// key columns never lie a multiple of 4 KiB apart. At a power-of-two stride (2048 rows: 8 KiB)
// every column of a tile maps to the same L1 set and the score loop's loads evict each other:
// measured on an Intel Xeon (L1 48 KiB, 12-way), GQA prefill over 2048-row segments ran slower
// than over one whole-context segment of a non-power-of-two stride.
inline int64_t StagedKeyStride(int64_t n) { return (n + 63) / 64 * 64 + 16; }

// Y = A B in f32 for staging rows (MLA prefill's decompression): Y[r][c] = sum_k A[r][k] B[k][c],
// r < M, c < N (N a multiple of StagedValueAlign()), k < K, every entry one f32 FMA chain in k
// order. Row-major with strides lda, ldb, ldy (elements). Register blocks of 4 rows x 4 vectors
// (the values kernel's shape: each B load feeds 4 FMAs), rows split over the pool.
void StageProduct(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy,
                  int64_t M, int64_t N, int64_t K, ThreadPool* pool);

}  // namespace strata
