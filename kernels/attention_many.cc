// Dense causal attention of many query heads over staged rows (kernels/attention_many.h).
//
// Measured (one quiet AMD EPYC Zen5 core, AVX-512): the score and value blocks run at ~80 GFMA/s,
// the rate AttendStream reaches on MLA's absorbed rows (G = 16 heads share each row) -- about the
// core's FMA peak. The kernel's gain is where the caller can stage cheaper rows than the absorbed
// ones (MLA prefill: 192 + 128 multiply-adds per (query, row, head) instead of 576 + 512, see
// model/mla.cc), not the arithmetic rate.
//
// Session 17 (2-core Intel Xeon, Emerald Rapids, AVX3_SPR target; `generate -n 1 --threads 2`
// on `synth --preset 125m --dtype f16`, a 5,192-token prompt, prefill tokens/s, quiet host):
//   - Weights below exp(-87) are 0 (Softmax, ColumnBlock; AttendStream likewise): their
//     exponentials were subnormal, and subnormal operands take a microcode assist per
//     instruction on Intel cores. full 228.6 / 258.6 -> 363.3 / 360.1 (two rounds, the same
//     binaries alternating); a KIVI prompt (wider score spreads) had run its staged prefix 1.6x
//     slower than full's identical-shaped pass before it.
//   - Staged keys at StagedKeyStride (not a multiple of 4 KiB apart): one run, full 341 / 408.
//   - StageProduct in 256-column panels: MLA's per-head decompression streamed all of B once
//     per 4 rows of A; `synth --preset 150m`, 23,101 tokens: full 105.6 -> 125.8, h2o 99.3 ->
//     104.0 (one run each).
#include "kernels/attention_many.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/check.h"
#include "core/scratch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_many.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace many {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t kT = 64;  // rows per tile: a multiple of 4 vectors on every target
constexpr int kR = 4;       // query heads per register block
constexpr float kMinExp = -87.f;  // exp(-87) = 1.6e-38, the smallest weight kept (normal)
// Query heads per task: a task walks the tiles outermost, so its heads' states (64 x dvp floats)
// and one tile stay in L2 together.
constexpr int64_t kTaskHeads = 64;

// s[r][i] (rows kT apart) = q_r . key_i for R query heads (q_r = qs[r]->q) and the 64 keys of
// the tile starting at column `col0` of the staged key columns.
template <int R>
HWY_INLINE void Scores(const StagedRows& rows, const StagedQuery* qs, int64_t col0,
                       float* HWY_RESTRICT s) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t k0 = 0; k0 < kT; k0 += 4 * N) {
    VF a[R][4];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < 4; ++c) a[r][c] = hn::Zero(df);
    }
    int64_t dq = 0;  // the query entry of the part's first column
    for (int p = 0; p < 2; ++p) {
      const float* col = rows.kt[p] + col0 + k0;
      for (int64_t c = 0; c < rows.kd[p]; ++c, col += rows.k_stride) {
        const VF k0v = hn::LoadU(df, col), k1v = hn::LoadU(df, col + N),
                 k2v = hn::LoadU(df, col + 2 * N), k3v = hn::LoadU(df, col + 3 * N);
        for (int r = 0; r < R; ++r) {
          const VF qv = hn::Set(df, qs[r].q[dq + c]);
          a[r][0] = hn::MulAdd(qv, k0v, a[r][0]);
          a[r][1] = hn::MulAdd(qv, k1v, a[r][1]);
          a[r][2] = hn::MulAdd(qv, k2v, a[r][2]);
          a[r][3] = hn::MulAdd(qv, k3v, a[r][3]);
        }
      }
      dq += rows.kd[p];
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < 4; ++c) hn::Store(a[r][c], df, s + r * kT + k0 + c * N);
    }
  }
}

