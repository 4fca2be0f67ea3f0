// Kimi Delta Attention (KDA) kernels: the gated delta rule with a per-channel (key-axis) decay on
// one head's f32 state, in the exact per-token form (decode) and the chunked WY form (prefill),
// and the causal depthwise short convolution with its carried tail. Scalar code; the float64
// references are in kimi_linear_test.cc. Spec: docs/reference/kimi-linear.md §2.
//
// State layout (documented because llama.cpp's internal layout changed between versions): one
// head's state S is [d_k, d_v] f32 row-major, S[i][j] at i * d_v + j, rows = key channels i,
// columns = value channels j. The decay multiplies key rows.
//
// Version log:
//   v1  per-token step; chunked form with pairwise exponents (Γ_r − Γ_s, never e^Γ · e^−Γ) and
//       forward substitution for (I + L)^-1; conv with a tap-contiguous tail.
#pragma once

#include <cstdint>

namespace strata {

// One token of one head, in place on S [dk, dv]:
//   S <- Diag(exp(g)) S;  u = S^T k;  delta = beta (v - u);  S <- S + k delta^T;  o = S^T q.
// q already L2-normalised and scaled by 1/sqrt(dk); k L2-normalised; g <= 0 [dk]; o [dv].
void KdaStep(const float* q, const float* k, const float* v, const float* g, float beta, int dk,
             int dv, float* S, float* o);

// T tokens of one head from state S (updated in place to the state after the last token), in
// chunks of `chunk` tokens (the WY/UT form of spec §2). Token t's vectors are at q + t *
// stride, k + t * stride, v + t * stride, g + t * stride, beta[t * beta_stride]; outputs at
// o + t * stride. Equals T calls of KdaStep up to f32 rounding. scratch: KdaChunkScratchFloats.
int64_t KdaChunkScratchFloats(int chunk, int dk, int dv);
void KdaChunked(const float* q, const float* k, const float* v, const float* g,
                const float* beta, int64_t stride, int64_t beta_stride, int T, int dk, int dv,
                int chunk, float* S, float* o, float* scratch);

// Causal depthwise conv over `channels` channels with `taps` weights per channel (w[c * taps + m],
// tap taps-1 multiplies the current token) and the carried tail tail[c * (taps - 1) + m] (the
// last taps-1 pre-conv inputs, oldest first; zeros at a sequence start). x: [channels] of one
// token; y = the conv output (before any activation); the tail advances by x.
void ShortConvStep(const float* x, const float* w, int64_t channels, int taps, float* tail,
                   float* y);

}  // namespace strata
