// Tests of the Geodesia packed attention kernel on views built here from random slot bytes (no
// encoder: any code bytes and f16 scales are a valid block): SIMD (every target) and the scalar
// f32 kernel against the float64 reference, split and pool invariance, the per-block states and
// head selection, and the read-byte count. kv/geodesia/packed_attention_test.cc runs the same
// kernel over blocks a GradedLayer encoded from real rows.
#include "kernels/packed_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/packed_attention_testing.h"
#include "kernels/quant_testing.h"
#include "kernels/test_util.h"

namespace strata::geodesia {
namespace {

// One KV head's tables and slabs (one segment per level), filled at random.
struct RandomHead {
  std::vector<int8_t> level;
  std::vector<int64_t> offset;
  std::vector<int32_t> n_valid;
  std::array<std::vector<uint8_t>, kNumLevels> slab;
  std::array<const uint8_t*, kNumLevels> seg_base = {};
  std::vector<uint64_t> res_mask;
  std::vector<int32_t> res_begin;
  std::vector<uint16_t> res_k, res_v;
  PackedHeadView view;
};

// n blocks of head dim D and group g: levels cycle through the ladder from a random start,
// the last block is partial (17 valid tokens), one block is empty, and a few tokens of every
// third block are overridden by exact residual rows.
void MakeRandomHead(Rng& rng, int D, int g, int64_t n, RandomHead* x) {
  x->level.resize(n);
  x->offset.resize(n);
  x->n_valid.resize(n);
  x->res_mask.assign(n, 0);
  x->res_begin.assign(n, 0);
  const int start = static_cast<int>(rng.Below(kNumLevels));
  std::array<int64_t, kNumLevels> used = {};
  for (int64_t b = 0; b < n; ++b) {
    const int level = kLevels[(start + b) % kNumLevels];
    const int li = LevelIndex(level);
    x->level[b] = static_cast<int8_t>(level);
    x->n_valid[b] = b == n - 1 ? 17 : (b == 1 ? 0 : kBlockTokens);
    x->offset[b] = used[li];
    used[li] += SlotBytes(level, D, g);
  }
  for (int li = 0; li < kNumLevels; ++li) x->slab[li].assign(std::max<int64_t>(used[li], 1), 0);
  for (int64_t b = 0; b < n; ++b) {
    const int level = x->level[b];
    uint8_t* slot = x->slab[LevelIndex(level)].data() + x->offset[b];
    const SlotLayout L = GetSlotLayout(level, D, g);
    auto put16 = [&](int64_t at, int64_t count, auto make) {
      uint16_t* p = reinterpret_cast<uint16_t*>(slot + at);
      for (int64_t i = 0; i < count; ++i) p[i] = make();
    };
    auto bf16 = [&] { return F32ToBf16(static_cast<float>(rng.Normal())); };
    auto f16 = [&] { return F32ToF16(static_cast<float>(rng.Normal())); };
    if (level == 16) {
      put16(L.k_rows, int64_t{kBlockTokens} * D, bf16);
      put16(L.v_rows, int64_t{kBlockTokens} * D, bf16);
    } else if (level == 1) {
      put16(L.k_rows, D, f16);
      put16(L.v_rows, D, f16);
    } else {
      for (int64_t i = 0; i < L.k_lo; ++i) slot[i] = static_cast<uint8_t>(rng.Below(256));
      const int64_t nk = int64_t{kBlockTokens / g} * D, nvv = int64_t{kBlockTokens} * (D / g);
      put16(L.k_lo, nk, f16);
      put16(L.k_step, nk, [&] { return F32ToF16(0.5f / ((1 << level) - 1) *
                                                 static_cast<float>(std::fabs(rng.Normal()))); });
      put16(L.v_lo, nvv, f16);
      put16(L.v_step, nvv, [&] { return F32ToF16(0.5f / ((1 << level) - 1) *
                                                  static_cast<float>(std::fabs(rng.Normal()))); });
    }
  }
  int32_t rows = 0;
  for (int64_t b = 0; b < n; ++b) {
    x->res_begin[b] = rows;
    if (b % 3 != 0 || x->n_valid[b] == 0) continue;
    for (int i = 0; i < 3; ++i) x->res_mask[b] |= uint64_t{1} << rng.Below(x->n_valid[b]);
    rows += std::popcount(x->res_mask[b]);
  }
  x->res_k.resize(static_cast<size_t>(rows) * D);
  x->res_v.resize(x->res_k.size());
  for (auto& v : x->res_k) v = F32ToBf16(static_cast<float>(rng.Normal()));
  for (auto& v : x->res_v) v = F32ToBf16(static_cast<float>(rng.Normal()));
  PackedHeadView& w = x->view;
  w.head_dim = D;
  w.group_size = g;
  w.n_blocks = n;
  w.level = x->level.data();
  w.offset = x->offset.data();
  w.n_valid = x->n_valid.data();
  for (int li = 0; li < kNumLevels; ++li) {
    x->seg_base[li] = x->slab[li].data();
    w.seg[li] = &x->seg_base[li];
    w.seg_bytes[li] = static_cast<int64_t>(x->slab[li].size());
  }
  w.res_mask = x->res_mask.data();
  w.res_begin = x->res_begin.data();
  w.res_k = x->res_k.data();
  w.res_v = x->res_v.data();
}

using packed_testing::Finalize;
using packed_testing::RelErr;

TEST(PackedAttentionKernel, MatchesFloat64OnRandomSlots) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool pool(3);
  struct Shape { int D, g, G; };
  // g = 8: the 32-row path on AVX-512; g = 64 the span-order codes; 16, 32 channel order.
  const Shape shapes[] = {{128, 64, 4}, {64, 32, 3}, {96, 16, 5}, {64, 8, 2}, {32, 32, 1}};
  ForEachSimdTarget([&] {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "D " << sh.D << " g " << sh.g << " G " << sh.G);
      RandomHead head;
      MakeRandomHead(rng, sh.D, sh.g, 6 + static_cast<int64_t>(rng.Below(9)), &head);
      const PackedHeadView& view = head.view;
      std::vector<float> q(static_cast<size_t>(sh.G) * sh.D);
      for (auto& x : q) x = static_cast<float>(2.0 * rng.Normal());
      const float scale = 1.f / std::sqrt(static_cast<float>(sh.D));
      std::vector<int64_t> sel(view.n_blocks);
      std::iota(sel.begin(), sel.end(), 0);
      for (int64_t i = static_cast<int64_t>(sel.size()) - 1; i > 0; --i) {
        std::swap(sel[i], sel[rng.Below(i + 1)]);
      }
      sel.resize(std::max<size_t>(1, sel.size() / 2));
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t* list = pass == 0 ? nullptr : sel.data();
        const int64_t n_list = pass == 0 ? view.n_blocks : static_cast<int64_t>(sel.size());
        std::vector<double> ref(static_cast<size_t>(sh.G) * sh.D);
        PackedAttendRef(view, q.data(), sh.G, scale, list, n_list, ref.data());
        // 1e-4 relative (as the GradedLayer test): f32 dots of length D, f32 online softmax.
        SoftmaxStateBuffer scalar(sh.G, sh.D);
        PackedAttendScalar(view, q.data(), sh.G, scale, list, n_list, &scalar.states());
        EXPECT_LE(RelErr(Finalize(scalar), ref), 1e-4) << "scalar pass " << pass;
        std::vector<int64_t> ids(n_list);
        for (int64_t i = 0; i < n_list; ++i) ids[i] = list ? list[i] : i;
        SoftmaxStateBuffer simd(sh.G, sh.D);
        PackedAttend(view, q.data(), sh.G, scale, ids.data(), n_list, &simd.states());
        const std::vector<float> one = Finalize(simd);
        EXPECT_LE(RelErr(one, ref), 1e-4) << "simd pass " << pass;
        for (int splits : {1, 2, 5}) {
          SoftmaxStateBuffer st(sh.G, sh.D), st_seq(sh.G, sh.D);
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, &pool,
                            &st.states());
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, nullptr,
                            &st_seq.states());
          EXPECT_EQ(Finalize(st), Finalize(st_seq)) << "pool changed the result, " << splits;
          if (splits == 1) {
            EXPECT_EQ(Finalize(st), one);  // one split is one kernel call
          }
        }
      }
    }
  });
}