// The online-softmax step of one query head over a tile's first `valid` rows: scores s[0..64)
// become weights p = exp(s - m_new) (zero past `valid`); returns alpha = exp(m_old - m_new), the
// factor its output so far is scaled by, and updates *m and *d.
HWY_INLINE float Softmax(float* HWY_RESTRICT s, int64_t valid, float* m, float* d) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto lim = hn::Set(di, static_cast<int32_t>(valid));
  VF vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < valid; i += N) {
    const auto live =
        hn::RebindMask(df, hn::Lt(hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(i))), lim));
    vmax = hn::Max(vmax, hn::IfThenElse(live, hn::Load(df, s + i), vmax));
  }
  const float mt = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const float m_new = std::max(*m, mt);
  // m_old = -inf: 0; an unchanged maximum: exactly 1 (exp(0)), without the call.
  const float alpha = m_new == *m ? 1.f : std::exp(*m - m_new);
  const VF vm = hn::Set(df, m_new), vmin = hn::Set(df, kMinExp);
  VF sum = hn::Zero(df);
  for (int64_t i = 0; i < kT; i += N) {
    const auto live =
        hn::RebindMask(df, hn::Lt(hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(i))), lim));
    const VF x = hn::IfThenElseZero(live, hn::Sub(hn::Load(df, s + i), vm));
    // Weights below exp(kMinExp) (< 2^-125) are 0: their exponentials would be subnormal, and
    // subnormal operands cost a microcode assist per instruction on Intel cores (a KIVI prompt's
    // wide score spreads made this kernel 1.8x slower there). Each is < 1e-37 of the tile's
    // largest weight, far below f32 rounding of the sum.
    const VF p = hn::IfThenElseZero(hn::And(live, hn::Ge(x, vmin)), hn::Exp(df, hn::Max(x, vmin)));
    hn::Store(p, df, s + i);
    sum = hn::Add(sum, p);
  }
  *d = *d * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
  *m = m_new;
  return alpha;
}

// o_r = alpha_r o_r + sum_{i < valid} p_r[i] v_i for R query heads over a tile's values (rows
// past a head's own valid count carry weight 0).
template <int R>
HWY_INLINE void Values(const float* HWY_RESTRICT p, const float* alpha, int64_t valid,
                       const float* HWY_RESTRICT v, int64_t v_stride, int64_t dvp,
                       const StagedQuery* qs) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t c0 = 0;
  for (; c0 + 4 * N <= dvp; c0 += 4 * N) {
    VF a[R][4];
    for (int r = 0; r < R; ++r) {
      const VF al = hn::Set(df, alpha[r]);
      for (int c = 0; c < 4; ++c) a[r][c] = hn::Mul(hn::LoadU(df, qs[r].o + c0 + c * N), al);
    }
    const float* vrow = v + c0;
    for (int64_t i = 0; i < valid; ++i, vrow += v_stride) {
      const VF v0 = hn::LoadU(df, vrow), v1 = hn::LoadU(df, vrow + N),
               v2 = hn::LoadU(df, vrow + 2 * N), v3 = hn::LoadU(df, vrow + 3 * N);
      for (int r = 0; r < R; ++r) {
        const VF pv = hn::Set(df, p[r * kT + i]);
        a[r][0] = hn::MulAdd(pv, v0, a[r][0]);
        a[r][1] = hn::MulAdd(pv, v1, a[r][1]);
        a[r][2] = hn::MulAdd(pv, v2, a[r][2]);
        a[r][3] = hn::MulAdd(pv, v3, a[r][3]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < 4; ++c) hn::StoreU(a[r][c], df, qs[r].o + c0 + c * N);
    }
  }
  for (; c0 < dvp; c0 += N) {  // the last 1-3 vectors one at a time (the same chain per column)
    VF a[R];
    for (int r = 0; r < R; ++r) a[r] = hn::Mul(hn::LoadU(df, qs[r].o + c0), hn::Set(df, alpha[r]));
    const float* vrow = v + c0;
    for (int64_t i = 0; i < valid; ++i, vrow += v_stride) {
      const VF vv = hn::LoadU(df, vrow);
      for (int r = 0; r < R; ++r) a[r] = hn::MulAdd(hn::Set(df, p[r * kT + i]), vv, a[r]);
    }
    for (int r = 0; r < R; ++r) hn::StoreU(a[r], df, qs[r].o + c0);
  }
}

// Where an observed query head keeps a tile's weights (AttendStagedObserved): the tile's 64
// weights exp(s - m) (zero past its valid rows) and the running maximum m they were taken at.
struct Kept {
  float* p = nullptr;
  float* m = nullptr;
};

