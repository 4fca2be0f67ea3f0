// VestigeKV's low-pass residual norms (see lowpass.h), Highway SIMD with runtime dispatch.
//
// Version log (2-core Xeon host with AVX-512, AVX3 target; `strata bench attention --kind mla`
// prints the selector's ms per 4096-row close, and `lowpass_tests` compares against the scalar
// reference):
//   v1  Replaces kv/vestige's per-channel KissFFT forward transform + direct kappa-bin synthesis
//       (2.30 ms per close, issue 21 part 5) by two register-tiled products on the basis:
//       analysis Y = B^T X in 4-column x V-vector tiles (V <= 4 vectors of channels, 16
//       accumulators on AVX3), rows in 64-row blocks so the x block and its basis rows stay in L1;
//       synthesis + residual in 4-row x V-vector tiles, sum of squares reduced per row.
//       Rows are read in their natural [u, c] layout: no transpose.
//       Measured, BlockSigma::Compute on one random 4096 x 576 bf16 block, branch (64 channels),
//       kappa 16, both back-ends in one process, best of 20 calls each, 1 thread, on the shared
//       2-core Xeon (AVX-512, ~10 runnable processes): direct 0.345-0.382 ms, the KissFFT path
//       (16-row-tile transpose + 64 forward rFFTs + the kappa-bin synthesis) 2.98-3.04 ms:
//       8.4x. Issue 21 part 5 had measured the FFT form at 2.30 ms on a quiet core; the same
//       ratio puts the direct form at ~0.27 ms there (goal <= 1 ms).
#include "kernels/lowpass.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/lowpass.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {  // internal linkage: other kernels define helpers with the same names per target
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if HWY_TARGET <= HWY_AVX3
constexpr int kVMax = 4;  // channel vectors per tile (x 4 basis columns / rows = 16 accumulators)
#else
constexpr int kVMax = 2;  // 16 vector registers: 8 accumulators
#endif
constexpr int kJT = 4;        // basis columns per analysis tile
constexpr int kR = 4;         // rows per synthesis tile
constexpr int64_t kUB = 64;   // rows per analysis block (x block + basis rows stay in L1)

// Y[j0 + i, c + v N] += sum_{u in [u0, u1)} B[u, j0 + i] x[u, c + v N], i < kJT, v < V.
template <int V>
void AnalysisTile(const float* x, int64_t ldx, int64_t u0, int64_t u1, const float* B, int Jp,
                  int j0, int c, float* Y, int64_t ldy) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[kJT][V];
  for (int i = 0; i < kJT; ++i) {
    for (int v = 0; v < V; ++v) acc[i][v] = hn::LoadU(df, Y + (j0 + i) * ldy + c + v * N);
  }
  for (int64_t u = u0; u < u1; ++u) {
    const float* xr = x + u * ldx + c;
    const float* br = B + u * Jp + j0;
    VF xv[V];
    for (int v = 0; v < V; ++v) xv[v] = hn::LoadU(df, xr + v * N);
    for (int i = 0; i < kJT; ++i) {
      const VF b = hn::Set(df, br[i]);
      for (int v = 0; v < V; ++v) acc[i][v] = hn::MulAdd(b, xv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < kJT; ++i) {
    for (int v = 0; v < V; ++v) hn::StoreU(acc[i][v], df, Y + (j0 + i) * ldy + c + v * N);
  }
}

// For rows [u, u + R): low = sum_j B[u, j] Yw[j, chunk]; ss[u] += sum over the chunk of
// (x - low)^2.
template <int V, int R>
void SynthesisTile(const float* x, int64_t ldx, int64_t u, const float* B, int Jp, int J, int c,
                   const float* Yw, int64_t ldy, float* ss) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  }
  for (int j = 0; j < J; ++j) {
    VF y[V];
    for (int v = 0; v < V; ++v) y[v] = hn::LoadU(df, Yw + j * ldy + c + v * N);
    for (int r = 0; r < R; ++r) {
      const VF b = hn::Set(df, B[(u + r) * Jp + j]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(b, y[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + (u + r) * ldx + c;
    VF s = hn::Zero(df);
    for (int v = 0; v < V; ++v) {
      const VF e = hn::Sub(hn::LoadU(df, xr + v * N), acc[r][v]);
      s = hn::MulAdd(e, e, s);
    }
    ss[u + r] += hn::GetLane(hn::SumOfLanes(df, s));
  }
}

template <int V>
void ChunkPass(const float* x, int64_t ldx, int64_t n, const float* B, int Jp, int J, int c,
               float* Y, int64_t ldy, const float* w, float* ss) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (int j = 0; j < Jp; ++j) {
    for (int v = 0; v < V; ++v) hn::StoreU(hn::Zero(df), df, Y + j * ldy + c + v * N);
  }
  for (int64_t u0 = 0; u0 < n; u0 += kUB) {
    const int64_t u1 = std::min(n, u0 + kUB);
    for (int j0 = 0; j0 < Jp; j0 += kJT) AnalysisTile<V>(x, ldx, u0, u1, B, Jp, j0, c, Y, ldy);
  }
  for (int j = 0; j < J; ++j) {
    const VF wj = hn::Set(df, w[j]);
    for (int v = 0; v < V; ++v) {
      float* p = Y + j * ldy + c + v * N;
      hn::StoreU(hn::Mul(wj, hn::LoadU(df, p)), df, p);
    }
  }
  int64_t u = 0;
  for (; u + kR <= n; u += kR) SynthesisTile<V, kR>(x, ldx, u, B, Jp, J, c, Y, ldy, ss);
  for (; u < n; ++u) SynthesisTile<V, 1>(x, ldx, u, B, Jp, J, c, Y, ldy, ss);
}

}  // namespace

void LowpassResidualNormsImpl(const float* x, int64_t ldx, int64_t n, int C, const float* basis,
                              int kappa, std::vector<float>* scratch, float* sigma) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int J = 2 * kappa - 1;
  const int Jp = LowpassBasisWidth(kappa);
  const int64_t Cv = (C + N - 1) / N;  // channel vectors (columns [C, Cv N) are zero by contract)
  const int64_t ldy = Cv * N;
  scratch->resize(static_cast<size_t>(Jp) * ldy + J);
  float* Y = scratch->data();
  float* w = Y + Jp * ldy;
  w[0] = 1.0f / static_cast<float>(n);
  for (int j = 1; j < J; ++j) w[j] = 2.0f / static_cast<float>(n);
  std::fill(sigma, sigma + n, 0.f);  // running sums of squares, then their square roots
  for (int64_t cv = 0; cv < Cv; cv += kVMax) {
    const int V = static_cast<int>(std::min<int64_t>(kVMax, Cv - cv));
    const int c = static_cast<int>(cv * N);
    switch (V) {
      case 1: ChunkPass<1>(x, ldx, n, basis, Jp, J, c, Y, ldy, w, sigma); break;
#if HWY_TARGET <= HWY_AVX3
      case 2: ChunkPass<2>(x, ldx, n, basis, Jp, J, c, Y, ldy, w, sigma); break;
      case 3: ChunkPass<3>(x, ldx, n, basis, Jp, J, c, Y, ldy, w, sigma); break;
      default: ChunkPass<4>(x, ldx, n, basis, Jp, J, c, Y, ldy, w, sigma); break;
#else
      default: ChunkPass<2>(x, ldx, n, basis, Jp, J, c, Y, ldy, w, sigma); break;
#endif
    }
  }
  for (int64_t u = 0; u < n; ++u) sigma[u] = std::sqrt(sigma[u]);
}

