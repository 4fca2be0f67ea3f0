#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/quant_gemm.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

constexpr DType kWeightTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0};
// The float tests of MatVec/DotRow below compare with the f32/float64 product of x itself; Q8_0's
// MatVec (like every quantized type's) rounds x to int8 blocks first, so its bound is the one of
// kernels/quant_dot.h, tested in kernels/quant_dot_test.cc. The f32 GEMM (MatMulDequant) keeps
// Q8_0 in its reference test; MatMul equals MatVec for the float types, and for Q8_0 where the
// integer GEMM serves it (as MatMulInt8 does everywhere).
constexpr DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A weight matrix in storage type t, placed `shift` elements (F32/F16/BF16) or blocks past an
// aligned start, so SIMD loads are misaligned.
struct Weights {
  std::vector<uint8_t> bytes;
  TensorView view;
};

Weights MakeWeights(DType t, int64_t rows, int64_t cols, const std::vector<float>& values,
                    int shift) {
  Weights w;
  const int64_t row_bytes = DTypeRowBytes(t, cols);
  const int64_t off = shift * DTypeBlockBytes(t);
  w.bytes.resize(off + rows * row_bytes + 64);
  for (int64_t r = 0; r < rows; ++r) {
    FromF32(t, values.data() + r * cols, w.bytes.data() + off + r * row_bytes, cols);
  }
  w.view.data = w.bytes.data() + off;
  w.view.dtype = t;
  w.view.n_dims = 2;
  w.view.shape = {rows, cols, 1, 1};
  return w;
}

std::vector<float> RandomVec(Rng& rng, int64_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

int64_t RandomCols(Rng& rng, DType t) {
  if (t == DType::kQ8_0) return 32 * (1 + static_cast<int64_t>(rng.Below(40)));
  return 1 + static_cast<int64_t>(rng.Below(700));
}

// Integer data makes every product and partial sum exact in f32 (|w| <= 127, |x| <= 8, n <= 4096:
// sums stay below 2^24), so any SIMD/tail/indexing bug shows as an exact mismatch.
TEST(MatmulTest, DotRowExactOnIntegerData) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (DType t : kFloatTypes) {
      for (int it = 0; it < 60; ++it) {
        const int64_t n = it < 40 && t != DType::kQ8_0 ? it + 1 : RandomCols(rng, t) * 4;
        const int64_t n_ok = t == DType::kQ8_0 ? (n + 31) / 32 * 32 : n;
        const int wmax = 127;  // exact in f16, bf16 (8 significant bits) and Q8_0
        std::vector<float> w(n_ok), x(n_ok + 3);
        for (int64_t i = 0; i < n_ok; ++i) {
          w[i] = static_cast<float>(static_cast<int>(rng.Below(2 * wmax + 1)) - wmax);
          if (t == DType::kQ8_0 && i % 32 == 0) w[i] = 127.f;
        }
        const int xo = static_cast<int>(rng.Below(4));
        for (int64_t i = 0; i < n_ok; ++i) {
          x[xo + i] = static_cast<float>(static_cast<int>(rng.Below(17)) - 8);
        }
        Weights wt = MakeWeights(t, 1, n_ok, w, static_cast<int>(rng.Below(3)));
        double ref = 0;
        for (int64_t i = 0; i < n_ok; ++i) ref += static_cast<double>(w[i]) * x[xo + i];
        const float got = DotRow(t, wt.view.row(0), x.data() + xo, n_ok);
        ASSERT_EQ(static_cast<double>(got), ref) << DTypeName(t) << " n=" << n_ok;
      }
    }
  });
}

