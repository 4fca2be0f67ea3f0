// Tests of the Geodesia-KV graded block storage.
#include "kv/geodesia/blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kv/geodesia/quant.h"

namespace strata::geodesia {
namespace {

// A layer filled with n random tokens; the exact bf16 rows are kept in k[h], v[h] ([n, D]).
struct Filled {
  GradedLayer layer;
  std::vector<std::vector<uint16_t>> k, v;
};

Filled Fill(Rng& rng, int H, int D, int g, int64_t n, DemotionMode mode = DemotionMode::kOnce,
            double kscale = 1.0) {
  GradedConfig c;
  c.n_kv_heads = H;
  c.head_dim = D;
  c.group_size = g;
  c.demotion = mode;
  Filled f{std::move(GradedLayer::Create(c)).value(), std::vector<std::vector<uint16_t>>(H),
           std::vector<std::vector<uint16_t>>(H)};
  std::vector<uint16_t> kt(H * D), vt(H * D);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        // Per-channel offsets, like real keys (outlier channels).
        kt[h * D + d] = F32ToBf16(static_cast<float>(kscale * (rng.Normal() + 0.1 * (d % 7))));
        vt[h * D + d] = F32ToBf16(static_cast<float>(rng.Normal()));
      }
      f.k[h].insert(f.k[h].end(), kt.begin() + h * D, kt.begin() + (h + 1) * D);
      f.v[h].insert(f.v[h].end(), vt.begin() + h * D, vt.begin() + (h + 1) * D);
    }
    f.layer.Append(kt.data(), vt.data());
  }
  return f;
}

TEST(GeodesiaBlocks, ConfigErrorsNameTheValue) {
  GradedConfig c{2, 128, 48, DemotionMode::kOnce};
  auto r = GradedLayer::Create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("48"), std::string::npos) << r.status().ToString();
  c.group_size = 64;
  c.head_dim = 96;
  r = GradedLayer::Create(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("96"), std::string::npos) << r.status().ToString();
  c.head_dim = 128;
  c.group_size = 128;
  EXPECT_FALSE(GradedLayer::Create(c).ok());
  c.group_size = 32;
  EXPECT_TRUE(GradedLayer::Create(c).ok());
  c.n_kv_heads = 0;
  EXPECT_FALSE(GradedLayer::Create(c).ok());
}

TEST(GeodesiaBlocks, ExactBlocksAreBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int H = 2, D = 64;
  const int64_t n = 64 * 3 + 17;
  Filled f = Fill(rng, H, D, 32, n);
  EXPECT_EQ(f.layer.n_blocks(), 4);
  EXPECT_EQ(f.layer.n_closed_blocks(), 3);
  EXPECT_EQ(f.layer.n_valid(3), 17);
  std::vector<double> k(64 * D), v(64 * D);
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < 4; ++b) {
      EXPECT_EQ(f.layer.level(h, b), 16);
      f.layer.Reconstruct(h, b, k.data(), v.data());
      const int nv = f.layer.n_valid(b);
      for (int i = 0; i < nv * D; ++i) {
        ASSERT_EQ(k[i], Bf16ToF32(f.k[h][b * 64 * D + i]));
        ASSERT_EQ(v[i], Bf16ToF32(f.v[h][b * 64 * D + i]));
      }
      // The slot holds the bf16 bits verbatim.
      EXPECT_EQ(std::memcmp(f.layer.slot(h, b), f.k[h].data() + b * 64 * D, nv * D * 2), 0);
    }
  }
}

