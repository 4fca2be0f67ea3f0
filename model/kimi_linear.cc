// kimi-linear forward pass (Kimi Linear 48B-A3B as llama.cpp converts it): per layer either a KDA
// layer (Kimi Delta Attention: a gated delta-rule recurrence on a fixed-size per-head state,
// model/kda.h) or a NoPE MLA layer (absorbed attention over 576-wide latent rows [c_hat ; k_pe],
// exactly as deepseek2 with NoPE), then a dense SwiGLU FFN (leading layers) or a sigmoid-routed
// MoE with a selection bias, renormalised weights, a routed scaling factor and a shared expert.
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
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/kda.h"
#include "model/moe.h"

namespace strata {
namespace {

constexpr int kKdaChunk = 16;

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<float> ToF32Vec(const TensorView& t) {
  std::vector<float> v(t.numel());
  ToF32(t.dtype, t.data, v.data(), t.numel());
  return v;
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

struct MlaWeights {
  TensorView wq, wkv_a, wo;
  TensorView k_b;  // [H, d_c, nope]: per head W_UK,h^T
  TensorView v_b;  // [H, v, d_c]: per head W_UV,h
  std::vector<float> kv_a_norm;
};

struct FfnWeights {
  bool moe = false;
  TensorView gate, up, down;                 // dense [ff, d], [ff, d], [d, ff]
  TensorView router;                         // [E, d]
  std::vector<float> router_bias;            // [E] selection bias (optional)
  TensorView gate_exps, up_exps, down_exps;  // [E, ffe, d], [E, ffe, d], [E, d, ffe]
  TensorView gate_sh, up_sh, down_sh;        // [ffs, d], [ffs, d], [d, ffs]
  bool has_shared = false;
};

struct Layer {
  bool kda = false;
  int slot = 0;  // KDA: recurrent layer index; MLA: cache layer index
  std::vector<float> attn_norm, ffn_norm;
  KdaWeights k;
  MlaWeights m;
  FfnWeights f;
};

class KimiLinearModel final : public Model {
 public:
  KimiLinearModel(std::unique_ptr<GgufFile> f, const ModelConfig& c) : Model(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    const ModelConfig& c = config_;
    LayerGeometry g;
    g.kind = AttnKind::kMla;
    g.n_q_heads = c.n_heads;
    g.n_kv_heads = 1;
    g.k_dim = c.kv_lora_rank + c.qk_rope_dim;
    g.v_dim = c.kv_lora_rank;
    g.rope_dim = c.qk_rope_dim;
    g.rope = false;
    g.scale = 1.f / std::sqrt(static_cast<float>(c.qk_nope_dim + c.qk_rope_dim));
    return std::vector<LayerGeometry>(c.n_layers - c.n_kda_layers(), g);
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
    const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                  nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr;
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
      ASSIGN_OR_RETURN(TensorView an, Weight(p + "attn_norm.weight", {d}));
      ASSIGN_OR_RETURN(TensorView fn, Weight(p + "ffn_norm.weight", {d}));
      L.attn_norm = ToF32Vec(an);
      L.ffn_norm = ToF32Vec(fn);
      L.kda = c.is_kda_layer(l);
      if (L.kda) {
        L.slot = n_kda++;
        RETURN_IF_ERROR(LoadKda(p, &L.k));
      } else {
        L.slot = n_mla++;
        MlaWeights& M = L.m;
        ASSIGN_OR_RETURN(TensorView kvn, Weight(p + "attn_kv_a_norm.weight", {dc}));
        M.kv_a_norm = ToF32Vec(kvn);
        ASSIGN_OR_RETURN(M.wq, Weight(p + "attn_q.weight", {H * qk, d}));
        ASSIGN_OR_RETURN(M.wkv_a, Weight(p + "attn_kv_a_mqa.weight", {dc + dr, d}));
        ASSIGN_OR_RETURN(M.k_b, Weight(p + "attn_k_b.weight", {H, dc, nope}));
        ASSIGN_OR_RETURN(M.v_b, Weight(p + "attn_v_b.weight", {H, vd, dc}));
        ASSIGN_OR_RETURN(M.wo, Weight(p + "attn_output.weight", {d, H * vd}));
      }
      FfnWeights& F = L.f;
      F.moe = c.is_moe_layer(l);
      if (!F.moe) {
        ASSIGN_OR_RETURN(F.gate, Weight(p + "ffn_gate.weight", {c.d_ff, d}));
        ASSIGN_OR_RETURN(F.up, Weight(p + "ffn_up.weight", {c.d_ff, d}));
        ASSIGN_OR_RETURN(F.down, Weight(p + "ffn_down.weight", {d, c.d_ff}));
      } else {
        const int64_t E = c.n_experts, ffe = c.d_ff_expert;
        ASSIGN_OR_RETURN(F.router, Weight(p + "ffn_gate_inp.weight", {E, d}));
        // llama.cpp's name is exp_probs_b.bias (gguf-py FFN_EXP_PROBS_B); some tools write
        // ffn_exp_probs_b.bias, which is read too.
        bool has_bias = false;
        ASSIGN_OR_RETURN(TensorView rb, OptionalWeight(p + "exp_probs_b.bias", {E}, &has_bias));
        if (!has_bias) {
          ASSIGN_OR_RETURN(rb, OptionalWeight(p + "ffn_exp_probs_b.bias", {E}, &has_bias));
        }
        if (has_bias) F.router_bias = ToF32Vec(rb);
        ASSIGN_OR_RETURN(F.gate_exps, Weight(p + "ffn_gate_exps.weight", {E, ffe, d}));
        ASSIGN_OR_RETURN(F.up_exps, Weight(p + "ffn_up_exps.weight", {E, ffe, d}));
        ASSIGN_OR_RETURN(F.down_exps, Weight(p + "ffn_down_exps.weight", {E, d, ffe}));
        if (c.n_shared_experts > 0) {
          const int64_t ffs = ffe * c.n_shared_experts;
          F.has_shared = true;
          ASSIGN_OR_RETURN(F.gate_sh, Weight(p + "ffn_gate_shexp.weight", {ffs, d}));
          ASSIGN_OR_RETURN(F.up_sh, Weight(p + "ffn_up_shexp.weight", {ffs, d}));
          ASSIGN_OR_RETURN(F.down_sh, Weight(p + "ffn_down_shexp.weight", {d, ffs}));
        }
      }
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
    std::vector<float> xn(n * d), y(n * d);
    for (int l = 0; l < c.n_layers; ++l) {
      const Layer& L = layers_[l];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.attn_norm.data(), d, c.rms_eps, &xn[i * d]);
      if (L.kda) {
        RETURN_IF_ERROR(KdaForward(rows, L, xn.data(), pool, y.data()));
      } else {
        RETURN_IF_ERROR(MlaForward(rows, L, xn.data(), pool, y.data()));
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.ffn_norm.data(), d, c.rms_eps, &xn[i * d]);
      if (!L.f.moe) {
        Ffn(rows, L.f.gate, L.f.up, L.f.down, xn.data(), c.d_ff, pool, y.data());
      } else if (rows.independent && n > 1) {
        MoeBatch(L.f, xn.data(), rows, pool, y.data());
      } else {
        Moe(L.f, xn.data(), rows, pool, y.data());
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
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
      K->conv[j] = ToF32Vec(cv);
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
      K->a = ToF32Vec(av);
      for (int64_t h = 0; h < H; ++h) {
        if (!(K->a[h] < 0.f) || !std::isfinite(K->a[h])) {
          return InvalidArgument("tensor " + name + "[" + std::to_string(h) + "] = " +
                                 std::to_string(K->a[h]) + ": it holds -exp(A_log), so every "
                                 "value must be finite and < 0");
        }
      }
    }
    ASSIGN_OR_RETURN(TensorView dt, Weight(p + "ssm_dt.bias", {C}));
    K->dt_bias = ToF32Vec(dt);
    ASSIGN_OR_RETURN(TensorView on, Weight(p + "ssm_norm.weight", {D}));
    K->onorm = ToF32Vec(on);
    return OkStatus();
  }

  Status KdaForward(const Rows& rows, const Layer& L, const float* xn, ThreadPool* pool,
                    float* y) const {
    const ModelConfig& c = config_;
    const KdaWeights& K = L.k;
    const int n = rows.n;
    const int64_t d = c.d_model, H = c.kda_heads, D = c.kda_head_dim, C = H * D;
    const int W = c.ssm_conv_kernel;
    std::vector<float> q(n * C), k(n * C), v(n * C), fa(n * K.rf), ga(n * K.rg), b(n * H),
        g(n * C), gate(n * C), o(n * C), tmp(C);
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

  // Absorbed NoPE MLA (as deepseek2 with mla_use_nope, no q LoRA).
  Status MlaForward(const Rows& rows, const Layer& L, const float* xn, ThreadPool* pool,
                    float* y) const {
    const ModelConfig& c = config_;
    const MlaWeights& M = L.m;
    const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                  nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr, row = dc + dr;
    const int n = rows.n;
    const int cl = L.slot;
    std::vector<float> q(n * H * qk), kva(n * row), qabs(H * row), att(H * dc), o(n * H * vd);
    const MatVecBatchJob jobs[] = {{M.wq, q.data(), H * qk}, {M.wkv_a, kva.data(), row}};
    ProjectMany(rows, jobs, 2, xn, d, pool);
    for (int i = 0; i < n; ++i) {
      float* r = &kva[i * row];
      RmsNorm(r, M.kv_a_norm.data(), dc, c.rms_eps, r);
      if (!rows.live(i)) continue;
      RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(cl, r, nullptr)));
    }
    for (int i = 0; i < n; ++i) {
      if (!rows.live(i)) continue;
      KvCache* cache = rows.caches[i];
      const int64_t p = rows.pos[i];
      auto absorb = [&](int64_t hb, int64_t he, int) {
        for (int64_t h = hb; h < he; ++h) {
          const float* qh = &q[(i * H + h) * qk];
          float* out = &qabs[h * row];
          MatVec(M.k_b.Rows(h * dc, dc), qh, out, nullptr);
          std::memcpy(out + dc, qh + nope, sizeof(float) * dr);
        }
      };
      ParallelForOrInline(pool, H, 1, absorb);
      RETURN_IF_ERROR(rows.Event(i, cache->ObserveQuery(cl, p, qabs.data())));
      if (!rows.live(i)) continue;
      RETURN_IF_ERROR(rows.Event(i, cache->Attend(cl, qabs.data(), p, pool, att.data())));
      if (!rows.live(i)) continue;
      auto expand = [&](int64_t hb, int64_t he, int) {
        for (int64_t h = hb; h < he; ++h) {
          MatVec(M.v_b.Rows(h * vd, vd), &att[h * dc], &o[(i * H + h) * vd], nullptr);
        }
      };
      ParallelForOrInline(pool, H, 1, expand);
    }
    Project(rows, M.wo, o.data(), H * vd, y, d, pool);
    return OkStatus();
  }

  // y = down(silu(gate x) * up x) for the rows of a pass.
  void Ffn(const Rows& rows, const TensorView& gate, const TensorView& up, const TensorView& down,
           const float* x, int64_t ff, ThreadPool* pool, float* y) const {
    const int64_t d = config_.d_model;
    const int n = rows.n;
    std::vector<float> g(n * ff), u(n * ff);
    const MatVecBatchJob gate_up[] = {{gate, g.data(), ff}, {up, u.data(), ff}};
    ProjectMany(rows, gate_up, 2, x, d, pool);
    if (rows.independent) {
      for (int i = 0; i < n; ++i) SwiGlu(&g[i * ff], &u[i * ff], ff);
    } else {
      SwiGlu(g.data(), u.data(), n * ff);
    }
    Project(rows, down, g.data(), ff, y, d, pool);
  }

  RouteParams Routing(const FfnWeights& F) const {
    const ModelConfig& c = config_;
    RouteParams rp;
    rp.n_experts = c.n_experts;
    rp.n_used = c.n_experts_used;
    rp.gating = c.expert_gating;
    rp.renormalize = c.expert_weights_norm;
    rp.scale = c.expert_weights_scale;
    rp.bias = F.router_bias.empty() ? nullptr : F.router_bias.data();
    return rp;
  }

  // Per token: router, then its experts one by one (shared expert unweighted).
  void Moe(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool,
           float* y) const {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
    const int n = rows.n, K = c.n_experts_used;
    std::vector<float> logits(E), tmp(d), g(ffe), u(ffe), w(K);
    std::vector<int> ids(K);
    if (F.has_shared) {
      Ffn(rows, F.gate_sh, F.up_sh, F.down_sh, x, ffe * c.n_shared_experts, pool, y);
    } else {
      std::fill(y, y + n * d, 0.f);
    }
    const RouteParams rp = Routing(F);
    for (int i = 0; i < n; ++i) {
      const float* xi = x + i * d;
      MatVec(F.router, xi, logits.data(), pool);
      RouteExperts(rp, logits.data(), ids.data(), w.data());
      for (int kk = 0; kk < K; ++kk) {
        const int e = ids[kk];
        const MatVecJob gate_up[] = {{F.gate_exps.Rows(e * ffe, ffe), g.data()},
                                     {F.up_exps.Rows(e * ffe, ffe), u.data()}};
        MatVecMany(gate_up, 2, xi, pool);
        SwiGlu(g.data(), u.data(), ffe);
        MatVec(F.down_exps.Rows(e * d, d), g.data(), tmp.data(), pool);
        Axpy(w[kk], tmp.data(), y + i * d, d);
      }
    }
  }

  // A decode batch: rows grouped by expert so each routed expert is read once per step; each
  // row's expert outputs are added in its own routing order, so every row equals its solo Moe.
  void MoeBatch(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool,
                float* y) const {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
    const int n = rows.n, K = c.n_experts_used;
    if (F.has_shared) {
      Ffn(rows, F.gate_sh, F.up_sh, F.down_sh, x, ffe * c.n_shared_experts, pool, y);
    } else {
      std::fill(y, y + n * d, 0.f);
    }
    std::vector<float> logits(n * E), w(n * K);
    std::vector<int> ids(n * K);
    MatVecBatch(F.router, x, n, d, logits.data(), E, pool);
    const RouteParams rp = Routing(F);
    for (int i = 0; i < n; ++i) {
      if (rows.live(i)) {
        RouteExperts(rp, &logits[i * E], &ids[i * K], &w[i * K]);
      } else {
        std::fill(&ids[i * K], &ids[i * K] + K, -1);
        std::fill(&w[i * K], &w[i * K] + K, 0.f);
      }
    }
    std::vector<std::vector<int>> slots(E);
    for (int s = 0; s < n * K; ++s) {
      if (ids[s] >= 0) slots[ids[s]].push_back(s);
    }
    std::vector<float> out(static_cast<size_t>(n) * K * d, 0.f), xg, g, u, dn;
    for (int64_t e = 0; e < E; ++e) {
      const int m = static_cast<int>(slots[e].size());
      if (m == 0) continue;
      xg.resize(m * d);
      for (int j = 0; j < m; ++j) {
        std::memcpy(&xg[j * d], x + (slots[e][j] / K) * d, sizeof(float) * d);
      }
      g.resize(m * ffe);
      u.resize(m * ffe);
      dn.resize(m * d);
      const MatVecBatchJob gate_up[] = {{F.gate_exps.Rows(e * ffe, ffe), g.data(), ffe},
                                        {F.up_exps.Rows(e * ffe, ffe), u.data(), ffe}};
      MatVecBatchMany(gate_up, 2, xg.data(), m, d, pool);
      for (int j = 0; j < m; ++j) SwiGlu(&g[j * ffe], &u[j * ffe], ffe);
      MatVecBatch(F.down_exps.Rows(e * d, d), g.data(), m, ffe, dn.data(), d, pool);
      for (int j = 0; j < m; ++j) {
        std::memcpy(&out[static_cast<size_t>(slots[e][j]) * d], &dn[j * d], sizeof(float) * d);
      }
    }
    for (int i = 0; i < n; ++i) {
      for (int kk = 0; kk < K; ++kk) {
        Axpy(w[i * K + kk], &out[(static_cast<size_t>(i) * K + kk) * d], y + i * d, d);
      }
    }
  }

  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> NewKimiLinearModel(std::unique_ptr<GgufFile> file,
                                          const ModelConfig& config) {
  return std::make_unique<KimiLinearModel>(std::move(file), config);
}

}  // namespace strata
