// The prefill GEMM of block-quantized weights on integer dot products: each (row, token) result
// equals QuantDotRef (kernels/quant_dot.h) bit for bit, with each weight row's codes unpacked once
// per tile of tokens and multiplied with several tokens from registers.
//
// Scheme: a row's codes are unpacked to bytes and laid out "lane = segment": a segment is one
// 32-element block (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), one 32-element sub-block (Q4_K) or one
// 16-element sub-block (Q6_K); L segments (L = 16 on AVX-512, 8 on AVX2) share one vector, column c
// of the group holding bytes 4c..4c+3 of every segment. A token's int8 activations
// (QuantizeActivations) are laid out the same way once per token. One vpdpbusd (AVX-512 VNNI;
// vpmaddubsw + vpmaddwd otherwise) per column then adds 4 products into each segment's own int32
// lane, so a group's columns leave the exact integer sum of every segment in its lane, with no
// horizontal reduction. A micro-kernel keeps R rows x T tokens of such accumulators in registers
// (AVX-512: 4 x 4, AVX2: 4 x 2), loading each weight column once for T tokens and each token column
// once for R rows. The segment sums are then turned into the block terms of quant_dot.h (code
// offsets from the activation sums, the K-quants' integer sub-block scales and mins, then the same
// f32 operations in the same order, 8 accumulators by block index = 8 f32 lanes), so the result is
// QuantDotRef's float.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace strata {

// True where QuantGemmRows serves weight type t with k columns on the SIMD target this CPU
// dispatches to (x86 AVX2 or AVX-512; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K; k a whole number of
// blocks). Elsewhere (other types, SSE4 and older) prefill uses the other paths of
// kernels/matmul.h.
bool HasQuantGemm(DType t, int64_t k);

// Bytes of one token's activations in the GEMM's layout (k elements, weight type t). No
// alignment is needed, but 64-byte strides load faster.
int64_t QuantGemmTokenBytes(DType t, int64_t k);

// One token: from QuantizeActivations' output `act` (weight type t, k elements) to the GEMM's
// layout in `out` (QuantGemmTokenBytes(t, k) bytes). Requires HasQuantGemm(t, k).
void PrepareQuantGemmToken(DType t, const void* act, int64_t k, void* out);

// Y[j, r] = QuantDotRef(W row r, activations of token j) bit for bit, for j in [0, n_tok) and r in
// [r0, r1): token j's prepared activations at tokens + j * token_stride bytes. Requires
// HasQuantGemm(w.dtype, w.cols()).
void QuantGemmRows(const TensorView& w, const uint8_t* tokens, int64_t token_stride, int64_t n_tok,
                   float* y, int64_t y_stride, int64_t r0, int64_t r1);

}  // namespace strata
