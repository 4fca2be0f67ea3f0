// deepseek2 forward pass: MLA with absorbed attention over 576-wide latent rows [c_hat ; r] (the
// branch last), RoPE or NoPE on the branch, optional q LoRA (model/mla.h), and MoE FFNs (softmax
// or sigmoid routing, top-k, shared experts, leading dense layers; model/moe.h).
#include <cmath>

#include "core/scratch.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/mla.h"

namespace strata {
namespace {

struct MlaLayer {
  std::vector<float> attn_norm, ffn_norm;
  MlaWeights m;
  FfnWeights f;
};

class Deepseek2Model final : public MlaModel {
 public:
  Deepseek2Model(std::unique_ptr<GgufFile> f, const ModelConfig& c) : MlaModel(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    return std::vector<LayerGeometry>(config_.n_layers, MlaGeometry());
  }

 protected:
  Status LoadWeights() override {
    const ModelConfig& c = config_;
    // Grown as each layer's tensors check out (block_count is bounded by the file's tensor count
    // in ModelConfig). Reserved so that no reallocation moves a layer whose views point into it.
    layers_.clear();
    layers_.reserve(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      MlaLayer& L = layers_.emplace_back();
      RETURN_IF_ERROR(LoadNorm(p + "attn_norm.weight", &L.attn_norm));
      RETURN_IF_ERROR(LoadNorm(p + "ffn_norm.weight", &L.ffn_norm));
      RETURN_IF_ERROR(LoadMla(p, &L.m));
      RETURN_IF_ERROR(LoadFfn(p, l, &L.f));
    }
    return OkStatus();
  }

  Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* x) override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model;
    const int n = rows.n;
    Embed(rows.tokens, n, x);
    ScratchScope ws;
    std::span<float> xn = ws.Floats(n * d), y = ws.Floats(n * d);
    for (int l = 0; l < c.n_layers; ++l) {
      const MlaLayer& L = layers_[l];
      NormRows(x, L.attn_norm, n, xn.data());
      RETURN_IF_ERROR(MlaForward(rows, L.m, l, xn.data(), pool, y.data()));
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
      FeedForwardResidual(L.f, L.ffn_norm, rows, pool, x, xn.data(), y.data());
    }
    return OkStatus();
  }

 private:
  std::vector<MlaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> NewDeepseek2Model(std::unique_ptr<GgufFile> file, const ModelConfig& config) {
  return std::make_unique<Deepseek2Model>(std::move(file), config);
}

}  // namespace strata
