#include "model/kda.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace strata {

void KdaStep(const float* q, const float* k, const float* v, const float* g, float beta, int dk,
             int dv, float* S, float* o) {
  // Decay the key rows, then u = S^T k over the decayed state.
  float u[512];
  float* ub = dv <= 512 ? u : new float[dv];
  std::fill(ub, ub + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    const float a = std::exp(g[i]);
    float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      row[j] *= a;
      ub[j] += row[j] * ki;
    }
  }
  for (int j = 0; j < dv; ++j) ub[j] = beta * (v[j] - ub[j]);  // delta
  std::fill(o, o + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      row[j] += ki * ub[j];
      o[j] += row[j] * qi;
    }
  }
  if (ub != u) delete[] ub;
}

int64_t KdaChunkScratchFloats(int chunk, int dk, int dv) {
  // gamma [C, dk], L [C, C], A [C, C], delta [C, dv]
  return int64_t{chunk} * dk + 2 * int64_t{chunk} * chunk + int64_t{chunk} * dv;
}

void KdaChunked(const float* q, const float* k, const float* v, const float* g,
                const float* beta, int64_t stride, int64_t beta_stride, int T, int dk, int dv,
                int chunk, float* S, float* o, float* scratch) {
  float* gam = scratch;                                   // [C, dk] cumulative log decay
  float* L = gam + int64_t{chunk} * dk;                    // [C, C] strictly lower
  float* A = L + int64_t{chunk} * chunk;                   // [C, C] lower incl. diagonal
  float* delta = A + int64_t{chunk} * chunk;               // [C, dv] the new values V_new
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int c = std::min(chunk, T - t0);
    const float* qc = q + t0 * stride;
    const float* kc = k + t0 * stride;
    const float* vc = v + t0 * stride;
    const float* gc = g + t0 * stride;
    for (int r = 0; r < c; ++r) {
      float* gr = gam + int64_t{r} * dk;
      const float* gt = gc + r * stride;
      const float* prev = r ? gr - dk : nullptr;
      for (int i = 0; i < dk; ++i) gr[i] = (prev ? prev[i] : 0.f) + gt[i];
    }
    // Pairwise products with exponents Γ_r − Γ_s <= 0 (s <= r).
    for (int r = 0; r < c; ++r) {
      const float* gr = gam + int64_t{r} * dk;
      const float* kr = kc + r * stride;
      const float* qr = qc + r * stride;
      const float br = beta[(t0 + r) * beta_stride];
      for (int s = 0; s <= r; ++s) {
        const float* gs = gam + int64_t{s} * dk;
        const float* ks = kc + s * stride;
        float lk = 0.f, aq = 0.f;
        for (int i = 0; i < dk; ++i) {
          const float w = std::exp(gr[i] - gs[i]) * ks[i];
          lk += kr[i] * w;
          aq += qr[i] * w;
        }
        L[r * chunk + s] = s < r ? br * lk : 0.f;
        A[r * chunk + s] = aq;
      }
    }
    // delta_r = beta_r (v_r - S0^T (e^Γ_r ⊙ k_r)) - sum_{s<r} L[r][s] delta_s.
    for (int r = 0; r < c; ++r) {
      const float* gr = gam + int64_t{r} * dk;
      const float* kr = kc + r * stride;
      const float* vr = vc + r * stride;
      const float br = beta[(t0 + r) * beta_stride];
      float* dr = delta + int64_t{r} * dv;
      std::fill(dr, dr + dv, 0.f);
      for (int i = 0; i < dk; ++i) {
        const float ei = std::exp(gr[i]) * kr[i];
        const float* row = S + int64_t{i} * dv;
        for (int j = 0; j < dv; ++j) dr[j] += row[j] * ei;
      }
      for (int j = 0; j < dv; ++j) dr[j] = br * (vr[j] - dr[j]);
      for (int s = 0; s < r; ++s) {
        const float l = L[r * chunk + s];
        const float* ds = delta + int64_t{s} * dv;
        for (int j = 0; j < dv; ++j) dr[j] -= l * ds[j];
      }
    }
    // o_r = S0^T (e^Γ_r ⊙ q_r) + sum_{s<=r} A[r][s] delta_s.
    for (int r = 0; r < c; ++r) {
      const float* gr = gam + int64_t{r} * dk;
      const float* qr = qc + r * stride;
      float* orow = o + (t0 + r) * stride;
      std::fill(orow, orow + dv, 0.f);
      for (int i = 0; i < dk; ++i) {
        const float ei = std::exp(gr[i]) * qr[i];
        const float* row = S + int64_t{i} * dv;
        for (int j = 0; j < dv; ++j) orow[j] += row[j] * ei;
      }
      for (int s = 0; s <= r; ++s) {
        const float a = A[r * chunk + s];
        const float* ds = delta + int64_t{s} * dv;
        for (int j = 0; j < dv; ++j) orow[j] += a * ds[j];
      }
    }
    // S <- Diag(e^Γ_c) S0 + sum_s (e^(Γ_c − Γ_s) ⊙ k_s) delta_s^T.
    const float* gl = gam + int64_t{c - 1} * dk;
    for (int i = 0; i < dk; ++i) {
      float* row = S + int64_t{i} * dv;
      const float a = std::exp(gl[i]);
      for (int j = 0; j < dv; ++j) row[j] *= a;
      for (int s = 0; s < c; ++s) {
        const float w = std::exp(gl[i] - gam[int64_t{s} * dk + i]) * kc[s * stride + i];
        const float* ds = delta + int64_t{s} * dv;
        for (int j = 0; j < dv; ++j) row[j] += w * ds[j];
      }
    }
  }
}

void ShortConvStep(const float* x, const float* w, int64_t channels, int taps, float* tail,
                   float* y) {
  const int m = taps - 1;
  for (int64_t c = 0; c < channels; ++c) {
    const float* wc = w + c * taps;
    float* tc = tail + c * m;
    float acc = wc[m] * x[c];
    for (int t = 0; t < m; ++t) acc += wc[t] * tc[t];
    y[c] = acc;
    for (int t = 0; t + 1 < m; ++t) tc[t] = tc[t + 1];
    if (m > 0) tc[m - 1] = x[c];
  }
}

}  // namespace strata
