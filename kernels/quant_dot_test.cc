#include "kernels/quant_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_gemm.h"
#include "kernels/quant_testing.h"

namespace strata {
namespace {

// Activations with a magnitude that changes per 32 elements over six decades, some blocks all
// zero (d_x = 0) and some holding exact ties of the rounding (x = (j + 1/2) d_x).
std::vector<float> RandomActivations(Rng& rng, int64_t k) {
  std::vector<float> x(k);
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint64_t mode = rng.Below(10);
    const float scale = std::pow(10.f, rng.UniformF(-3.f, 3.f));
    for (int i = 0; i < 32; ++i) {
      float v = static_cast<float>(rng.Normal()) * scale;
      if (mode == 0) v = 0.f;
      if (mode == 1) {
        v = i == 0 ? 127.f : static_cast<float>(static_cast<int>(rng.Below(254)) - 127) + 0.5f;
      }
      x[32 * b + i] = v;
    }
  }
  return x;
}

// A row of weights and its activations, each placed at a random byte offset (0-3) from an
// aligned start, so no SIMD or scalar load may rely on alignment.
struct Case {
  std::vector<uint8_t> wbuf, abuf;
  const uint8_t* row = nullptr;
  uint8_t* act = nullptr;
};

Case MakeCase(DType t, int64_t k, const std::vector<float>& x, Rng& rng) {
  Case c;
  const int64_t nb = k / DTypeBlockElems(t);
  std::vector<uint8_t> blocks = RandomBlocks(t, nb, rng);
  const int wo = static_cast<int>(rng.Below(4)), ao = static_cast<int>(rng.Below(4));
  c.wbuf.assign(blocks.size() + 8, 0);
  std::memcpy(c.wbuf.data() + wo, blocks.data(), blocks.size());
  c.row = c.wbuf.data() + wo;
  c.abuf.assign(ActivationBytes(t, k) + 8, 0);
  c.act = c.abuf.data() + ao;
  QuantizeActivations(t, x.data(), k, c.act);
  return c;
}

int64_t RandomK(DType t, Rng& rng, int it) {
  const int64_t be = DTypeBlockElems(t);
  // One block, a few blocks around the 8-block SIMD group, and many blocks.
  const int64_t nbs[] = {1, 2, 7, 8, 9, 15, 16, 17, 24, 40};
  const int64_t nb = it < 10 ? nbs[it] : 1 + static_cast<int64_t>(rng.Below(be == 32 ? 200 : 24));
  return nb * be;
}

// Integer sums are exact and the f32 operations are the same sequence, so every SIMD target
// gives the scalar reference's float bit for bit.
TEST(QuantDotTest, SimdEqualsScalarReferenceBitForBit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachQuantTarget([&] {
    for (DType t : kQuantTypes) {
      for (int it = 0; it < 24; ++it) {
        const int64_t k = RandomK(t, rng, it);
        const std::vector<float> x = RandomActivations(rng, k);
        Case c = MakeCase(t, k, x, rng);
        const float ref = QuantDotRef(t, c.row, c.act, k);
        const float got = QuantDot(t, c.row, c.act, k);
        ASSERT_EQ(F32Bits(got), F32Bits(ref))
            << DTypeName(t) << " k=" << k << " got " << got << " ref " << ref;
        float y = 0.f;
        QuantDotRows(t, c.row, DTypeRowBytes(t, k), c.act, k, &y, 1);
        ASSERT_EQ(F32Bits(y), F32Bits(ref)) << DTypeName(t) << " k=" << k;
      }
    }
  });
}

// The largest intermediate sums the SIMD kernels form (int16 pair sums of vpmaddubsw, int16 lanes
// fed to vpmaddwd / vpdpwssd): every code at its maximum (all code bits set), the largest
// sub-block scales (and Q6_K's -128 / 127), activations all q = +127 or all -127, and a row of
// 40 blocks (full SIMD groups plus a tail). A saturating or wrapping intermediate would make
// QuantDot differ from the plain integer sums of the reference.
TEST(QuantDotTest, ExtremeCodesAndActivationsBitForBit) {
  ForEachQuantTarget([&] {
    for (DType t : kQuantTypes) {
      const int64_t nb = 40, k = nb * DTypeBlockElems(t);
      const QuantBlockInfo info = BlockInfo(t);
      std::vector<uint8_t> row(nb * DTypeBlockBytes(t));
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* p = row.data() + b * DTypeBlockBytes(t);
        std::memset(p, 0xff, DTypeBlockBytes(t));  // codes and integer scales at their maximum
        if (t == DType::kQ6_K && b % 2 == 1) std::memset(p + info.sc_lo, 0x80, 16);  // -128
        if (t == DType::kQ6_K && b % 4 == 2) std::memset(p + info.sc_lo, 0x7f, 16);  // +127
        for (int f = 0; f < info.n_f16; ++f) {
          const uint16_t one = F32ToF16(1.f);
          std::memcpy(p + info.f16[f], &one, 2);
        }
      }
      for (float sign : {1.f, -1.f}) {
        const std::vector<float> x(k, sign);  // q = +-127 everywhere
        std::vector<uint8_t> act(ActivationBytes(t, k));
        QuantizeActivations(t, x.data(), k, act.data());
        const float ref = QuantDotRef(t, row.data(), act.data(), k);
        const float got = QuantDot(t, row.data(), act.data(), k);
        ASSERT_TRUE(std::isfinite(ref)) << DTypeName(t);
        ASSERT_EQ(F32Bits(got), F32Bits(ref))
            << DTypeName(t) << " sign " << sign << " got " << got << " ref " << ref;
      }
    }
  });
}