// Stored lo/step of a quantized block equal the quantizer's on the reference groups: keys per
// (time group, channel), values per (token, channel group); the reconstruction error is within
// the stated bound.
TEST(GeodesiaBlocks, QuantizedGroupsAndError) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int g : {64, 32, 16}) {
    for (int bits : {8, 4, 2}) {
      const int D = 64;
      Filled f = Fill(rng, 1, D, g, 64 * 2);
      ASSERT_TRUE(f.layer.Demote(0, 1, bits).ok());
      const SlotLayout L = GetSlotLayout(bits, D, g);
      const uint8_t* slot = f.layer.slot(0, 1);
      const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
      const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
      const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
      const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
      const uint16_t* ek = f.k[0].data() + 64 * D;
      const uint16_t* ev = f.v[0].data() + 64 * D;
      std::vector<double> k(64 * D), v(64 * D);
      f.layer.Reconstruct(0, 1, k.data(), v.data());
      auto bound = [&](QuantParams p, float lo, float hi) {
        const double lo16 = F16ToF32(p.lo), s16 = F16ToF32(p.step);
        const double s32 = (static_cast<double>(hi) - lo) / ((1 << bits) - 1);
        return s16 / 2 + std::fabs(lo - lo16) + ((1 << bits) - 1) * std::fabs(s32 - s16) +
               std::ldexp(std::max(std::fabs(lo), std::fabs(hi)), -21);
      };
      for (int tg = 0; tg < 64 / g; ++tg) {
        for (int c = 0; c < D; ++c) {
          float lo = 1e30f, hi = -1e30f;
          for (int t = tg * g; t < (tg + 1) * g; ++t) {
            lo = std::min(lo, Bf16ToF32(ek[t * D + c]));
            hi = std::max(hi, Bf16ToF32(ek[t * D + c]));
          }
          const QuantParams p = MakeQuantParams(lo, hi, bits);
          ASSERT_EQ(klo[tg * D + c], p.lo);
          ASSERT_EQ(kst[tg * D + c], p.step);
          for (int t = tg * g; t < (tg + 1) * g; ++t) {
            ASSERT_LE(std::fabs(k[t * D + c] - Bf16ToF32(ek[t * D + c])), bound(p, lo, hi));
          }
        }
      }
      for (int t = 0; t < 64; ++t) {
        for (int cg = 0; cg < D / g; ++cg) {
          float lo = 1e30f, hi = -1e30f;
          for (int c = cg * g; c < (cg + 1) * g; ++c) {
            lo = std::min(lo, Bf16ToF32(ev[t * D + c]));
            hi = std::max(hi, Bf16ToF32(ev[t * D + c]));
          }
          const QuantParams p = MakeQuantParams(lo, hi, bits);
          ASSERT_EQ(vlo[t * (D / g) + cg], p.lo);
          ASSERT_EQ(vst[t * (D / g) + cg], p.step);
          for (int c = cg * g; c < (cg + 1) * g; ++c) {
            ASSERT_LE(std::fabs(v[t * D + c] - Bf16ToF32(ev[t * D + c])), bound(p, lo, hi));
          }
        }
      }
      // Codes are token-major and LSB-first: re-quantizing element (t, c) gives the code at
      // index t * D + c of the unpacked stream.
      std::vector<uint8_t> codes(64 * D);
      UnpackCodes(slot + L.k_codes, 64 * D, bits, codes.data());
      for (int t = 0; t < 64; t += 7) {
        for (int c = 0; c < D; c += 5) {
          QuantParams p{klo[(t / g) * D + c], kst[(t / g) * D + c]};
          ASSERT_EQ(codes[t * D + c], QuantizeValue(Bf16ToF32(ek[t * D + c]), p, bits));
        }
      }
    }
  }
}

TEST(GeodesiaBlocks, ConstantBlockNoNaN) {
  GradedLayer layer = std::move(GradedLayer::Create({1, 32, 32, DemotionMode::kCascade})).value();
  std::vector<uint16_t> k(32, F32ToBf16(1.25f)), v(32, F32ToBf16(-0.5f));
  for (int t = 0; t < 64 * 4; ++t) layer.Append(k.data(), v.data());
  const int levels[4] = {8, 4, 2, 1};
  std::vector<double> rk(64 * 32), rv(64 * 32);
  for (int b = 0; b < 4; ++b) {
    ASSERT_TRUE(layer.Demote(0, b, levels[b]).ok());
    layer.Reconstruct(0, b, rk.data(), rv.data());
    for (int i = 0; i < 64 * 32; ++i) {
      ASSERT_EQ(rk[i], 1.25) << "level " << levels[b];
      ASSERT_EQ(rv[i], -0.5) << "level " << levels[b];
    }
    EXPECT_EQ(layer.ek(0, b), 0.0);
  }
}

