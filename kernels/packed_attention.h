// Geodesia-KV packed attention kernel: one pass of all query heads of a GQA group over a
// mixed-level block list of one KV head, dequantizing inside the online softmax
// (docs/reference/geodesia-kv.md §6, with the C++-port extensions: per-head tables, GQA grouping,
// partial blocks, exact residual overlay and an optional block selection list). The format:
// kernels/geodesia_format.h.
//
// Semantics (identical for the SIMD kernel, the scalar reference and the f64 reference):
//   * the blocks read are blocks[0..n_list) (any order, no duplicates) or, when blocks is null,
//     every block of the view; tokens t >= n_valid[b] are not part of block b;
//   * level 16: the bf16 rows; level L: code * step + lo per element (keys: step/lo of the
//     token's time group and the channel; values: of the token and the channel's group);
//   * level 1: the block is ONE key/value pair (the f16 centroids) whose logit is
//     scale * q.k_bar + ln(n), n = valid tokens not overridden: the same softmax as n copies;
//   * overridden tokens (residual mask) are skipped in their block and attended exactly from the
//     residual rows instead (only for blocks that are read).
// Results are merged into `st` (MergeStates arithmetic); call st->Reset() first for a fresh read.
// q: [n_q, head_dim] f32, unscaled (`scale` multiplies q.k); st: n_heads = n_q, dv = head_dim.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/geodesia_format.h"

namespace strata::geodesia {

// Optional per-block inputs and outputs of PackedAttend: arrays over the listed blocks and the
// query heads, [n_list * n_q] (listed block i, head r at i * n_q + r).
struct PackedBlockIO {
  // 0: head r does not take listed block i into its state (the block is still evaluated for it:
  // a GQA group reads the union of its heads' selections once).
  const uint8_t* head_sel = nullptr;
  // Out: each head's state over listed block i alone (max logit and sum of exp(logit - max),
  // residual rows included; -inf / 0 when nothing in the block is live). Both or neither.
  float* block_m = nullptr;
  float* block_d = nullptr;
};

// Highway SIMD kernel (runtime dispatch).
void PackedAttend(const PackedHeadView& view, const float* q, int n_q, float scale,
                  const int64_t* blocks, int64_t n_list, SoftmaxStates* st,
                  const PackedBlockIO* io = nullptr);
// Plain scalar f32 reference of the same.
void PackedAttendScalar(const PackedHeadView& view, const float* q, int n_q, float scale,
                        const int64_t* blocks, int64_t n_list, SoftmaxStates* st);
// The block list cut into n_splits contiguous chunks (ChunkRange), each read into its own state
// (in parallel on `pool` when given), merged into st in chunk order. For a given n_splits the
// result does not depend on the pool; across n_splits it agrees to f32 rounding.
void PackedAttendSplit(const PackedHeadView& view, const float* q, int n_q, float scale,
                       const int64_t* blocks, int64_t n_list, int n_splits, ThreadPool* pool,
                       SoftmaxStates* st);
// Float64 reference (dequantized in f64, exact softmax). out: [n_q, head_dim] final outputs
// (o / d; zeros when nothing is read).
void PackedAttendRef(const PackedHeadView& view, const float* q, int n_q, float scale,
                     const int64_t* blocks, int64_t n_list, double* out);

// Bytes a read of the listed blocks touches: their slots and their residual rows (not the boxes
// a selection step reads, nor the tables).
int64_t PackedReadBytes(const PackedHeadView& view, const int64_t* blocks, int64_t n_list);

}  // namespace strata::geodesia