int64_t LowpassLanesImpl() { return static_cast<int64_t>(hn::Lanes(DF())); }

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(LowpassResidualNormsImpl);
HWY_EXPORT(LowpassLanesImpl);

int LowpassBasisWidth(int kappa) {
  STRATA_CHECK(kappa >= 1);
  return (2 * kappa - 1 + 3) / 4 * 4;
}

std::vector<float> LowpassBasis(int64_t n, int kappa) {
  STRATA_CHECK(n >= 2 && n % 2 == 0 && kappa >= 1 && kappa < n / 2);
  const int Jp = LowpassBasisWidth(kappa);
  std::vector<float> b(static_cast<size_t>(n) * Jp, 0.f);
  for (int64_t u = 0; u < n; ++u) {
    float* r = b.data() + u * Jp;
    r[0] = 1.f;
    for (int k = 1; k < kappa; ++k) {
      const double t = 2 * M_PI * static_cast<double>((k * u) % n) / static_cast<double>(n);
      r[2 * k - 1] = static_cast<float>(std::cos(t));
      r[2 * k] = static_cast<float>(std::sin(t));
    }
  }
  return b;
}

void LowpassResidualNorms(const float* x, int64_t ldx, int64_t n, int C, const float* basis,
                          int kappa, std::vector<float>* scratch, float* sigma) {
  STRATA_CHECK(n >= 2 && n % 2 == 0 && kappa >= 1 && kappa < n / 2);
  STRATA_CHECK(C >= 1 && ldx % kLowpassPad == 0 && ldx >= C);
  const int64_t lanes = HWY_DYNAMIC_DISPATCH(LowpassLanesImpl)();
  if (kLowpassPad % lanes != 0) {  // vectors wider than the padding: the scalar form
    LowpassResidualNormsRef(x, ldx, n, C, basis, kappa, sigma);
    return;
  }
  HWY_DYNAMIC_DISPATCH(LowpassResidualNormsImpl)(x, ldx, n, C, basis, kappa, scratch, sigma);
}

void LowpassResidualNormsRef(const float* x, int64_t ldx, int64_t n, int C, const float* basis,
                             int kappa, float* sigma) {
  const int J = 2 * kappa - 1;
  const int Jp = LowpassBasisWidth(kappa);
  std::vector<float> Y(static_cast<size_t>(J) * C, 0.f), low(C);
  for (int64_t u = 0; u < n; ++u) {
    for (int j = 0; j < J; ++j) {
      const float b = basis[u * Jp + j];
      for (int c = 0; c < C; ++c) Y[j * C + c] += b * x[u * ldx + c];
    }
  }
  for (int j = 0; j < J; ++j) {
    const float wj = (j == 0 ? 1.0f : 2.0f) / static_cast<float>(n);
    for (int c = 0; c < C; ++c) Y[j * C + c] *= wj;
  }
  for (int64_t u = 0; u < n; ++u) {
    std::fill(low.begin(), low.end(), 0.f);
    for (int j = 0; j < J; ++j) {
      const float b = basis[u * Jp + j];
      for (int c = 0; c < C; ++c) low[c] += b * Y[j * C + c];
    }
    float s = 0;
    for (int c = 0; c < C; ++c) {
      const float e = x[u * ldx + c] - low[c];
      s += e * e;
    }
    sigma[u] = std::sqrt(s);
  }
}

}  // namespace strata
#endif  // HWY_ONCE
