// Tests of the Geodesia-KV packed attention kernel against a float64 reference.
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/packed_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/packed_attention_testing.h"
#include "kernels/test_util.h"

namespace strata::geodesia {
namespace {

// A layer of n random tokens whose closed blocks are demoted to random levels (all five levels
// present when there are enough blocks) with a few exact residual tokens.
GradedLayer RandomLayer(Rng& rng, int H, int D, int g, int64_t n, int n_residual,
                        DemotionMode mode = DemotionMode::kCascade) {
  GradedLayer layer = std::move(GradedLayer::Create({H, D, g, mode})).value();
  std::vector<uint16_t> k(H * D), v(H * D);
  std::vector<std::vector<uint16_t>> ek(H), evv(H);
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < H * D; ++i) {
      k[i] = F32ToBf16(static_cast<float>(rng.Normal() + 0.3 * ((i % D) % 5)));
      v[i] = F32ToBf16(static_cast<float>(rng.Normal()));
    }
    for (int h = 0; h < H; ++h) {
      ek[h].insert(ek[h].end(), k.begin() + h * D, k.begin() + (h + 1) * D);
      evv[h].insert(evv[h].end(), v.begin() + h * D, v.begin() + (h + 1) * D);
    }
    layer.Append(k.data(), v.data());
  }
  for (int h = 0; h < H; ++h) {
    for (int64_t b = 0; b < layer.n_closed_blocks(); ++b) {
      const int level = kLevels[(b + h + rng.Below(2)) % kNumLevels];
      if (level != 16) {
        EXPECT_TRUE(layer.Demote(h, b, level).ok());
      }
    }
    for (int r = 0; r < n_residual; ++r) {
      const int64_t p = static_cast<int64_t>(rng.Below(n));
      if (!layer.has_residual(h, p)) {
        EXPECT_TRUE(layer.AddResidual(h, p, ek[h].data() + p * D, evv[h].data() + p * D).ok());
      }
    }
  }
  return layer;
}

double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max<double>(num, std::fabs(a[i] - b[i]));
    den = std::max<double>(den, std::fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

using packed_testing::Finalize;
using packed_testing::RelErr;

// §12.22: all five levels, G >= 4 distinct queries, a partial last block (valid = 17),
// residual overlay, with and without a selection list; every split count; SIMD and scalar.
TEST(GeodesiaPacked, MatchesFloat64ReferenceAtAnySplit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool pool(3);
  struct Shape { int D, g, G; };
  // g = 8 is narrower than an AVX-512 vector: it exercises the 32-row tile path; g = 64 with
  // D = 64, 128 the span-order 2- and 4-bit codes; g = 32, 16 the channel-order unpacking.
  const Shape shapes[] = {{128, 64, 4}, {64, 32, 5}, {96, 16, 4}, {128, 32, 8}, {32, 32, 1},
                          {64, 8, 3},   {64, 64, 7}, {192, 64, 2}};
  ForEachSimdTarget([&] {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "D " << sh.D << " g " << sh.g << " G " << sh.G);
      const int64_t n = 64 * (5 + rng.Below(8)) + 17;
      GradedLayer layer = RandomLayer(rng, 2, sh.D, sh.g, n, 12);
      const int h = static_cast<int>(rng.Below(2));
      const PackedHeadView view = layer.view(h);
      std::vector<float> q(sh.G * sh.D);
      for (auto& x : q) x = static_cast<float>(2.0 * rng.Normal());
      const float scale = 1.f / std::sqrt(static_cast<float>(sh.D));
      // Selection: all blocks (null) and a random subset in random order.
      std::vector<int64_t> sel(view.n_blocks);
      std::iota(sel.begin(), sel.end(), 0);
      for (int64_t i = sel.size() - 1; i > 0; --i) std::swap(sel[i], sel[rng.Below(i + 1)]);
      sel.resize(std::max<size_t>(1, sel.size() / 2));
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t* list = pass == 0 ? nullptr : sel.data();
        const int64_t n_list = pass == 0 ? view.n_blocks : static_cast<int64_t>(sel.size());
        std::vector<double> ref(sh.G * sh.D);
        PackedAttendRef(view, q.data(), sh.G, scale, list, n_list, ref.data());
        SoftmaxStateBuffer scalar(sh.G, sh.D);
        PackedAttendScalar(view, q.data(), sh.G, scale, list, n_list, &scalar.states());
        // Tolerance 1e-4 relative (§12.22): f32 dot products of length D and f32 online
        // softmax; observed errors are ~1e-6.
        EXPECT_LE(RelErr(Finalize(scalar), ref), 1e-4) << "scalar pass " << pass;
        std::vector<float> one;
        for (int splits = 1; splits <= 8; ++splits) {
          SoftmaxStateBuffer st(sh.G, sh.D), st_seq(sh.G, sh.D);
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, &pool,
                            &st.states());
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, nullptr,
                            &st_seq.states());
          const std::vector<float> out = Finalize(st), out_seq = Finalize(st_seq);
          EXPECT_EQ(out, out_seq) << "pool changed the result at " << splits << " splits";
          EXPECT_LE(RelErr(out, ref), 1e-4) << "splits " << splits << " pass " << pass;
          if (splits == 1) one = out;
          // Split invariance within 1e-6 relative: only the merge order's f32 rounding differs.
          EXPECT_LE(RelDiff(out, one), 1e-6) << "splits " << splits << " pass " << pass;
        }
      }
    }
  });
}

