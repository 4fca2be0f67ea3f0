// llama-family forward pass: GQA attention with RoPE (llama: adjacent pairs; qwen2: neox halves
// and q/k/v biases), RMSNorm, SwiGLU FFN, tied or untied output.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/scratch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"

namespace strata {
namespace {

struct LlamaLayer {
  std::vector<float> attn_norm, ffn_norm;      // [d_model]
  TensorView wq, wk, wv, wo;                   // [H*hd, d], [KV*hd, d], [KV*hd, d], [d, H*hd]
  std::vector<float> bq, bk, bv;               // qwen2 biases (empty when absent)
  TensorView gate, up, down;                   // [ff, d], [ff, d], [d, ff]
};

class LlamaModel final : public Model {
 public:
  LlamaModel(std::unique_ptr<GgufFile> f, const ModelConfig& c) : Model(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    const ModelConfig& c = config_;
    LayerGeometry g;
    g.kind = AttnKind::kGqa;
    g.n_q_heads = c.n_heads;
    g.n_kv_heads = c.n_kv_heads;
    g.k_dim = c.head_dim;
    g.v_dim = c.head_dim;
    g.rope_dim = c.rope_dim;
    g.rope = true;
    g.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    return std::vector<LayerGeometry>(c.n_layers, g);
  }

 protected:
  Status LoadWeights() override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, qd = int64_t{c.n_heads} * c.head_dim,
                  kvd = int64_t{c.n_kv_heads} * c.head_dim, ff = c.d_ff;
    // Grown as each layer's tensors check out (block_count is bounded by the file's tensor count
    // in ModelConfig). Reserved so that no reallocation moves a layer whose views point into it.
    layers_.clear();
    layers_.reserve(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LlamaLayer& L = layers_.emplace_back();
      ASSIGN_OR_RETURN(TensorView an, Weight(p + "attn_norm.weight", {d}));
      ASSIGN_OR_RETURN(TensorView fn, Weight(p + "ffn_norm.weight", {d}));
      L.attn_norm.resize(d);
      L.ffn_norm.resize(d);
      ToF32(an.dtype, an.data, L.attn_norm.data(), d);
      ToF32(fn.dtype, fn.data, L.ffn_norm.data(), d);
      ASSIGN_OR_RETURN(L.wq, Weight(p + "attn_q.weight", {qd, d}));
      ASSIGN_OR_RETURN(L.wk, Weight(p + "attn_k.weight", {kvd, d}));
      ASSIGN_OR_RETURN(L.wv, Weight(p + "attn_v.weight", {kvd, d}));
      ASSIGN_OR_RETURN(L.wo, Weight(p + "attn_output.weight", {d, qd}));
      ASSIGN_OR_RETURN(L.gate, Weight(p + "ffn_gate.weight", {ff, d}));
      ASSIGN_OR_RETURN(L.up, Weight(p + "ffn_up.weight", {ff, d}));
      ASSIGN_OR_RETURN(L.down, Weight(p + "ffn_down.weight", {d, ff}));
      auto bias = [&](const std::string& name, int64_t n, std::vector<float>* out) -> Status {
        bool present = false;
        ASSIGN_OR_RETURN(TensorView b, OptionalWeight(p + name, {n}, &present));
        if (present) {
          out->resize(n);
          ToF32(b.dtype, b.data, out->data(), n);
        }
        return OkStatus();
      };
      RETURN_IF_ERROR(bias("attn_q.bias", qd, &L.bq));
      RETURN_IF_ERROR(bias("attn_k.bias", kvd, &L.bk));
      RETURN_IF_ERROR(bias("attn_v.bias", kvd, &L.bv));
    }
    if (c.has_rope_freqs) {
      ASSIGN_OR_RETURN(TensorView rf, Weight("rope_freqs.weight", {c.rope_dim / 2}));
      rope_freqs_.resize(c.rope_dim / 2);
      ToF32(rf.dtype, rf.data, rope_freqs_.data(), c.rope_dim / 2);
    }
    rope_.freq_base = c.rope_base;
    rope_.freq_scale = c.rope_freq_scale;
    rope_.freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
    return OkStatus();
  }

  Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* x) override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd,
                  ff = c.d_ff;
    const int n = rows.n;
    Embed(rows.tokens, n, x);
    ScratchScope ws;
    std::span<float> xn = ws.Floats(n * d), q = ws.Floats(n * qd), k = ws.Floats(n * kvd),
                     v = ws.Floats(n * kvd), att = ws.Floats(n * qd), o = ws.Floats(n * d),
                     g = ws.Floats(n * ff), u = ws.Floats(n * ff);
    auto add_bias = [&](std::span<float> y, const std::vector<float>& b, int64_t dim) {
      if (b.empty()) return;
      for (int i = 0; i < n; ++i) {
        for (int64_t j = 0; j < dim; ++j) y[i * dim + j] += b[j];
      }
    };
    // The rotation factors of the chunk's positions, shared by every head and layer.
    std::span<float> rcs = ws.FloatsUnset(n * c.rope_dim);
    for (int i = 0; i < n; ++i) RopeFactors(c.rope_dim, rows.pos[i], rope_, &rcs[i * c.rope_dim]);
    for (int l = 0; l < c.n_layers; ++l) {
      const LlamaLayer& L = layers_[l];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.attn_norm.data(), d, c.rms_eps, &xn[i * d]);
      // In decode one pool dispatch for the three projections.
      const MatVecBatchJob qkv[] = {{L.wq, q.data(), qd}, {L.wk, k.data(), kvd},
                                    {L.wv, v.data(), kvd}};
      ProjectMany(rows, qkv, 3, xn.data(), d, pool);
      add_bias(q, L.bq, qd);
      add_bias(k, L.bk, kvd);
      add_bias(v, L.bv, kvd);
      for (int i = 0; i < n; ++i) {
        const float* cs = &rcs[i * c.rope_dim];
        for (int h = 0; h < c.n_heads; ++h) RopeApply(&q[i * qd + h * hd], c.rope_dim, c.rope_style, cs);
        for (int h = 0; h < c.n_kv_heads; ++h) RopeApply(&k[i * kvd + h * hd], c.rope_dim, c.rope_style, cs);
        if (!rows.live(i)) continue;
        RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(l, &k[i * kvd], &v[i * kvd])));
      }
      RETURN_IF_ERROR(GqaAttention(rows, l, q.data(), pool, att.data()));
      Project(rows, L.wo, att.data(), qd, o.data(), d, pool);
      for (int64_t j = 0; j < n * d; ++j) x[j] += o[j];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.ffn_norm.data(), d, c.rms_eps, &xn[i * d]);
      GatedFfn(rows, L.gate, L.up, L.down, Glu::kSilu, xn.data(), d, ff, g.data(), u.data(), pool,
               o.data());
      for (int64_t j = 0; j < n * d; ++j) x[j] += o[j];
    }
    return OkStatus();
  }

 private:
  std::vector<LlamaLayer> layers_;
  std::vector<float> rope_freqs_;
  RopeParams rope_;
};

}  // namespace

std::unique_ptr<Model> NewLlamaModel(std::unique_ptr<GgufFile> file, const ModelConfig& config) {
  return std::make_unique<LlamaModel>(std::move(file), config);
}

}  // namespace strata
