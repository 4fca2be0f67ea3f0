#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/scratch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace strata {
namespace {

TensorView OwnedF32(const std::vector<float>& buf, std::vector<int64_t> shape) {
  TensorView t;
  t.data = buf.data();
  t.dtype = DType::kF32;
  t.n_dims = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

}  // namespace

LayerGeometry MlaModel::MlaGeometry() const {
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
  return g;
}

Status MlaModel::LoadMla(const std::string& p, MlaWeights* M) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr;
  ASSIGN_OR_RETURN(TensorView kvn, Weight(p + "attn_kv_a_norm.weight", {dc}));
  M->kv_a_norm = F32Values(kvn);
  if (c.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(M->wq_a, Weight(p + "attn_q_a.weight", {c.q_lora_rank, d}));
    ASSIGN_OR_RETURN(TensorView qn, Weight(p + "attn_q_a_norm.weight", {c.q_lora_rank}));
    M->q_a_norm = F32Values(qn);
    ASSIGN_OR_RETURN(M->wq_b, Weight(p + "attn_q_b.weight", {H * qk, c.q_lora_rank}));
  } else {
    ASSIGN_OR_RETURN(M->wq, Weight(p + "attn_q.weight", {H * qk, d}));
  }
  ASSIGN_OR_RETURN(M->wkv_a, Weight(p + "attn_kv_a_mqa.weight", {dc + dr, d}));
  ASSIGN_OR_RETURN(M->wo, Weight(p + "attn_output.weight", {d, H * vd}));
  bool has_kb = false;
  ASSIGN_OR_RETURN(M->k_b, OptionalWeight(p + "attn_k_b.weight", {H, dc, nope}, &has_kb));
  if (has_kb) {
    ASSIGN_OR_RETURN(M->v_b, Weight(p + "attn_v_b.weight", {H, vd, dc}));
    return OkStatus();
  }
  // Legacy unsplit kv_b [H * (nope + v), d_c]: split into W_UK,h^T and W_UV,h at load.
  ASSIGN_OR_RETURN(TensorView kvb, Weight(p + "attn_kv_b.weight", {H * (nope + vd), dc}));
  std::vector<float> full = F32Values(kvb);
  M->k_b_owned.resize(H * dc * nope);
  M->v_b_owned.resize(H * vd * dc);
  for (int64_t h = 0; h < H; ++h) {
    const float* base = full.data() + h * (nope + vd) * dc;
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t j = 0; j < dc; ++j) M->k_b_owned[(h * dc + j) * nope + i] = base[i * dc + j];
    }
    std::memcpy(&M->v_b_owned[h * vd * dc], base + nope * dc, sizeof(float) * vd * dc);
  }
  M->k_b = OwnedF32(M->k_b_owned, {H, dc, nope});
  M->v_b = OwnedF32(M->v_b_owned, {H, vd, dc});
  return OkStatus();
}

Status MlaModel::MlaForward(const Rows& rows, const MlaWeights& M, int cache_layer, const float* xn,
                            ThreadPool* pool, float* y) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                nope = c.qk_nope_dim, vd = c.v_head_dim, qk = nope + dr, row = dc + dr;
  const int n = rows.n;
  const int l = cache_layer;
  const int group = std::min(n, kAbsorbRows);
  RopeParams rope;
  rope.freq_base = c.rope_base;
  rope.freq_scale = c.rope_freq_scale;
  ScratchScope ws;
  std::span<float> q = ws.Floats(n * H * qk), kva = ws.Floats(n * row),
                   qabs = ws.Floats(group * H * row), att = ws.Floats(group * H * dc),
                   o = ws.Floats(n * H * vd);
  std::span<float> qa = ws.Floats(c.q_lora_rank > 0 ? n * c.q_lora_rank : 0);
  // The projections of xn: q (or its LoRA down-projection) and kv_a; in decode as one pool
  // dispatch.
  const TensorView& wq_x = c.q_lora_rank > 0 ? M.wq_a : M.wq;
  float* q_x = c.q_lora_rank > 0 ? qa.data() : q.data();
  const MatVecBatchJob jobs[] = {{wq_x, q_x, wq_x.rows()}, {M.wkv_a, kva.data(), row}};
  ProjectMany(rows, jobs, 2, xn, d, pool);
  if (c.q_lora_rank > 0) {
    const int64_t r = c.q_lora_rank;
    for (int i = 0; i < n; ++i) RmsNorm(&qa[i * r], M.q_a_norm.data(), r, c.rms_eps, &qa[i * r]);
    Project(rows, M.wq_b, qa.data(), r, q.data(), H * qk, pool);
  }
  // Cache rows: [RMSNorm(c) ; k_pe (rotated unless NoPE)].
  for (int i = 0; i < n; ++i) {
    float* r = &kva[i * row];
    RmsNorm(r, M.kv_a_norm.data(), dc, c.rms_eps, r);
    if (!c.mla_nope) Rope(r + dc, static_cast<int>(dr), rows.pos[i], RopeStyle::kNorm, rope);
    if (!rows.live(i)) continue;
    RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(l, r, nullptr)));
  }
  for (int i0 = 0; i0 < n; i0 += kAbsorbRows) {
    const int m = std::min(n - i0, kAbsorbRows);
    // Absorbed queries for every row of the group and every head, in parallel over heads.
    auto absorb = [&](int64_t hb, int64_t he, int) {
      for (int64_t h = hb; h < he; ++h) {
        MatVecBatch(M.k_b.Rows(h * dc, dc), &q[(i0 * H + h) * qk], m, H * qk, &qabs[h * row],
                    H * row, nullptr);
        for (int j = 0; j < m; ++j) {
          float* out = &qabs[(j * H + h) * row];
          std::memcpy(out + dc, &q[((i0 + j) * H + h) * qk + nope], sizeof(float) * dr);
          if (!c.mla_nope) {
            Rope(out + dc, static_cast<int>(dr), rows.pos[i0 + j], RopeStyle::kNorm, rope);
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
        MatVecBatch(M.v_b.Rows(h * vd, vd), &att[h * dc], m, H * dc, &o[(i0 * H + h) * vd], H * vd,
                    nullptr);
      }
    };
    ParallelForOrInline(pool, H, 1, expand);
  }
  Project(rows, M.wo, o.data(), H * vd, y, d, pool);
  return OkStatus();
}

}  // namespace strata
