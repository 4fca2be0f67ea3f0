// gemma3 forward pass, as llama.cpp's src/models/gemma3.cpp computes it: embeddings scaled by
// sqrt(d_model); per layer RMSNorm -> GQA attention (q/k RMSNorm per head, NEOX RoPE with the
// local base on sliding-window layers and rope.freq_base on global ones, softmax scale
// 1/sqrt(query_pre_attn_scalar)) -> post-attention RMSNorm -> residual; RMSNorm -> GELU-tanh gated
// FFN -> post-FFN RMSNorm -> residual; tied output. The GGUF norm weights already hold Gemma's
// (1 + w) (llama.cpp's converter adds the 1), so every norm here is a plain RMSNorm.
// Sliding-window layers are the cache's own (LayerGeometry::window); the policy sees the global
// layers only (kv/cache.h).
#include <cmath>

#include "core/scratch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"

namespace strata {
namespace {

struct Gemma3Layer {
  std::vector<float> attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // [d_model]
  std::vector<float> q_norm, k_norm;                                      // [head_dim]
  TensorView wq, wk, wv, wo;  // [H*hd, d], [KV*hd, d], [KV*hd, d], [d, H*hd]
  TensorView gate, up, down;  // [ff, d], [ff, d], [d, ff]
};

class Gemma3Model final : public Model {
 public:
  Gemma3Model(std::unique_ptr<GgufFile> f, const ModelConfig& c) : Model(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    const ModelConfig& c = config_;
    std::vector<LayerGeometry> layers;
    for (int l = 0; l < c.n_layers; ++l) {
      LayerGeometry g;
      g.kind = AttnKind::kGqa;
      g.n_q_heads = c.n_heads;
      g.n_kv_heads = c.n_kv_heads;
      g.k_dim = c.head_dim;
      g.v_dim = c.head_dim;
      g.rope_dim = c.rope_dim;
      g.rope = true;
      g.scale = c.attn_scale;
      g.window = c.is_local_layer(l) ? c.sliding_window : 0;
      layers.push_back(g);
    }
    return layers;
  }

