#include "model/mla.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "core/scratch.h"
#include "kernels/attention_many.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace strata {
namespace {

TensorView F32View(const float* data, std::vector<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = DType::kF32;
  t.n_dims = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}
TensorView OwnedF32(const std::vector<float>& buf, std::vector<int64_t> shape) {
  return F32View(buf.data(), std::move(shape));
}

// Rows decompressed at once by ExpandedAttention: bounds its scratch at
// kExpandSegmentRows x (d_c + d_r + nope + v) x 4 bytes (DeepSeek-V2 shapes: 7 MiB) whatever the
// context.
constexpr int64_t kExpandSegmentRows = 2048;
// Observed queries' column sums come from the attention pass itself (AttendStagedObserved) up to
// this many rows: a head's decompressed rows staged whole, (nope + d_r + v) x 4 bytes per row
// (40 MiB at DeepSeek-V2's shapes), plus 64 x 4 bytes per row per pool thread for the kept
// weights. Longer contexts take a second pass over the re-decompressed keys (StagedColumnSums).
constexpr int64_t kMlaObservedRows = 32768;
std::atomic<int64_t> g_observed_rows{kMlaObservedRows};  // tests lower it (SetObservedRowsForTest)

std::atomic<int64_t> g_expanded_min_rows{0};

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
  // A long prefill chunk whose reads the policy grants in bulk reads in the expanded form: its
  // absorbed queries are then formed only for the rows the cache observes.
  bool expanded = false;
  if (!rows.independent && n >= 2 && ExpandedPays(n)) {
    bool one_sequence = true;
    for (int i = 0; i < n; ++i) {
      one_sequence = one_sequence && rows.caches[i] == rows.caches[0] && rows.live(i) &&
                     rows.pos[i] == rows.pos[0] + i;
    }
    expanded = one_sequence && rows.caches[0]->ClaimDenseReads(l, rows.pos[0], n);
  }
  // The chunk's observed queries [obs_a, obs_b) (a run: the observed window is a range of
  // positions), delivered as column sums by the expanded pass where the policy takes them.
  int obs_a = n, obs_b = n;
  bool col_sums = false;
  if (expanded) {
    for (int i = 0; i < n; ++i) {
      if (!rows.caches[0]->observes(rows.pos[i])) continue;
      obs_a = std::min(obs_a, i);
      obs_b = i + 1;
    }
    col_sums = obs_b > obs_a && rows.caches[0]->takes_column_sums() && ColumnSumsPay(obs_b - obs_a, rows.pos[0] + n);
  }
  for (int i0 = 0; i0 < n; i0 += kAbsorbRows) {
    const int m = std::min(n - i0, kAbsorbRows);
    if (expanded) {
      if (col_sums) continue;
      bool observed = false;
      for (int j = 0; j < m; ++j) observed = observed || rows.caches[i0 + j]->observes(rows.pos[i0 + j]);
      if (!observed) continue;
    }
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
      RETURN_IF_ERROR(rows.Event(i, cache->ObserveQuery(l, p, qa_i, pool)));
      if (!rows.live(i) || expanded) continue;
      RETURN_IF_ERROR(rows.Event(i, cache->Attend(l, qa_i, p, pool, &att[j * H * dc])));
    }
    if (expanded) continue;
    // Rows that failed expand whatever their att holds: meaningless, not read back.
    auto expand = [&](int64_t hb, int64_t he, int) {
      for (int64_t h = hb; h < he; ++h) {
        MatVecBatch(M.v_b.Rows(h * vd, vd), &att[h * dc], m, H * dc, &o[(i0 * H + h) * vd], H * vd,
                    nullptr);
      }
    };
    ParallelForOrInline(pool, H, 1, expand);
  }
  if (expanded && col_sums) {
    std::vector<double> col(rows.pos[0] + obs_b, 0.0);
    RETURN_IF_ERROR(
        ExpandedAttention(rows, M, l, q.data(), pool, o.data(), obs_a, obs_b, col.data()));
    RETURN_IF_ERROR(rows.Event(obs_a, rows.caches[0]->ObserveColumnSums(
                                          l, rows.pos[obs_a], rows.pos[0] + obs_b, col.data())));
  } else if (expanded) {
    RETURN_IF_ERROR(ExpandedAttention(rows, M, l, q.data(), pool, o.data()));
  }
  Project(rows, M.wo, o.data(), H * vd, y, d, pool);
  return OkStatus();
}