TEST(GeodesiaBlocks, CentroidIsF16Mean) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 32;
  Filled f = Fill(rng, 1, D, 32, 65);
  ASSERT_TRUE(f.layer.Demote(0, 0, 1).ok());
  std::vector<double> k(64 * D), v(64 * D);
  f.layer.Reconstruct(0, 0, k.data(), v.data());
  for (int c = 0; c < D; ++c) {
    double sk = 0, sv = 0;
    for (int t = 0; t < 64; ++t) {
      sk += Bf16ToF32(f.k[0][t * D + c]);
      sv += Bf16ToF32(f.v[0][t * D + c]);
    }
    for (int t = 0; t < 64; ++t) {
      ASSERT_EQ(k[t * D + c], F16ToF32(F32ToF16(static_cast<float>(sk / 64))));
      ASSERT_EQ(v[t * D + c], F16ToF32(F32ToF16(static_cast<float>(sv / 64))));
    }
  }
}

TEST(GeodesiaBlocks, BoxIsSoundAndNeverChanges) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int H = 2, D = 64;
  Filled f = Fill(rng, H, D, 64, 64 * 6 + 5, DemotionMode::kCascade, 3.0);
  const float scale = 1.f / 8.f;
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < 6; ++b) {
      std::vector<uint16_t> before(f.layer.box_min(h, b), f.layer.box_min(h, b) + 2 * D);
      for (int c = 0; c < D; ++c) {
        float lo = 1e30f, hi = -1e30f;
        for (int t = 0; t < 64; ++t) {
          lo = std::min(lo, Bf16ToF32(f.k[h][(b * 64 + t) * D + c]));
          hi = std::max(hi, Bf16ToF32(f.k[h][(b * 64 + t) * D + c]));
        }
        ASSERT_EQ(f.layer.box_min(h, b)[c], F16RoundDown(lo));
        ASSERT_EQ(f.layer.box_max(h, b)[c], F16RoundUp(hi));
      }
      // Demote through every level: the box stays.
      for (int level : {8, 4, 2, 1}) {
        if (level < f.layer.level(h, b) && ((b + level) % 3 != 0 || level == 1)) {
          ASSERT_TRUE(f.layer.Demote(h, b, level).ok());
        }
        ASSERT_EQ(std::memcmp(before.data(), f.layer.box_min(h, b), 4 * D), 0);
      }
      std::vector<float> q(D);
      for (int trial = 0; trial < 1000; ++trial) {
        const double qs = std::exp(rng.Normal());
        for (auto& x : q) x = static_cast<float>(qs * rng.Normal());
        const double u = BoxUpperBound(f.layer.box_min(h, b), f.layer.box_max(h, b), q.data(), D,
                                       scale);
        double best = -1e300;
        for (int t = 0; t < 64; ++t) {
          double s = 0;
          for (int c = 0; c < D; ++c) s += static_cast<double>(q[c]) * Bf16ToF32(f.k[h][(b * 64 + t) * D + c]);
          best = std::max(best, s * scale);
        }
        ASSERT_GE(u, best) << "head " << h << " block " << b;
      }
    }
  }
}

TEST(GeodesiaBlocks, DemotionModesAndErrors) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 32;
  Filled once = Fill(rng, 1, D, 32, 64 * 3 + 1, DemotionMode::kOnce);
  EXPECT_FALSE(once.layer.Demote(0, 3, 8).ok());   // open block
  EXPECT_FALSE(once.layer.Demote(0, 0, 3).ok());   // not a level
  EXPECT_FALSE(once.layer.Demote(0, 0, 16).ok());  // not lower
  EXPECT_FALSE(once.layer.Demote(1, 0, 8).ok());   // no such head
  ASSERT_TRUE(once.layer.Demote(0, 0, 4).ok());
  const Status st = once.layer.Demote(0, 0, 2);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("once"), std::string::npos) << st.ToString();
  EXPECT_FALSE(once.layer.Demote(0, 0, 8).ok());

  Filled cas = Fill(rng, 1, D, 32, 64 * 3, DemotionMode::kCascade);
  std::vector<double> k(64 * D), v(64 * D);
  for (int level : {8, 4, 2, 1}) {
    ASSERT_TRUE(cas.layer.Demote(0, 1, level).ok());
    // ek/ev bound the distance of the current reconstruction from the exact rows.
    cas.layer.Reconstruct(0, 1, k.data(), v.data());
    double wk = 0, wv = 0;
    for (int t = 0; t < 64; ++t) {
      double sk = 0, sv = 0;
      for (int c = 0; c < D; ++c) {
        const double dk = k[t * D + c] - Bf16ToF32(cas.k[0][(64 + t) * D + c]);
        const double dv = v[t * D + c] - Bf16ToF32(cas.v[0][(64 + t) * D + c]);
        sk += dk * dk;
        sv += dv * dv;
      }
      wk = std::max(wk, std::sqrt(sk));
      wv = std::max(wv, std::sqrt(sv));
    }
    EXPECT_GE(cas.layer.ek(0, 1) * (1 + 1e-12), wk) << "level " << level;
    EXPECT_GE(cas.layer.ev(0, 1) * (1 + 1e-12), wv) << "level " << level;
    EXPECT_GT(cas.layer.ek(0, 1), 0.0);
  }
  EXPECT_EQ(cas.layer.ek(0, 0), 0.0);
}