// §12.7: a centroid block is one key of log-multiplicity ln(n): the same as attending
// n copies of the centroid key/value (n = valid tokens not overridden).
TEST(GeodesiaPacked, CentroidEqualsCopies) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 64, G = 4;
  GradedLayer layer = std::move(GradedLayer::Create({1, D, 64, DemotionMode::kOnce})).value();
  std::vector<uint16_t> k(D), v(D);
  for (int t = 0; t < 64 * 3 + 30; ++t) {
    for (int c = 0; c < D; ++c) {
      k[c] = F32ToBf16(static_cast<float>(rng.Normal()));
      v[c] = F32ToBf16(static_cast<float>(rng.Normal()));
    }
    layer.Append(k.data(), v.data());
    if (t == 64 + 5 || t == 64 + 40) {
      ASSERT_TRUE(layer.AddResidual(0, t, k.data(), v.data()).ok());
    }
  }
  ASSERT_TRUE(layer.Demote(0, 0, 1).ok());
  ASSERT_TRUE(layer.Demote(0, 1, 1).ok());
  const PackedHeadView view = layer.view(0);
  std::vector<float> q(G * D);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  const float scale = 0.125f;
  std::vector<double> kc(64 * D), vc(64 * D), kb(64 * D), vb(64 * D);
  ForEachSimdTarget([&] {
    for (int64_t b : {0, 1}) {
      // f64: n copies of the centroid (plus block 1's two exact residual tokens) and block 2.
      layer.Reconstruct(0, b, kc.data(), vc.data());
      layer.Reconstruct(0, 2, kb.data(), vb.data());
      const int n = b == 0 ? 64 : 62;
      std::vector<std::pair<const double*, const double*>> rows;
      for (int i = 0; i < n; ++i) rows.emplace_back(kc.data(), vc.data());
      for (int t = 0; t < 64; ++t) rows.emplace_back(kb.data() + t * D, vb.data() + t * D);
      std::vector<double> rk, rv;
      if (b == 1) {
        for (int r = 0; r < 2; ++r) {
          for (int c = 0; c < D; ++c) {
            rk.push_back(Bf16ToF32(view.res_k[r * D + c]));
            rv.push_back(Bf16ToF32(view.res_v[r * D + c]));
          }
        }
        rows.emplace_back(rk.data(), rv.data());
        rows.emplace_back(rk.data() + D, rv.data() + D);
      }
      std::vector<double> ref(G * D, 0.0);
      for (int h = 0; h < G; ++h) {
        std::vector<double> s(rows.size());
        double m = -1e300, den = 0;
        for (size_t r = 0; r < rows.size(); ++r) {
          double a = 0;
          for (int c = 0; c < D; ++c) a += static_cast<double>(q[h * D + c]) * rows[r].first[c];
          s[r] = a * scale;
          m = std::max(m, s[r]);
        }
        for (size_t r = 0; r < rows.size(); ++r) {
          const double p = std::exp(s[r] - m);
          den += p;
          for (int c = 0; c < D; ++c) ref[h * D + c] += p * rows[r].second[c];
        }
        for (int c = 0; c < D; ++c) ref[h * D + c] /= den;
      }
      const int64_t list[2] = {b, 2};
      SoftmaxStateBuffer st(G, D), sc(G, D);
      PackedAttend(view, q.data(), G, scale, list, 2, &st.states());
      PackedAttendScalar(view, q.data(), G, scale, list, 2, &sc.states());
      // 1e-6 relative (§12.7): only f32 rounding of 128 dot products separates them.
      EXPECT_LE(RelErr(Finalize(st), ref), 1e-6) << "block " << b;
      EXPECT_LE(RelErr(Finalize(sc), ref), 1e-6) << "block " << b;
    }
  });
}