// The activation quantizer writes the same bytes on every SIMD target (all its operations are
// exact or correctly rounded), so the integer dots above see the same q everywhere.
TEST(QuantDotTest, ActivationsEqualOnEveryTarget) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (DType t : {DType::kQ4_0, DType::kQ6_K}) {
    const int64_t k = 256 * (1 + static_cast<int64_t>(rng.Below(8)));
    const std::vector<float> x = RandomActivations(rng, k);
    std::vector<uint8_t> first;
    ForEachQuantTarget([&] {
      std::vector<uint8_t> a(ActivationBytes(t, k));
      QuantizeActivations(t, x.data(), k, a.data());
      if (first.empty()) first = a;
      ASSERT_EQ(a, first) << DTypeName(t) << " k=" << k;
    });
  }
}

// The float64 error contract of quant_dot.h, and a tighter check against the product with the
// int8 activations themselves (only the f32 term remains there, which catches any wrong code,
// scale or offset: one wrong code moves the result by ~d_w d_x, far beyond that term).
TEST(QuantDotTest, WithinFloat64BoundOfDequantizedProduct) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (DType t : kQuantTypes) {
    for (int it = 0; it < 40; ++it) {
      const int64_t k = RandomK(t, rng, it);
      const int64_t be = ActivationBlockElems(t);
      const int64_t nb = k / DTypeBlockElems(t);
      const std::vector<float> x = RandomActivations(rng, k);
      Case c = MakeCase(t, k, x, rng);
      std::vector<float> w(k);
      DequantizeRow(t, c.row, w.data(), k);
      const std::vector<float> mn = MinParts(t, c.row, k);
      double exact = 0, exact_q = 0, act_term = 0, mag = 0;
      for (int64_t b = 0; b < k / be; ++b) {
        float amax = 0.f;
        for (int64_t i = b * be; i < (b + 1) * be; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float dx = amax / 127.f;
        double sw = 0, sm = 0;
        for (int64_t i = b * be; i < (b + 1) * be; ++i) {
          const double q = dx == 0.f ? 0.0 : std::nearbyint(static_cast<double>(x[i] / dx));
          exact += static_cast<double>(w[i]) * x[i];
          exact_q += static_cast<double>(w[i]) * (static_cast<double>(dx) * q);
          sw += std::fabs(static_cast<double>(w[i]));
          sm += std::fabs(static_cast<double>(w[i])) + 2 * std::fabs(static_cast<double>(mn[i]));
        }
        act_term += dx * (0.5 + std::ldexp(1.0, -15)) * sw;
        mag += dx * 127.0 * sm;
      }
      const double f32_term = (std::ceil(nb / 8.0) + 6) * std::ldexp(1.0, -23) * mag;
      const double y = QuantDot(t, c.row, c.act, k);
      ASSERT_LE(std::fabs(y - exact), act_term + f32_term)
          << DTypeName(t) << " k=" << k << " y " << y << " exact " << exact;
      ASSERT_LE(std::fabs(y - exact_q), f32_term)
          << DTypeName(t) << " k=" << k << " y " << y << " exact_q " << exact_q;
    }
  }
}

