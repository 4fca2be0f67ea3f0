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

// Y[t, r] = sum_c W[r, c] * X[t, c] for t in [0, n). X rows have stride x_stride (elements), Y rows
// y_stride. Each weight row is read once per tile of tokens. For every dtype, row and token the
// result equals MatVec of that token bit for bit.
void MatMul(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool* pool);

// The other prefill path for quantized weights, kept to measure against MatMul (strata bench
// kernels): tiles of rows dequantized exactly to f32 (DequantizeRow) for the f32 class-major GEMM
// with the f32 activations. Not bit-equal to MatMul on quantized weights (no activation rounding:
// it is within MatVecRef's f32 tolerance of the float64 product instead); same as MatMul on
// F32/F16/BF16.
void MatMulDequantF32(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                      int64_t y_stride, ThreadPool* pool);

// Scalar references (float64 accumulation).
void MatVecRef(const TensorView& w, const float* x, float* y);

// Dot product of a weight row (any dtype, n elements) with f32 x, SIMD; equals MatVec's row bit
// for bit (quantized types: x is quantized to int8 blocks first, as MatVec does).
float DotRow(DType t, const void* row, const float* x, int64_t n);

}  // namespace strata
