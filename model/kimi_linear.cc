// kimi-linear forward pass (Kimi Linear 48B-A3B as llama.cpp converts it): per layer either a KDA
// layer (Kimi Delta Attention: a gated delta-rule recurrence on a fixed-size per-head state,
// model/kda.h) or a NoPE MLA layer (absorbed attention over 576-wide latent rows [c_hat ; k_pe],
// deepseek2's MLA with NoPE, model/mla.h), then a dense SwiGLU FFN (leading layers) or a
// sigmoid-routed MoE with a selection bias, renormalised weights, a routed scaling factor and a
// shared expert (model/moe.h).
// Spec: docs/reference/kimi-linear.md.
//
// The cache: only the MLA layers are cache layers (CacheLayers, in model order), so every policy
// sees exactly what it sees on deepseek2 NoPE. The KDA layers' state (per head a [d_k, d_v] f32
// state, and the q/k/v short-conv tails) is the cache's RecurrentGeometry part: per sequence,
// counted in its resident bytes, zero in a new cache, never seen by a policy.
//
// KDA per token t (channel c = h * D + i, x = the RMS-normed layer input):
//   q~, k~, v~ = Wq x, Wk x, Wv x;  q^, k^, v^ = silu(causal depthwise conv_4(.))  (carried tail)
//   q = l2(q^_h) / sqrt(D),  k = l2(k^_h),  v = v^_h
//   g = ssm_a[h] * softplus(F_b F_a x + dt_bias)   (ssm_a = -exp(A_log) as stored)
//   beta = sigmoid(W_beta x)[h];  S_h <- gated delta rule;  o_h = S_h^T q
//   y_h = RMSNorm_D(o_h) * w_onorm * sigmoid(G_b G_a x)_h;  out = Wo concat_h y_h
// Decode (and decode batches) run the per-token form; a prefill call of n > 1 tokens runs the
// chunked form (chunk 16, as llama.cpp for KDA).
#include <algorithm>
#include <cmath>

#include "core/scratch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/kda.h"
#include "model/mla.h"

namespace strata {
namespace {

constexpr int kKdaChunk = 16;

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float Softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }
float Silu(float x) { return x / (1.f + std::exp(-x)); }

struct KdaWeights {
  TensorView wq, wk, wv;      // [C, d] each (C = H * D)
  TensorView f_a, f_b;        // [rf, d], [C, rf]
  TensorView g_a, g_b;        // [rg, d], [C, rg]
  TensorView beta;            // [H, d]
  TensorView wo;              // [d, C]
  std::vector<float> conv[3];  // q, k, v: [C, taps] (tap-contiguous per channel)
  std::vector<float> a;        // [H] = -exp(A_log)
  std::vector<float> dt_bias;  // [C]
  std::vector<float> onorm;    // [D]
  int64_t rf = 0, rg = 0;
};

struct Layer {
  bool kda = false;
  int slot = 0;  // KDA: recurrent layer index; MLA: cache layer index
  std::vector<float> attn_norm, ffn_norm;
  KdaWeights k;
  MlaWeights m;
  FfnWeights f;
};

class KimiLinearModel final : public MlaModel {
 public:
  KimiLinearModel(std::unique_ptr<GgufFile> f, const ModelConfig& c) : MlaModel(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    const ModelConfig& c = config_;
    std::vector<LayerGeometry> layers;
    for (int l = 0; l < c.n_layers; ++l) {
      if (c.is_kda_layer(l)) continue;
      layers.push_back(MlaGeometry());
      layers.back().model_layer = l;  // cache layer i is not model layer i
    }
    return layers;
  }

  RecurrentGeometry RecurrentLayers() const override {
    const ModelConfig& c = config_;
    RecurrentGeometry r;
    r.n_layers = c.n_kda_layers();
    if (r.n_layers == 0) return r;
    const int64_t C = int64_t{c.kda_heads} * c.kda_head_dim;
    r.state_floats = C * c.kda_head_dim;
    r.conv_floats = 3 * C * (c.ssm_conv_kernel - 1);
    return r;
  }

