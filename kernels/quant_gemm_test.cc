#include "kernels/quant_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/rng.h"
#include "kernels/quant_dot.h"
#include "kernels/quant_testing.h"

namespace strata {
namespace {

constexpr DType kGemmTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};

TensorView View(DType t, const uint8_t* data, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.n_dims = 2;
  v.shape = {rows, cols, 1, 1};
  return v;
}

// Activations whose 32-element blocks vary in magnitude over six decades, with all-zero blocks,
// blocks at the extremes (every q = +127 or every q = -127, the largest int16 pair sums of
// vpmaddubsw against the largest codes) and exact ties of the rounding.
std::vector<float> Activations(Rng& rng, int64_t k) {
  std::vector<float> x(k);
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint64_t mode = rng.Below(10);
    const float scale = std::pow(10.f, rng.UniformF(-3.f, 3.f));
    for (int i = 0; i < 32; ++i) {
      float v = static_cast<float>(rng.Normal()) * scale;
      if (mode == 0) v = 0.f;
      if (mode == 1) v = scale;
      if (mode == 2) v = -scale;
      if (mode == 3) {
        v = i == 0 ? 127.f : static_cast<float>(static_cast<int>(rng.Below(254)) - 127) + 0.5f;
      }
      x[32 * b + i] = v;
    }
  }
  return x;
}

// A weight [rows, k] and n_tok quantized, prepared tokens; checks QuantGemmRows over rows
// [r0, r1) against QuantDotRef for every (row, token), and that no other output is written.
void CheckShape(DType t, int64_t rows, int64_t k, int64_t n_tok, int64_t r0, int64_t r1, Rng& rng) {
  SCOPED_TRACE(testing::Message() << DTypeName(t) << " rows=" << rows << " k=" << k
                                  << " tokens=" << n_tok << " range [" << r0 << ", " << r1 << ")");
  std::vector<uint8_t> wbuf = RandomBlocks(t, rows * k / DTypeBlockElems(t), rng);
  // All codes at their maximum in some rows (the saturation corner of the int16 pair sums).
  const int64_t rb = DTypeRowBytes(t, k);
  const QuantBlockInfo info = BlockInfo(t);
  for (int64_t r = 0; r < rows; r += 3) {
    for (int64_t b = 0; b < k / DTypeBlockElems(t); ++b) {
      uint8_t* p = wbuf.data() + r * rb + b * DTypeBlockBytes(t);
      std::memset(p + info.code_lo, 0xff, info.code_hi - info.code_lo);
    }
  }
  const TensorView w = View(t, wbuf.data(), rows, k);
  const int64_t ab = ActivationBytes(t, k);
  // An odd stride: the prepared tokens need no alignment.
  const int64_t tb = QuantGemmTokenBytes(t, k) + 4;
  std::vector<uint8_t> acts(n_tok * ab), toks(n_tok * tb + 8);
  const uint8_t* tok0 = toks.data() + 4;
  for (int64_t j = 0; j < n_tok; ++j) {
    const std::vector<float> x = Activations(rng, k);
    QuantizeActivations(t, x.data(), k, acts.data() + j * ab);
    PrepareQuantGemmToken(t, acts.data() + j * ab, k, toks.data() + 4 + j * tb);
  }
  const int64_t y_stride = rows + 3;
  const float kSentinel = -12345.f;
  std::vector<float> y(n_tok * y_stride, kSentinel);
  QuantGemmRows(w, tok0, tb, n_tok, y.data(), y_stride, r0, r1);
  for (int64_t j = 0; j < n_tok; ++j) {
    for (int64_t r = 0; r < y_stride; ++r) {
      const float got = y[j * y_stride + r];
      if (r < r0 || r >= r1) {
        ASSERT_EQ(F32Bits(got), F32Bits(kSentinel))
            << "wrote outside its rows: t=" << j << " r=" << r;
        continue;
      }
      const float ref = QuantDotRef(t, w.row(r), acts.data() + j * ab, k);
      ASSERT_EQ(F32Bits(got), F32Bits(ref))
          << "t=" << j << " r=" << r << " got " << got << " ref " << ref;
    }
  }
}

// Integer sums are exact and the f32 operations are QuantDotRef's, so every (row, token) equals
// the scalar reference bit for bit, on every SIMD target that serves the type. Shapes are ragged
// on purpose: block counts around the 8- and 16-lane groups, row counts around the 4-row tile,
// token counts around the 2- and 4-token register tiles and the token tile.
TEST(QuantGemmTest, EqualsScalarReferenceBitForBit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  int served_targets = 0;
  ForEachQuantTarget([&] {
    bool any = false;
    for (DType t : kGemmTypes) {
      const int64_t be = DTypeBlockElems(t);
      if (!HasQuantGemm(t, be)) continue;
      any = true;
      const int64_t nbs32[] = {1, 7, 8, 9, 16, 17, 18, 33};
      const int64_t nbs256[] = {1, 2, 3, 9};
      const bool big = be == 256;
      const int n_nb = big ? 4 : 8;
      for (int i = 0; i < n_nb; ++i) {
        const int64_t nb = big ? nbs256[i] : nbs32[i];
        const int64_t rows = 1 + static_cast<int64_t>(rng.Below(9));   // 1..9
        const int64_t n_tok = 1 + static_cast<int64_t>(rng.Below(7));  // 1..7
        CheckShape(t, rows, nb * be, n_tok, 0, rows, rng);
        if (HasFatalFailure()) return;
      }
      for (int i = 0; i < 3; ++i) {  // fresh random shapes
        const int64_t nb = 1 + static_cast<int64_t>(rng.Below(big ? 12 : 48));
        const int64_t rows = 1 + static_cast<int64_t>(rng.Below(13));
        const int64_t n_tok = 1 + static_cast<int64_t>(rng.Below(13));
        CheckShape(t, rows, nb * be, n_tok, 0, rows, rng);
        if (HasFatalFailure()) return;
      }
      // A row range inside the matrix, and more tokens than one tile (at most 256 tokens).
      CheckShape(t, 11, (big ? 2 : 9) * be, 259, 2, 9, rng);
      if (HasFatalFailure()) return;
    }
    served_targets += any ? 1 : 0;
  });
#if HWY_ARCH_X86
  // Every x86-64 CPU these tests run on has AVX2.
  EXPECT_GE(served_targets, 1);
#endif
}

TEST(QuantGemmTest, ServesOnlyItsTypes) {
  EXPECT_FALSE(HasQuantGemm(DType::kF32, 32));
  EXPECT_FALSE(HasQuantGemm(DType::kQ3_K, 256));
  EXPECT_FALSE(HasQuantGemm(DType::kQ4_K, 128));  // not a whole super-block
  EXPECT_FALSE(HasQuantGemm(DType::kQ4_0, 0));
}

}  // namespace
}  // namespace strata