bool MlaModel::ExpandedPays(int64_t n) const {
  const int64_t min_rows = g_expanded_min_rows.load(std::memory_order_relaxed);
  if (min_rows < 0) return false;
  if (min_rows > 0) return n >= min_rows;
  const ModelConfig& c = config_;
  const int64_t dc = c.kv_lora_rank, dr = c.qk_rope_dim, nope = c.qk_nope_dim, vd = c.v_head_dim;
  // Per (row, head): the absorbed form costs n (d_c + d_r + d_c) multiply-adds, the expanded one
  // d_c (nope + v) to decompress plus n (nope + d_r + v). The decompression is a GEMM and runs
  // at about the kernels' rate; 1.5x margin for its staging.
  const int64_t saved = n * ((dc + dr + dc) - (nope + dr + vd));
  return 2 * saved >= 3 * dc * (nope + vd);
}

bool MlaModel::ColumnSumsPay(int64_t k, int64_t n_rows) const {
  if (g_expanded_min_rows.load(std::memory_order_relaxed) < 0) return false;
  // Kept by the attention pass itself: a few operations per (observed query, row, head).
  if (n_rows <= g_observed_rows.load(std::memory_order_relaxed)) return true;
  const ModelConfig& c = config_;
  const int64_t dc = c.kv_lora_rank, dr = c.qk_rope_dim, nope = c.qk_nope_dim;
  // Per (row, head): k absorbed weight passes cost k (d_c + d_r) multiply-adds (on one thread),
  // the column-sum pass d_c nope to decompress the keys again plus k (nope + d_r).
  return k * (dc + dr) >= dc * nope + k * (nope + dr);
}