 protected:
  Status LoadWeights() override {
    const ModelConfig& c = config_;
    if (c.q_lora_rank > 0) {
      return Unimplemented("kimi-linear with attention.q_lora_rank = " +
                           std::to_string(c.q_lora_rank) + " (the architecture has a single "
                           "attn_q; q LoRA is not supported)");
    }
    layers_.clear();
    layers_.reserve(c.n_layers);
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Layer& L = layers_.emplace_back();
      RETURN_IF_ERROR(LoadNorm(p + "attn_norm.weight", &L.attn_norm));
      RETURN_IF_ERROR(LoadNorm(p + "ffn_norm.weight", &L.ffn_norm));
      L.kda = c.is_kda_layer(l);
      if (L.kda) {
        L.slot = n_kda++;
        RETURN_IF_ERROR(LoadKda(p, &L.k));
      } else {
        L.slot = n_mla++;
        RETURN_IF_ERROR(LoadMla(p, &L.m));
      }
      RETURN_IF_ERROR(LoadFfn(p, l, &L.f));
    }
    return OkStatus();
  }

  Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* x) override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model;
    const int n = rows.n;
    const RecurrentGeometry want = RecurrentLayers();
    for (int i = 0; i < n; ++i) {
      if (!rows.live(i)) continue;
      if (!(rows.caches[i]->recurrent() == want)) {
        RETURN_IF_ERROR(rows.Event(
            i, InvalidArgument("kimi-linear: the cache holds " +
                               std::to_string(rows.caches[i]->recurrent().n_layers) +
                               " recurrent layers, the model needs " +
                               std::to_string(want.n_layers) +
                               " KDA states (make the cache with Model::NewCache)")));
      }
    }
    Embed(rows.tokens, n, x);
    ScratchScope ws;
    std::span<float> xn = ws.Floats(n * d), y = ws.Floats(n * d);
    for (int l = 0; l < c.n_layers; ++l) {
      const Layer& L = layers_[l];
      NormRows(x, L.attn_norm, n, xn.data());
      if (L.kda) {
        RETURN_IF_ERROR(KdaForward(rows, L, xn.data(), pool, y.data()));
      } else {
        RETURN_IF_ERROR(MlaForward(rows, L.m, L.slot, xn.data(), pool, y.data()));
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
      FeedForwardResidual(L.f, L.ffn_norm, rows, pool, x, xn.data(), y.data());
    }
    return OkStatus();
  }

 private:
  // A KDA layer's tensors, with the checks that name what is wrong in a bad file.
  Status LoadKda(const std::string& p, KdaWeights* K) {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, H = c.kda_heads, D = c.kda_head_dim, W = c.ssm_conv_kernel;
    const std::string a = std::string(ArchName(c.arch)) + ".";
    {
      const GgufTensorInfo* q = file_->FindTensor(p + "attn_q.weight");
      if (!q) return NotFound("missing tensor " + p + "attn_q.weight (KDA layer)");
      if (q->shape.size() != 2 || q->shape[1] != d) {
        return InvalidArgument("tensor " + p + "attn_q.weight has shape " + ShapeText(q->shape) +
                               ", expected [heads x head_dim, " + std::to_string(d) + "]");
      }
      const int64_t rows = q->shape[0];
      if (rows % H != 0) {
        return InvalidArgument("tensor " + p + "attn_q.weight has " + std::to_string(rows) +
                               " rows, which " + a + "attention.head_count = " +
                               std::to_string(H) + " (the KDA head count) does not divide");
      }
      if (rows / H != D) {
        return InvalidArgument("tensor " + p + "attn_q.weight has " + std::to_string(rows) +
                               " rows = " + std::to_string(H) + " heads x " +
                               std::to_string(rows / H) + ", but " + a + "kda.head_dim = " +
                               std::to_string(D));
      }
    }
    const int64_t C = H * D;
    ASSIGN_OR_RETURN(K->wq, Weight(p + "attn_q.weight", {C, d}));
    ASSIGN_OR_RETURN(K->wk, Weight(p + "attn_k.weight", {C, d}));
    ASSIGN_OR_RETURN(K->wv, Weight(p + "attn_v.weight", {C, d}));
    const char* conv_names[3] = {"ssm_conv1d_q.weight", "ssm_conv1d_k.weight",
                                 "ssm_conv1d_v.weight"};
    for (int j = 0; j < 3; ++j) {
      const std::string name = p + conv_names[j];
      const GgufTensorInfo* t = file_->FindTensor(name);
      if (!t) {
        return NotFound("missing tensor " + name + " (KDA short conv, ggml ne [" +
                        std::to_string(W) + ", 1, " + std::to_string(C) + ", 1])");
      }
      // llama.cpp writes torch shape (1, C, 1, W); its loader also accepts (C, 1, W).
      const std::vector<int64_t> s4 = {1, C, 1, W}, s3 = {C, 1, W};
      ASSIGN_OR_RETURN(TensorView cv, Weight(name, t->shape == s3 ? s3 : s4));
      K->conv[j] = F32Values(cv);
    }
    {
      const std::string name = p + "ssm_f_a.weight";
      const GgufTensorInfo* t = file_->FindTensor(name);
      if (!t) return NotFound("missing tensor " + name + " (KDA forget-gate down projection)");
      K->rf = t->shape.size() == 2 ? t->shape[0] : 0;
      ASSIGN_OR_RETURN(K->f_a, Weight(name, {K->rf, d}));
      ASSIGN_OR_RETURN(K->f_b, Weight(p + "ssm_f_b.weight", {C, K->rf}));
    }
    {
      const std::string name = p + "ssm_g_a.weight";
      const GgufTensorInfo* t = file_->FindTensor(name);
      if (!t) return NotFound("missing tensor " + name + " (KDA output-gate down projection)");
      K->rg = t->shape.size() == 2 ? t->shape[0] : 0;
      ASSIGN_OR_RETURN(K->g_a, Weight(name, {K->rg, d}));
      ASSIGN_OR_RETURN(K->g_b, Weight(p + "ssm_g_b.weight", {C, K->rg}));
    }
    ASSIGN_OR_RETURN(K->beta, Weight(p + "ssm_beta.weight", {H, d}));
    ASSIGN_OR_RETURN(K->wo, Weight(p + "attn_output.weight", {d, C}));
    {
      const std::string name = p + "ssm_a";
      const GgufTensorInfo* t = file_->FindTensor(name);
      if (!t) return NotFound("missing tensor " + name + " (KDA -exp(A_log), ggml ne [1, " +
                              std::to_string(H) + ", 1, 1])");
      const std::vector<int64_t> s4 = {1, 1, H, 1}, s2 = {H, 1};
      ASSIGN_OR_RETURN(TensorView av, Weight(name, t->shape == s2 ? s2 : s4));
      K->a = F32Values(av);
      for (int64_t h = 0; h < H; ++h) {
        if (!(K->a[h] < 0.f) || !std::isfinite(K->a[h])) {
          return InvalidArgument("tensor " + name + "[" + std::to_string(h) + "] = " +
                                 std::to_string(K->a[h]) + ": it holds -exp(A_log), so every "
                                 "value must be finite and < 0");
        }
      }
    }
    ASSIGN_OR_RETURN(TensorView dt, Weight(p + "ssm_dt.bias", {C}));
    K->dt_bias = F32Values(dt);
    ASSIGN_OR_RETURN(TensorView on, Weight(p + "ssm_norm.weight", {D}));
    K->onorm = F32Values(on);
    return OkStatus();
  }

  Status KdaForward(const Rows& rows, const Layer& L, const float* xn, ThreadPool* pool,
                    float* y) const {
    const ModelConfig& c = config_;
    const KdaWeights& K = L.k;
    const int n = rows.n;
    const int64_t d = c.d_model, H = c.kda_heads, D = c.kda_head_dim, C = H * D;
    const int W = c.ssm_conv_kernel;
    ScratchScope ws;
    std::span<float> q = ws.Floats(n * C), k = ws.Floats(n * C), v = ws.Floats(n * C),
                     fa = ws.Floats(n * K.rf), ga = ws.Floats(n * K.rg), b = ws.Floats(n * H),
                     g = ws.Floats(n * C), gate = ws.Floats(n * C), o = ws.Floats(n * C),
                     tmp = ws.Floats(C);
    const MatVecBatchJob jobs[] = {{K.wq, q.data(), C},         {K.wk, k.data(), C},
                                   {K.wv, v.data(), C},         {K.f_a, fa.data(), K.rf},
                                   {K.g_a, ga.data(), K.rg},    {K.beta, b.data(), H}};
    ProjectMany(rows, jobs, 6, xn, d, pool);
    Project(rows, K.f_b, fa.data(), K.rf, g.data(), C, pool);
    Project(rows, K.g_b, ga.data(), K.rg, gate.data(), C, pool);
    const float qscale = 1.f / std::sqrt(static_cast<float>(D));
    // Conv (in token order: each row advances its sequence's tail), activations, norms, gates.
    for (int i = 0; i < n; ++i) {
      if (!rows.live(i)) continue;
      float* tail = rows.caches[i]->recurrent_conv(L.slot);
      float* qkv[3] = {&q[i * C], &k[i * C], &v[i * C]};
      for (int j = 0; j < 3; ++j) {
        ShortConvStep(qkv[j], K.conv[j].data(), C, W, tail + j * C * (W - 1), tmp.data());
        for (int64_t ch = 0; ch < C; ++ch) qkv[j][ch] = Silu(tmp[ch]);
      }
      for (int64_t h = 0; h < H; ++h) {
        for (int j = 0; j < 2; ++j) {  // L2 norm of q and k per head: x / max(|x|, eps)
          float* hv = qkv[j] + h * D;
          double ss = 0;
          for (int64_t e = 0; e < D; ++e) ss += double{hv[e]} * hv[e];
          const float inv = 1.f / std::max(static_cast<float>(std::sqrt(ss)), c.rms_eps);
          const float s = j == 0 ? inv * qscale : inv;
          for (int64_t e = 0; e < D; ++e) hv[e] *= s;
        }
        b[i * H + h] = Sigmoid(b[i * H + h]);
      }
      for (int64_t ch = 0; ch < C; ++ch) {
        g[i * C + ch] = K.a[ch / D] * Softplus(g[i * C + ch] + K.dt_bias[ch]);
      }
    }
    // The recurrence: a prefill call of several tokens in the chunked form, else per token.
    const bool chunked = n > 1 && !rows.independent;
    if (chunked) {
      if (rows.live(0)) {
        float* S = rows.caches[0]->recurrent_state(L.slot);
        auto run = [&](int64_t hb, int64_t he, int) {
          std::vector<float> scratch(KdaChunkScratchFloats(kKdaChunk, D, D));
          for (int64_t h = hb; h < he; ++h) {
            KdaChunked(&q[h * D], &k[h * D], &v[h * D], &g[h * D], &b[h], C, H, n, D, D,
                       kKdaChunk, S + h * D * D, &o[h * D], scratch.data());
          }
        };
        ParallelForOrInline(pool, H, 1, run);
      }
    } else {
      for (int i = 0; i < n; ++i) {
        if (!rows.live(i)) continue;
        float* S = rows.caches[i]->recurrent_state(L.slot);
        auto run = [&](int64_t hb, int64_t he, int) {
          for (int64_t h = hb; h < he; ++h) {
            const int64_t off = i * C + h * D;
            KdaStep(&q[off], &k[off], &v[off], &g[off], b[i * H + h], D, D, S + h * D * D,
                    &o[off]);
          }
        };
        ParallelForOrInline(pool, H, 1, run);
      }
    }
    // Per head: RMSNorm (shared D-wide weight), times sigmoid of the output gate.
    for (int i = 0; i < n; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        float* oh = &o[i * C + h * D];
        RmsNorm(oh, K.onorm.data(), D, c.rms_eps, oh);
        const float* gh = &gate[i * C + h * D];
        for (int64_t e = 0; e < D; ++e) oh[e] *= Sigmoid(gh[e]);
      }
    }
    Project(rows, K.wo, o.data(), C, y, d, pool);
    return OkStatus();
  }

  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> NewKimiLinearModel(std::unique_ptr<GgufFile> file,
                                          const ModelConfig& config) {
  return std::make_unique<KimiLinearModel>(std::move(file), config);
}

}  // namespace strata
