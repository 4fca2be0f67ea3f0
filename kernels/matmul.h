// Weight-times-activation products for every weight storage type (F32, F16, BF16 and the block-
// quantized types of core/quant.h). Decode is memory-bound: MatVec streams each weight byte once;
// MatMul (prefill) reuses each weight row across a tile of tokens. Scalar references live beside
// them for tests. Quantized weights use int8 activation blocks and integer dot products
// (kernels/quant_dot.h, with its error bound); F32/F16/BF16 use f32 arithmetic on exact weights.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace strata {

// y[r] = sum_c W[r, c] * x[c] for r in [0, W.rows()). W is a 2-D weight view [rows, cols].
// Rows are split across `pool` (may be null = caller thread only).
void MatVec(const TensorView& w, const float* x, float* y, ThreadPool* pool);

// Several products sharing one x (q/k/v, gate/up): y_i = W_i x for jobs[0..n_jobs), as one
// parallel job over their concatenated rows, so a pool is dispatched once instead of once per
// matrix. Results equal separate MatVec calls bit for bit (rows are independent).
struct MatVecJob {
  TensorView w;  // [rows_i, cols]; every job has the same cols
  float* y;      // [rows_i]
};
void MatVecMany(const MatVecJob* jobs, int n_jobs, const float* x, ThreadPool* pool);

// Decode over a batch of B independent sequences: Y[b, r] = MatVec(W, X[b])[r] for b in [0, B),
// BIT FOR BIT for every dtype (F32/F16/BF16: DotRow's summation order per (row, b); quantized:
// each X[b] quantized to int8 blocks as MatVec does, then the same integer dot). Each weight row
// is streamed from memory once and its B dot products formed while it is in cache (B <= 64 for
// the quantized types; float types: rows converted in tiles of up to 32 for B >= 8), so the
// weights are read once per step for the whole batch. Rows split across `pool` as MatVec does.
// X rows have stride x_stride (elements), Y rows y_stride. B = 1 is MatVec itself.
void MatVecBatch(const TensorView& w, const float* x, int64_t B, int64_t x_stride, float* y,
                 int64_t y_stride, ThreadPool* pool);
// MatVecMany over a batch: jobs share X [B, x_stride]; job i writes Y_i [B, y_stride_i]. One pool
// dispatch for all jobs; equals MatVecBatch per job (and so MatVec per row) bit for bit.
struct MatVecBatchJob {
  TensorView w;      // [rows_i, cols]; every job has the same cols
  float* y;          // [B, y_stride]
  int64_t y_stride;  // elements between the B output rows (>= rows_i)
};
void MatVecBatchMany(const MatVecBatchJob* jobs, int n_jobs, const float* x, int64_t B,
                     int64_t x_stride, ThreadPool* pool);
// The scalar reference of MatVecBatch: MatVec per row b, one at a time.
void MatVecBatchRef(const TensorView& w, const float* x, int64_t B, int64_t x_stride, float* y,
                    int64_t y_stride);

// Y[t, r] = sum_c W[r, c] * X[t, c] for t in [0, n). X rows have stride x_stride (elements), Y rows
// y_stride. Each weight row is read once per tile of tokens. Two paths:
//   - Quantized weights that the integer GEMM serves on this CPU (HasQuantGemm: Q4_0, Q4_1, Q8_0,
//     Q4_K, Q6_K on x86 AVX2 / AVX-512): every token's activations are quantized once to int8
//     blocks (as MatVec does) and each weight row's codes are unpacked once per tile of tokens and
//     multiplied with several tokens from registers by integer dot products (kernels/
//     quant_gemm.h). Every (row, token) equals MatVec of that token bit for bit, so it carries the
//     int8 activation error bound of kernels/quant_dot.h. Chosen because it measured faster than
//     the dequantizing path (v6 in kernels/matmul.cc's version log).
//     STRATA_QUANT_PREFILL=dequant in the environment (read once) selects MatMulDequant instead,
//     for comparisons of the two paths.
//   - Everything else (F32/F16/BF16, the other quantized types, quantized weights on CPUs without
//     AVX2): MatMulDequant.
// n = 1 is MatVec itself for every dtype.
void MatMul(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool* pool);

// The f32 GEMM: tiles of rows converted exactly to f32 (quantized types: DequantizeRow) for an
// f32 register-tiled GEMM with the f32 activations. For F32/F16/BF16 every (row, token) equals
// MatVec of that token bit for bit. For quantized weights there is no activation rounding: the
// result is within f32 rounding of the float64 product of the dequantized weights (MatVecRef),
// while MatVec (and the integer GEMM) carry the int8 activation error of kernels/quant_dot.h.
void MatMulDequant(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                   int64_t y_stride, ThreadPool* pool);

// The int8 row-dot path for quantized weights, kept for measurements (see
// kernels/quant_dot_bench_test.cc): every token's activations quantized to int8 blocks and each
// (row, token) the MatVec integer dot, each row reused from L1 across a tile of tokens but
// unpacked again for every token (the 32-element formats: once per 4 tokens). Equals MatVec per
// token bit for bit for every dtype (F32/F16/BF16: it is MatMul).
void MatMulInt8(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                int64_t y_stride, ThreadPool* pool);

// Scalar references (float64 accumulation).
void MatVecRef(const TensorView& w, const float* x, float* y);

// Dot product of a weight row (any dtype, n elements) with f32 x, SIMD; equals MatVec's row bit
// for bit (quantized types: x is quantized to int8 blocks first, as MatVec does).
float DotRow(DType t, const void* row, const float* x, int64_t n);

}  // namespace strata
