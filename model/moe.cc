#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/scratch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace strata {

void RouteExperts(const RouteParams& p, float* logits, int* ids, float* w) {
  const int E = p.n_experts;
  if (p.gating == 2) {
    for (int e = 0; e < E; ++e) logits[e] = 1.f / (1.f + std::exp(-logits[e]));
  } else {
    Softmax(logits, E);
  }
  std::vector<float> key(E);
  for (int e = 0; e < E; ++e) key[e] = logits[e] + (p.bias ? p.bias[e] : 0.f);
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + p.n_used, order.end(), [&](int a, int b) {
    return key[a] != key[b] ? key[a] > key[b] : a < b;
  });
  double sum = 0;
  for (int k = 0; k < p.n_used; ++k) sum += logits[order[k]];
  for (int k = 0; k < p.n_used; ++k) {
    const int e = order[k];
    float wk = logits[e];  // the unbiased score
    if (p.renormalize && sum > 0) wk = static_cast<float>(wk / sum);
    ids[k] = e;
    w[k] = wk * p.scale;
  }
}

std::vector<float> MoeModel::F32Values(const TensorView& t) {
  std::vector<float> v(t.numel());
  ToF32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

Status MoeModel::LoadNorm(const std::string& name, std::vector<float>* w) const {
  ASSIGN_OR_RETURN(TensorView t, Weight(name, {config_.d_model}));
  *w = F32Values(t);
  return OkStatus();
}

void MoeModel::NormRows(const float* x, const std::vector<float>& w, int n, float* out) const {
  const int64_t d = config_.d_model;
  for (int i = 0; i < n; ++i) RmsNorm(x + i * d, w.data(), d, config_.rms_eps, out + i * d);
}

void MoeModel::FeedForwardResidual(const FfnWeights& F, const std::vector<float>& norm,
                                   const Rows& rows, ThreadPool* pool, float* x, float* xn,
                                   float* y) const {
  const int64_t nd = rows.n * config_.d_model;
  NormRows(x, norm, rows.n, xn);
  FeedForward(F, rows, xn, pool, y);
  for (int64_t j = 0; j < nd; ++j) x[j] += y[j];
}

Status MoeModel::LoadFfn(const std::string& p, int layer, FfnWeights* F) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  F->moe = c.is_moe_layer(layer);
  if (!F->moe) {
    ASSIGN_OR_RETURN(F->gate, Weight(p + "ffn_gate.weight", {c.d_ff, d}));
    ASSIGN_OR_RETURN(F->up, Weight(p + "ffn_up.weight", {c.d_ff, d}));
    ASSIGN_OR_RETURN(F->down, Weight(p + "ffn_down.weight", {d, c.d_ff}));
    return OkStatus();
  }
  const int64_t E = c.n_experts, ffe = c.d_ff_expert;
  ASSIGN_OR_RETURN(F->router, Weight(p + "ffn_gate_inp.weight", {E, d}));
  // llama.cpp's name is exp_probs_b.bias (gguf-py FFN_EXP_PROBS_B); some tools write
  // ffn_exp_probs_b.bias, which is read too.
  bool has_bias = false;
  ASSIGN_OR_RETURN(TensorView rb, OptionalWeight(p + "exp_probs_b.bias", {E}, &has_bias));
  if (!has_bias) {
    ASSIGN_OR_RETURN(rb, OptionalWeight(p + "ffn_exp_probs_b.bias", {E}, &has_bias));
  }
  if (has_bias) F->router_bias = F32Values(rb);
  ASSIGN_OR_RETURN(F->gate_exps, Weight(p + "ffn_gate_exps.weight", {E, ffe, d}));
  ASSIGN_OR_RETURN(F->up_exps, Weight(p + "ffn_up_exps.weight", {E, ffe, d}));
  ASSIGN_OR_RETURN(F->down_exps, Weight(p + "ffn_down_exps.weight", {E, d, ffe}));
  if (c.n_shared_experts > 0) {
    const int64_t ffs = ffe * c.n_shared_experts;
    F->has_shared = true;
    ASSIGN_OR_RETURN(F->gate_sh, Weight(p + "ffn_gate_shexp.weight", {ffs, d}));
    ASSIGN_OR_RETURN(F->up_sh, Weight(p + "ffn_up_shexp.weight", {ffs, d}));
    ASSIGN_OR_RETURN(F->down_sh, Weight(p + "ffn_down_shexp.weight", {d, ffs}));
  }
  return OkStatus();
}