TEST(GeodesiaBlocks, DemotionFreesBytes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int H = 4, D = 128;
  Filled f = Fill(rng, H, D, 64, 64 * 40 + 9);
  f.layer.Compact();
  const int64_t res0 = f.layer.resident_bytes().total();
  const int64_t alloc0 = f.layer.allocated_bytes();
  EXPECT_EQ(alloc0, res0);
  int64_t expect = res0;
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < 40; ++b) {
      const int level = kLevels[1 + (b + h) % 4];
      const int64_t before = f.layer.resident_bytes().total();
      ASSERT_TRUE(f.layer.Demote(h, b, level).ok());
      EXPECT_EQ(before - f.layer.resident_bytes().total(),
                SlotBytes(16, D, 64) - SlotBytes(level, D, 64));
      expect -= SlotBytes(16, D, 64) - SlotBytes(level, D, 64);
      // Slabs compact themselves once a quarter is free: allocated stays within 4/3 x live + the
      // growth slack of the other slabs.
    }
  }
  EXPECT_EQ(f.layer.resident_bytes().total(), expect);
  EXPECT_LT(f.layer.allocated_bytes(), alloc0 / 2);
  f.layer.Compact();
  EXPECT_EQ(f.layer.allocated_bytes(), f.layer.resident_bytes().total());
  // Demoted blocks still decode after compaction moved them.
  std::vector<double> k(64 * D), v(64 * D);
  f.layer.Reconstruct(2, 7, k.data(), v.data());
  EXPECT_TRUE(std::isfinite(k[0]));
}

