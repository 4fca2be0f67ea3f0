// Tests of the Geodesia-KV rate accounting against the storage.
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/accounting.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kv/geodesia/packed_attention.h"

namespace strata::geodesia {
namespace {

// §12.5.
TEST(GeodesiaAccounting, LevelCostClosedForms) {
  const int D = 128;
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(8, D, 64), 8.5);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(4, D, 64), 4.5);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(2, D, 64), 2.5);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(8, D, 32), 9.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(4, D, 32), 5.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(2, D, 32), 3.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(8, D, 16), 10.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(4, D, 16), 6.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(2, D, 16), 4.0);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(1, D, 64), 0.25);
  EXPECT_DOUBLE_EQ(LevelBitsPerValue(16, D, 64), 16.0);
  // General form L + 16 max(1, P/g) / P + 16 max(1, D/g) / D, and the slots hold exactly beta.
  for (int Dd : {32, 64, 96, 128}) {
    for (int g : {16, 32}) {
      for (int L : {8, 4, 2}) {
        EXPECT_DOUBLE_EQ(LevelBitsPerValue(L, Dd, g),
                         L + 16.0 * (64 / g) / 64 + 16.0 * (Dd / g) / Dd);
      }
    }
  }
  for (int L : kLevels) EXPECT_EQ(8 * SlotBytes(L, D, 64), LevelBlockBits(L, D, 64));
}

// §12.6: a cache with a known histogram, residual tokens and boxes; the partial block is
// charged as 64 exact rows.
TEST(GeodesiaAccounting, ResidentMatchesStorage) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int trial = 0; trial < 5; ++trial) {
    const int H = 1 + static_cast<int>(rng.Below(3));
    const int D = 32 * (1 + static_cast<int>(rng.Below(4)));
    const int g = (trial % 2) ? 32 : 16;
    GradedLayer layer = std::move(GradedLayer::Create({H, D, g, DemotionMode::kOnce})).value();
    const int64_t T = 64 * (3 + rng.Below(20)) + rng.Below(64);
    std::vector<uint16_t> k(H * D), v(H * D);
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < H * D; ++i) {
        k[i] = F32ToBf16(static_cast<float>(rng.Normal()));
        v[i] = F32ToBf16(static_cast<float>(rng.Normal()));
      }
      layer.Append(k.data(), v.data());
    }
    int64_t expect_bits = 0;
    const int64_t nb = layer.n_blocks();
    for (int h = 0; h < H; ++h) {
      std::array<int64_t, kNumLevels> hist{};
      for (int64_t b = 0; b < nb; ++b) {
        int level = 16;
        if (layer.closed(b)) level = kLevels[rng.Below(kNumLevels)];
        if (level != 16) {
          ASSERT_TRUE(layer.Demote(h, b, level).ok());
        }
        ++hist[LevelIndex(level)];
      }
      const int n_res = static_cast<int>(rng.Below(10));
      for (int r = 0; r < n_res; ++r) {
        const int64_t p = static_cast<int64_t>(rng.Below(T));
        if (!layer.has_residual(h, p)) {
          ASSERT_TRUE(layer.AddResidual(h, p, k.data(), v.data()).ok());
        }
      }
      EXPECT_EQ(layer.level_histogram(h), hist);
      int64_t beta = 0;
      for (int i = 0; i < kNumLevels; ++i) beta += hist[i] * LevelBlockBits(kLevels[i], D, g);
      expect_bits += beta + 32 * D * layer.n_residual(h) + 32 * D * nb;
      EXPECT_EQ(8 * layer.resident_bytes(h).total(),
                ResidentBitsClosedForm(hist, layer.n_residual(h), D, g));
    }
    EXPECT_EQ(8 * layer.resident_bytes().total(), expect_bits);
    EXPECT_EQ(ResidentBitsClosedForm(layer), expect_bits);
    EXPECT_DOUBLE_EQ(ResidentBitsPerValue(layer),
                     static_cast<double>(expect_bits) / (2.0 * T * D * H));
    layer.Compact();
    EXPECT_EQ(layer.allocated_bytes(), layer.resident_bytes().total());

    // Read bits of a selection: the kernel's touched bytes + every box = the closed form.
    const PackedHeadView view = layer.view(0);
    std::vector<int64_t> sel;
    std::array<int64_t, kNumLevels> read_hist{};
    int64_t read_res = 0;
    for (int64_t b = 0; b < nb; ++b) {
      if (rng.Below(3) == 0 || b == nb - 1) {
        sel.push_back(b);
        ++read_hist[LevelIndex(view.level[b])];
        if (view.res_mask) read_res += std::popcount(view.res_mask[b]);
      }
    }
    EXPECT_EQ(8 * PackedReadBytes(view, sel.data(), sel.size()) + 32 * D * nb,
              ReadBitsClosedForm(read_hist, read_res, nb, D, g));
  }
}

}  // namespace
}  // namespace strata::geodesia
