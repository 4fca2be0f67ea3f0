// deepseek2 forward pass: MLA with absorbed attention over 576-wide latent rows [c_hat ; r] (the
// branch last), RoPE or NoPE on the branch, optional q LoRA, and MoE FFNs (softmax or sigmoid
// routing, top-k, shared experts, leading dense layers).
//
// Absorbed form, per head h:  q_abs_h = [W_UK,h^T q_nope_h ; q_pe_h]  (d_c + d_r),
//   s_h(u) = q_abs_h . row_u / sqrt(nope + rope),  o_hat_h = sum softmax * c_hat_u  (d_c),
//   o_h = W_UV,h o_hat_h  (v),  out = W_o concat_h o_h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/arch.h"

namespace strata {
namespace {

struct MlaLayer {
  std::vector<float> attn_norm, ffn_norm, kv_a_norm, q_a_norm;
  TensorView wq, wq_a, wq_b, wkv_a, wo;
  TensorView k_b;  // [H, d_c, nope]: per head W_UK,h^T
  TensorView v_b;  // [H, v, d_c]: per head W_UV,h
  std::vector<float> k_b_owned, v_b_owned;  // filled when split from a legacy attn_kv_b
  // FFN: dense or MoE
  bool moe = false;
  TensorView gate, up, down;                        // dense [ff, d], [ff, d], [d, ff]
  TensorView router;                                // [E, d]
  std::vector<float> router_bias;                   // [E] exp_probs_b (sigmoid routing), optional
  TensorView gate_exps, up_exps, down_exps;         // [E, ffe, d], [E, ffe, d], [E, d, ffe]
  TensorView gate_sh, up_sh, down_sh;               // shared experts [ffs, d], [ffs, d], [d, ffs]
  bool has_shared = false;
};

TensorView OwnedF32(const std::vector<float>& buf, std::vector<int64_t> shape) {
  TensorView t;
  t.data = buf.data();
  t.dtype = DType::kF32;
  t.n_dims = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

std::vector<float> ToF32Vec(const TensorView& t) {
  std::vector<float> v(t.numel());
  ToF32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

class Deepseek2Model final : public Model {
 public:
  Deepseek2Model(std::unique_ptr<GgufFile> f, const ModelConfig& c) : Model(std::move(f), c) {}

  std::vector<LayerGeometry> CacheLayers() const override {
    const ModelConfig& c = config_;
    LayerGeometry g;
    g.kind = AttnKind::kMla;
    g.n_q_heads = c.n_heads;
    g.n_kv_heads = 1;
    g.k_dim = c.kv_lora_rank + c.qk_rope_dim;
    g.v_dim = c.kv_lora_rank;
    g.rope_dim = c.qk_rope_dim;
    g.rope = !c.mla_nope;
    g.scale = 1.f / std::sqrt(static_cast<float>(c.qk_nope_dim + c.qk_rope_dim));
    return std::vector<LayerGeometry>(c.n_layers, g);
  }

 protected:
  Status LoadWeights() override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                  nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr;
    // Grown as each layer's tensors check out (block_count is bounded by the file's tensor count
    // in ModelConfig). Reserved so that no reallocation moves a layer whose views point into it.
    layers_.clear();
    layers_.reserve(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      MlaLayer& L = layers_.emplace_back();
      ASSIGN_OR_RETURN(TensorView an, Weight(p + "attn_norm.weight", {d}));
      ASSIGN_OR_RETURN(TensorView fn, Weight(p + "ffn_norm.weight", {d}));
      ASSIGN_OR_RETURN(TensorView kvn, Weight(p + "attn_kv_a_norm.weight", {dc}));
      L.attn_norm = ToF32Vec(an);
      L.ffn_norm = ToF32Vec(fn);
      L.kv_a_norm = ToF32Vec(kvn);
      if (c.q_lora_rank > 0) {
        ASSIGN_OR_RETURN(L.wq_a, Weight(p + "attn_q_a.weight", {c.q_lora_rank, d}));
        ASSIGN_OR_RETURN(TensorView qn, Weight(p + "attn_q_a_norm.weight", {c.q_lora_rank}));
        L.q_a_norm = ToF32Vec(qn);
        ASSIGN_OR_RETURN(L.wq_b, Weight(p + "attn_q_b.weight", {H * qk, c.q_lora_rank}));
      } else {
        ASSIGN_OR_RETURN(L.wq, Weight(p + "attn_q.weight", {H * qk, d}));
      }
      ASSIGN_OR_RETURN(L.wkv_a, Weight(p + "attn_kv_a_mqa.weight", {dc + dr, d}));
      ASSIGN_OR_RETURN(L.wo, Weight(p + "attn_output.weight", {d, H * vd}));
      bool has_kb = false;
      ASSIGN_OR_RETURN(L.k_b, OptionalWeight(p + "attn_k_b.weight", {H, dc, nope}, &has_kb));
      if (has_kb) {
        ASSIGN_OR_RETURN(L.v_b, Weight(p + "attn_v_b.weight", {H, vd, dc}));
      } else {
        // Legacy unsplit kv_b [H * (nope + v), d_c]: split into W_UK,h^T and W_UV,h at load.
        ASSIGN_OR_RETURN(TensorView kvb, Weight(p + "attn_kv_b.weight", {H * (nope + vd), dc}));
        std::vector<float> full = ToF32Vec(kvb);
        L.k_b_owned.resize(H * dc * nope);
        L.v_b_owned.resize(H * vd * dc);
        for (int64_t h = 0; h < H; ++h) {
          const float* base = full.data() + h * (nope + vd) * dc;
          for (int64_t i = 0; i < nope; ++i) {
            for (int64_t j = 0; j < dc; ++j) L.k_b_owned[(h * dc + j) * nope + i] = base[i * dc + j];
          }
          std::memcpy(&L.v_b_owned[h * vd * dc], base + nope * dc, sizeof(float) * vd * dc);
        }
        L.k_b = OwnedF32(L.k_b_owned, {H, dc, nope});
        L.v_b = OwnedF32(L.v_b_owned, {H, vd, dc});
      }
      L.moe = c.is_moe_layer(l);
      if (!L.moe) {
        ASSIGN_OR_RETURN(L.gate, Weight(p + "ffn_gate.weight", {c.d_ff, d}));
        ASSIGN_OR_RETURN(L.up, Weight(p + "ffn_up.weight", {c.d_ff, d}));
        ASSIGN_OR_RETURN(L.down, Weight(p + "ffn_down.weight", {d, c.d_ff}));
      } else {
        const int64_t E = c.n_experts, ffe = c.d_ff_expert;
        ASSIGN_OR_RETURN(L.router, Weight(p + "ffn_gate_inp.weight", {E, d}));
        bool has_bias = false;
        ASSIGN_OR_RETURN(TensorView rb, OptionalWeight(p + "exp_probs_b.bias", {E}, &has_bias));
        if (has_bias) L.router_bias = ToF32Vec(rb);
        ASSIGN_OR_RETURN(L.gate_exps, Weight(p + "ffn_gate_exps.weight", {E, ffe, d}));
        ASSIGN_OR_RETURN(L.up_exps, Weight(p + "ffn_up_exps.weight", {E, ffe, d}));
        ASSIGN_OR_RETURN(L.down_exps, Weight(p + "ffn_down_exps.weight", {E, d, ffe}));
        if (c.n_shared_experts > 0) {
          const int64_t ffs = ffe * c.n_shared_experts;
          L.has_shared = true;
          ASSIGN_OR_RETURN(L.gate_sh, Weight(p + "ffn_gate_shexp.weight", {ffs, d}));
          ASSIGN_OR_RETURN(L.up_sh, Weight(p + "ffn_up_shexp.weight", {ffs, d}));
          ASSIGN_OR_RETURN(L.down_sh, Weight(p + "ffn_down_shexp.weight", {d, ffs}));
        }
      }
    }
    rope_.freq_base = c.rope_base;
    rope_.freq_scale = c.rope_freq_scale;
    return OkStatus();
  }

  Status ForwardChunk(const Rows& rows, ThreadPool* pool, float* x) override {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                  nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr, row = dc + dr;
    const int n = rows.n;
    Embed(rows.tokens, n, x);
    const int group = std::min(n, kAbsorbRows);
    std::vector<float> xn(n * d), q(n * H * qk), kva(n * row), qabs(group * H * row),
        att(group * H * dc), o(n * H * vd), y(n * d);
    std::vector<float> qa(c.q_lora_rank > 0 ? n * c.q_lora_rank : 0);
    for (int l = 0; l < c.n_layers; ++l) {
      const MlaLayer& L = layers_[l];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.attn_norm.data(), d, c.rms_eps, &xn[i * d]);
      // The projections of xn: q (or its LoRA down-projection) and kv_a; in decode as one pool
      // dispatch.
      const TensorView& wq_x = c.q_lora_rank > 0 ? L.wq_a : L.wq;
      float* q_x = c.q_lora_rank > 0 ? qa.data() : q.data();
      const MatVecBatchJob jobs[] = {{wq_x, q_x, wq_x.rows()}, {L.wkv_a, kva.data(), row}};
      ProjectMany(rows, jobs, 2, xn.data(), d, pool);
      if (c.q_lora_rank > 0) {
        const int64_t r = c.q_lora_rank;
        for (int i = 0; i < n; ++i) RmsNorm(&qa[i * r], L.q_a_norm.data(), r, c.rms_eps, &qa[i * r]);
        Project(rows, L.wq_b, qa.data(), r, q.data(), H * qk, pool);
      }
      // Cache rows: [RMSNorm(c) ; k_pe (rotated unless NoPE)].
      for (int i = 0; i < n; ++i) {
        float* r = &kva[i * row];
        RmsNorm(r, L.kv_a_norm.data(), dc, c.rms_eps, r);
        if (!c.mla_nope) Rope(r + dc, static_cast<int>(dr), rows.pos[i], RopeStyle::kNorm, rope_);
        if (!rows.live(i)) continue;
        RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(l, r, nullptr)));
      }
      // Rows in groups of up to kAbsorbRows: the group's absorbed queries, then each row's
      // observation and read (in row order), then the group's value expansion. The per-head
      // products W_UK,h^T q and W_UV,h att are MatVecBatch over the group's rows (== MatVec per
      // row bit for bit), so each head's weights are read once per group instead of once per row.
      for (int i0 = 0; i0 < n; i0 += kAbsorbRows) {
        const int m = std::min(n - i0, kAbsorbRows);
        // Absorbed queries for every row of the group and every head, in parallel over heads.
        auto absorb = [&](int64_t hb, int64_t he, int) {
          for (int64_t h = hb; h < he; ++h) {
            MatVecBatch(L.k_b.Rows(h * dc, dc), &q[(i0 * H + h) * qk], m, H * qk,
                        &qabs[h * row], H * row, nullptr);
            for (int j = 0; j < m; ++j) {
              float* out = &qabs[(j * H + h) * row];
              std::memcpy(out + dc, &q[((i0 + j) * H + h) * qk + nope], sizeof(float) * dr);
              if (!c.mla_nope) {
                Rope(out + dc, static_cast<int>(dr), rows.pos[i0 + j], RopeStyle::kNorm, rope_);
              }
            }
          }
        };
        ParallelForOrInline(pool, H, 1, absorb);
        for (int j = 0; j < m; ++j) {
          const int i = i0 + j;
          if (!rows.live(i)) continue;  // its o rows stay as they were: meaningless, not read back
          KvCache* cache = rows.caches[i];
          const int64_t p = rows.pos[i];
          const float* qa_i = &qabs[j * H * row];
          RETURN_IF_ERROR(rows.Event(i, cache->ObserveQuery(l, p, qa_i)));
          if (!rows.live(i)) continue;
          RETURN_IF_ERROR(rows.Event(i, cache->Attend(l, qa_i, p, pool, &att[j * H * dc])));
        }
        // Rows that failed expand whatever their att holds: meaningless, not read back.
        auto expand = [&](int64_t hb, int64_t he, int) {
          for (int64_t h = hb; h < he; ++h) {
            MatVecBatch(L.v_b.Rows(h * vd, vd), &att[h * dc], m, H * dc, &o[(i0 * H + h) * vd],
                        H * vd, nullptr);
          }
        };
        ParallelForOrInline(pool, H, 1, expand);
      }
      Project(rows, L.wo, o.data(), H * vd, y.data(), d, pool);
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
      for (int i = 0; i < n; ++i) RmsNorm(x + i * d, L.ffn_norm.data(), d, c.rms_eps, &xn[i * d]);
      if (!L.moe) {
        Ffn(rows, L.gate, L.up, L.down, xn.data(), c.d_ff, pool, y.data());
      } else if (n > 1) {  // a decode batch or a prefill chunk (== Moe per row bit for bit)
        MoeBatch(L, xn.data(), rows, pool, y.data());
      } else {
        Moe(L, xn.data(), rows, pool, y.data());
      }
      for (int64_t j = 0; j < n * d; ++j) x[j] += y[j];
    }
    return OkStatus();
  }

