// The feed-forward of the MoE architectures (deepseek2, kimi-linear): per layer a dense SwiGLU FFN
// or routed experts (router scores by softmax or sigmoid, an optional per-expert selection bias
// that changes which experts are chosen but not their weights (DeepSeek-V3 / llama.cpp / vLLM
// semantics), top-k, optional renormalisation and scaling) plus optional shared experts. Every
// difference between the architectures is a ModelConfig value: expert_gating, the bias tensor,
// expert_weights_norm, expert_weights_scale, n_shared_experts, leading dense layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

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

// One layer's FFN tensors: dense or MoE (ModelConfig::is_moe_layer).
struct FfnWeights {
  bool moe = false;
  TensorView gate, up, down;                 // dense [ff, d], [ff, d], [d, ff]
  TensorView router;                         // [E, d]
  std::vector<float> router_bias;            // [E] selection bias (optional)
  TensorView gate_exps, up_exps, down_exps;  // [E, ffe, d], [E, ffe, d], [E, d, ffe]
  TensorView gate_sh, up_sh, down_sh;        // shared experts [ffs, d], [ffs, d], [d, ffs]
  bool has_shared = false;
};

// A Model whose layers end in FfnWeights.
class MoeModel : public Model {
 protected:
  using Model::Model;

  // A tensor's values as f32 (norm weights, biases: read per token as floats).
  static std::vector<float> F32Values(const TensorView& t);
  // A d_model-wide norm weight (tensor `name`) as f32.
  Status LoadNorm(const std::string& name, std::vector<float>* w) const;
  // out row i = RMSNorm(x row i) * w for the n rows of a pass (d_model wide).
  void NormRows(const float* x, const std::vector<float>& w, int n, float* out) const;
  // The FFN half of a layer: x += FeedForward(NormRows(x, norm)); xn, y: [n, d_model] scratch.
  void FeedForwardResidual(const FfnWeights& F, const std::vector<float>& norm, const Rows& rows,
                           ThreadPool* pool, float* x, float* xn, float* y) const;
  // Layer `layer`'s FFN tensors, names prefixed by p ("blk.L.").
  Status LoadFfn(const std::string& p, int layer, FfnWeights* F) const;
  // y = FFN(x) for the rows of a pass: dense, or MoE (MoeBatch for several rows, Moe for one;
  // equal bit for bit).
  void FeedForward(const FfnWeights& F, const Rows& rows, const float* x, ThreadPool* pool,
                   float* y) const;
  // y = down(silu(gate x) * up x) for the rows of a pass.
  void SwiGluFfn(const Rows& rows, const TensorView& gate, const TensorView& up,
                 const TensorView& down, const float* x, int64_t ff, ThreadPool* pool,
                 float* y) const;

 private:
  RouteParams Routing(const FfnWeights& F) const;
  // Per token: router, then its experts one by one (shared experts unweighted).
  void Moe(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool, float* y) const;
  // Several rows (a decode batch or a prefill chunk): the router for every row in one product,
  // then the rows grouped by expert so that each routed expert's weights are read once per pass
  // (MatVecBatch over its rows), and each row's expert outputs added in its own routing order,
  // as Moe adds them, so every row equals its solo Moe bit for bit.
  void MoeBatch(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool,
                float* y) const;
};

}  // namespace strata