void MoeModel::FeedForward(const FfnWeights& F, const Rows& rows, const float* x, ThreadPool* pool,
                           float* y) const {
  if (!F.moe) {
    SwiGluFfn(rows, F.gate, F.up, F.down, x, config_.d_ff, pool, y);
  } else if (rows.n > 1) {  // a decode batch or a prefill chunk (== Moe per row bit for bit)
    MoeBatch(F, x, rows, pool, y);
  } else {
    Moe(F, x, rows, pool, y);
  }
}

void MoeModel::SwiGluFfn(const Rows& rows, const TensorView& gate, const TensorView& up,
                         const TensorView& down, const float* x, int64_t ff, ThreadPool* pool,
                         float* y) const {
  const int64_t d = config_.d_model;
  const int n = rows.n;
  ScratchScope ws;
  std::span<float> g = ws.Floats(n * ff), u = ws.Floats(n * ff);
  const MatVecBatchJob gate_up[] = {{gate, g.data(), ff}, {up, u.data(), ff}};
  ProjectMany(rows, gate_up, 2, x, d, pool);
  if (rows.independent) {
    for (int i = 0; i < n; ++i) SwiGlu(&g[i * ff], &u[i * ff], ff);  // as each solo row
  } else {
    SwiGlu(g.data(), u.data(), n * ff);
  }
  Project(rows, down, g.data(), ff, y, d, pool);
}

RouteParams MoeModel::Routing(const FfnWeights& F) const {
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

void MoeModel::Moe(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool,
                   float* y) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
  const int n = rows.n, K = c.n_experts_used;
  std::vector<float> logits(E), tmp(d), g(ffe), u(ffe), w(K);
  std::vector<int> ids(K);
  if (F.has_shared) {
    SwiGluFfn(rows, F.gate_sh, F.up_sh, F.down_sh, x, ffe * c.n_shared_experts, pool, y);
  } else {
    std::fill(y, y + n * d, 0.f);
  }
  const RouteParams rp = Routing(F);
  for (int i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    MatVec(F.router, xi, logits.data(), pool);
    RouteExperts(rp, logits.data(), ids.data(), w.data());
    for (int k = 0; k < K; ++k) {
      const int e = ids[k];
      const MatVecJob gate_up[] = {{F.gate_exps.Rows(e * ffe, ffe), g.data()},
                                   {F.up_exps.Rows(e * ffe, ffe), u.data()}};
      MatVecMany(gate_up, 2, xi, pool);
      SwiGlu(g.data(), u.data(), ffe);
      MatVec(F.down_exps.Rows(e * d, d), g.data(), tmp.data(), pool);
      Axpy(w[k], tmp.data(), y + i * d, d);
    }
  }
}

void MoeModel::MoeBatch(const FfnWeights& F, const float* x, const Rows& rows, ThreadPool* pool,
                        float* y) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, E = c.n_experts, ffe = c.d_ff_expert;
  const int n = rows.n, K = c.n_experts_used;
  if (F.has_shared) {
    SwiGluFfn(rows, F.gate_sh, F.up_sh, F.down_sh, x, ffe * c.n_shared_experts, pool, y);
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
  // Work arrays sized for the largest expert group (at most n rows: one slot per row and expert).
  int max_m = 0;
  for (int64_t e = 0; e < E; ++e) max_m = std::max(max_m, static_cast<int>(slots[e].size()));
  ScratchScope ws;
  std::span<float> out = ws.Floats(static_cast<size_t>(n) * K * d), xg = ws.Floats(max_m * d),
                   g = ws.Floats(max_m * ffe), u = ws.Floats(max_m * ffe),
                   dn = ws.Floats(max_m * d);
  for (int64_t e = 0; e < E; ++e) {
    const int m = static_cast<int>(slots[e].size());
    if (m == 0) continue;
    for (int j = 0; j < m; ++j) {
      std::memcpy(&xg[j * d], x + (slots[e][j] / K) * d, sizeof(float) * d);
    }
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
    for (int k = 0; k < K; ++k) {
      Axpy(w[i * K + k], &out[(static_cast<size_t>(i) * K + k) * d], y + i * d, d);
    }
  }
}

}  // namespace strata
