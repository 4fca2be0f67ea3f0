#include "kernels/attention_many.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

// A stream of n rows: keys of kd0 + kd1 entries, values of dv entries (f32), and m query heads.
struct Problem {
  int64_t n = 0, kd0 = 0, kd1 = 0, dv = 0, dvp = 0;
  std::vector<float> keys, vals;  // [n, kd0 + kd1], [n, dv]
  std::vector<float> q;           // [m, kd0 + kd1]
  std::vector<int64_t> limit;     // [m]
};

Problem MakeProblem(Rng& rng, int64_t n, int64_t kd0, int64_t kd1, int64_t dv,
                    const std::vector<int64_t>& limits) {
  Problem p;
  p.n = n;
  p.kd0 = kd0;
  p.kd1 = kd1;
  p.dv = dv;
  p.dvp = (dv + StagedValueAlign() - 1) / StagedValueAlign() * StagedValueAlign();
  const int64_t dk = kd0 + kd1;
  p.keys.resize(n * dk);
  for (float& x : p.keys) x = static_cast<float>(rng.Normal());
  p.vals.resize(n * dv);
  for (float& x : p.vals) x = static_cast<float>(rng.Normal());
  p.limit = limits;
  p.q.resize(limits.size() * dk);
  const float scale = 1.f / std::sqrt(static_cast<float>(dk));
  for (float& x : p.q) x = static_cast<float>(rng.Normal()) * 2.f * scale;
  return p;
}

// Stages each segment of p's rows (starting at the given rows; the last ends at n) afresh, with
// padding that holds garbage (NaN), and calls fn(rows) on it.
template <typename F>
void ForEachSegment(const Problem& p, const std::vector<int64_t>& seg_starts, F&& fn) {
  const int64_t dk = p.kd0 + p.kd1;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t s = 0; s < seg_starts.size(); ++s) {
    const int64_t r0 = seg_starts[s];
    const int64_t n = (s + 1 < seg_starts.size() ? seg_starts[s + 1] : p.n) - r0;
    const int64_t ks = (n + 63) / 64 * 64 + 5;
    std::vector<float> k0(p.kd0 * ks, nan);
    std::vector<float> k1(p.kd1 * ks + 1, nan);
    const int64_t vs = p.dvp + 3;
    std::vector<float> v(n * vs, nan);
    for (int64_t i = 0; i < n; ++i) {
      const float* key = &p.keys[(r0 + i) * dk];
      for (int64_t c = 0; c < p.kd0; ++c) k0[c * ks + i] = key[c];
      for (int64_t c = 0; c < p.kd1; ++c) k1[c * ks + i] = key[p.kd0 + c];
      for (int64_t c = 0; c < p.dvp; ++c) v[i * vs + c] = c < p.dv ? p.vals[(r0 + i) * p.dv + c] : 0.f;
    }
    StagedRows rows;
    rows.r0 = r0;
    rows.n = n;
    rows.kt[0] = k0.data();
    rows.kt[1] = k1.data();
    rows.kd[0] = p.kd0;
    rows.kd[1] = p.kd1;
    rows.k_stride = ks;
    rows.v = v.data();
    rows.v_stride = vs;
    fn(rows);
  }
}

// The outputs [m, dv] of AttendStaged over the segments, on `pool`. With col: then a second pass
// over the same segments adds the final weights' column sums into col ([n], StagedColumnSums).
std::vector<float> RunStaged(const Problem& p, const std::vector<int64_t>& seg_starts, ThreadPool* pool,
                             std::vector<double>* col = nullptr) {
  const int64_t m = static_cast<int64_t>(p.limit.size());
  const int64_t dk = p.kd0 + p.kd1;
  std::vector<float> ms(m, -std::numeric_limits<float>::infinity());
  std::vector<float> ds(m, 0.f);
  std::vector<float> os(m * p.dvp, 0.f);
  std::vector<StagedQuery> qs(m);
  for (int64_t j = 0; j < m; ++j) {
    qs[j] = {p.q.data() + j * dk, p.limit[j], &ms[j], &ds[j], &os[j * p.dvp]};
  }
  ForEachSegment(p, seg_starts,
                 [&](const StagedRows& rows) { AttendStaged(rows, p.dvp, qs.data(), m, pool); });
  if (col != nullptr) {
    col->assign(p.n, 0.0);
    ForEachSegment(p, seg_starts, [&](const StagedRows& rows) {
      StagedColumnSums(rows, qs.data(), m, col->data() + rows.r0, pool);
    });
  }
  std::vector<float> out(m * p.dv);
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t c = 0; c < p.dv; ++c) out[j * p.dv + c] = os[j * p.dvp + c] / ds[j];
  }
  return out;
}

