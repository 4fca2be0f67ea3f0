// MatVecBatch / MatVecBatchMany (decode over a batch of sequences): bit-identical to MatVec per
// sequence for every weight dtype, every SIMD target, batch sizes around the kernels' token tiles
// (float: DotTokens' 4 below 8, the GEMM tiles from 8; quantized: 64), odd shapes, padded
// strides, with and without a pool.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_testing.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

struct Matrix {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// rows x cols of type t: normal values for the float types, random blocks with their corner cases
// (kernels/quant_testing.h) for the quantized ones.
Matrix RandomMatrix(DType t, int64_t rows, int64_t cols, Rng& rng) {
  Matrix m;
  const int64_t row_bytes = DTypeRowBytes(t, cols);
  if (IsQuantized(t)) {
    m.bytes = RandomBlocks(t, rows * cols / DTypeBlockElems(t), rng);
  } else {
    m.bytes.resize(rows * row_bytes);
    std::vector<float> v(cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& x : v) x = static_cast<float>(rng.Normal());
      FromF32(t, v.data(), m.bytes.data() + r * row_bytes, cols);
    }
  }
  m.view.data = m.bytes.data();
  m.view.dtype = t;
  m.view.n_dims = 2;
  m.view.shape = {rows, cols, 1, 1};
  return m;
}

std::vector<DType> AllTypes() {
  std::vector<DType> all = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType t : kQuantTypes) all.push_back(t);
  return all;
}

// Odd column counts for the type: tails of every length for the float types, 1 and 3 blocks (and
// a wide row) for the quantized ones.
std::vector<int64_t> ColsFor(DType t) {
  if (!IsQuantized(t)) return {1, 7, 16, 67, 131, 768};
  const int64_t b = DTypeBlockElems(t);
  return {b, 3 * b, b == 32 ? 768 : 1024};
}

// Bitwise: NaN results (possible with the corner-case scales) must match too.
void ExpectSameBits(const float* a, const float* b, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, a + i, 4);
    std::memcpy(&ub, b + i, 4);
    ASSERT_EQ(ua, ub) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(MatVecBatchTest, EqualsMatVecBitForBitEveryDtype) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool pool(2);
  ForEachQuantTarget([&] {
    for (DType t : AllTypes()) {
      for (int64_t cols : ColsFor(t)) {
        for (int64_t rows : {1, 5, 37}) {
          const Matrix w = RandomMatrix(t, rows, cols, rng);
          for (int64_t nb : {1, 2, 3, 7, 8, 16, 65}) {
            SCOPED_TRACE(testing::Message() << DTypeName(t) << " [" << rows << ", " << cols
                                            << "] B=" << nb);
            const int64_t xs = cols + static_cast<int64_t>(rng.Below(5));  // padded strides
            const int64_t ys = rows + static_cast<int64_t>(rng.Below(5));
            std::vector<float> x(nb * xs);
            for (auto& v : x) v = static_cast<float>(rng.Normal());
            std::vector<float> want(nb * ys, -7.f), got(nb * ys, -7.f), got_pool(nb * ys, -7.f);
            MatVecBatchRef(w.view, x.data(), nb, xs, want.data(), ys);
            MatVecBatch(w.view, x.data(), nb, xs, got.data(), ys, nullptr);
            MatVecBatch(w.view, x.data(), nb, xs, got_pool.data(), ys, &pool);
            for (int64_t b = 0; b < nb; ++b) {
              // The reference is MatVec itself, row by row.
              std::vector<float> solo(rows);
              MatVec(w.view, x.data() + b * xs, solo.data(), nullptr);
              ExpectSameBits(want.data() + b * ys, solo.data(), rows, "reference");
            }
            ExpectSameBits(got.data(), want.data(), nb * ys, "no pool");
            ExpectSameBits(got_pool.data(), want.data(), nb * ys, "pool");
            if (testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  });
}

// Jobs of mixed types sharing X (a Q4_K_M layer mixes Q4_K and Q6_K, whose activations are the
// same 256-blocks; Q8_0 takes 32-blocks; F16 none), different output strides, one dispatch.
TEST(MatVecBatchTest, ManyEqualsMatVecPerJob) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool pool(2);
  const int64_t cols = 512;
  ForEachQuantTarget([&] {
    const DType types[] = {DType::kQ4_K, DType::kQ6_K, DType::kQ8_0, DType::kF16, DType::kBF16};
    std::vector<Matrix> ws;
    for (DType t : types) ws.push_back(RandomMatrix(t, 20 + rng.Below(30), cols, rng));
    for (int64_t nb : {1, 2, 3, 7, 16}) {
      SCOPED_TRACE(testing::Message() << "B=" << nb);
      std::vector<float> x(nb * cols);
      for (auto& v : x) v = static_cast<float>(rng.Normal());
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<std::vector<float>> ys(ws.size());
        std::vector<MatVecBatchJob> jobs;
        for (size_t j = 0; j < ws.size(); ++j) {
          const int64_t stride = ws[j].view.rows() + static_cast<int64_t>(j);
          ys[j].assign(nb * stride, -7.f);
          jobs.push_back({ws[j].view, ys[j].data(), stride});
        }
        MatVecBatchMany(jobs.data(), static_cast<int>(jobs.size()), x.data(), nb, cols, p);
        for (size_t j = 0; j < ws.size(); ++j) {
          const int64_t rows = ws[j].view.rows();
          for (int64_t b = 0; b < nb; ++b) {
            std::vector<float> solo(rows);
            MatVec(ws[j].view, x.data() + b * cols, solo.data(), nullptr);
            ExpectSameBits(ys[j].data() + b * jobs[j].y_stride, solo.data(), rows,
                           std::string(DTypeName(types[j])));
          }
          // The padding between output rows is left alone.
          for (int64_t b = 0; b < nb; ++b) {
            for (int64_t r = rows; r < jobs[j].y_stride; ++r) {
              ASSERT_EQ(ys[j][b * jobs[j].y_stride + r], -7.f);
            }
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace strata
