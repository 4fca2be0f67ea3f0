// Integer dot products of block-quantized weight rows (Q4_0 ... IQ4_XS, Q8_0) with int8 activation
// blocks: the decode GEMV and prefill GEMM kernels of the quantized types.
//
// Scheme (the q8 activation blocks of llama.cpp, our own code): the f32 activation vector x is
// quantized once per call to int8 blocks, q_i = round(x_i / d_x), d_x = max|x_b| / 127, with
//   - 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): one f32 d_x and the integer sum
//     S = sum q per block (the _1 types' min term and the code offsets use it);
//   - 256-element blocks (the K-quants and IQ4_XS): one f32 d_x per 256 and the integer sums of
//     every 16 and every 32 elements (the K-quants' mins and code offsets use them).
// A weight (super-)block and its activation block are multiplied in integers (exact int32 sums of
// code * q, times the integer sub-block scales), then the f32 block scales are applied once per
// block:  T_b = (d_w * d_x) * float(isum) [+ m * (d_x * float(S)) or - (dmin * d_x) * float(msum)].
// The row sum is sum_b T_b over 8 accumulators (block b into accumulator b % 8, in increasing b,
// then ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))), every f32 operation rounded on its own
// (no fused multiply-add). Integer sums are exact, so the scalar reference (QuantDotRef), every
// SIMD target (AVX-512 VNNI vpdpbusd, AVX2/AVX-512 maddubs, the portable path: the scalar
// reference itself on SSE4/EMU128) and every caller (MatVec, MatVecMany, DotRow, MatMulInt8,
// MatVecBatch; QuantMatMulRows' 4-token pass of the 32-element formats, which unpacks a row's
// blocks once for 4 tokens) give the same float bit for bit. So does the prefill GEMM
// (kernels/quant_gemm.h, which MatMul runs for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K on x86
// AVX2 / AVX-512): it keeps each unpacked weight row in registers for several tokens, which made
// it faster than dequantizing weight tiles to f32 (kernels/matmul.cc, v6), while the row dots here
// unpack a row again per token and measured slower than that f32 path (v4). Prefill of the other
// types, and on older CPUs, still runs the f32 GEMM (no activation rounding; kernels/matmul.h).
//
// Error contract (tested in float64 for every type, kernels/quant_dot_test.cc): with w_i the
// dequantized weights (DequantizeRow) and x the f32 activations, the result y of QuantDot satisfies
//   |y - sum_i w_i x_i| <= sum_b d_x,b * (1/2 + 2^-15) * sum_{i in b} |w_i|          (activation)
//                        + (ceil(nb / 8) + 6) * 2^-23 * sum_b d_x,b * sum_{i in b} 127 (|w_i| + 2|m_i|)
// where b runs over the activation blocks (32 or 256 elements), nb is the number of weight blocks,
// and m_i is the min part of element i (m for Q4_1/Q5_1, dmin * min for Q2_K/Q4_K/Q5_K, else 0).
// The first term is the int8 rounding of x (|x_i - d_x q_i| <= d_x (1/2 + 2^-15): the 1/2 of the
// rounding plus the f32 rounding of x / d_x); the second bounds the f32 block-scale products and
// the 8-way sum (each T_b carries at most 4 roundings, each accumulator ceil(nb/8) additions, the
// final tree 3), applied to the magnitudes of the two terms the min types subtract.
// Inf or NaN in x makes the activation block's d_x NaN, so every row's result is NaN.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace strata {

// True for the weight types these kernels serve (IsQuantized(t)).
bool HasQuantDot(DType t);

// Elements per activation block for weight type t: 32 or 256.
int64_t ActivationBlockElems(DType weight_type);

// Bytes of the quantized activations of k elements (k a multiple of the weight block) for weight
// type t. The buffer needs no alignment.
int64_t ActivationBytes(DType weight_type, int64_t k);

// Quantizes x[0..k) into `out` (ActivationBytes(weight_type, k) bytes).
void QuantizeActivations(DType weight_type, const float* x, int64_t k, void* out);

// Dot product of one weight row (k elements of type t) with quantized activations (same t, k).
// SIMD, runtime dispatch.
float QuantDot(DType t, const void* row, const void* act, int64_t k);

// The scalar reference: plain C++ integer sums and the same f32 operations; equals QuantDot bit
// for bit on every target.
float QuantDotRef(DType t, const void* row, const void* act, int64_t k);

// y[r] = QuantDot(rows r) for r in [0, n_rows): rows are row_bytes apart, streamed in order.
void QuantDotRows(DType t, const void* rows, int64_t row_bytes, const void* act, int64_t k,
                  float* y, int64_t n_rows);

// Y[j, r] = QuantDot(W row r, activations of token j) for j in [0, n_tok), r in [r0, r1): the
// prefill product over quantized tokens act[j] = acts + j * act_stride bytes. Each weight row is
// reused across a tile of tokens while it is in L1.
void QuantMatMulRows(const TensorView& w, const uint8_t* acts, int64_t act_stride, int64_t n_tok,
                     float* y, int64_t y_stride, int64_t r0, int64_t r1);

}  // namespace strata
