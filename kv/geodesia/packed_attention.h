// Geodesia-KV packed attention: one pass of all query heads of a GQA group over a mixed-level
// block list of one KV head, dequantizing inside the online softmax (spec section 6, with the
// C++-port extensions: per-head tables, GQA grouping, partial blocks, exact residual overlay and
// an optional block selection list).
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
#include "kv/geodesia/blocks.h"

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

// Whole layer: query heads [h * G, (h + 1) * G) read KV head h (G = n_q_heads / n_kv_heads), all
// blocks, every (head, split) pair one task on the pool, merged per head in split order.
// q: [n_q_heads, head_dim]; st: n_heads = n_q_heads (merged into).
void PackedAttendLayer(const GradedLayer& layer, const float* q, int n_q_heads, float scale,
                       int n_splits, ThreadPool* pool, SoftmaxStates* st);

// Timing of PackedAttendLayer against AttendStream over the same tokens in bf16 (the full
// cache), on random data, in the same process.
struct PackedBenchConfig {
  int64_t ctx = 16384;
  int n_q_heads = 32;
  int n_kv_heads = 8;
  int head_dim = 128;
  int group_size = 64;
  // Fraction of closed blocks at levels 16, 8, 4, 2, 1 (the open block and the last 2 closed
  // blocks and block 0 stay exact, like the policy's hot set).
  std::array<double, kNumLevels> mix = {0, 0, 1, 0, 0};
  int n_splits = 0;  // 0: pool size
  int reps = 5;      // timed steps (best of)
  uint64_t seed = 1;
};
struct PackedBenchResult {
  double packed_ms = 0;  // best step time, PackedAttendLayer
  double full_ms = 0;    // best step time, AttendStream over bf16 (one call per KV head group)
  double speedup = 0;    // full_ms / packed_ms
  double resident_bpv = 0;  // resident bits per value of the graded layer (boxes included)
  double payload_bpv = 0;   // without the boxes
};
PackedBenchResult BenchPackedAttention(const PackedBenchConfig& c, ThreadPool* pool);

}  // namespace strata::geodesia
