// Elementwise and small vector kernels used by the forward pass (f32 in, f32 out).
#pragma once

#include <cstdint>

namespace strata {

// y = x / sqrt(mean(x^2) + eps) * w   (w may be null: no weight). x and y may alias.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);

// Rotary embedding, in place, on one head vector of `dim` values at position `pos`.
// kNorm rotates adjacent pairs (x[2i], x[2i+1]) (llama.cpp's LLAMA_ROPE_TYPE_NORM: llama, deepseek2);
// kNeox rotates (x[i], x[i + dim/2]) (qwen2). theta_i = pos * freq_base^(-2i/dim) * freq_scale,
// with optional per-pair frequency factors (llama3 rope scaling), may be null.
enum class RopeStyle { kNorm, kNeox };
struct RopeParams {
  float freq_base = 10000.f;
  float freq_scale = 1.f;           // linear scaling: 1 / factor
  const float* freq_factors = nullptr;  // [dim/2] divisors of each pair's frequency (llama3), or null
  float attn_factor = 1.f;          // multiplies cos/sin (YaRN mscale), 1 = none
};
void Rope(float* x, int dim, int64_t pos, RopeStyle style, const RopeParams& p);
// Rope in two steps, for many head vectors at one position (the factors cost a double exp, cos
// and sin per pair; computed once per position instead of once per head and layer):
// cs[2i] = cos(theta_i) * attn_factor, cs[2i + 1] = sin(theta_i) * attn_factor ([dim] floats),
// and RopeApply(x, dim, style, cs) gives Rope(x, dim, pos, style, p) bit for bit.
void RopeFactors(int dim, int64_t pos, const RopeParams& p, float* cs);
void RopeApply(float* x, int dim, RopeStyle style, const float* cs);

// In-place softmax over n values (max-subtracted, f32 exp, f64-free).
void Softmax(float* x, int64_t n);
// x = silu(x) * y  (SwiGLU gate), elementwise.
void SwiGlu(float* x, const float* y, int64_t n);
// x[i] = gelu_tanh(x[i]) * y[i], gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
// (Gemma's GELU-gated FFN; llama.cpp's ggml_geglu with the tanh approximation).
void GeluTanhGlu(float* x, const float* y, int64_t n);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);
// f32 dot products. Two summation orders, kept apart on purpose because they round differently:
// Dot: four interleaved vector accumulators (forward pass, cache statistics, baselines);
// DotAcc2: two interleaved vector accumulators, VestigeKV's recall index (sketch projections csk,
//   residual norms eta, query sketches), whose fired rows are pinned bit for bit by its tests.
// Both: lanes, then one horizontal sum, then a scalar tail in index order.
float Dot(const float* a, const float* b, int64_t n);
float DotAcc2(const float* a, const float* b, int64_t n);

}  // namespace strata