// R query heads over the tile starting at row r0 + col0; valid[r] of its rows are theirs. keep
// (optional): where head r keeps the tile's weights (null p: not kept).
template <int R>
HWY_INLINE void Block(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t col0,
                      const int64_t* valid, const Kept* keep) {
  alignas(64) float s[kR * kT];
  float alpha[kR];
  Scores<R>(rows, qs, col0, s);
  int64_t most = 0;
  for (int r = 0; r < R; ++r) {
    alpha[r] = Softmax(s + r * kT, valid[r], qs[r].m, qs[r].d);
    most = std::max(most, valid[r]);
    if (keep != nullptr && keep[r].p != nullptr) {
      std::copy(s + r * kT, s + (r + 1) * kT, keep[r].p);
      *keep[r].m = *qs[r].m;
    }
  }
  Values<R>(s, alpha, most, rows.v + col0 * rows.v_stride, rows.v_stride, dvp, qs);
}

// Observed query heads [obs_b, obs_e) of AttendStagedObserved: each task's kept weights
// (kTaskHeads x n_tiles x 64 floats and kTaskHeads x n_tiles maxima, per pool chunk) and its
// column sums (f32, per task from the first observed one, n_tiles x 64 floats each).
struct Observed {
  int64_t obs_b = 0, obs_e = 0;
  float* const* kept_p = nullptr;  // [pool chunks]
  float* const* kept_m = nullptr;  // [pool chunks]
  float* part = nullptr;           // [tasks from obs_b / kTaskHeads][n_tiles * 64]
};

// part[u] += w_h(u) over the task's observed heads in order, once their states are final: the
// kept weight of row u (tile t) times exp(m_t - m) / d, m_t its maximum then, m and d final.
void SumKept(const StagedQuery* qs, int64_t qb, int64_t qe, const Observed& obs, int64_t n_tiles,
             const float* kept_p, const float* kept_m, float* HWY_RESTRICT part) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t q = std::max(qb, obs.obs_b); q < std::min(qe, obs.obs_e); ++q) {
    const int64_t hl = q - qb;
    const int64_t tiles = std::min(n_tiles, (qs[q].limit + kT - 1) / kT);
    const float m = *qs[q].m, inv_d = 1.f / *qs[q].d;
    for (int64_t t = 0; t < tiles; ++t) {
      const VF c = hn::Set(df, std::exp(kept_m[hl * n_tiles + t] - m) * inv_d);
      const float* w = kept_p + (hl * n_tiles + t) * kT;
      float* dst = part + t * kT;
      for (int64_t i = 0; i < kT; i += N) {
        hn::Store(hn::MulAdd(hn::Load(df, w + i), c, hn::Load(df, dst + i)), df, dst + i);
      }
    }
  }
}

void AttendStagedRun(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                     ThreadPool* pool, const Observed* obs) {
  const int64_t n_tiles = (rows.n + kT - 1) / kT;
  const int64_t n_tasks = (nq + kTaskHeads - 1) / kTaskHeads;
  // Tasks in the order first, last, second, second last, ...: a causal chunk's queries read more
  // rows the later they are, and the pool's contiguous chunks then share long and short ones
  // evenly.
  ParallelForOrInline(pool, n_tasks, 1, [&](int64_t tb, int64_t te, int chunk) {
    for (int64_t k = tb; k < te; ++k) {
      const int64_t task = k % 2 == 0 ? k / 2 : n_tasks - 1 - k / 2;
      const int64_t qb = task * kTaskHeads, qe = std::min(nq, qb + kTaskHeads);
      const bool observed = obs != nullptr && qb < obs->obs_e && qe > obs->obs_b;
      float* kept_p = observed ? obs->kept_p[chunk] : nullptr;
      float* kept_m = observed ? obs->kept_m[chunk] : nullptr;
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t u0 = rows.r0 + t * kT;  // the tile's first row
        const int64_t in_tile = std::min(kT, rows.n - t * kT);
        for (int64_t b = qb; b < qe; b += kR) {
          const int R = static_cast<int>(std::min<int64_t>(kR, qe - b));
          int64_t valid[kR] = {0, 0, 0, 0};
          bool any = false;
          for (int r = 0; r < R; ++r) {
            valid[r] = std::clamp<int64_t>(qs[b + r].limit - u0, 0, in_tile);
            any = any || valid[r] > 0;
          }
          if (!any) continue;
          // Heads without a row here keep their state: their block is run without them.
          int live[kR], n_live = 0;
          for (int r = 0; r < R; ++r) {
            if (valid[r] > 0) live[n_live++] = r;
          }
          StagedQuery sub[kR];
          int64_t sub_valid[kR];
          Kept keep[kR];
          for (int k = 0; k < n_live; ++k) {
            const int64_t q = b + live[k];
            sub[k] = qs[q];
            sub_valid[k] = valid[live[k]];
            if (observed && q >= obs->obs_b && q < obs->obs_e) {
              keep[k] = {kept_p + ((q - qb) * n_tiles + t) * kT, kept_m + (q - qb) * n_tiles + t};
            }
          }
          const Kept* kp = observed ? keep : nullptr;
          switch (n_live) {
            case 4: Block<4>(rows, dvp, sub, t * kT, sub_valid, kp); break;
            case 3: Block<3>(rows, dvp, sub, t * kT, sub_valid, kp); break;
            case 2: Block<2>(rows, dvp, sub, t * kT, sub_valid, kp); break;
            default: Block<1>(rows, dvp, sub, t * kT, sub_valid, kp); break;
          }
        }
      }
      if (observed) {
        float* part = obs->part + (task - obs->obs_b / kTaskHeads) * n_tiles * kT;
        SumKept(qs, qb, qe, *obs, n_tiles, kept_p, kept_m, part);
      }
    }
  });
}

