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
#include "kernels/attn_math.h"
#include "kernels/geodesia_format.h"

namespace strata::geodesia {

// Arithmetic of the quantized blocks (levels 8, 4, 2; bf16 rows, centroids and residual rows are
// always read in f32):
//   kF32   the codes are converted to f32 and every product is an f32 FMA (the exact path; what
//          the bit-exactness tests of the policies use);
//   kInt8  integer dot products on the codes, with the f32 operands rounded to two int8 pieces
//          (x ~ d qi + d2 qi2: qi = int8 of x with d = max |x| / 127, qi2 = int8 of the remainder
//          r = x - d qi with d2 = max |r| / 127 <= d (1/2 + 2^-22) / 127; QuantizeInt8). Per
//          block, time group tg and head: the folded query q'_c = (scale q_c) step_c, and
//          s_t = d2 * float(sum_c qi2_c code_tc) + (d * float(sum_c qi_c code_tc) + a) (FMAs),
//          a = (scale q).lo + mu sum_c (q'_c - d qi_c - d2 qi2_c), mu = (2^bits - 1) / 2 (the
//          left-over rounding re-centred, so the logit error is sum_c eps_c (code_tc - mu)).
//          Per block, value channel group cg and head: the weights w_t = p_t step_t (p_t =
//          exp(s_t - block max) <= 1), and o_c = e2 * float(sum_t wi2_t code_tc) + (e *
//          float(sum_t wi_t code_tc) + sum_t p_t lo_t + mu sum_t (left-over of w_t)). The
//          integer sums are exact (AVX-512 VNNI vpdpbusd where the CPU has it, else plain
//          integer loops: PackedInt8KeyDots / PackedInt8ValueSums, equal to their scalar
//          references bit for bit on every target).
//          Error bound vs float64 (kernels/packed_attention_test.cc, WithinStatedBoundOfFloat64):
//          per logit |ds_t| <= E_t = (1/2 + 2^-10) d2 sum_c |code_tc - mu| + 2^-16 (sum_c |q'_c|
//          code_tc + sum_c |scale q_c lo_c| + 1); per output channel (e^(2E) - 1) max_t |v_tc -
//          o_c| + e^(2E) V_c + 2^-14 max_t |v_tc|, E = max_t E_t, V_c = sum_b (e2_b / 2)(1 +
//          2^-10) sum_t |code_tc - mu| / Z (Z: the softmax denominator in the frame of the block
//          weights). Used for head dims that are a multiple of 64 and groups that are a multiple
//          of 16; other shapes read in f32.
enum class PackedMath : uint8_t { kF32, kInt8 };
const char* PackedMathName(PackedMath m);  // "f32", "int8"
// The packed read's arithmetic under a cache's --attn-math: int8 -> kInt8; f32, bf16 and auto ->
// kF32. auto is f32 because the int8 form, which meets the accuracy contract only with two int8
// pieces per input, measured slower than f32 on the AVX512-VNNI host it was built on (version log
// v3 above: ctx 4096, 1 thread, geodesia@2.5 2.63x vs 2.86x of full, kivi2 1.02x vs 1.60x).
PackedMath PackedCodesMath(AttnMath m);

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
                  const PackedBlockIO* io = nullptr, PackedMath math = PackedMath::kF32);
// Plain scalar reference of the same (f32; kInt8: the same roundings and integer sums in plain
// C++, a softmax per block; agrees with PackedAttend to f32 rounding).
void PackedAttendScalar(const PackedHeadView& view, const float* q, int n_q, float scale,
                        const int64_t* blocks, int64_t n_list, SoftmaxStates* st,
                        PackedMath math = PackedMath::kF32);
// True when PackedAttend's kInt8 path serves this view's quantized blocks (see PackedMath).
bool PackedInt8Applies(const PackedHeadView& view);
// The integer dot products of the kInt8 path (runtime dispatch; *Ref: plain loops; equal on
// every target). codes: [64, D] one code per byte (D a multiple of 64).
//   key dots:   out[h * 64 + t] = sum_c q[h * D + c] * codes[t * D + c], h < n_q;
//   value sums: out[h * D + c] = sum_t w[((c / g) * n_q + h) * 64 + t] * codes[t * D + c]
//               (g a multiple of 16 dividing D; w in [0, 127]).
void PackedInt8KeyDots(const uint8_t* codes, int64_t D, const int8_t* q, int n_q, int32_t* out);
void PackedInt8KeyDotsRef(const uint8_t* codes, int64_t D, const int8_t* q, int n_q,
                          int32_t* out);
void PackedInt8ValueSums(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                         int32_t* out);
void PackedInt8ValueSumsRef(const uint8_t* codes, int64_t D, int g, const int8_t* w, int n_q,
                            int32_t* out);
// x[0, n) -> q[i] = clamp(nearest-even(x[i] * (qmax / m)), -qmax, qmax), m = max |x|; returns
// d = m / qmax (0 and q = 0 for an all-zero x). |x_i - d q_i| <= d (1/2 + 2^-22). Correctly
// rounded operations only: the same bytes on every target.
float QuantizeInt8(const float* x, int64_t n, int qmax, int8_t* q);
// The block list cut into n_splits contiguous chunks (ChunkRange), each read into its own state
// (in parallel on `pool` when given), merged into st in chunk order. For a given n_splits the
// result does not depend on the pool; across n_splits it agrees to f32 rounding.
void PackedAttendSplit(const PackedHeadView& view, const float* q, int n_q, float scale,
                       const int64_t* blocks, int64_t n_list, int n_splits, ThreadPool* pool,
                       SoftmaxStates* st, PackedMath math = PackedMath::kF32);
// Float64 reference (dequantized in f64, exact softmax). out: [n_q, head_dim] final outputs
// (o / d; zeros when nothing is read).
void PackedAttendRef(const PackedHeadView& view, const float* q, int n_q, float scale,
                     const int64_t* blocks, int64_t n_list, double* out);

// Bytes a read of the listed blocks touches: their slots and their residual rows (not the boxes
// a selection step reads, nor the tables).
int64_t PackedReadBytes(const PackedHeadView& view, const int64_t* blocks, int64_t n_list);

}  // namespace strata::geodesia
