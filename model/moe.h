// MoE routing shared by the MoE architectures: router scores (softmax or sigmoid), an optional
// per-expert selection bias that changes which experts are chosen but not their weights
// (DeepSeek-V3 / llama.cpp / vLLM semantics), top-k, optional renormalisation and scaling.
#pragma once

#include <cstdint>

namespace strata {

struct RouteParams {
  int n_experts = 0;
  int n_used = 0;
  int gating = 1;                // 1 softmax, 2 sigmoid
  bool renormalize = false;      // w <- w / sum(w) over the chosen experts
  float scale = 1.f;             // then w <- scale * w
  const float* bias = nullptr;   // [n_experts] selection bias, or null
};

// logits [n_experts] (overwritten by the scores); ids[k], w[k] for k < n_used, in selection
// order (ties: lower index first).
void RouteExperts(const RouteParams& p, float* logits, int* ids, float* w);

}  // namespace strata
