// Tests of the Geodesia packed format helpers: LSB-first bit packing and the slot layout.
#include "kernels/geodesia_format.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"

namespace strata::geodesia {
namespace {

TEST(GeodesiaFormat, PackLsbFirstExamples) {
  const uint8_t c2[4] = {1, 2, 3, 0};
  uint8_t out = 0;
  PackCodes(c2, 4, 2, &out);
  EXPECT_EQ(out, 0x39);
  const uint8_t c4[2] = {0xA, 0x3};
  PackCodes(c4, 2, 4, &out);
  EXPECT_EQ(out, 0x3A);
  const uint8_t c8[1] = {0xC7};
  PackCodes(c8, 1, 8, &out);
  EXPECT_EQ(out, 0xC7);
  uint8_t back[4];
  UnpackCodes(&out, 1, 8, back);
  EXPECT_EQ(back[0], 0xC7);
  const uint8_t b39 = 0x39;
  UnpackCodes(&b39, 4, 2, back);
  EXPECT_EQ(back[0], 1);
  EXPECT_EQ(back[1], 2);
  EXPECT_EQ(back[2], 3);
  EXPECT_EQ(back[3], 0);
}

TEST(GeodesiaFormat, PackUnpackIdentity) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int bits : {2, 4, 8}) {
    const int64_t n = 8 * (1 + static_cast<int64_t>(rng.Below(1000)));
    std::vector<uint8_t> c(n), p(PackedBytes(n, bits)), u(n);
    for (auto& x : c) x = static_cast<uint8_t>(rng.Below(1u << bits));
    PackCodes(c.data(), n, bits, p.data());
    UnpackCodes(p.data(), n, bits, u.data());
    EXPECT_EQ(c, u) << "bits " << bits;
    EXPECT_EQ(static_cast<int64_t>(p.size()), n * bits / 8);
  }
}

// Slots are the parts laid end to end: 256 D bytes at level 16, 4 D at level 1, and at level L
// two code arrays of 64 D L / 8 bytes plus four f16 scale arrays.
TEST(GeodesiaFormat, SlotLayoutSizes) {
  const int D = 128, g = 32;
  EXPECT_EQ(SlotBytes(16, D, g), 256 * D);
  EXPECT_EQ(SlotBytes(1, D, g), 4 * D);
  for (int level : {8, 4, 2}) {
    const SlotLayout L = GetSlotLayout(level, D, g);
    const int64_t codes = 64 * D * level / 8;
    EXPECT_EQ(L.k_codes, 0);
    EXPECT_EQ(L.v_codes, codes);
    EXPECT_EQ(L.k_lo, 2 * codes);
    EXPECT_EQ(L.scale_bytes, 2 * (64 / g) * D * 2 + 2 * 64 * (D / g) * 2);
    EXPECT_EQ(L.bytes, 2 * codes + L.scale_bytes);
  }
}

}  // namespace
}  // namespace strata::geodesia