void AttendStagedImpl(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                      ThreadPool* pool) {
  AttendStagedRun(rows, dvp, qs, nq, pool, nullptr);
}

void AttendStagedObservedImpl(const StagedRows& rows, int64_t dvp, const StagedQuery* qs,
                              int64_t nq, int64_t obs_b, int64_t obs_e, double* col,
                              ThreadPool* pool) {
  const int64_t n_tiles = (rows.n + kT - 1) / kT;
  const int T = pool != nullptr ? pool->size() : 1;
  const int64_t first = obs_b / kTaskHeads, last = (obs_e - 1) / kTaskHeads;
  ScratchScope ws;
  std::vector<float*> kept_p(T), kept_m(T);
  for (int i = 0; i < T; ++i) {
    kept_p[i] = ws.FloatsUnset(kTaskHeads * n_tiles * kT).data();
    kept_m[i] = ws.FloatsUnset(kTaskHeads * n_tiles).data();
  }
  std::span<float> part = ws.Floats((last - first + 1) * n_tiles * kT);
  const Observed obs{obs_b, obs_e, kept_p.data(), kept_m.data(), part.data()};
  AttendStagedRun(rows, dvp, qs, nq, pool, &obs);
  // The tasks' sums in task order (float64), rows split over the pool.
  int64_t n_cols = 0;
  for (int64_t q = obs_b; q < obs_e; ++q) n_cols = std::max(n_cols, qs[q].limit);
  ParallelForOrInline(pool, n_cols, kT, [&](int64_t ub, int64_t ue, int) {
    for (int64_t task = first; task <= last; ++task) {
      const float* p = &part[(task - first) * n_tiles * kT];
      for (int64_t u = ub; u < ue; ++u) col[u] += p[u];
    }
  });
}

// Column sums of the final weights over the tile starting at column col0: part[i] += sum_r
// exp(s_r[i] - m_r) / d_r over the R query heads (valid[r] of the tile's rows are theirs).
template <int R>
HWY_INLINE void ColumnBlock(const StagedRows& rows, const StagedQuery* qs, int64_t col0,
                            const int64_t* valid, float* HWY_RESTRICT part) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  alignas(64) float s[kR * kT];
  Scores<R>(rows, qs, col0, s);
  for (int r = 0; r < R; ++r) {
    const VF vm = hn::Set(df, *qs[r].m), vmin = hn::Set(df, kMinExp);
    const VF inv = hn::Set(df, 1.f / *qs[r].d);
    const auto lim = hn::Set(di, static_cast<int32_t>(valid[r]));
    for (int64_t i = 0; i < valid[r]; i += N) {
      const auto live = hn::RebindMask(
          df, hn::Lt(hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(i))), lim));
      const VF x = hn::IfThenElseZero(live, hn::Sub(hn::Load(df, s + r * kT + i), vm));
      const VF p = hn::IfThenElseZero(hn::And(live, hn::Ge(x, vmin)),
                                      hn::Mul(hn::Exp(df, hn::Max(x, vmin)), inv));  // as Softmax
      hn::Store(hn::Add(hn::Load(df, part + i), p), df, part + i);
    }
  }
}