Status MlaModel::ExpandedAttention(const Rows& rows, const MlaWeights& M, int cache_layer,
                                   const float* q, ThreadPool* pool, float* o, int64_t obs_a,
                                   int64_t obs_b, double* col) const {
  const ModelConfig& c = config_;
  const int64_t H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim, nope = c.qk_nope_dim,
                vd = c.v_head_dim, qk = nope + dr;
  const int n = rows.n;
  const LayerStore& store = rows.caches[0]->store(cache_layer);
  const LayerGeometry& g = store.geometry();
  const int64_t p0 = rows.pos[0], n_rows = p0 + n;
  const int64_t align = StagedValueAlign();
  const int64_t vdp = (vd + align - 1) / align * align;
  const int64_t S = std::min(n_rows, kExpandSegmentRows);
  const int64_t Sp = StagedKeyStride(S);
  RopeParams rope;
  rope.freq_base = c.rope_base;
  rope.freq_scale = c.rope_freq_scale;
  ScratchScope ws;
  // Queries [n, H, qk]: q_pe rotated at the row's position (as the absorbed query's), then
  // scaled (as AttendStream scales).
  std::span<float> qx = ws.FloatsUnset(n * H * qk);
  for (int i = 0; i < n; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      float* dst = &qx[(i * H + h) * qk];
      std::memcpy(dst, &q[(i * H + h) * qk], sizeof(float) * qk);
      if (!c.mla_nope) Rope(dst + nope, static_cast<int>(dr), rows.pos[i], RopeStyle::kNorm, rope);
      for (int64_t k = 0; k < qk; ++k) dst[k] *= g.scale;
    }
  }
  std::span<float> ms = ws.FloatsUnset(n * H), ds = ws.Floats(n * H), os = ws.Floats(n * H * vdp);
  std::fill(ms.begin(), ms.end(), -std::numeric_limits<float>::infinity());
  // W_UK,h as [nope, d_c] and W_UV,h transposed, [d_c, vdp] (zero past v), f32, for all heads
  // (k_b holds W_UK,h transposed, [d_c, nope] per head; v_b W_UV,h, [v, d_c]; of any type).
  std::span<float> wuk = ws.FloatsUnset(H * nope * dc), wuv = ws.Floats(H * dc * vdp),
                   tmp = ws.FloatsUnset(dc * std::max(nope, vd));
  for (int64_t h = 0; h < H; ++h) {
    const TensorView kb = M.k_b.Rows(h * dc, dc);
    ToF32(kb.dtype, kb.data, tmp.data(), dc * nope);
    float* w = &wuk[h * nope * dc];
    for (int64_t j = 0; j < dc; ++j) {
      for (int64_t i = 0; i < nope; ++i) w[i * dc + j] = tmp[j * nope + i];
    }
    const TensorView vb = M.v_b.Rows(h * vd, vd);
    ToF32(vb.dtype, vb.data, tmp.data(), vd * dc);
    float* wv = &wuv[h * dc * vdp];
    for (int64_t i = 0; i < vd; ++i) {
      for (int64_t j = 0; j < dc; ++j) wv[j * vdp + i] = tmp[i * dc + j];
    }
  }
  // A segment's rows: c_hat [S, d_c] and transposed [d_c, Sp], r transposed [d_r, Sp]; one
  // head's decompressed keys transposed [nope, Sp] and values [S, vdp].
  std::span<float> cs = ws.FloatsUnset(S * dc), ct = ws.FloatsUnset(dc * Sp),
                   rt = ws.FloatsUnset(dr * Sp), kt = ws.FloatsUnset(nope * Sp),
                   vs = ws.FloatsUnset(S * vdp);
  std::vector<StagedQuery> qs(n);
  const int64_t P = LayerStore::kPageRows;
  // Stages rows [s0, s0 + sn) of the cache: c_hat into cs_d [sn, d_c], transposed into ct_d
  // [d_c, ld] and r transposed into rt_d [d_r, ld]. Rows go 16 at a time, so each transposed
  // write is a run of 16 floats rather than one float per ld-strided line.
  auto stage_into = [&](int64_t s0, int64_t sn, float* cs_d, float* ct_d, float* rt_d,
                        int64_t ld) {
    constexpr int64_t kB = 16;
    ParallelForOrInline(pool, (sn + P - 1) / P, 1, [&](int64_t b, int64_t e, int) {
      std::vector<float> blk(kB * (dc + dr));
      for (int64_t t = b; t < e; ++t) {
        const int64_t u0 = s0 + t * P;  // s0 is a multiple of the page size
        const KvStreamView page = store.PageView(0, u0 / P);
        const int64_t in_page = std::min(P, sn - t * P);
        for (int64_t k0 = 0; k0 < in_page; k0 += kB) {
          const int64_t nb = std::min(kB, in_page - k0), i0 = t * P + k0;
          for (int64_t k = 0; k < nb; ++k) {
            float* row = &blk[k * (dc + dr)];
            ToF32(page.dtype, page.keys + (k0 + k) * page.k_stride, row, dc + dr);
            std::memcpy(&cs_d[(i0 + k) * dc], row, sizeof(float) * dc);
          }
          for (int64_t j = 0; j < dc + dr; ++j) {
            float* dst = j < dc ? &ct_d[j * ld + i0] : &rt_d[(j - dc) * ld + i0];
            for (int64_t k = 0; k < nb; ++k) dst[k] = blk[k * (dc + dr) + j];
          }
        }
      }
    });
  };
  auto stage = [&](int64_t s0, int64_t sn) {
    stage_into(s0, sn, cs.data(), ct.data(), rt.data(), Sp);
  };
  auto staged = [&](int64_t s0, int64_t sn) {
    StagedRows sr;
    sr.r0 = s0;
    sr.n = sn;
    sr.kt[0] = kt.data();
    sr.kt[1] = rt.data();
    sr.kd[0] = nope;
    sr.kd[1] = dr;
    sr.k_stride = Sp;
    sr.v = vs.data();
    sr.v_stride = vdp;
    return sr;
  };
  // Observed queries' column sums in the attention pass itself where every row's decompressed
  // keys and values of a head fit (AttendStagedObserved): heads outermost, each head's rows
  // decompressed whole from the latent rows, staged once for all heads.
  const bool fused = col != nullptr && obs_b > obs_a &&
                     n_rows <= g_observed_rows.load(std::memory_order_relaxed);
  if (fused) {
    // The latent rows staged once for all heads (c_hat [n_rows, d_c] and transposed
    // [d_c, Np]); then per head its decompressed keys [nope, Np] and values [n_rows, vdp].
    const int64_t Np = StagedKeyStride(n_rows);
    std::span<float> cs_all = ws.FloatsUnset(n_rows * dc), ct_all = ws.FloatsUnset(dc * Np),
                     kt_all = ws.FloatsUnset(nope * Np), rt_all = ws.FloatsUnset(dr * Np),
                     vs_all = ws.FloatsUnset(n_rows * vdp);
    for (int64_t s0 = 0; s0 < n_rows; s0 += S) {
      stage_into(s0, std::min(S, n_rows - s0), &cs_all[s0 * dc], &ct_all[s0], &rt_all[s0], Np);
    }
    for (int64_t h = 0; h < H; ++h) {
      StageProduct(&wuk[h * nope * dc], dc, ct_all.data(), Np, kt_all.data(), Np, nope, Np, dc,
                   pool);
      StageProduct(cs_all.data(), dc, &wuv[h * dc * vdp], vdp, vs_all.data(), vdp, n_rows, vdp,
                   dc, pool);
      for (int j = 0; j < n; ++j) {
        const int64_t k = j * H + h;
        qs[j] = StagedQuery{&qx[k * qk], p0 + j + 1, &ms[k], &ds[k], &os[k * vdp]};
      }
      StagedRows all;
      all.n = n_rows;
      all.kt[0] = kt_all.data();
      all.kt[1] = rt_all.data();
      all.kd[0] = nope;
      all.kd[1] = dr;
      all.k_stride = Np;
      all.v = vs_all.data();
      all.v_stride = vdp;
      AttendStagedObserved(all, vdp, qs.data(), n, obs_a, obs_b, col, pool);
    }
    col = nullptr;  // delivered
  }
  for (int64_t s0 = 0; !fused && s0 < n_rows; s0 += S) {
    const int64_t sn = std::min(S, n_rows - s0);
    stage(s0, sn);
    for (int64_t h = 0; h < H; ++h) {
      // kt = W_UK,h c^T (the kernel's key columns), vs = c W_UV,h^T.
      StageProduct(&wuk[h * nope * dc], dc, ct.data(), Sp, kt.data(), Sp, nope, Sp, dc, pool);
      StageProduct(cs.data(), dc, &wuv[h * dc * vdp], vdp, vs.data(), vdp, sn, vdp, dc, pool);
      for (int j = 0; j < n; ++j) {
        const int64_t k = j * H + h;
        qs[j] = StagedQuery{&qx[k * qk], p0 + j + 1, &ms[k], &ds[k], &os[k * vdp]};
      }
      AttendStaged(staged(s0, sn), vdp, qs.data(), n, pool);
    }
  }
  // The observed queries' column sums with their heads' final states: the keys again, segment
  // by segment (heads in order, so each row's sum does not depend on the pool).
  for (int64_t s0 = 0; col != nullptr && s0 < p0 + obs_b; s0 += S) {
    const int64_t sn = std::min(S, p0 + obs_b - s0);
    stage(s0, sn);
    for (int64_t h = 0; h < H; ++h) {
      StageProduct(&wuk[h * nope * dc], dc, ct.data(), Sp, kt.data(), Sp, nope, Sp, dc, pool);
      for (int64_t j = obs_a; j < obs_b; ++j) {
        const int64_t k = j * H + h;
        qs[j - obs_a] = StagedQuery{&qx[k * qk], p0 + j + 1, &ms[k], &ds[k], nullptr};
      }
      StagedColumnSums(staged(s0, sn), qs.data(), obs_b - obs_a, col + s0, pool);
    }
  }
  for (int64_t k = 0; k < n * H; ++k) {
    const float inv = 1.f / ds[k];  // every query reads at least its own row
    for (int64_t j = 0; j < vd; ++j) o[k * vd + j] = os[k * vdp + j] * inv;
  }
  return OkStatus();
}

namespace mla_internal {
int64_t SetExpandedMinRowsForTest(int64_t rows) { return g_expanded_min_rows.exchange(rows); }
int64_t SetObservedRowsForTest(int64_t rows) { return g_observed_rows.exchange(rows); }
}  // namespace mla_internal

}  // namespace strata