 private:
  // Rows per group of the absorbed-query and value-expansion products in ForwardChunk.
  static constexpr int kAbsorbRows = 64;

  // y = down(silu(gate x) * up x) for the rows of a pass.
  void Ffn(const Rows& rows, const TensorView& gate, const TensorView& up, const TensorView& down,
           const float* x, int64_t ff, ThreadPool* pool, float* y) const {
    const int64_t d = config_.d_model;
    const int n = rows.n;
    std::vector<float> g(n * ff), u(n * ff);
    const MatVecBatchJob gate_up[] = {{gate, g.data(), ff}, {up, u.data(), ff}};
    ProjectMany(rows, gate_up, 2, x, d, pool);
    if (rows.independent) {
      for (int i = 0; i < n; ++i) SwiGlu(&g[i * ff], &u[i * ff], ff);  // as each solo row
    } else {
      SwiGlu(g.data(), u.data(), n * ff);
    }
    Project(rows, down, g.data(), ff, y, d, pool);
  }

  // The routed experts of token x: ids[k] and weights w[k] for k < n_experts_used, from the
  // router logits (overwritten by the scores).
  void Route(const MlaLayer& L, float* logits, int* ids, float* w) const {
    const ModelConfig& c = config_;
    const int64_t E = c.n_experts;
    std::vector<float> sel_key(E);
    std::vector<int> order(E);
    if (c.expert_gating == 2) {
      for (int64_t e = 0; e < E; ++e) logits[e] = 1.f / (1.f + std::exp(-logits[e]));
    } else {
      Softmax(logits, E);
    }
    const float* score = logits;
    for (int64_t e = 0; e < E; ++e) {
      sel_key[e] = score[e] + (L.router_bias.empty() ? 0.f : L.router_bias[e]);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + c.n_experts_used, order.end(),
                      [&](int a, int b) { return sel_key[a] != sel_key[b] ? sel_key[a] > sel_key[b] : a < b; });
    double wsum = 0;
    for (int k = 0; k < c.n_experts_used; ++k) wsum += score[order[k]];
    for (int k = 0; k < c.n_experts_used; ++k) {
      const int e = order[k];
      float wk = score[e];
      if (c.expert_weights_norm && wsum > 0) wk = static_cast<float>(wk / wsum);
      wk *= c.expert_weights_scale;
      ids[k] = e;
      w[k] = wk;
    }
  }