void StagedColumnSumsImpl(const StagedRows& rows, const StagedQuery* qs, int64_t nq, double* col,
                          ThreadPool* pool) {
  const int64_t n_tiles = (rows.n + kT - 1) / kT;
  // Tiles in the order first, last, second, second last, ...: the pool's contiguous chunks then
  // share the causal triangle's long and short columns evenly.
  ParallelForOrInline(pool, n_tiles, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t k = tb; k < te; ++k) {
      const int64_t t = k % 2 == 0 ? k / 2 : n_tiles - 1 - k / 2;
      const int64_t u0 = rows.r0 + t * kT;
      const int64_t in_tile = std::min(kT, rows.n - t * kT);
      alignas(64) float part[kT];
      double acc[kT];
      std::fill(part, part + kT, 0.f);
      std::fill(acc, acc + kT, 0.0);
      int64_t in_part = 0;  // query heads summed in f32 since the last flush into acc
      auto flush = [&] {
        for (int64_t i = 0; i < in_tile; ++i) acc[i] += part[i];
        std::fill(part, part + kT, 0.f);
        in_part = 0;
      };
      for (int64_t b = 0; b < nq; b += kR) {
        const int R = static_cast<int>(std::min<int64_t>(kR, nq - b));
        StagedQuery sub[kR];
        int64_t sub_valid[kR];
        int n_live = 0;
        for (int r = 0; r < R; ++r) {
          const int64_t v = std::clamp<int64_t>(qs[b + r].limit - u0, 0, in_tile);
          if (v == 0) continue;
          sub[n_live] = qs[b + r];
          sub_valid[n_live++] = v;
        }
        switch (n_live) {
          case 0: continue;
          case 4: ColumnBlock<4>(rows, sub, t * kT, sub_valid, part); break;
          case 3: ColumnBlock<3>(rows, sub, t * kT, sub_valid, part); break;
          case 2: ColumnBlock<2>(rows, sub, t * kT, sub_valid, part); break;
          default: ColumnBlock<1>(rows, sub, t * kT, sub_valid, part); break;
        }
        in_part += n_live;
        if (in_part >= kTaskHeads) flush();
      }
      flush();
      for (int64_t i = 0; i < in_tile; ++i) col[t * kT + i] += acc[i];
    }
  });
}

// Y rows [r, r + R), columns [c0, c0 + C vectors) of A B.
template <int R, int C>
HWY_INLINE void ProductBlock(const float* HWY_RESTRICT a, int64_t lda, const float* HWY_RESTRICT b,
                             int64_t ldb, float* HWY_RESTRICT y, int64_t ldy, int64_t K) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  }
  for (int64_t k = 0; k < K; ++k) {
    VF bv[C];
    for (int c = 0; c < C; ++c) bv[c] = hn::LoadU(df, b + k * ldb + c * N);
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(df, a[r * lda + k]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(av, bv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) hn::StoreU(acc[r][c], df, y + r * ldy + c * N);
  }
}

template <int R>
HWY_INLINE void ProductRows(const float* a, int64_t lda, const float* b, int64_t ldb, float* y,
                            int64_t ldy, int64_t N, int64_t K) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t c0 = 0;
  for (; c0 + 4 * L <= N; c0 += 4 * L) ProductBlock<R, 4>(a, lda, b + c0, ldb, y + c0, ldy, K);
  for (; c0 < N; c0 += L) ProductBlock<R, 1>(a, lda, b + c0, ldb, y + c0, ldy, K);
}

// StageProduct's work: tasks of kRowsPerTask rows x kPanelCols columns, panel-major (a task's
// index is panel * row groups + row group), so the pool's contiguous chunks share a panel of B
// (K x kPanelCols floats: 512 KiB at MLA's K = 512) while it is in L2. Before (version 1:
// tasks of 32 rows over every column) each 4-row block streamed all of B, K x N floats (47 MB at
// N = 23k rows, MLA's fused column-sum pass), once per 4 rows of A.
constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kPanelCols = 256;