 protected:
  Status LoadWeights() override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, hd = c.head_dim, qd = int64_t{c.n_heads} * hd,
                  kvd = int64_t{c.n_kv_heads} * hd, ff = c.d_ff;
    layers_.clear();
    layers_.reserve(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Gemma3Layer& L = layers_.emplace_back();
      auto norm = [&](const std::string& name, int64_t n, std::vector<float>* out) -> Status {
        ASSIGN_OR_RETURN(TensorView w, Weight(p + name, {n}));
        out->resize(n);
        ToF32(w.dtype, w.data, out->data(), n);
        return OkStatus();
      };
      RETURN_IF_ERROR(norm("attn_norm.weight", d, &L.attn_norm));
      RETURN_IF_ERROR(norm("post_attention_norm.weight", d, &L.post_attn_norm));
      RETURN_IF_ERROR(norm("ffn_norm.weight", d, &L.ffn_norm));
      RETURN_IF_ERROR(norm("post_ffw_norm.weight", d, &L.post_ffn_norm));
      RETURN_IF_ERROR(norm("attn_q_norm.weight", hd, &L.q_norm));
      RETURN_IF_ERROR(norm("attn_k_norm.weight", hd, &L.k_norm));
      ASSIGN_OR_RETURN(L.wq, Weight(p + "attn_q.weight", {qd, d}));
      ASSIGN_OR_RETURN(L.wk, Weight(p + "attn_k.weight", {kvd, d}));
      ASSIGN_OR_RETURN(L.wv, Weight(p + "attn_v.weight", {kvd, d}));
      ASSIGN_OR_RETURN(L.wo, Weight(p + "attn_output.weight", {d, qd}));
      ASSIGN_OR_RETURN(L.gate, Weight(p + "ffn_gate.weight", {ff, d}));
      ASSIGN_OR_RETURN(L.up, Weight(p + "ffn_up.weight", {ff, d}));
      ASSIGN_OR_RETURN(L.down, Weight(p + "ffn_down.weight", {d, ff}));
    }
    rope_global_.freq_base = c.rope_base;
    rope_global_.freq_scale = c.rope_freq_scale;
    rope_local_.freq_base = c.rope_base_local;  // llama.cpp: no frequency scaling on local layers
    return OkStatus();
  }

  Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* x) override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd,
                  ff = c.d_ff;
    const int n = rows.n;
    Embed(rows.tokens, n, x);
    const float embed_scale = std::sqrt(static_cast<float>(d));
    for (int64_t j = 0; j < n * d; ++j) x[j] *= embed_scale;
    ScratchScope ws;
    std::span<float> xn = ws.Floats(n * d), q = ws.Floats(n * qd), k = ws.Floats(n * kvd),
                     v = ws.Floats(n * kvd), att = ws.Floats(n * qd), o = ws.Floats(n * d),
                     on = ws.Floats(n * d), g = ws.Floats(n * ff), u = ws.Floats(n * ff),
                     hn = ws.Floats(hd);
    // The rotation factors of the chunk's positions for both bases, shared by every head and
    // layer of that kind.
    std::span<float> rcs_global = ws.FloatsUnset(n * c.rope_dim);
    std::span<float> rcs_local = ws.FloatsUnset(n * c.rope_dim);
    for (int i = 0; i < n; ++i) {
      RopeFactors(c.rope_dim, rows.pos[i], rope_global_, &rcs_global[i * c.rope_dim]);
      RopeFactors(c.rope_dim, rows.pos[i], rope_local_, &rcs_local[i * c.rope_dim]);
    }
    // Per-head RMSNorm in place (q/k norm).
    auto head_norm = [&](float* h, const std::vector<float>& w) {
      RmsNorm(h, w.data(), hd, c.rms_eps, hn.data());
      std::copy(hn.begin(), hn.end(), h);
    };
    for (int l = 0; l < c.n_layers; ++l) {
      const Gemma3Layer& L = layers_[l];
      const std::span<float> rcs = c.is_local_layer(l) ? rcs_local : rcs_global;
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.attn_norm.data(), d, c.rms_eps, &xn[i * d]);
      const MatVecBatchJob qkv[] = {{L.wq, q.data(), qd}, {L.wk, k.data(), kvd},
                                    {L.wv, v.data(), kvd}};
      ProjectMany(rows, qkv, 3, xn.data(), d, pool);
      for (int i = 0; i < n; ++i) {
        const float* cs = &rcs[i * c.rope_dim];
        for (int h = 0; h < c.n_heads; ++h) {
          head_norm(&q[i * qd + h * hd], L.q_norm);
          RopeApply(&q[i * qd + h * hd], c.rope_dim, c.rope_style, cs);
        }
        for (int h = 0; h < c.n_kv_heads; ++h) {
          head_norm(&k[i * kvd + h * hd], L.k_norm);
          RopeApply(&k[i * kvd + h * hd], c.rope_dim, c.rope_style, cs);
        }
        if (!rows.live(i)) continue;
        RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(l, &k[i * kvd], &v[i * kvd])));
      }
      RETURN_IF_ERROR(GqaAttention(rows, l, q.data(), pool, att.data()));
      Project(rows, L.wo, att.data(), qd, o.data(), d, pool);
      for (int i = 0; i < n; ++i) {
        RmsNorm(&o[i * d], L.post_attn_norm.data(), d, c.rms_eps, &on[i * d]);
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += on[j];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.ffn_norm.data(), d, c.rms_eps, &xn[i * d]);
      GatedFfn(rows, L.gate, L.up, L.down, Glu::kGeluTanh, xn.data(), d, ff, g.data(), u.data(),
               pool, o.data());
      for (int i = 0; i < n; ++i) {
        RmsNorm(&o[i * d], L.post_ffn_norm.data(), d, c.rms_eps, &on[i * d]);
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += on[j];
    }
    return OkStatus();
  }

 private:
  std::vector<Gemma3Layer> layers_;
  RopeParams rope_global_, rope_local_;
};

}  // namespace

std::unique_ptr<Model> NewGemma3Model(std::unique_ptr<GgufFile> file, const ModelConfig& config) {
  return std::make_unique<Gemma3Model>(std::move(file), config);
}

}  // namespace strata