std::vector<double> Reference(const Problem& p, int64_t j) {
  const int64_t dk = p.kd0 + p.kd1;
  std::vector<double> s(p.limit[j]);
  double mx = -1e300;
  for (int64_t u = 0; u < p.limit[j]; ++u) {
    double acc = 0;
    for (int64_t c = 0; c < dk; ++c) acc += double{p.q[j * dk + c]} * p.keys[u * dk + c];
    s[u] = acc;
    mx = std::max(mx, acc);
  }
  std::vector<double> o(p.dv, 0.0);
  double d = 0;
  for (int64_t u = 0; u < p.limit[j]; ++u) {
    const double w = std::exp(s[u] - mx);
    d += w;
    for (int64_t c = 0; c < p.dv; ++c) o[c] += w * p.vals[u * p.dv + c];
  }
  for (double& x : o) x /= d;
  return o;
}

// The float64 column sums of query heads [j0, j1)'s softmax weights over p's rows, and each
// sum's bound for an f32 computation: 64 u, plus per term its weight times 3 e (e: the f32
// rounding bound of the head's largest score, dk u sum |q_c k_c|) and (limit + slack) u for
// the rescaling and the sum.
void ColumnSumsReference(const Problem& p, int64_t j0, int64_t j1, int64_t slack,
                         std::vector<double>* ref, std::vector<double>* tol) {
  const double u = std::ldexp(1.0, -24);
  const int64_t dk = p.kd0 + p.kd1;
  ref->assign(p.n, 0.0);
  tol->assign(p.n, 64 * u);
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t lim = p.limit[j];
    std::vector<double> sc(lim);
    double mx = -1e300, e = 0, d = 0;
    for (int64_t r = 0; r < lim; ++r) {
      double acc = 0, mag = 0;
      for (int64_t c = 0; c < dk; ++c) {
        acc += double{p.q[j * dk + c]} * p.keys[r * dk + c];
        mag += std::fabs(double{p.q[j * dk + c]} * p.keys[r * dk + c]);
      }
      sc[r] = acc;
      mx = std::max(mx, acc);
      e = std::max(e, dk * u * mag);
    }
    for (int64_t r = 0; r < lim; ++r) d += std::exp(sc[r] - mx);
    for (int64_t r = 0; r < lim; ++r) {
      const double w = std::exp(sc[r] - mx) / d;
      (*ref)[r] += w;
      (*tol)[r] += w * (3 * e + (lim + slack) * u);
    }
  }
}

// A prefill chunk: m queries at positions [p0, p0 + m) read rows [0, p0 + j + 1).
std::vector<int64_t> Causal(int64_t p0, int64_t m) {
  std::vector<int64_t> l(m);
  for (int64_t j = 0; j < m; ++j) l[j] = p0 + j + 1;
  return l;
}

// Outputs are convex combinations of values of size ~1; f32 scores and the online rescaling
// differ from float64 by ~1e-6 absolute at these sizes (AttendStream's test uses the same 2e-5;
// a missing or extra row moves an output by ~|v| / n >= 1e-3 here).
constexpr double kRefTol = 2e-5;

TEST(AttendStagedTest, EveryQueryHeadMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Case {
    int64_t kd0, kd1, dv;
  };
  const Case cases[] = {{128, 64, 128}, {72, 0, 64}, {37, 5, 19}, {1, 1, 1}, {16, 8, 40}};
  ForEachSimdTarget([&] {
    for (const Case& c : cases) {
      for (int64_t p0 : {0, 7, 64, 150}) {
        const int64_t m = 1 + static_cast<int64_t>(rng.Below(90));
        Problem p = MakeProblem(rng, p0 + m, c.kd0, c.kd1, c.dv, Causal(p0, m));
        // One segment, and the rows split in three at uneven places.
        const std::vector<std::vector<int64_t>> splits = {
            {0}, {0, (p0 + m) / 3, (p0 + m) / 3 + 1 + (p0 + m) / 2 / 2}};
        for (const auto& seg : splits) {
          if (seg.back() >= p.n) continue;
          ThreadPool pool(2);
          const std::vector<float> got = RunStaged(p, seg, &pool);
          for (int64_t j = 0; j < m; ++j) {
            const std::vector<double> ref = Reference(p, j);
            for (int64_t i = 0; i < c.dv; ++i) {
              ASSERT_NEAR(got[j * c.dv + i], ref[i], kRefTol)
                  << "kd " << c.kd0 << "+" << c.kd1 << " dv " << c.dv << " p0 " << p0 << " m "
                  << m << " segments " << seg.size() << " query " << j << " entry " << i;
            }
          }
        }
      }
    }
  });
}