void StageProductImpl(const float* a, int64_t lda, const float* b, int64_t ldb, float* y,
                      int64_t ldy, int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  const int64_t n_groups = (M + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t n_panels = (N + kPanelCols - 1) / kPanelCols;
  ParallelForOrInline(pool, n_groups * n_panels, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t task = tb; task < te; ++task) {
      const int64_t c0 = (task / n_groups) * kPanelCols, nc = std::min(kPanelCols, N - c0);
      const int64_t r_end = std::min(M, (task % n_groups + 1) * kRowsPerTask);
      for (int64_t r = (task % n_groups) * kRowsPerTask; r < r_end; r += kR) {
        const float* ar = a + r * lda;
        float* yr = y + r * ldy + c0;
        switch (std::min<int64_t>(kR, M - r)) {
          case 4: ProductRows<4>(ar, lda, b + c0, ldb, yr, ldy, nc, K); break;
          case 3: ProductRows<3>(ar, lda, b + c0, ldb, yr, ldy, nc, K); break;
          case 2: ProductRows<2>(ar, lda, b + c0, ldb, yr, ldy, nc, K); break;
          default: ProductRows<1>(ar, lda, b + c0, ldb, yr, ldy, nc, K); break;
        }
      }
    }
  });
}

}  // namespace many

using many::AttendStagedImpl;
using many::AttendStagedObservedImpl;
using many::StageProductImpl;
using many::StagedColumnSumsImpl;

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(AttendStagedImpl);
HWY_EXPORT(AttendStagedObservedImpl);
HWY_EXPORT(StageProductImpl);
HWY_EXPORT(StagedColumnSumsImpl);

void StageProduct(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy,
                  int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  if (M <= 0 || N <= 0) return;
  STRATA_CHECK_MSG(N % StagedValueAlign() == 0, "StageProduct: %lld columns",
                   static_cast<long long>(N));
  HWY_DYNAMIC_DISPATCH(StageProductImpl)(a, lda, b, ldb, y, ldy, M, N, K, pool);
}

int64_t StagedValueAlign() { return 16; }

void AttendStaged(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                  ThreadPool* pool) {
  if (nq <= 0 || rows.n <= 0) return;
  STRATA_CHECK_MSG(dvp % StagedValueAlign() == 0, "value width %lld is not a multiple of %lld",
                   static_cast<long long>(dvp), static_cast<long long>(StagedValueAlign()));
  STRATA_CHECK(rows.k_stride >= (rows.n + 63) / 64 * 64 && rows.v_stride >= dvp);
  HWY_DYNAMIC_DISPATCH(AttendStagedImpl)(rows, dvp, qs, nq, pool);
}

void AttendStagedObserved(const StagedRows& rows, int64_t dvp, const StagedQuery* qs, int64_t nq,
                          int64_t obs_b, int64_t obs_e, double* col, ThreadPool* pool) {
  if (nq <= 0 || rows.n <= 0) return;
  STRATA_CHECK_MSG(dvp % StagedValueAlign() == 0, "value width %lld is not a multiple of %lld",
                   static_cast<long long>(dvp), static_cast<long long>(StagedValueAlign()));
  STRATA_CHECK(rows.k_stride >= (rows.n + 63) / 64 * 64 && rows.v_stride >= dvp);
  STRATA_CHECK_MSG(rows.r0 == 0 && 0 <= obs_b && obs_b < obs_e && obs_e <= nq,
                   "AttendStagedObserved: rows from %lld, observed heads [%lld, %lld) of %lld",
                   static_cast<long long>(rows.r0), static_cast<long long>(obs_b),
                   static_cast<long long>(obs_e), static_cast<long long>(nq));
  for (int64_t q = 0; q < nq; ++q) {
    STRATA_CHECK_MSG(qs[q].limit <= rows.n && *qs[q].d == 0.f,
                     "AttendStagedObserved: query head %lld reads past the rows or has a state",
                     static_cast<long long>(q));
  }
  HWY_DYNAMIC_DISPATCH(AttendStagedObservedImpl)(rows, dvp, qs, nq, obs_b, obs_e, col, pool);
}

void StagedColumnSums(const StagedRows& rows, const StagedQuery* qs, int64_t nq, double* col,
                      ThreadPool* pool) {
  if (nq <= 0 || rows.n <= 0) return;
  STRATA_CHECK(rows.k_stride >= (rows.n + 63) / 64 * 64);
  HWY_DYNAMIC_DISPATCH(StagedColumnSumsImpl)(rows, qs, nq, col, pool);
}

}  // namespace strata
#endif  // HWY_ONCE