// Random real data: SIMD vs the float64 reference. Tolerance: the f32 rounding error of a sum of n
// products grows like sqrt(n) * eps * sum|w x| for random signs; 8 * sqrt(n) * eps * sum|w x| is a
// safe margin over that (the rigorous worst case n * eps would hide real indexing bugs).
TEST(MatmulTest, MatVecMatchesFloat64Reference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (DType t : kFloatTypes) {
      for (int it = 0; it < 12; ++it) {
        const int64_t rows = 1 + static_cast<int64_t>(rng.Below(70));
        const int64_t cols = RandomCols(rng, t);
        Weights wt =
            MakeWeights(t, rows, cols, RandomVec(rng, rows * cols), static_cast<int>(rng.Below(3)));
        const int xo = static_cast<int>(rng.Below(4));
        std::vector<float> xbuf = RandomVec(rng, cols + 4);
        const float* x = xbuf.data() + xo;
        std::vector<float> y(rows), yref(rows), wrow(cols);
        MatVec(wt.view, x, y.data(), nullptr);
        MatVecRef(wt.view, x, yref.data());
        for (int64_t r = 0; r < rows; ++r) {
          ToF32(t, wt.view.row(r), wrow.data(), cols);
          double mag = 0;
          for (int64_t c = 0; c < cols; ++c) mag += std::fabs(static_cast<double>(wrow[c]) * x[c]);
          const double tol = 8 * std::sqrt(static_cast<double>(cols)) * 1.2e-7 * mag + 1e-30;
          ASSERT_NEAR(y[r], yref[r], tol) << DTypeName(t) << " r=" << r << " cols=" << cols;
        }
      }
    }
  });
}

// Rows are independent and every row is summed by the same operation sequence, so MatVec equals
// DotRow bit for bit and does not depend on the thread count (1, 2, 3 threads).
TEST(MatmulTest, MatVecBitExactAcrossThreadsAndDotRow) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    ThreadPool p1(1), p2(2), p3(3);
    for (DType t : kWeightTypes) {
      for (int it = 0; it < 6; ++it) {
        const int64_t rows = 1 + static_cast<int64_t>(rng.Below(300));
        const int64_t cols = RandomCols(rng, t);
        Weights wt = MakeWeights(t, rows, cols, RandomVec(rng, rows * cols), 1);
        std::vector<float> x = RandomVec(rng, cols);
        std::vector<float> y0(rows), y1(rows), y2(rows), y3(rows);
        MatVec(wt.view, x.data(), y0.data(), nullptr);
        MatVec(wt.view, x.data(), y1.data(), &p1);
        MatVec(wt.view, x.data(), y2.data(), &p2);
        MatVec(wt.view, x.data(), y3.data(), &p3);
        for (int64_t r = 0; r < rows; ++r) {
          const float d = DotRow(t, wt.view.row(r), x.data(), cols);
          ASSERT_EQ(F32Bits(y0[r]), F32Bits(d)) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(y0[r]), F32Bits(y1[r])) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(y0[r]), F32Bits(y2[r])) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(y0[r]), F32Bits(y3[r])) << DTypeName(t) << " r=" << r;
        }
      }
    }
  });
}

// MatVecMany splits the concatenated rows of several matrices across threads; each row is still
// summed by the MatVec sequence, so it equals separate MatVec calls bit for bit for any pool.
TEST(MatmulTest, MatVecManyEqualsSeparateMatVec) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    ThreadPool p2(2), p3(3);
    for (DType t : kWeightTypes) {
      for (int it = 0; it < 4; ++it) {
        const int64_t cols = RandomCols(rng, t);
        const int n_jobs = 1 + static_cast<int>(rng.Below(3));
        std::vector<Weights> ws;
        std::vector<std::vector<float>> ref(n_jobs);
        const std::vector<float> x = RandomVec(rng, cols);
        for (int j = 0; j < n_jobs; ++j) {
          const int64_t rows = 1 + static_cast<int64_t>(rng.Below(j == 0 ? 5 : 120));
          ws.push_back(MakeWeights(t, rows, cols, RandomVec(rng, rows * cols), j % 2));
          ref[j].resize(rows);
          MatVec(ws[j].view, x.data(), ref[j].data(), nullptr);
        }
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2, &p3}) {
          std::vector<std::vector<float>> got(n_jobs);
          std::vector<MatVecJob> jobs;
          for (int j = 0; j < n_jobs; ++j) {
            got[j].assign(ws[j].view.rows() + 1, -1.f);
            jobs.push_back({ws[j].view, got[j].data()});
          }
          MatVecMany(jobs.data(), n_jobs, x.data(), pool);
          for (int j = 0; j < n_jobs; ++j) {
            for (int64_t r = 0; r < ws[j].view.rows(); ++r) {
              ASSERT_EQ(F32Bits(got[j][r]), F32Bits(ref[j][r]))
                  << DTypeName(t) << " job " << j << " r=" << r;
            }
            ASSERT_EQ(got[j].back(), -1.f) << "wrote past the rows of job " << j;
          }
        }
      }
    }
  });
}

