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
  // The rotation factors of the chunk's positions, shared by the cache row and every head.
  std::span<float> rcs = ws.FloatsUnset(c.mla_nope ? 0 : n * dr);
  if (!c.mla_nope) {
    for (int i = 0; i < n; ++i) RopeFactors(static_cast<int>(dr), rows.pos[i], rope, &rcs[i * dr]);
  }
  const float* rope_cs = c.mla_nope ? nullptr : rcs.data();
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
    if (!c.mla_nope) RopeApply(r + dc, static_cast<int>(dr), RopeStyle::kNorm, &rcs[i * dr]);
    if (!rows.live(i)) continue;
    RETURN_IF_ERROR(rows.Event(i, rows.caches[i]->Append(l, r, nullptr)));
  }
  // A long prefill chunk whose reads the policy grants in bulk reads in the expanded form: its
  // absorbed queries are then formed only for the rows the cache observes.
  StagedPrefixPlan plan;
  const Claim claim = ClaimStaged(rows, l, n >= 2 && ExpandedPays(n), &plan);
  const bool expanded = claim != Claim::kNone;
  const bool prefix = claim == Claim::kPrefix;  // nothing of the chunk observed then
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
  // Expanded: the absorbed queries of the observed rows alone, gathered (a policy may observe
  // only every s-th prompt query: KvCache::observes).
  std::vector<int> sel;
  std::span<float> qg = ws.FloatsUnset(expanded && !col_sums ? group * H * qk : 0);
  for (int i0 = 0; i0 < n; i0 += kAbsorbRows) {
    const int m0 = std::min(n - i0, kAbsorbRows);
    sel.clear();
    for (int j = 0; j < m0; ++j) {
      if (!expanded || rows.caches[i0 + j]->observes(rows.pos[i0 + j])) sel.push_back(i0 + j);
    }
    if (expanded && (col_sums || sel.empty())) continue;
    const int m = static_cast<int>(sel.size());
    // The group's queries [m, H, qk]: in place when every row is taken (always when not expanded).
    const float* qm = &q[i0 * H * qk];
    if (m < m0) {
      for (int j = 0; j < m; ++j) {
        std::memcpy(&qg[j * H * qk], &q[sel[j] * H * qk], sizeof(float) * H * qk);
      }
      qm = qg.data();
    }
    // Absorbed queries for the taken rows and every head, in parallel over heads (each row's
    // product is the same in any batch).
    auto absorb = [&](int64_t hb, int64_t he, int) {
      for (int64_t h = hb; h < he; ++h) {
        MatVecBatch(M.k_b.Rows(h * dc, dc), &qm[h * qk], m, H * qk, &qabs[h * row], H * row,
                    nullptr);
        for (int j = 0; j < m; ++j) {
          float* out = &qabs[(j * H + h) * row];
          std::memcpy(out + dc, &qm[(j * H + h) * qk + nope], sizeof(float) * dr);
          if (!c.mla_nope) {
            RopeApply(out + dc, static_cast<int>(dr), RopeStyle::kNorm, &rcs[sel[j] * dr]);
          }
        }
      }
    };
    ParallelForOrInline(pool, H, 1, absorb);
    for (int j = 0; j < m; ++j) {
      const int i = sel[j];
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
        ExpandedAttention(rows, M, l, q.data(), rope_cs, pool, o.data(), obs_a, obs_b, col.data()));
    RETURN_IF_ERROR(rows.Event(obs_a, rows.caches[0]->ObserveColumnSums(
                                          l, rows.pos[obs_a], rows.pos[0] + obs_b, col.data())));
  } else if (prefix) {
    KvCache* cache = rows.caches[0];
    const StagedPrefix staged{plan, [cache, l](int h, int64_t s0, int64_t sn, float* k, float* v) {
                                cache->StagePrefixRows(l, h, s0, sn, k, v);
                              }};
    RETURN_IF_ERROR(ExpandedPrefixAttention(rows, M, l, q.data(), rope_cs, staged, pool, o.data()));
  } else if (expanded) {
    RETURN_IF_ERROR(ExpandedAttention(rows, M, l, q.data(), rope_cs, pool, o.data()));
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

namespace {

// A prefill chunk read in the expanded form: its queries [n, H, nope + dr] (q_pe rotated at the
// row's position by the caller's RopeFactors, as the absorbed query's, then scaled as
// AttendStream scales), their online-softmax states, every head's W_UK,h and W_UV,h as f32, and
// the staging of latent rows and of a head's decompressed keys and values.
class ExpandedChunk {
 public:
  ExpandedChunk(const ModelConfig& c, const MlaWeights& M, const LayerStore& store,
                int n, const float* q, const float* rope_cs, ThreadPool* pool, ScratchScope& ws)
      : store_(store), n_(n), pool_(pool), H_(c.n_heads), dc_(c.kv_lora_rank),
        dr_(c.qk_rope_dim), nope_(c.qk_nope_dim), vd_(c.v_head_dim), qk_(nope_ + dr_) {
    const LayerGeometry& g = store.geometry();
    const int64_t align = StagedValueAlign();
    vdp_ = (vd_ + align - 1) / align * align;
    qx_ = ws.FloatsUnset(n * H_ * qk_);
    for (int i = 0; i < n; ++i) {
      for (int64_t h = 0; h < H_; ++h) {
        float* dst = &qx_[(i * H_ + h) * qk_];
        std::memcpy(dst, &q[(i * H_ + h) * qk_], sizeof(float) * qk_);
        if (rope_cs) {
          RopeApply(dst + nope_, static_cast<int>(dr_), RopeStyle::kNorm, &rope_cs[i * dr_]);
        }
        for (int64_t k = 0; k < qk_; ++k) dst[k] *= g.scale;
      }
    }
    ms_ = ws.FloatsUnset(n * H_);
    ds_ = ws.Floats(n * H_);
    os_ = ws.Floats(n * H_ * vdp_);
    std::fill(ms_.begin(), ms_.end(), -std::numeric_limits<float>::infinity());
    // W_UK,h as [nope, d_c] and W_UV,h transposed, [d_c, vdp] (zero past v), f32, for all heads
    // (k_b holds W_UK,h transposed, [d_c, nope] per head; v_b W_UV,h, [v, d_c]; of any type).
    wuk_ = ws.FloatsUnset(H_ * nope_ * dc_);
    wuv_ = ws.Floats(H_ * dc_ * vdp_);
    std::span<float> tmp = ws.FloatsUnset(dc_ * std::max(nope_, vd_));
    for (int64_t h = 0; h < H_; ++h) {
      const TensorView kb = M.k_b.Rows(h * dc_, dc_);
      ToF32(kb.dtype, kb.data, tmp.data(), dc_ * nope_);
      float* w = &wuk_[h * nope_ * dc_];
      for (int64_t j = 0; j < dc_; ++j) {
        for (int64_t i = 0; i < nope_; ++i) w[i * dc_ + j] = tmp[j * nope_ + i];
      }
      const TensorView vb = M.v_b.Rows(h * vd_, vd_);
      ToF32(vb.dtype, vb.data, tmp.data(), vd_ * dc_);
      float* wv = &wuv_[h * dc_ * vdp_];
      for (int64_t i = 0; i < vd_; ++i) {
        for (int64_t j = 0; j < dc_; ++j) wv[j * vdp_ + i] = tmp[i * dc_ + j];
      }
    }
  }
  int64_t dvp() const { return vdp_; }

  // Latent rows [s0, s0 + sn) (s0 a multiple of the page size): c_hat into cs [sn, d_c],
  // transposed into ct [d_c, ld], and r transposed into rt [d_r, ld]; from the store, or as
  // `prefix` stages them when given. Rows go 32 at a time, so each transposed write is a run
  // of 32 floats rather than one float per ld-strided line (and a KIVI group is staged whole).
  void StageLatent(const StagedPrefix* prefix, int64_t s0, int64_t sn, float* cs, float* ct,
                   float* rt, int64_t ld) const {
    constexpr int64_t kB = 32;
    const int64_t P = LayerStore::kPageRows, w = dc_ + dr_;
    ParallelForOrInline(pool_, (sn + P - 1) / P, 1, [&](int64_t b, int64_t e, int) {
      ScratchScope ts;
      std::span<float> blk = ts.FloatsUnset(kB * w);
      for (int64_t t = b; t < e; ++t) {
        const int64_t u0 = s0 + t * P;
        const int64_t in_page = std::min(P, sn - t * P);
        for (int64_t k0 = 0; k0 < in_page; k0 += kB) {
          const int64_t nb = std::min(kB, in_page - k0), i0 = t * P + k0;
          if (prefix != nullptr) {
            prefix->stage(0, u0 + k0, nb, blk.data(), nullptr);
          } else {
            const KvStreamView page = store_.PageView(0, u0 / P);
            for (int64_t k = 0; k < nb; ++k) {
              ToF32(page.dtype, page.keys + (k0 + k) * page.k_stride, &blk[k * w], w);
            }
          }
          for (int64_t k = 0; k < nb; ++k) {
            std::memcpy(&cs[(i0 + k) * dc_], &blk[k * w], sizeof(float) * dc_);
          }
          for (int64_t j = 0; j < w; ++j) {
            float* dst = j < dc_ ? &ct[j * ld + i0] : &rt[(j - dc_) * ld + i0];
            for (int64_t k = 0; k < nb; ++k) dst[k] = blk[k * w + j];
          }
        }
      }
    });
  }
  // Head h's decompressed rows from StageLatent's: keys kt [nope, ld] = W_UK,h c^T (ld columns)
  // and, unless vs is null, values vs [sn, vdp] = c W_UV,h^T.
  void Decompress(int64_t h, const float* cs, const float* ct, int64_t ld, int64_t sn, float* kt,
                  float* vs) const {
    StageProduct(&wuk_[h * nope_ * dc_], dc_, ct, ld, kt, ld, nope_, ld, dc_, pool_);
    if (vs == nullptr) return;
    StageProduct(cs, dc_, &wuv_[h * dc_ * vdp_], vdp_, vs, vdp_, sn, vdp_, dc_, pool_);
  }
  // Head h of chunk query j, reading to `limit`.
  StagedQuery Query(int64_t j, int64_t h, int64_t limit, bool output = true) {
    const int64_t k = j * H_ + h;
    return StagedQuery{&qx_[k * qk_], limit, &ms_[k], &ds_[k], output ? &os_[k * vdp_] : nullptr};
  }
  // Staged rows [r0, r0 + n): keys kt [nope, ld] and rt [d_r, ld], values vs [n, vdp].
  StagedRows Staged(int64_t r0, int64_t n, const float* kt, const float* rt, int64_t ld,
                    const float* vs) const {
    StagedRows sr;
    sr.r0 = r0;
    sr.n = n;
    sr.kt[0] = kt;
    sr.kt[1] = rt;
    sr.kd[0] = nope_;
    sr.kd[1] = dr_;
    sr.k_stride = ld;
    sr.v = vs;
    sr.v_stride = vdp_;
    return sr;
  }
  // o [n, H, v]: the normalised outputs.
  void Finish(float* o) const {
    for (int64_t k = 0; k < n_ * H_; ++k) {
      const float inv = 1.f / ds_[k];  // every query reads at least its own row
      for (int64_t j = 0; j < vd_; ++j) o[k * vd_ + j] = os_[k * vdp_ + j] * inv;
    }
  }

 private:
  const LayerStore& store_;
  int64_t n_;
  ThreadPool* pool_;
  int64_t H_, dc_, dr_, nope_, vd_, qk_, vdp_ = 0;
  std::span<float> qx_, ms_, ds_, os_, wuk_, wuv_;
};

}  // namespace

Status MlaModel::ExpandedAttention(const Rows& rows, const MlaWeights& M, int cache_layer,
                                   const float* q, const float* rope_cs, ThreadPool* pool, float* o,
                                   int64_t obs_a, int64_t obs_b, double* col) const {
  const ModelConfig& c = config_;
  const int64_t H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim, nope = c.qk_nope_dim;
  const int n = rows.n;
  const LayerStore& store = rows.caches[0]->store(cache_layer);
  const int64_t p0 = rows.pos[0], n_rows = p0 + n;
  ScratchScope ws;
  ExpandedChunk chunk(c, M, store, n, q, rope_cs, pool, ws);
  const int64_t vdp = chunk.dvp();
  std::vector<StagedQuery> qs(n);
  // Observed queries' column sums in the attention pass itself where every row's decompressed
  // keys and values of a head fit (AttendStagedObserved): heads outermost, each head's rows
  // decompressed whole from the latent rows, staged once for all heads.
  const bool fused = col != nullptr && obs_b > obs_a &&
                     n_rows <= g_observed_rows.load(std::memory_order_relaxed);
  // A segment's rows: c_hat [S, d_c] and transposed [d_c, Sp], r transposed [d_r, Sp]; one
  // head's decompressed keys transposed [nope, Sp] and values [S, vdp]. Fused: one segment.
  const int64_t S = fused ? n_rows : std::min(n_rows, kExpandSegmentRows);
  const int64_t Sp = StagedKeyStride(S);
  std::span<float> cs = ws.FloatsUnset(S * dc), ct = ws.FloatsUnset(dc * Sp),
                   rt = ws.FloatsUnset(dr * Sp), kt = ws.FloatsUnset(nope * Sp),
                   vs = ws.FloatsUnset(S * vdp);
  if (fused) {
    chunk.StageLatent(nullptr, 0, n_rows, cs.data(), ct.data(), rt.data(), Sp);
    for (int64_t h = 0; h < H; ++h) {
      chunk.Decompress(h, cs.data(), ct.data(), Sp, n_rows, kt.data(), vs.data());
      for (int j = 0; j < n; ++j) qs[j] = chunk.Query(j, h, p0 + j + 1);
      AttendStagedObserved(chunk.Staged(0, n_rows, kt.data(), rt.data(), Sp, vs.data()), vdp,
                           qs.data(), n, obs_a, obs_b, col, pool);
    }
    col = nullptr;  // delivered
  }
  for (int64_t s0 = 0; !fused && s0 < n_rows; s0 += S) {
    const int64_t sn = std::min(S, n_rows - s0);
    chunk.StageLatent(nullptr, s0, sn, cs.data(), ct.data(), rt.data(), Sp);
    for (int64_t h = 0; h < H; ++h) {
      chunk.Decompress(h, cs.data(), ct.data(), Sp, sn, kt.data(), vs.data());
      for (int j = 0; j < n; ++j) qs[j] = chunk.Query(j, h, p0 + j + 1);
      AttendStaged(chunk.Staged(s0, sn, kt.data(), rt.data(), Sp, vs.data()), vdp, qs.data(), n,
                   pool);
    }
  }
  // The observed queries' column sums with their heads' final states: the keys again, segment
  // by segment (heads in order, so each row's sum does not depend on the pool).
  for (int64_t s0 = 0; col != nullptr && s0 < p0 + obs_b; s0 += S) {
    const int64_t sn = std::min(S, p0 + obs_b - s0);
    chunk.StageLatent(nullptr, s0, sn, cs.data(), ct.data(), rt.data(), Sp);
    for (int64_t h = 0; h < H; ++h) {
      chunk.Decompress(h, cs.data(), ct.data(), Sp, sn, kt.data(), nullptr);
      for (int64_t j = obs_a; j < obs_b; ++j) {
        qs[j - obs_a] = chunk.Query(j, h, p0 + j + 1, /*output=*/false);
      }
      StagedColumnSums(chunk.Staged(s0, sn, kt.data(), rt.data(), Sp, nullptr), qs.data(),
                       obs_b - obs_a, col + s0, pool);
    }
  }
  chunk.Finish(o);
  return OkStatus();
}

Status MlaModel::ExpandedPrefixAttention(const Rows& rows, const MlaWeights& M, int cache_layer,
                                         const float* q, const float* rope_cs,
                                         const StagedPrefix& prefix, ThreadPool* pool,
                                         float* o) const {
  const ModelConfig& c = config_;
  const int64_t H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim, nope = c.qk_nope_dim;
  const int n = rows.n;
  const LayerStore& store = rows.caches[0]->store(cache_layer);
  const int64_t p0 = rows.pos[0], n_rows = p0 + n, P = LayerStore::kPageRows;
  auto split = [&](int64_t j) { return prefix.plan.Split(p0 + j + 1); };  // chunk query j's
  ScratchScope ws;
  ExpandedChunk chunk(c, M, store, n, q, rope_cs, pool, ws);
  const int64_t vdp = chunk.dvp();
  std::vector<StagedQuery> qs(n);
  // The prefix: rows [0, split(n - 1)) in segments, staged by the policy.
  const int64_t b_max = split(n - 1);
  const int64_t S = std::min(b_max, kExpandSegmentRows), Sp = StagedKeyStride(S);
  std::span<float> cs = ws.FloatsUnset(S * dc), ct = ws.FloatsUnset(dc * Sp),
                   rt = ws.FloatsUnset(dr * Sp), kt = ws.FloatsUnset(nope * Sp),
                   vs = ws.FloatsUnset(S * vdp);
  for (int64_t s0 = 0; s0 < b_max; s0 += S) {
    const int64_t sn = std::min(S, b_max - s0);
    int64_t j0 = 0;  // queries before j0 read no prefix row of the segment (splits ascend)
    while (j0 < n && split(j0) <= s0) ++j0;
    chunk.StageLatent(&prefix, s0, sn, cs.data(), ct.data(), rt.data(), Sp);
    for (int64_t h = 0; h < H; ++h) {
      chunk.Decompress(h, cs.data(), ct.data(), Sp, sn, kt.data(), vs.data());
      for (int64_t j = j0; j < n; ++j) qs[j - j0] = chunk.Query(j, h, split(j));
      AttendStaged(chunk.Staged(s0, sn, kt.data(), rt.data(), Sp, vs.data()), vdp, qs.data(),
                   n - j0, pool);
    }
  }
  // The exact rows: [e0, n_rows) from the page holding the smallest split, decompressed once
  // per head; each run of queries with the same split b reads [b, limit) from there (64 floats
  // of padding: a run's key columns start inside the staged ones).
  const int64_t e0 = split(0) / P * P, ne = n_rows - e0, Ep = StagedKeyStride(ne);
  std::span<float> ce = ws.FloatsUnset(ne * dc), cte = ws.FloatsUnset(dc * Ep),
                   rte = ws.FloatsUnset(dr * Ep + 64), kte = ws.FloatsUnset(nope * Ep + 64),
                   ve = ws.FloatsUnset(ne * vdp);
  chunk.StageLatent(nullptr, e0, ne, ce.data(), cte.data(), rte.data(), Ep);
  for (int64_t h = 0; h < H; ++h) {
    chunk.Decompress(h, ce.data(), cte.data(), Ep, ne, kte.data(), ve.data());
    for (int64_t j = 0; j < n;) {
      const int64_t b = split(j);
      int64_t je = j;
      while (je < n && split(je) == b) ++je;
      for (int64_t i = j; i < je; ++i) qs[i - j] = chunk.Query(i, h, p0 + i + 1);
      AttendStaged(chunk.Staged(b, n_rows - b, kte.data() + (b - e0), rte.data() + (b - e0), Ep,
                                ve.data() + (b - e0) * vdp),
                   vdp, qs.data(), je - j, pool);
      j = je;
    }
  }
  chunk.Finish(o);
  return OkStatus();
}

namespace mla_internal {
int64_t SetExpandedMinRowsForTest(int64_t rows) { return g_expanded_min_rows.exchange(rows); }
int64_t SetObservedRowsForTest(int64_t rows) { return g_observed_rows.exchange(rows); }
}  // namespace mla_internal

}  // namespace strata