// Slabs are segmented (blocks.h): a slot in a full segment never moves when its slab grows (at
// most the last, partial segment of a slab is reallocated), so growth leaves under one segment of
// slack where a doubling slab left up to its whole size; random cascaded demotions, with the
// automatic compactions that move slots between segments, a final Compact() and growth after it
// keep every block's contents; after Compact() allocated == resident. Without boxes the layer
// stores and charges none and decodes exactly as with them.
TEST(GeodesiaBlocks, SegmentedSlabsStableAcrossGrowthDemotionAndCompaction) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const int H = 3, D = 64, g = 32;
  const int64_t seg16 = kSegmentBytes / SlotBytes(16, D, g);  // level-16 slots per segment
  ASSERT_GT(seg16, 1);
  std::vector<std::vector<double>> final_with_boxes;
  for (const bool boxes : {true, false}) {
    SCOPED_TRACE(boxes ? "boxes" : "no boxes");
    Rng rng(seed);  // the same rows and demotions in both variants
    GradedConfig c{H, D, g, DemotionMode::kCascade, boxes};
    GradedLayer layer = std::move(GradedLayer::Create(c)).value();
    EXPECT_EQ(layer.has_boxes(), boxes);
    std::vector<uint16_t> kt(H * D), vt(H * D);
    auto append = [&](int64_t n) {
      for (int64_t t = 0; t < n; ++t) {
        for (auto& x : kt) x = F32ToBf16(static_cast<float>(rng.Normal()));
        for (auto& x : vt) x = F32ToBf16(static_cast<float>(rng.Normal()));
        layer.Append(kt.data(), vt.data());
      }
    };
    // snap[h * nb + b]: the block's decoded K and V ([2, 64, D] f64).
    std::vector<std::vector<double>> snap;
    auto decode = [&](int h, int64_t b) {
      std::vector<double> kv(2 * 64 * D);
      layer.Reconstruct(h, b, kv.data(), kv.data() + 64 * D);
      return kv;
    };
    auto snapshot_all = [&]() {
      snap.clear();
      for (int h = 0; h < H; ++h) {
        for (int64_t b = 0; b < layer.n_blocks(); ++b) snap.push_back(decode(h, b));
      }
    };
    auto expect_all = [&](const std::string& where) {
      const int64_t nb = layer.n_blocks();
      ASSERT_EQ(static_cast<int64_t>(snap.size()), H * nb);
      for (int h = 0; h < H; ++h) {
        for (int64_t b = 0; b < nb; ++b) {
          ASSERT_EQ(decode(h, b), snap[h * nb + b]) << where << ": head " << h << " block " << b;
        }
      }
    };
    // Growth: 70 blocks, then 60 more; only slots of the last level-16 segment may move.
    append(64 * 70);
    std::vector<const uint8_t*> ptr;
    for (int h = 0; h < H; ++h) {
      for (int64_t b = 0; b < 70; ++b) ptr.push_back(layer.slot(h, b));
    }
    append(64 * 60 + 9);
    int64_t moved = 0;
    for (int h = 0; h < H; ++h) {
      for (int64_t b = 0; b < 70; ++b) moved += layer.slot(h, b) != ptr[h * 70 + b];
    }
    EXPECT_LE(moved, seg16);
    const ResidentBytes r0 = layer.resident_bytes();
    EXPECT_EQ(r0.boxes, boxes ? layer.n_blocks() * H * 2 * D * 2 : 0);
    // No slot is free yet: the slack is the unused part of the last level-16 segment (plus the
    // box vectors' capacity).
    EXPECT_LE(layer.allocated_bytes() - r0.total(), kSegmentBytes + r0.boxes);
    snapshot_all();
    // Random demotions of closed blocks (cascade: any level below the current one).
    const int64_t nb = layer.n_blocks();
    for (int it = 0; it < 600; ++it) {
      const int h = static_cast<int>(rng.Below(H));
      const int64_t b = static_cast<int64_t>(rng.Below(layer.n_closed_blocks()));
      const int cur = LevelIndex(layer.level(h, b));
      if (cur == kNumLevels - 1) continue;
      const int to = kLevels[cur + 1 + static_cast<int>(rng.Below(kNumLevels - 1 - cur))];
      ASSERT_TRUE(layer.Demote(h, b, to).ok());
      snap[h * nb + b] = decode(h, b);
      if (it % 100 == 99) {
        expect_all("demotion " + std::to_string(it));
        // Automatic compaction keeps every slab at most a quarter free (+ one partial segment
        // each; the box vectors' capacity on top).
        const ResidentBytes r = layer.resident_bytes();
        const int64_t live_slabs = r.payload + r.scales;
        EXPECT_LE(layer.allocated_bytes() - r.boxes - r.residual,
                  live_slabs * 4 / 3 + kNumLevels * kSegmentBytes + r.boxes);
      }
    }
    expect_all("before Compact");
    layer.Compact();
    EXPECT_EQ(layer.allocated_bytes(), layer.resident_bytes().total());
    expect_all("after Compact");
    // Growth after a compaction shrank the last segments.
    append(64 * 40);
    for (int it = 0; it < 50; ++it) {
      const int h = static_cast<int>(rng.Below(H));
      const int64_t b = nb + static_cast<int64_t>(rng.Below(layer.n_closed_blocks() - nb));
      if (layer.level(h, b) == 16) {
        ASSERT_TRUE(layer.Demote(h, b, 2).ok());
      }
    }
    const int64_t nb2 = layer.n_blocks();
    std::vector<std::vector<double>> all;
    for (int h = 0; h < H; ++h) {
      for (int64_t b = 0; b < nb2; ++b) {
        if (b < nb - 1) {  // block nb - 1 was open (9 tokens) and has been filled since
          ASSERT_EQ(decode(h, b), snap[h * nb + b]) << "after regrowth: head " << h << " block "
                                                    << b;
        }
        all.push_back(decode(h, b));
      }
    }
    layer.Compact();
    EXPECT_EQ(layer.allocated_bytes(), layer.resident_bytes().total());
    if (boxes) {
      final_with_boxes = std::move(all);
    } else {
      EXPECT_EQ(all, final_with_boxes);  // boxes change no stored block
    }
  }
}