// Per-block states and head selection: head r's state is its selected blocks only (float64),
// and block i's recorded (m, d) is the state of a read of block i alone (m exactly).
TEST(PackedAttentionKernel, PerBlockStatesAndHeadSelection) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    const int D = 64, g = 16, G = 3;
    RandomHead head;
    MakeRandomHead(rng, D, g, 11, &head);
    packed_testing::ExpectHeadSelectionAndBlockStates(head.view, G, rng, "random head");
  });
}

// kInt8 integer sums: every target (AVX3_DL's vpdpbusd with the transposes, the plain loops
// elsewhere) equals the scalar reference exactly, at the extreme codes and weights too.
TEST(PackedAttentionInt8, DotsEqualScalarReferenceOnEveryTarget) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachQuantTarget([&] {
    for (int it = 0; it < 12; ++it) {
      const int64_t D = 64 * (1 + static_cast<int64_t>(rng.Below(3)));
      const int gs[] = {16, 32, 64};
      int g = gs[rng.Below(3)];
      if (D % g != 0) g = 64 == D ? 64 : 32;
      const int n_q = 1 + static_cast<int>(rng.Below(9));
      const bool extreme = it < 2;
      std::vector<uint8_t> codes(64 * D);
      for (auto& c : codes) c = extreme ? 255 : static_cast<uint8_t>(rng.Below(256));
      std::vector<int8_t> q(n_q * D), w((D / g) * n_q * 64);
      for (auto& x : q) x = static_cast<int8_t>(extreme ? (it == 0 ? 127 : -127)
                                                        : static_cast<int>(rng.Below(255)) - 127);
      for (auto& x : w) x = static_cast<int8_t>(extreme ? 127 : static_cast<int>(rng.Below(128)));
      std::vector<int32_t> a(n_q * 64), b(n_q * 64), va(n_q * D), vb(n_q * D);
      PackedInt8KeyDots(codes.data(), D, q.data(), n_q, a.data());
      PackedInt8KeyDotsRef(codes.data(), D, q.data(), n_q, b.data());
      ASSERT_EQ(a, b) << "key dots D " << D << " n_q " << n_q;
      PackedInt8ValueSums(codes.data(), D, g, w.data(), n_q, va.data());
      PackedInt8ValueSumsRef(codes.data(), D, g, w.data(), n_q, vb.data());
      ASSERT_EQ(va, vb) << "value sums D " << D << " g " << g << " n_q " << n_q;
      if (extreme) {
        EXPECT_EQ(b[0], (it == 0 ? 1 : -1) * 127 * 255 * static_cast<int32_t>(D));
        EXPECT_EQ(vb[0], 127 * 255 * 64);
      }
    }
  });
}