// A query head's result does not depend on the other heads of the call (alone, in a chunk, in a
// different order of limits), on the pool or its size: bit for bit.
TEST(AttendStagedTest, QueryResultDoesNotDependOnTheOthersOrThePool) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int64_t p0 = 300, m = 150;
  std::vector<int64_t> lim = Causal(p0, m);
  // Heads of one query share a limit (MLA's absorbed shape), the others differ by one per head.
  for (int64_t j = 0; j < 40; ++j) lim[j] = p0 + 1 + j / 4;
  Problem p = MakeProblem(rng, p0 + m, 48, 16, 48, lim);
  const std::vector<int64_t> seg = {0, 200};
  const std::vector<float> all = RunStaged(p, seg, nullptr);
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const std::vector<float> got = RunStaged(p, seg, &pool);
    EXPECT_EQ(0, std::memcmp(got.data(), all.data(), 4 * all.size())) << threads << " threads";
  }
  for (int64_t j : {0, 5, 39, 77, 149}) {
    Problem one = p;
    one.limit = {p.limit[j]};
    one.q.assign(p.q.begin() + j * 64, p.q.begin() + (j + 1) * 64);
    const std::vector<float> got = RunStaged(one, seg, nullptr);
    EXPECT_EQ(0, std::memcmp(got.data(), &all[j * p.dv], 4 * p.dv)) << "query head " << j;
  }
}

// StagedColumnSums against float64 weights. Weight w_ju = exp(s_ju - m_j) / d_j of query head j
// carries the f32 errors of its score (|ds| <= E_j = dk u max_u sum_c |q_c k_uc|, u = 2^-24), of
// m_j (the f32 max of the same scores: <= E_j), of d_j (relative <= E_j + (limit_j + 8) u: an
// online sum of <= limit_j f32 exponentials) and of exp and the product (8 u), so
// |w - w_ref| <= w_ref (3 E_j + (limit_j + 16) u) to first order; the f32 runs of <= 64 heads
// add 64 u per column sum. A missing or extra query head or row moves a sum by a whole weight
// (~1 / limit >= 1e-3 here).
TEST(StagedColumnSumsTest, MatchesFloat64WeightsAndIgnoresThePool) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (int64_t p0 : {0, 9, 130}) {
      const int64_t m = 1 + static_cast<int64_t>(rng.Below(150));
      // Heads of a query share its limit (MLA: 16 heads per query); 4 heads per query here.
      std::vector<int64_t> lim(4 * m);
      for (int64_t j = 0; j < 4 * m; ++j) lim[j] = p0 + j / 4 + 1;
      Problem p = MakeProblem(rng, p0 + m, 40, 8, 16, lim);
      const int64_t nq = 4 * m;
      const std::vector<int64_t> seg = {0, (p0 + m) / 2 + 1};
      std::vector<double> col;
      ThreadPool pool(2);
      RunStaged(p, seg, &pool, &col);
      std::vector<double> ref, tol;
      ColumnSumsReference(p, 0, nq, 16, &ref, &tol);
      for (int64_t r = 0; r < p.n; ++r) {
        ASSERT_NEAR(col[r], ref[r], tol[r]) << "p0 " << p0 << " m " << m << " row " << r;
      }
      std::vector<double> col2;
      ThreadPool pool3(3);
      RunStaged(p, seg, &pool3, &col2);
      ASSERT_EQ(0, std::memcmp(col.data(), col2.data(), 8 * col.size())) << "pool changed bits";
    }
  });
}