TEST(GeodesiaBlocks, ResidualOverlayTables) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int H = 2, D = 32;
  Filled f = Fill(rng, H, D, 32, 64 * 5 + 3);
  EXPECT_FALSE(f.layer.AddResidual(0, -1, f.k[0].data(), f.v[0].data()).ok());
  EXPECT_FALSE(f.layer.AddResidual(0, 64 * 5 + 3, f.k[0].data(), f.v[0].data()).ok());
  std::vector<int64_t> pos = {200, 3, 64, 65, 127, 320, 0, 250};
  for (int64_t p : pos) {
    ASSERT_TRUE(f.layer.AddResidual(1, p, f.k[1].data() + p * D, f.v[1].data() + p * D).ok());
  }
  EXPECT_FALSE(f.layer.AddResidual(1, 64, f.k[1].data(), f.v[1].data()).ok());
  EXPECT_EQ(f.layer.n_residual(1), 8);
  EXPECT_EQ(f.layer.n_residual(0), 0);
  const PackedHeadView v0 = f.layer.view(0), v1 = f.layer.view(1);
  EXPECT_EQ(v0.res_mask, nullptr);
  std::sort(pos.begin(), pos.end());
  for (size_t i = 0; i < pos.size(); ++i) {
    const int64_t b = pos[i] / 64;
    const int t = static_cast<int>(pos[i] % 64);
    ASSERT_TRUE((v1.res_mask[b] >> t) & 1);
    const int64_t row =
        v1.res_begin[b] + std::popcount(v1.res_mask[b] & ((uint64_t{1} << t) - 1));
    EXPECT_EQ(row, static_cast<int64_t>(i));
    EXPECT_EQ(std::memcmp(v1.res_k + row * D, f.k[1].data() + pos[i] * D, 2 * D), 0);
    EXPECT_EQ(std::memcmp(v1.res_v + row * D, f.v[1].data() + pos[i] * D, 2 * D), 0);
  }
  EXPECT_EQ(f.layer.resident_bytes(1).residual, 8 * 4 * D);
}

// A box edge beyond the f16 range is +-inf (outward rounding of a 1e6 key): the bound is +inf where
// q_c points at it, stays finite (not NaN from 0 * inf) where q_c = 0, and ignores an infinite
// edge on the side q_c points away from. Widths 20 and 3 cover the SIMD body and the scalar tail.
TEST(GeodesiaBoxBound, InfiniteEdges) {
  for (int D : {20, 3}) {
    SCOPED_TRACE(D);
    std::vector<uint16_t> kmin(D, F16RoundDown(-1.f)), kmax(D, F16RoundUp(1.f));
    kmax[1] = F16RoundUp(1e6f);    // +inf
    kmin[2] = F16RoundDown(-1e6f);  // -inf
    std::vector<float> q(D, 0.5f);
    q[1] = 0.f;
    const double finite = BoxUpperBound(kmin.data(), kmax.data(), q.data(), D, 0.25f);
    ASSERT_TRUE(std::isfinite(finite));
    EXPECT_DOUBLE_EQ(finite, 0.25 * 0.5 * (D - 1));
    q[1] = 1e-3f;
    EXPECT_EQ(BoxUpperBound(kmin.data(), kmax.data(), q.data(), D, 0.25f),
              std::numeric_limits<double>::infinity());
    q[1] = -0.25f;  // points away from +inf (its term is -0.25 * -1); channel 2 away from -inf
    EXPECT_DOUBLE_EQ(BoxUpperBound(kmin.data(), kmax.data(), q.data(), D, 0.25f),
                     0.25 * (0.5 * (D - 1) + 0.25));
  }
}

}  // namespace
}  // namespace strata::geodesia