// The activation blocks themselves: |x - d q| <= d (1/2 + 2^-15), |q| <= 127, and the stated
// Inf/NaN behaviour (a NaN result, not a silent finite one).
TEST(QuantDotTest, ActivationRoundingAndNonFinite) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (DType t : {DType::kQ4_0, DType::kQ4_K}) {
    const int64_t k = 512;
    const std::vector<float> x = RandomActivations(rng, k);
    std::vector<uint8_t> act(ActivationBytes(t, k));
    QuantizeActivations(t, x.data(), k, act.data());
    const int8_t* q = reinterpret_cast<const int8_t*>(act.data());
    const int64_t be = ActivationBlockElems(t);
    for (int64_t b = 0; b < k / be; ++b) {
      float amax = 0.f;
      for (int64_t i = b * be; i < (b + 1) * be; ++i) amax = std::max(amax, std::fabs(x[i]));
      const double d = amax / 127.f;
      for (int64_t i = b * be; i < (b + 1) * be; ++i) {
        ASSERT_LE(std::abs(static_cast<int>(q[i])), 127);
        ASSERT_LE(std::fabs(x[i] - d * q[i]), d * (0.5 + std::ldexp(1.0, -15)) + 1e-300)
            << DTypeName(t) << " i=" << i;
      }
    }
    for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
      std::vector<float> xb = x;
      xb[3] = bad;
      QuantizeActivations(t, xb.data(), k, act.data());
      const std::vector<uint8_t> row = RandomBlocks(t, k / DTypeBlockElems(t), rng);
      EXPECT_TRUE(std::isnan(QuantDot(t, row.data(), act.data(), k))) << DTypeName(t);
    }
  }
}

TensorView View(DType t, const uint8_t* data, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.n_dims = 2;
  v.shape = {rows, cols, 1, 1};
  return v;
}

// MatVec (any pool) == DotRow == MatMulInt8 per token, bit for bit, for every quantized type on
// odd row counts: every path runs QuantDot's row function on the same int8 activations. (MatMul
// itself: see MatMulPathsMatchReferenceAndMatVec.)
TEST(QuantDotTest, MatVecDotRowMatMulBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool p2(2), p3(3);
  ForEachQuantTarget([&] {
    for (DType t : kQuantTypes) {
      const int64_t rows = 1 + 2 * static_cast<int64_t>(rng.Below(60));
      const int64_t k = RandomK(t, rng, 10);
      const int64_t rb = DTypeRowBytes(t, k);
      std::vector<uint8_t> wbuf = RandomBlocks(t, rows * (k / DTypeBlockElems(t)), rng);
      const TensorView w = View(t, wbuf.data(), rows, k);
      const int64_t n = 1 + static_cast<int64_t>(rng.Below(9));
      const int64_t xs = k + static_cast<int64_t>(rng.Below(3));
      std::vector<float> x(n * xs + 1);
      for (int64_t j = 0; j < n; ++j) {
        const std::vector<float> xj = RandomActivations(rng, k);
        std::copy(xj.begin(), xj.end(), x.begin() + 1 + j * xs);
      }
      std::vector<float> ym(n * (rows + 1), -1.f), ym3(n * (rows + 1), -1.f);
      MatMulInt8(w, x.data() + 1, n, xs, ym.data(), rows + 1, nullptr);
      MatMulInt8(w, x.data() + 1, n, xs, ym3.data(), rows + 1, &p3);
      for (int64_t j = 0; j < n; ++j) {
        const float* xj = x.data() + 1 + j * xs;
        std::vector<float> y0(rows), y2(rows), y3(rows);
        MatVec(w, xj, y0.data(), nullptr);
        MatVec(w, xj, y2.data(), &p2);
        MatVec(w, xj, y3.data(), &p3);
        for (int64_t r = 0; r < rows; ++r) {
          const float d = DotRow(t, wbuf.data() + r * rb, xj, k);
          ASSERT_EQ(F32Bits(y0[r]), F32Bits(d)) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(y2[r]), F32Bits(d)) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(y3[r]), F32Bits(d)) << DTypeName(t) << " r=" << r;
          ASSERT_EQ(F32Bits(ym[j * (rows + 1) + r]), F32Bits(d))
              << DTypeName(t) << " n=" << n << " t=" << j << " r=" << r;
          ASSERT_EQ(F32Bits(ym3[j * (rows + 1) + r]), F32Bits(d))
              << DTypeName(t) << " n=" << n << " t=" << j << " r=" << r;
        }
        ASSERT_EQ(ym[j * (rows + 1) + rows], -1.f) << "MatMulInt8 wrote past the rows";
      }
    }
  });
}