  // One decoded token: router, then its experts one by one.
  void Moe(const MlaLayer& L, const float* x, const Rows& rows, ThreadPool* pool, float* y) const {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
    const int n = rows.n, K = c.n_experts_used;
    std::vector<float> logits(E), tmp(d), g(ffe), u(ffe), w(K);
    std::vector<int> ids(K);
    if (L.has_shared) {
      Ffn(rows, L.gate_sh, L.up_sh, L.down_sh, x, ffe * c.n_shared_experts, pool, y);
    } else {
      std::fill(y, y + n * d, 0.f);
    }
    for (int i = 0; i < n; ++i) {
      const float* xi = x + i * d;
      MatVec(L.router, xi, logits.data(), pool);
      Route(L, logits.data(), ids.data(), w.data());
      for (int k = 0; k < K; ++k) {
        const int e = ids[k];
        const MatVecJob gate_up[] = {{L.gate_exps.Rows(e * ffe, ffe), g.data()},
                                     {L.up_exps.Rows(e * ffe, ffe), u.data()}};
        MatVecMany(gate_up, 2, xi, pool);
        SwiGlu(g.data(), u.data(), ffe);
        MatVec(L.down_exps.Rows(e * d, d), g.data(), tmp.data(), pool);
        Axpy(w[k], tmp.data(), y + i * d, d);
      }
    }
  }