// AttendStagedObserved: the outputs are AttendStaged's bit for bit, and the observed heads'
// column sums match the float64 weights within StagedColumnSumsTest's bound plus 8 u per weight
// (a kept weight exp(s - m_t) times exp(m_t - m) / d: two more roundings and one exponential);
// the pool does not change a bit.
TEST(AttendStagedObservedTest, OutputsAreAttendStagedsAndSumsMatchFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (int64_t p0 : {0, 9, 130}) {
      const int64_t m = 2 + static_cast<int64_t>(rng.Below(150));
      std::vector<int64_t> lim(4 * m);
      for (int64_t j = 0; j < 4 * m; ++j) lim[j] = p0 + j / 4 + 1;
      Problem p = MakeProblem(rng, p0 + m, 40, 8, 16, lim);
      const int64_t dk = p.kd0 + p.kd1, nq = 4 * m;
      // Observed: a run of heads that starts and ends inside 64-head tasks.
      const int64_t obs_b = static_cast<int64_t>(rng.Below(nq - 1)),
                    obs_e = obs_b + 1 + static_cast<int64_t>(rng.Below(nq - obs_b));
      const std::vector<int64_t> one_segment = {0};
      const std::vector<float> want = RunStaged(p, one_segment, nullptr);
      auto run = [&](ThreadPool* pool, std::vector<double>* col) {
        std::vector<float> ms(nq, -std::numeric_limits<float>::infinity()), ds(nq, 0.f),
            os(nq * p.dvp, 0.f);
        std::vector<StagedQuery> qs(nq);
        for (int64_t j = 0; j < nq; ++j) {
          qs[j] = {p.q.data() + j * dk, p.limit[j], &ms[j], &ds[j], &os[j * p.dvp]};
        }
        col->assign(p.n, 0.0);
        ForEachSegment(p, one_segment, [&](const StagedRows& rows) {
          AttendStagedObserved(rows, p.dvp, qs.data(), nq, obs_b, obs_e, col->data(), pool);
        });
        std::vector<float> out(nq * p.dv);
        for (int64_t j = 0; j < nq; ++j) {
          for (int64_t c = 0; c < p.dv; ++c) out[j * p.dv + c] = os[j * p.dvp + c] / ds[j];
        }
        return out;
      };
      std::vector<double> col, col3;
      ThreadPool pool(2), pool3(3);
      const std::vector<float> got = run(&pool, &col);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), 4 * want.size())) << "outputs changed";
      run(&pool3, &col3);
      ASSERT_EQ(0, std::memcmp(col.data(), col3.data(), 8 * col.size())) << "pool changed bits";
      std::vector<double> ref, tol;
      ColumnSumsReference(p, obs_b, obs_e, 24, &ref, &tol);
      for (int64_t r = 0; r < p.n; ++r) {
        ASSERT_NEAR(col[r], ref[r], tol[r]) << "p0 " << p0 << " m " << m << " observed ["
                                            << obs_b << ", " << obs_e << ") row " << r;
      }
    }
  });
}

// StageProduct: every entry within f32 rounding of the float64 product (|error| <= K u sum_k
// |a b| with u = 2^-24, the bound of a K-term FMA chain), on every SIMD target, for shapes with
// row and column tails; the pool does not change a bit.
TEST(StageProductTest, MatchesFloat64AndIgnoresThePool) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{128, 2048, 512}, {7, 16, 3}, {33, 80, 40}, {1, 64, 1}, {70, 128, 129},
                          {9, 400, 17}};  // 400: a partial 256-column panel
  ForEachSimdTarget([&] {
    for (const Shape& sh : shapes) {
      const int64_t lda = sh.K + 3, ldb = sh.N + 16, ldy = sh.N + 5;
      std::vector<float> a(sh.M * lda), b(sh.K * ldb);
      for (float& x : a) x = static_cast<float>(rng.Normal());
      for (float& x : b) x = static_cast<float>(rng.Normal());
      std::vector<float> y(sh.M * ldy, -3.f), y2(sh.M * ldy, -3.f);
      StageProduct(a.data(), lda, b.data(), ldb, y.data(), ldy, sh.M, sh.N, sh.K, nullptr);
      ThreadPool pool(3);
      StageProduct(a.data(), lda, b.data(), ldb, y2.data(), ldy, sh.M, sh.N, sh.K, &pool);
      ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), 4 * y.size())) << "pool changed bits";
      for (int64_t r = 0; r < sh.M; ++r) {
        for (int64_t c = 0; c < ldy; ++c) {
          if (c >= sh.N) {
            ASSERT_EQ(y[r * ldy + c], -3.f) << "wrote past column " << sh.N;
            continue;
          }
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < sh.K; ++k) {
            const double p = double{a[r * lda + k]} * b[k * ldb + c];
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_LE(std::fabs(y[r * ldy + c] - ref), sh.K * std::ldexp(mag, -24) + 1e-30)
              << sh.M << "x" << sh.N << "x" << sh.K << " at " << r << "," << c;
        }
      }
    }
  });
}

}  // namespace
}  // namespace strata