TEST(PackedAttentionInt8, QuantizeInt8RoundsToNearestAndScales) {
  const float x[] = {1.f, -2.f, 0.5f, 0.f, 1.25f};
  int8_t q[5];
  const float d = QuantizeInt8(x, 5, 127, q);
  EXPECT_EQ(d, 2.f / 127.f);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[3], 0);
  for (int i = 0; i < 5; ++i) EXPECT_LE(std::fabs(x[i] - d * q[i]), d * (0.5f + 1e-6f)) << i;
  const float z[3] = {0.f, 0.f, 0.f};
  EXPECT_EQ(QuantizeInt8(z, 3, 127, q), 0.f);
  EXPECT_EQ(q[0] | q[1] | q[2], 0);
}

// The kInt8 path against float64, within the bound stated at PackedMath (packed_attention.h):
//   logits  |ds_t| <= E_t = (1/2 + 2^-10) d2 sum_c |code_tc - mu| + 2^-16 (sum_c |q'_c| code_tc +
//           sum_c |scale q_c lo_c| + 1): the left-over of the two-piece int8 rounding of q' =
//           scale q step, d2 <= d (1/2 + 2^-22) / 127 with d = max_c |q'_c| / 127, re-centred on
//           mu = (2^bits - 1) / 2, plus the f32 dots; exact rows (bf16, centroid, residual):
//           2^-16 (sum_c |scale q_c k_c| + 1);
//   outputs |do_c| <= (e^(2E) - 1) max_t |v_tc - o_c| + e^(2E) V_c + 2^-14 max_t |v_tc|, E = max_t
//           E_t, V_c = sum_b (e2_b / 2)(1 + 2^-10) sum_t |code_tc - mu| / Z, e2_b <= e_b (1/2 +
//           2^-22) / 127, e_b = max_t p_t step_t / 127 of block b and channel c's group (p, Z: the
//           float64 softmax weights and denominator; e^(2E) covers the kernel's own weights being
//           within e^(+-2E) of them).
// Fresh seeds: STRATA_TEST_SEED reproduces a failure. Also checks that int8 is not exact (the
// bound is exercised) and that the scalar kInt8 reference agrees with the SIMD kernel.
TEST(PackedAttentionInt8, WithinStatedBoundOfFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Shape { int D, g, G; };
  const Shape shapes[] = {{128, 64, 4}, {128, 32, 4}, {64, 16, 3}, {64, 64, 1}, {192, 32, 6}};
  ForEachQuantTarget([&] {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "D " << sh.D << " g " << sh.g << " G " << sh.G);
      const int D = sh.D, g = sh.g, G = sh.G;
      RandomHead head;
      MakeRandomHead(rng, D, g, 6 + static_cast<int64_t>(rng.Below(9)), &head);
      const PackedHeadView& view = head.view;
      ASSERT_TRUE(PackedInt8Applies(view));
      std::vector<float> q(static_cast<size_t>(G) * D);
      for (auto& x : q) x = static_cast<float>(2.0 * rng.Normal());
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      std::vector<double> ref(static_cast<size_t>(G) * D);
      PackedAttendRef(view, q.data(), G, scale, nullptr, view.n_blocks, ref.data());
      SoftmaxStateBuffer simd(G, D), scal(G, D), f32(G, D);
      PackedAttend(view, q.data(), G, scale, nullptr, view.n_blocks, &simd.states(), nullptr,
                   PackedMath::kInt8);
      PackedAttendScalar(view, q.data(), G, scale, nullptr, view.n_blocks, &scal.states(),
                         PackedMath::kInt8);
      PackedAttend(view, q.data(), G, scale, nullptr, view.n_blocks, &f32.states());
      const std::vector<float> got = Finalize(simd), got_s = Finalize(scal), got_f = Finalize(f32);
      EXPECT_LE(RelErr(got, std::vector<double>(got_s.begin(), got_s.end())), 1e-4)
          << "SIMD int8 vs scalar int8 reference";
      EXPECT_NE(got, got_f) << "int8 equal to f32: the int8 path did not run";
      std::vector<double> k(64 * D), v(64 * D);
      std::vector<uint8_t> kc(64 * D), vc(64 * D);
      for (int h = 0; h < G; ++h) {
        // Rows: (logit, bound, block, token, value row) in f64.
        struct Row { double s, e; int64_t b; int t; std::vector<double> v; };
        std::vector<Row> rows;
        for (int64_t b = 0; b < view.n_blocks; ++b) {
          const int nv = view.n_valid[b];
          if (nv <= 0) continue;
          const int level = view.level[b];
          const uint64_t over = view.res_mask[b] & (nv >= 64 ? ~0ull : ((1ull << nv) - 1));
          ReconstructBlock(view, b, k.data(), v.data());
          const uint8_t* slot = view.slot(b);
          const SlotLayout L = GetSlotLayout(level, D, g);
          const bool quant = level != 16 && level != 1;
          if (quant) {
            UnpackCodes(slot + L.k_codes, 64 * D, level, kc.data());
            UnpackCodes(slot + L.v_codes, 64 * D, level, vc.data());
          }
          const double mu = ((1 << level) - 1) / 2.0;
          auto f16at = [&](int64_t off, int64_t i) {
            return static_cast<double>(F16ToF32(reinterpret_cast<const uint16_t*>(slot + off)[i]));
          };
          auto exact_row = [&](const double* kr, const double* vr, double logw) {
            double s = 0, a = 0;
            for (int c = 0; c < D; ++c) {
              s += scale * static_cast<double>(q[h * D + c]) * kr[c];
              a += std::fabs(scale * static_cast<double>(q[h * D + c]) * kr[c]);
            }
            rows.push_back({s + logw, std::ldexp(a + 1, -16), b, -1, {vr, vr + D}});
          };
          if (level == 1) {
            const int n = nv - std::popcount(over);
            if (n > 0) exact_row(k.data(), v.data(), std::log(static_cast<double>(n)));
          } else {
            for (int t = 0; t < nv; ++t) {
              if ((over >> t) & 1) continue;
              if (!quant) {
                exact_row(k.data() + t * D, v.data() + t * D, 0.0);
                continue;
              }
              const int tg = t / g;
              double dmax = 0, s = 0, extra = 0, sumc = 0;
              for (int c = 0; c < D; ++c) {
                const double qs = scale * static_cast<double>(q[h * D + c]);
                const double qf = qs * f16at(L.k_step, tg * D + c);
                dmax = std::max(dmax, std::fabs(qf));
                s += qs * k[t * D + c];
                extra += std::fabs(qf) * kc[t * D + c] + std::fabs(qs * f16at(L.k_lo, tg * D + c));
                sumc += std::fabs(kc[t * D + c] - mu);
              }
              const double d2 = dmax / 127 * (0.5 + std::ldexp(1, -22)) / 127;
              const double e = (0.5 + std::ldexp(1, -10)) * d2 * sumc +
                               std::ldexp(extra + 1, -16);
              rows.push_back({s, e, b, t, {v.begin() + t * D, v.begin() + (t + 1) * D}});
            }
          }
          for (uint64_t mm = over; mm != 0; mm &= mm - 1) {
            const int t = std::countr_zero(mm);
            const uint64_t below = t == 0 ? 0 : (view.res_mask[b] & ((1ull << t) - 1));
            const int64_t r = view.res_begin[b] + std::popcount(below);
            std::vector<double> kr(D), vr(D);
            for (int c = 0; c < D; ++c) {
              kr[c] = Bf16ToF32(view.res_k[r * D + c]);
              vr[c] = Bf16ToF32(view.res_v[r * D + c]);
            }
            exact_row(kr.data(), vr.data(), 0.0);
          }
        }
        double mx = -INFINITY, E = 0, Z = 0;
        for (const Row& r : rows) mx = std::max(mx, r.s), E = std::max(E, r.e);
        std::vector<double> p(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) Z += p[i] = std::exp(rows[i].s - mx);
        const double grow = std::exp(2 * E);
        // V_c: per quantized block and channel group, e_b = max_t p_t step_t / 127.
        std::vector<double> Vc(D, 0.0);
        for (int64_t b = 0; b < view.n_blocks; ++b) {
          const int level = view.level[b];
          if (view.n_valid[b] <= 0 || level == 16 || level == 1) continue;
          const uint8_t* slot = view.slot(b);
          const SlotLayout L = GetSlotLayout(level, D, g);
          UnpackCodes(slot + L.v_codes, 64 * D, level, vc.data());
          const double mu = ((1 << level) - 1) / 2.0;
          for (int cg = 0; cg < D / g; ++cg) {
            double eb = 0;
            std::vector<int> ts;
            for (size_t i = 0; i < rows.size(); ++i) {
              if (rows[i].b != b || rows[i].t < 0) continue;
              const double st = F16ToF32(reinterpret_cast<const uint16_t*>(
                  slot + L.v_step)[rows[i].t * (D / g) + cg]);
              eb = std::max(eb, p[i] * std::fabs(st) / 127);
              ts.push_back(rows[i].t);
            }
            for (int c = cg * g; c < (cg + 1) * g; ++c) {
              double sc = 0;
              for (int t : ts) sc += std::fabs(vc[t * D + c] - mu);
              const double eb2 = eb * (0.5 + std::ldexp(1, -22)) / 127;
              Vc[c] += eb2 / 2 * (1 + std::ldexp(1, -10)) * sc / Z;
            }
          }
        }
        for (int c = 0; c < D; ++c) {
          const double o = ref[h * D + c];
          double dev = 0, vmax = 0;
          for (const Row& r : rows) {
            dev = std::max(dev, std::fabs(r.v[c] - o));
            vmax = std::max(vmax, std::fabs(r.v[c]));
          }
          const double bound = (grow - 1) * dev + grow * Vc[c] + std::ldexp(vmax, -14);
          ASSERT_LE(std::fabs(got[h * D + c] - o), bound)
              << "head " << h << " channel " << c << " E " << E << " V " << Vc[c];
        }
      }
    }
  });
}

// Read bytes: every listed block's slot plus 4 D bytes (bf16 K and V) per residual row.
TEST(PackedAttentionKernel, ReadBytesCountSlotsAndResidualRows) {
  Rng rng(3);
  RandomHead head;
  const int D = 32, g = 32;
  MakeRandomHead(rng, D, g, 10, &head);
  const std::vector<int64_t> list = {0, 3, 4, 9};
  int64_t want = 0;
  for (int64_t b : list) {
    want += SlotBytes(head.level[b], D, g) + std::popcount(head.res_mask[b]) * int64_t{4} * D;
  }
  EXPECT_EQ(PackedReadBytes(head.view, list.data(), 4), want);
  EXPECT_GT(want, 0);
}

}  // namespace
}  // namespace strata::geodesia