// §12.13: all query heads of a group read one representation, so a head's result does not
// depend on the other heads read with it nor on their order.
TEST(GeodesiaPacked, GqaHeadsShareOneReconstruction) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 128, G = 6;
  GradedLayer layer = RandomLayer(rng, 1, D, 64, 64 * 12 + 33, 10);
  const PackedHeadView view = layer.view(0);
  std::vector<float> q(G * D);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  ForEachSimdTarget([&] {
    SoftmaxStateBuffer all(G, D);
    PackedAttend(view, q.data(), G, 0.09f, nullptr, view.n_blocks, &all.states());
    const std::vector<float> out = Finalize(all);
    std::vector<int> perm(G);
    std::iota(perm.begin(), perm.end(), 0);
    std::reverse(perm.begin(), perm.end());
    std::vector<float> qp(G * D);
    for (int i = 0; i < G; ++i) std::copy_n(q.data() + perm[i] * D, D, qp.data() + i * D);
    SoftmaxStateBuffer pst(G, D);
    PackedAttend(view, qp.data(), G, 0.09f, nullptr, view.n_blocks, &pst.states());
    const std::vector<float> pout = Finalize(pst);
    for (int i = 0; i < G; ++i) {
      for (int c = 0; c < D; ++c) {
        ASSERT_EQ(pout[i * D + c], out[perm[i] * D + c]) << "head " << perm[i];
      }
    }
    // One head alone: the same values up to the f32 rounding of the score tile shape.
    for (int h = 0; h < G; ++h) {
      SoftmaxStateBuffer one(1, D);
      PackedAttend(view, q.data() + h * D, 1, 0.09f, nullptr, view.n_blocks, &one.states());
      const std::vector<float> o1 = Finalize(one);
      for (int c = 0; c < D; ++c) ASSERT_NEAR(o1[c], out[h * D + c], 1e-5) << "head " << h;
    }
  });
}

// PackedBlockIO: a head with sel = 0 for a block reads exactly what a list without that block
// gives it; the recorded per-block states equal a read of that block alone.
TEST(GeodesiaPacked, BlockSelectionAndPerBlockStates) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (const int g : {64, 8}) {
      const int D = 64, G = 4;
      GradedLayer layer = RandomLayer(rng, 1, D, g, 64 * 9 + 21, 8);
      packed_testing::ExpectHeadSelectionAndBlockStates(layer.view(0), G, rng,
                                                 "graded layer g " + std::to_string(g));
    }
  });
}

TEST(GeodesiaPacked, EmptyAndFullyOverriddenBlocks) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 32, G = 2;
  GradedLayer layer = std::move(GradedLayer::Create({1, D, 32, DemotionMode::kOnce})).value();
  std::vector<uint16_t> k(D), v(D);
  for (int t = 0; t < 128; ++t) {
    for (int c = 0; c < D; ++c) {
      k[c] = F32ToBf16(static_cast<float>(rng.Normal()));
      v[c] = F32ToBf16(static_cast<float>(rng.Normal()));
    }
    layer.Append(k.data(), v.data());
    if (t < 64) {
      ASSERT_TRUE(layer.AddResidual(0, t, k.data(), v.data()).ok());
    }
  }
  ASSERT_TRUE(layer.Demote(0, 0, 1).ok());  // every token overridden: the centroid weighs 0
  const PackedHeadView view = layer.view(0);
  std::vector<float> q(G * D);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  SoftmaxStateBuffer st(G, D);
  PackedAttend(view, q.data(), G, 0.2f, nullptr, 0, &st.states());
  EXPECT_EQ(st.states().d[0], 0.f);
  const int64_t list[1] = {0};
  PackedAttend(view, q.data(), G, 0.2f, list, 1, &st.states());
  std::vector<double> ref(G * D);
  PackedAttendRef(view, q.data(), G, 0.2f, list, 1, ref.data());
  EXPECT_LE(RelErr(Finalize(st), ref), 1e-5);
  // The reference over block 0 is exactly attention over the 64 exact residual rows.
  KvStreamView kv{view.res_k, view.res_v, D, D, D, D};
  std::vector<double> exact(G * D);
  AttendStreamRef(q.data(), G, 0.2f, kv, nullptr, 64, exact.data());
  for (int i = 0; i < G * D; ++i) EXPECT_NEAR(ref[i], exact[i], 1e-12);
}

}  // namespace
}  // namespace strata::geodesia