// MatVecMany over a mix of types sharing x (a Q4_K_M layer mixes Q4_K and Q6_K, 32- and
// 256-element activation blocks, and F16 may sit beside them) equals separate MatVec calls.
TEST(QuantDotTest, MatVecManyMixedTypes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool p3(3);
  const int64_t k = 512;
  const DType types[] = {DType::kQ4_K, DType::kQ6_K, DType::kQ8_0, DType::kF16, DType::kQ4_0};
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorView> ws;
  for (DType t : types) {
    const int64_t rows = 1 + static_cast<int64_t>(rng.Below(50));
    if (t == DType::kF16) {
      std::vector<float> f(rows * k);
      for (auto& v : f) v = static_cast<float>(rng.Normal());
      bufs.emplace_back(rows * k * 2);
      FromF32(t, f.data(), bufs.back().data(), rows * k);
    } else {
      bufs.push_back(RandomBlocks(t, rows * k / DTypeBlockElems(t), rng));
    }
    ws.push_back(View(t, bufs.back().data(), rows, k));
  }
  const std::vector<float> x = RandomActivations(rng, k);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p3}) {
    std::vector<std::vector<float>> got(ws.size()), ref(ws.size());
    std::vector<MatVecJob> jobs;
    for (size_t j = 0; j < ws.size(); ++j) {
      got[j].assign(ws[j].rows(), 0.f);
      ref[j].assign(ws[j].rows(), 0.f);
      MatVec(ws[j], x.data(), ref[j].data(), nullptr);
      jobs.push_back({ws[j], got[j].data()});
    }
    MatVecMany(jobs.data(), static_cast<int>(jobs.size()), x.data(), pool);
    for (size_t j = 0; j < ws.size(); ++j) {
      for (int64_t r = 0; r < ws[j].rows(); ++r) {
        ASSERT_EQ(F32Bits(got[j][r]), F32Bits(ref[j][r])) << DTypeName(types[j]) << " r=" << r;
      }
    }
  }
}

// MatMulDequant (rows dequantized exactly to f32, f32 GEMM with the f32 activations) is within f32
// rounding of MatVecRef's float64 sums. MatMul (the prefill path) is the integer GEMM where
// HasQuantGemm serves the type on the target, and then equals MatVec per token bit for bit (the
// same int8 activations and QuantDotRef's float; kernels/quant_gemm_test.cc tests the kernel
// itself on ragged shapes); elsewhere it is MatMulDequant. n = 1 is MatVec.
TEST(QuantDotTest, MatMulPathsMatchReferenceAndMatVec) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool p2(2);
  ForEachQuantTarget([&] {
    for (DType t : kQuantTypes) {
      const int64_t rows = 37, k = 512, n = 5;
      std::vector<uint8_t> wbuf = RandomBlocks(t, rows * k / DTypeBlockElems(t), rng);
      const TensorView w = View(t, wbuf.data(), rows, k);
      std::vector<float> x(n * k), y(n * rows), yd(n * rows), yref(rows), yv(rows), wrow(k);
      for (auto& v : x) v = static_cast<float>(rng.Normal());
      MatMulDequant(w, x.data(), n, k, yd.data(), rows, &p2);
      MatMul(w, x.data(), n, k, y.data(), rows, &p2);
      const bool gemm = HasQuantGemm(t, k);
      for (int64_t j = 0; j < n; ++j) {
        MatVecRef(w, x.data() + j * k, yref.data());
        MatVec(w, x.data() + j * k, yv.data(), nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          DequantizeRow(t, w.row(r), wrow.data(), k);
          double mag = 0;
          for (int64_t i = 0; i < k; ++i) mag += std::fabs(double(wrow[i]) * x[j * k + i]);
          ASSERT_NEAR(yd[j * rows + r], yref[r], 8 * std::sqrt(double(k)) * 1.2e-7 * mag + 1e-30)
              << DTypeName(t) << " t=" << j << " r=" << r;
          if (gemm) {
            ASSERT_EQ(F32Bits(y[j * rows + r]), F32Bits(yv[r]))
                << DTypeName(t) << " t=" << j << " r=" << r;
          } else {
            ASSERT_EQ(F32Bits(y[j * rows + r]), F32Bits(yd[j * rows + r]))
                << DTypeName(t) << " t=" << j << " r=" << r;
          }
        }
      }
      std::vector<float> y1(rows);
      MatMul(w, x.data(), 1, k, y1.data(), rows, nullptr);
      MatVec(w, x.data(), yv.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(F32Bits(y1[r]), F32Bits(yv[r])) << DTypeName(t);
    }
  });
}

}  // namespace
}  // namespace strata