  // A decode batch or a prefill chunk: the router for every row in one product, then the rows
  // grouped by expert so that each routed expert's weights are read once per pass (MatVecBatch
  // over its rows; per token they were streamed once per row), and each row's expert outputs added in its own routing order, as Moe adds them, so
  // every row equals its solo Moe bit for bit.
  void MoeBatch(const MlaLayer& L, const float* x, const Rows& rows, ThreadPool* pool,
                float* y) const {
    const ModelConfig& c = config_;
    const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
    const int n = rows.n, K = c.n_experts_used;
    if (L.has_shared) {
      Ffn(rows, L.gate_sh, L.up_sh, L.down_sh, x, ffe * c.n_shared_experts, pool, y);
    } else {
      std::fill(y, y + n * d, 0.f);
    }
    std::vector<float> logits(n * E), w(n * K);
    std::vector<int> ids(n * K);
    MatVecBatch(L.router, x, n, d, logits.data(), E, pool);
    for (int i = 0; i < n; ++i) {
      if (rows.live(i)) {
        Route(L, &logits[i * E], &ids[i * K], &w[i * K]);
      } else {  // a failed sequence's (meaningless) state is not routed
        std::fill(&ids[i * K], &ids[i * K] + K, -1);
        std::fill(&w[i * K], &w[i * K] + K, 0.f);
      }
    }
    // slots[e]: the (row, k) pairs routed to expert e, in row order.
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
      const MatVecBatchJob gate_up[] = {{L.gate_exps.Rows(e * ffe, ffe), g.data(), ffe},
                                        {L.up_exps.Rows(e * ffe, ffe), u.data(), ffe}};
      MatVecBatchMany(gate_up, 2, xg.data(), m, d, pool);
      for (int j = 0; j < m; ++j) SwiGlu(&g[j * ffe], &u[j * ffe], ffe);
      MatVecBatch(L.down_exps.Rows(e * d, d), g.data(), m, ffe, dn.data(), d, pool);
      for (int j = 0; j < m; ++j) {
        std::memcpy(&out[static_cast<size_t>(slots[e][j]) * d], &dn[j * d], sizeof(float) * d);
      }
    }
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < K; ++k) Axpy(w[i * K + k], &out[(static_cast<size_t>(i) * K + k) * d], y + i * d, d);
    }
  }

  std::vector<MlaLayer> layers_;
  RopeParams rope_;
};

}  // namespace

std::unique_ptr<Model> NewDeepseek2Model(std::unique_ptr<GgufFile> file, const ModelConfig& config) {
  return std::make_unique<Deepseek2Model>(std::move(file), config);
}

}  // namespace strata