// MatMul converts float weights exactly to f32 and sums each (row, token) pair with the same
// sequence as MatVec, so it equals MatVec per token bit for bit, for any tile shape, stride and
// pool; for Q8_0 the integer GEMM (where it serves) and the int8 row dots (MatMulInt8) do the same
// with the integer dot on the same activations.
TEST(MatmulTest, MatMulEqualsMatVecPerToken) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    ThreadPool p3(3);
    const int64_t ns[] = {1, 2, 3, 4, 5, 7, 8, 13};
    for (DType t : kWeightTypes) {
      for (int64_t n : ns) {
        const int64_t rows = 1 + static_cast<int64_t>(rng.Below(90));
        const int64_t cols = RandomCols(rng, t);
        Weights wt =
            MakeWeights(t, rows, cols, RandomVec(rng, rows * cols), static_cast<int>(rng.Below(2)));
        const int64_t xs = cols + static_cast<int64_t>(rng.Below(5));
        const int64_t ys = rows + static_cast<int64_t>(rng.Below(5));
        std::vector<float> x = RandomVec(rng, n * xs + 1);
        std::vector<float> y(n * ys, -1.f), ym(n * ys, -1.f), yv(rows);
        // MatMulInt8 is MatMul for the float types, and the int8 prefill path for Q8_0.
        MatMulInt8(wt.view, x.data() + 1, n, xs, y.data(), ys, nullptr);
        MatMulInt8(wt.view, x.data() + 1, n, xs, ym.data(), ys, &p3);
        // MatMul: the f32 GEMM for the float types, the integer GEMM for Q8_0 where it serves.
        const bool mm = !IsQuantized(t) || HasQuantGemm(t, cols);
        std::vector<float> yg(n * ys, -1.f);
        if (mm) MatMul(wt.view, x.data() + 1, n, xs, yg.data(), ys, &p3);
        for (int64_t tk = 0; tk < n; ++tk) {
          MatVec(wt.view, x.data() + 1 + tk * xs, yv.data(), nullptr);
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(F32Bits(y[tk * ys + r]), F32Bits(yv[r]))
                << DTypeName(t) << " n=" << n << " t=" << tk << " r=" << r;
            ASSERT_EQ(F32Bits(ym[tk * ys + r]), F32Bits(yv[r]))
                << DTypeName(t) << " n=" << n << " t=" << tk << " r=" << r;
            if (mm) {
              ASSERT_EQ(F32Bits(yg[tk * ys + r]), F32Bits(yv[r]))
                  << "MatMul " << DTypeName(t) << " n=" << n << " t=" << tk << " r=" << r;
            }
          }
          for (int64_t r = rows; r < ys; ++r)
            ASSERT_EQ(y[tk * ys + r], -1.f) << "wrote past row end";
        }
      }
    }
  });
}

// A larger shape with several conversion tiles and thread chunks (the f32 GEMM; Q8_0's MatMul is
// the integer GEMM, with the int8 activation bound of kernels/quant_dot.h).
TEST(MatmulTest, MatMulLargeMatchesReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool p2(2);
  const int64_t rows = 200, cols = 2048, n = 9;
  for (DType t : kWeightTypes) {
    Weights wt = MakeWeights(t, rows, cols, RandomVec(rng, rows * cols), 0);
    std::vector<float> x = RandomVec(rng, n * cols), y(n * rows), yref(rows);
    MatMulDequant(wt.view, x.data(), n, cols, y.data(), rows, &p2);
    for (int64_t tk = 0; tk < n; ++tk) {
      MatVecRef(wt.view, x.data() + tk * cols, yref.data());
      for (int64_t r = 0; r < rows; ++r) {
        // The bound of the test above with sum|w x| <= cols (E|w x| = 2/pi for normal data).
        ASSERT_NEAR(y[tk * rows + r], yref[r], 8 * std::sqrt(double(cols)) * 1.2e-7 * cols)
            << DTypeName(t) << " t=" << tk << " r=" << r;
      }
    }
  }
}

}  // namespace
}  // namespace strata
