#include "kv/vestige/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/check.h"

// LAPACK (Fortran symbols from Debian's liblapack, linked into strata_kv). Relatively robust
// representation eigensolver for a real symmetric matrix; we ask for eigenvalues il..iu (ascending).
extern "C" void dsyevr_(const char* jobz, const char* range, const char* uplo, const int* n,
                        double* a, const int* lda, const double* vl, const double* vu,
                        const int* il, const int* iu, const double* abstol, int* m, double* w,
                        double* z, const int* ldz, int* isuppz, double* work, const int* lwork,
                        int* iwork, const int* liwork, int* info);

namespace strata {

Status FitRecallBasis(const float* x, int64_t n, int d, int rank, float* basis,
                      std::vector<double>* eigenvalues, ThreadPool* pool) {
  if (n < 1) return InvalidArgument("recall basis: no calibration queries (n = 0)");
  if (d < 1 || rank < 1 || rank > d) {
    return InvalidArgument("recall basis: rank " + std::to_string(rank) + " outside [1, " +
                           std::to_string(d) + "]");
  }
  // Column mean, then the centred Gram (upper triangle, column-major = row-major for symmetric).
  std::vector<double> mean(d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) mean[j] += x[i * d + j];
  for (int j = 0; j < d; ++j) mean[j] /= static_cast<double>(n);
  std::vector<double> gram(static_cast<size_t>(d) * d, 0.0);
  std::vector<double> xc(static_cast<size_t>(n) * d);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) xc[i * d + j] = x[i * d + j] - mean[j];
  // Gram rows [a0, a1) per task, each entry accumulated over i = 0, 1, ... n - 1.
  ParallelForOrInline(pool, d, 8, [&](int64_t a0, int64_t a1, int) {
    for (int64_t i = 0; i < n; ++i) {
      const double* row = xc.data() + i * d;
      for (int64_t a = a0; a < a1; ++a) {
        const double ra = row[a];
        if (ra == 0.0) continue;
        double* g = gram.data() + a * d;
        for (int b = static_cast<int>(a); b < d; ++b) g[b] += ra * row[b];
      }
    }
  });
  // gram row a holds entries (a, b >= a): in column-major terms that is the lower triangle.
  const char jobz = 'V', range = 'I', uplo = 'L';
  const int nn = d, lda = d, ldz = d;
  const int il = d - rank + 1, iu = d;
  const double vl = 0, vu = 0, abstol = 0;
  int m = 0, info = 0;
  std::vector<double> w(d), z(static_cast<size_t>(d) * rank);
  std::vector<int> isuppz(2 * static_cast<size_t>(rank));
  int lwork = -1, liwork = -1, iwork_q = 0;
  double work_q = 0;
  dsyevr_(&jobz, &range, &uplo, &nn, gram.data(), &lda, &vl, &vu, &il, &iu, &abstol, &m, w.data(),
          z.data(), &ldz, isuppz.data(), &work_q, &lwork, &iwork_q, &liwork, &info);
  if (info != 0) return Internal("recall basis: dsyevr workspace query failed, info " +
                                 std::to_string(info));
  lwork = static_cast<int>(work_q);
  liwork = iwork_q;
  std::vector<double> work(lwork);
  std::vector<int> iwork(liwork);
  dsyevr_(&jobz, &range, &uplo, &nn, gram.data(), &lda, &vl, &vu, &il, &iu, &abstol, &m, w.data(),
          z.data(), &ldz, isuppz.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0 || m != rank) {
    return Internal("recall basis: dsyevr failed, info " + std::to_string(info) + ", found " +
                    std::to_string(m) + " of " + std::to_string(rank) + " eigenvectors");
  }
  // Eigenvector j (ascending) is column j of z (column-major, d entries). Descending order out.
  if (eigenvalues) eigenvalues->assign(rank, 0.0);
  for (int k = 0; k < rank; ++k) {
    const int j = rank - 1 - k;
    const double* v = z.data() + static_cast<size_t>(j) * d;
    int arg = 0;
    for (int c = 1; c < d; ++c)
      if (std::fabs(v[c]) > std::fabs(v[arg])) arg = c;
    const double sign = v[arg] < 0 ? -1.0 : 1.0;
    for (int c = 0; c < d; ++c) basis[static_cast<size_t>(k) * d + c] = static_cast<float>(sign * v[c]);
    if (eigenvalues) (*eigenvalues)[k] = w[j];
  }
  return OkStatus();
}

double QuantileLinear(std::vector<double> v, double alpha) {
  STRATA_CHECK(!v.empty());
  STRATA_CHECK(alpha >= 0.0 && alpha <= 1.0);
  std::sort(v.begin(), v.end());
  const double pos = alpha * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

GateFit FitGate(const std::vector<double>& hard, const std::vector<double>& all, double alpha,
                int64_t min_hard) {
  GateFit g;
  g.n_hard = static_cast<int64_t>(hard.size());
  if (g.n_hard < min_hard || g.n_hard == 0) return g;
  const double thr = QuantileLinear(hard, alpha);
  int64_t above = 0;
  for (double e : all) above += e > thr ? 1 : 0;
  if (!all.empty() && static_cast<double>(above) > kRecallGateOffFraction * all.size()) {
    g.off = true;
    return g;
  }
  g.thr = static_cast<float>(thr);
  return g;
}

ConformalFit FitConformalZ(std::vector<double> z_q, RecallZFloor floor) {
  ConformalFit f;
  f.n = static_cast<int64_t>(z_q.size());
  if (f.n < kRecallMinRowsDecode) {
    f.z = kRecallZMax;
    f.clamped = true;
    return f;
  }
  std::sort(z_q.begin(), z_q.end());
  f.k = static_cast<int64_t>(std::ceil((f.n + 1) * kRecallScanTarget - 1e-9));
  f.k = std::min(std::max<int64_t>(f.k, 1), f.n);
  double z = z_q[f.k - 1];
  if (z > kRecallZMax || std::isnan(z)) {
    z = kRecallZMax;
    f.clamped = true;
  }
  if (floor == RecallZFloor::kZero && z < 0.0) {
    z = 0.0;
    f.clamped = true;
  }
  f.z = static_cast<float>(z);
  return f;
}

float FitLadderZ(const std::vector<LadderRow>& hard_rows, float margin) {
  if (hard_rows.empty()) return kRecallZNoHard;
  for (float z : kRecallZLadder) {
    int64_t hit = 0;
    for (const LadderRow& r : hard_rows) {
      if (r.gate_open && r.idx + z * r.cert > r.max1 - margin) ++hit;
    }
    if (static_cast<double>(hit) >= kRecallTarget * static_cast<double>(hard_rows.size())) return z;
  }
  return kRecallZMax;
}

}  // namespace strata
