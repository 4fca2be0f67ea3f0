#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

// A KV stream in bf16: MLA-like (values are the first dv entries of the key rows) or separate
// K and V buffers, with strides larger than the row widths.
struct Stream {
  std::vector<uint16_t> k, v;
  KvStreamView view;
};

Stream MakeStream(Rng& rng, int64_t n, int dk, int dv, bool shared, float key_scale = 1.f) {
  Stream s;
  const int64_t ks = dk + static_cast<int64_t>(rng.Below(9));
  s.k.resize(n * ks + 1);
  for (auto& x : s.k) x = F32ToBf16(static_cast<float>(rng.Normal()) * key_scale);
  s.view.keys = s.k.data() + 1;  // not 64-byte aligned
  s.view.k_stride = ks;
  s.view.dk = dk;
  s.view.dv = dv;
  if (shared) {
    s.view.vals = s.view.keys;
    s.view.v_stride = ks;
  } else {
    const int64_t vs = dv + static_cast<int64_t>(rng.Below(9));
    s.v.resize(n * vs + 3);
    for (auto& x : s.v) x = F32ToBf16(static_cast<float>(rng.Normal()));
    s.view.vals = s.v.data() + 3;
    s.view.v_stride = vs;
  }
  return s;
}

std::vector<float> RandomQ(Rng& rng, int g, int dk) {
  std::vector<float> q(static_cast<size_t>(g) * dk);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  return q;
}

std::vector<float> Attend(const std::vector<float>& q, int g, float scale, const KvStreamView& kv,
                          const int64_t* rows, int64_t n) {
  SoftmaxStateBuffer buf(g, kv.dv);
  AttendStream(q.data(), g, scale, kv, rows, n, &buf.states());
  std::vector<float> out(static_cast<size_t>(g) * kv.dv);
  FinalizeStates(buf.states(), out.data());
  return out;
}

struct Shape {
  int g, dk, dv;
  bool shared;
};

// Outputs are convex combinations of bf16 values of size ~1. f32 scores differ from float64 by
// ~sqrt(dk) eps |q||k| scale ~ 1e-6 and the online rescaling adds a few roundings per tile, so
// outputs agree to ~1e-6 absolute; 2e-5 absolute leaves margin without hiding a wrong or
// missing row (which moves the output by ~|v|/n >= 1e-3 at the sizes used here).
constexpr double kRefTol = 2e-5;

TEST(AttentionTest, AttendStreamMatchesFloat64Reference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    const Shape shapes[] = {{16, 576, 512, true}, {4, 128, 128, false}, {8, 128, 128, false},
                            {3, 37, 19, false},   {5, 40, 24, true},    {1, 1, 1, false},
                            {7, 17, 33, false},   {2, 64, 64, true},    {3, 64, 64, false},
                            {7, 128, 128, false}, {6, 64, 64, false}};
    const int64_t ns[] = {1, 2, 31, 32, 33, 64, 65, 200};
    for (const Shape& sh : shapes) {
      for (int64_t n : ns) {
        if (sh.dk >= 512 && n > 65) continue;  // keep the float64 reference quick
        Stream s = MakeStream(rng, n, sh.dk, sh.dv, sh.shared, 2.f);
        std::vector<float> q = RandomQ(rng, sh.g, sh.dk);
        const float scale = 1.f / std::sqrt(static_cast<float>(sh.dk));
        std::vector<float> got = Attend(q, sh.g, scale, s.view, nullptr, n);
        std::vector<double> ref(static_cast<size_t>(sh.g) * sh.dv);
        AttendStreamRef(q.data(), sh.g, scale, s.view, nullptr, n, ref.data());
        for (size_t i = 0; i < ref.size(); ++i) {
          ASSERT_NEAR(got[i], ref[i], kRefTol)
              << "G=" << sh.g << " dk=" << sh.dk << " dv=" << sh.dv << " n=" << n << " i=" << i;
        }
      }
    }
  });
}

// Large score ranges (sharp softmax, running max growing across tiles) stay finite and accurate.
TEST(AttentionTest, SharpScoresNoOverflow) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    const int g = 4, dk = 64, dv = 32;
    const int64_t n = 300;
    Stream s = MakeStream(rng, n, dk, dv, false, 30.f);
    std::vector<float> q = RandomQ(rng, g, dk);
    std::vector<float> got = Attend(q, g, 1.f, s.view, nullptr, n);
    std::vector<double> ref(g * dv);
    AttendStreamRef(q.data(), g, 1.f, s.view, nullptr, n, ref.data());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i]));
      // Scores ~ 1e3: f32 score error ~ 1e-4 absolute shifts weights by ~1e-4 relative.
      ASSERT_NEAR(got[i], ref[i], 2e-3) << i;
    }
  });
}

// Split the rows into k random disjoint parts (some possibly empty), attend each part through a
// gather list, merge in random order: equals attending the whole set densely (to f32 rounding of
// the rescalings, ~1e-6 relative; 1e-5 relative + 1e-6 absolute) and the float64 reference.
TEST(AttentionTest, MergeOfRandomPartsEqualsWhole) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    const Shape shapes[] = {{16, 576, 512, true}, {4, 128, 128, false}, {3, 37, 19, false}};
    for (const Shape& sh : shapes) {
      for (int k = 1; k <= 8; ++k) {
        const int64_t n = 1 + static_cast<int64_t>(rng.Below(sh.dk >= 512 ? 120 : 400));
        Stream s = MakeStream(rng, n, sh.dk, sh.dv, sh.shared);
        std::vector<float> q = RandomQ(rng, sh.g, sh.dk);
        const float scale = 1.f / std::sqrt(static_cast<float>(sh.dk));
        std::vector<float> whole = Attend(q, sh.g, scale, s.view, nullptr, n);

        std::vector<std::vector<int64_t>> parts(k);
        for (int64_t u = 0; u < n; ++u) parts[rng.Below(k)].push_back(u);
        std::vector<int> order(k);
        std::iota(order.begin(), order.end(), 0);
        for (int i = k - 1; i > 0; --i) std::swap(order[i], order[rng.Below(i + 1)]);
        SoftmaxStateBuffer acc(sh.g, sh.dv), part(sh.g, sh.dv);
        for (int pi : order) {
          part.states().Reset();
          AttendStream(q.data(), sh.g, scale, s.view, parts[pi].data(),
                       static_cast<int64_t>(parts[pi].size()), &part.states());
          MergeStates(&acc.states(), part.states());
        }
        std::vector<float> merged(whole.size());
        FinalizeStates(acc.states(), merged.data());
        std::vector<double> ref(whole.size());
        AttendStreamRef(q.data(), sh.g, scale, s.view, nullptr, n, ref.data());
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_TRUE(std::isfinite(merged[i]));
          ASSERT_NEAR(merged[i], whole[i], 1e-5 * std::fabs(whole[i]) + 1e-6)
              << "G=" << sh.g << " k=" << k << " n=" << n << " i=" << i;
          ASSERT_NEAR(merged[i], ref[i], kRefTol) << "k=" << k << " i=" << i;
        }
      }
    }
  });
}

// A gather over an index list reads the same rows in the same order as a dense read of those rows
// copied out, through the same arithmetic: bit-identical.
TEST(AttentionTest, GatherEqualsDenseOverSameRows) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (bool shared : {true, false}) {
      const int g = shared ? 16 : 4, dk = shared ? 576 : 128, dv = shared ? 512 : 128;
      const int64_t n_all = 300;
      Stream s = MakeStream(rng, n_all, dk, dv, shared);
      std::vector<int64_t> rows;
      for (int64_t u = 0; u < n_all; ++u)
        if (rng.Below(3) == 0) rows.push_back(u);
      for (int i = static_cast<int>(rows.size()) - 1; i > 0; --i)
        std::swap(rows[i], rows[rng.Below(i + 1)]);
      const int64_t n = static_cast<int64_t>(rows.size());
      // Dense copy of the gathered rows, same strides.
      Stream d = s;
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(d.k.data() + 1 + i * s.view.k_stride, s.view.keys + rows[i] * s.view.k_stride,
                    sizeof(uint16_t) * s.view.k_stride);
        if (!shared) {
          std::memcpy(d.v.data() + 3 + i * s.view.v_stride, s.view.vals + rows[i] * s.view.v_stride,
                      sizeof(uint16_t) * s.view.v_stride);
        }
      }
      d.view.keys = d.k.data() + 1;
      d.view.vals = shared ? d.view.keys : d.v.data() + 3;
      std::vector<float> q = RandomQ(rng, g, dk);
      const float scale = 0.07f;
      std::vector<float> a = Attend(q, g, scale, s.view, rows.data(), n);
      std::vector<float> b = Attend(q, g, scale, d.view, nullptr, n);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(F32Bits(a[i]), F32Bits(b[i])) << i;
    }
  });
}

TEST(AttentionTest, EmptySetsAndMergesWithEmptySides) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int g = 3, dk = 24, dv = 20;
  Stream s = MakeStream(rng, 50, dk, dv, false);
  std::vector<float> q = RandomQ(rng, g, dk);

  // n = 0 leaves a fresh state empty; finalizing it gives zeros, not NaN.
  SoftmaxStateBuffer e(g, dv);
  AttendStream(q.data(), g, 0.2f, s.view, nullptr, 0, &e.states());
  std::vector<float> out(g * dv, 1.f);
  FinalizeStates(e.states(), out.data());
  for (float v : out) ASSERT_EQ(v, 0.f);

  SoftmaxStateBuffer full(g, dv);
  AttendStream(q.data(), g, 0.2f, s.view, nullptr, 50, &full.states());
  std::vector<float> want(g * dv);
  FinalizeStates(full.states(), want.data());

  // full <- empty: unchanged, bit for bit.
  MergeStates(&full.states(), e.states());
  FinalizeStates(full.states(), out.data());
  for (int i = 0; i < g * dv; ++i) ASSERT_EQ(F32Bits(out[i]), F32Bits(want[i]));
  // empty <- full: takes the source verbatim.
  MergeStates(&e.states(), full.states());
  FinalizeStates(e.states(), out.data());
  for (int i = 0; i < g * dv; ++i) ASSERT_EQ(F32Bits(out[i]), F32Bits(want[i]));
  // empty <- empty: still empty, no NaN.
  SoftmaxStateBuffer e1(g, dv), e2(g, dv);
  MergeStates(&e1.states(), e2.states());
  for (int h = 0; h < g; ++h) {
    ASSERT_EQ(e1.states().d[h], 0.f);
    ASSERT_EQ(e1.states().m[h], -std::numeric_limits<float>::infinity());
  }
  FinalizeStates(e1.states(), out.data());
  for (float v : out) ASSERT_EQ(v, 0.f);
}

TEST(AttentionTest, MergeStatesMatchesClosedForm) {
  // Two single-row states: merge(m1, m2) gives weights softmax([s1, s2]).
  SoftmaxStateBuffer a(1, 2), b(1, 2);
  a.states().m[0] = 1.f;
  a.states().d[0] = 1.f;
  a.states().o[0] = 1.f;
  a.states().o[1] = 0.f;
  b.states().m[0] = 3.f;
  b.states().d[0] = 1.f;
  b.states().o[0] = 0.f;
  b.states().o[1] = 1.f;
  MergeStates(&a.states(), b.states());
  float out[2];
  FinalizeStates(a.states(), out);
  const double w1 = 1 / (1 + std::exp(2.0));
  EXPECT_NEAR(out[0], w1, 1e-7);
  EXPECT_NEAR(out[1], 1 - w1, 1e-7);
  EXPECT_EQ(a.states().m[0], 3.f);
}

TEST(AttentionTest, StateBufferIsAlignedAndReset) {
  SoftmaxStateBuffer b(5, 33);
  const SoftmaxStates& st = b.states();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(st.o) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(st.m) % 64, 0u);
  for (int h = 0; h < 5; ++h) {
    EXPECT_EQ(st.m[h], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(st.d[h], 0.f);
  }
  for (int i = 0; i < 5 * 33; ++i) EXPECT_EQ(st.o[i], 0.f);
}

// --attn-math bf16: the error bound, derived from the rounding.
//
// Scores. The kernel computes s'_i = sum_c qh_c k_ic with qh_c = bf16(fl(scale q_c)) and f32 sums
// of the (exact) bf16 x bf16 products. With u = 2^-24 (f32) and ub = 2^-8 (bf16, round to nearest
// even),
//   |qh_c - scale q_c| <= (ub + u + ub u) |scale q_c|,
//   |s'_i - s_i| <= E_i = ((ub + u + ub u)(1 + g) + g) a_i,  a_i = scale sum_c |q_c k_ic|,
// where g = gamma_dk = dk u / (1 - dk u) bounds the f32 summation of dk products. With
// D = max_i E_i the softmax weights move by factors within [e^-2D, e^2D], so an output moves by
// at most (e^2D - 1) S, S = sum_i w_i |v_ij| (w: the exact weights).
// Values (vdpbf16ps form only). The probabilities p_i = exp(s'_i - m) are rounded to bf16 before
// they multiply the (bf16) values, the denominator keeps the f32 sum: that adds at most
// ub sum_i w'_i |v_ij| <= ub e^2D S.
// Total: |o' - o| <= (e^2D - 1 + [native] ub e^2D) S + kRefTol (kRefTol: the f32 path's own
// value-side and online-softmax rounding). Denormal bf16 inputs (|x| < 2^-126) read as zero in
// vdpbf16ps: random rows of size ~1 have none.
// The bound is worst case (all roundings aligned); the second check below is the tight one:
// against float64 on the rounded query the portable form is as accurate as the f32 path
// (kRefTol), and the native form within the probability rounding ub S_h (S_h: S under the rounded
// query's weights, times the f32 score rounding's own factor e^(2 g max a_i)).
struct BoundTerms {
  double d = 0;     // D: the largest score error
  double f32 = 0;   // g max_i a_i: the f32 summation's share of it
  double s = 0;     // S = sum_i w_i |v_ij|
};
BoundTerms Bf16Terms(const float* qh, float scale, const KvStreamView& kv, int64_t n, int j) {
  const double u = std::ldexp(1.0, -24), ub = std::ldexp(1.0, -8);
  const double gam = kv.dk * u / (1 - kv.dk * u);
  const double rq = (ub + u + ub * u);
  std::vector<double> sc(n);
  std::vector<float> k(kv.dk), v(kv.dv);
  BoundTerms t;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    ToF32(kv.dtype, kv.key_row(i), k.data(), kv.dk);
    double ai = 0, si = 0;
    for (int c = 0; c < kv.dk; ++c) {
      ai += std::fabs(static_cast<double>(qh[c]) * k[c]);
      si += static_cast<double>(qh[c]) * k[c];
    }
    sc[i] = si * scale;
    m = std::max(m, sc[i]);
    t.d = std::max(t.d, (rq * (1 + gam) + gam) * ai * scale);
    t.f32 = std::max(t.f32, gam * ai * scale);
  }
  double den = 0, num = 0;
  for (int64_t i = 0; i < n; ++i) {
    ToF32(kv.dtype, kv.val_row(i), v.data(), kv.dv);
    const double w = std::exp(sc[i] - m);
    den += w;
    num += w * std::fabs(v[j]);
  }
  t.s = num / den;
  return t;
}

TEST(AttentionTest, Bf16MathWithinStatedBoundNativeAndPortable) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const bool has_native = CpuDotFeatures().avx512_bf16;
  for (bool native : {true, false}) {
    if (native && !has_native) continue;
    SCOPED_TRACE(native ? "vdpbf16ps" : "portable bf16");
    const bool prev = attn_math_internal::SetNativeBf16ForTest(native);
    ForEachSimdTarget([&] {
      const Shape shapes[] = {{16, 576, 512, true}, {4, 128, 128, false}, {8, 128, 128, false},
                              {3, 37, 19, false},   {5, 40, 24, true},    {1, 1, 1, false},
                              {7, 17, 33, false},   {2, 64, 64, true},    {3, 64, 64, false},
                              {1, 64, 64, false},   {6, 96, 64, false},   {128, 576, 512, true}};
      const int64_t ns[] = {1, 17, 64, 65, 200};
      int differs = 0;
      for (const Shape& sh : shapes) {
        for (int64_t n : ns) {
          if (sh.dk >= 512 && n > 65) continue;
          Stream s = MakeStream(rng, n, sh.dk, sh.dv, sh.shared, 2.f);
          std::vector<float> q = RandomQ(rng, sh.g, sh.dk);
          const float scale = 1.f / std::sqrt(static_cast<float>(sh.dk));
          KvStreamView fast = s.view;
          fast.math = AttnMath::kBF16;
          const std::vector<float> got = Attend(q, sh.g, scale, fast, nullptr, n);
          const std::vector<float> exact = Attend(q, sh.g, scale, s.view, nullptr, n);
          std::vector<double> ref(static_cast<size_t>(sh.g) * sh.dv);
          AttendStreamRef(q.data(), sh.g, scale, s.view, nullptr, n, ref.data());
          // The rounded query, scale folded in, in float64.
          std::vector<float> qh(q.size());
          for (size_t i = 0; i < q.size(); ++i) qh[i] = Bf16ToF32(F32ToBf16(q[i] * scale));
          std::vector<double> ref_h(ref.size());
          AttendStreamRef(qh.data(), sh.g, 1.f, s.view, nullptr, n, ref_h.data());
          const double ub = native ? std::ldexp(1.0, -8) : 0.0;
          for (int h = 0; h < sh.g; ++h) {
            for (int j = 0; j < sh.dv; ++j) {
              const size_t i = static_cast<size_t>(h) * sh.dv + j;
              const BoundTerms e = Bf16Terms(q.data() + h * sh.dk, scale, s.view, n, j);
              const double bound = (std::expm1(2 * e.d) + ub * std::exp(2 * e.d)) * e.s + kRefTol;
              ASSERT_LE(std::fabs(got[i] - ref[i]), bound)
                  << "G=" << sh.g << " dk=" << sh.dk << " n=" << n << " h=" << h << " j=" << j;
              const BoundTerms eh = Bf16Terms(qh.data() + h * sh.dk, 1.f, s.view, n, j);
              ASSERT_NEAR(got[i], ref_h[i], ub * eh.s * std::exp(2 * eh.f32) + kRefTol)
                  << "G=" << sh.g << " dk=" << sh.dk << " n=" << n << " h=" << h << " j=" << j;
              differs += got[i] != exact[i];
            }
          }
          if (sh.g >= 16) break;  // one size of the big MLA shapes keeps the test quick
        }
      }
      // The fast path was taken: its outputs are not the f32 path's.
      EXPECT_GT(differs, 0);
    });
    attn_math_internal::SetNativeBf16ForTest(prev);
  }
}

// f16 and f32 rows ignore the bf16 setting (their reads are the exact path).
TEST(AttentionTest, Bf16MathLeavesF32RowsExact) {
  Rng rng(TestSeed());
  const int g = 4, dk = 64, dv = 64;
  const int64_t n = 70;
  std::vector<float> k(n * dk), q = RandomQ(rng, g, dk);
  for (auto& x : k) x = static_cast<float>(rng.Normal());
  KvStreamView v;
  v.keys = v.vals = reinterpret_cast<const uint16_t*>(k.data());
  v.k_stride = v.v_stride = 2 * dk;
  v.dk = dk;
  v.dv = dv;
  v.dtype = DType::kF32;
  KvStreamView fast = v;
  fast.math = AttnMath::kBF16;
  EXPECT_EQ(Attend(q, g, 0.125f, v, nullptr, n), Attend(q, g, 0.125f, fast, nullptr, n));
}

// auto over bf16 rows, bit for bit: GQA rows (values apart from the keys) read in f32; MLA latent
// rows (values inside the keys) read in bf16 where vdpbf16ps runs at full rate
// (DotFeatures::bf16_dot_full_rate), else in f32, and in f32 whenever the native path is off.
TEST(AttentionTest, AutoMathPicksBf16OnlyForLatentRowsOnFullRateCpus) {
  Rng rng(TestSeed());
  const bool fast = CpuDotFeatures().bf16_dot_full_rate && CpuDotFeatures().avx512_bf16;
  for (bool latent : {false, true}) {
    SCOPED_TRACE(latent ? "latent rows" : "GQA rows");
    const int G = latent ? 16 : 4, dk = latent ? 576 : 128, dv = latent ? 512 : 128;
    Stream s = MakeStream(rng, 150, dk, dv, latent);
    std::vector<float> q = RandomQ(rng, G, dk);
    KvStreamView a = s.view, b = s.view;
    a.math = AttnMath::kAuto;
    b.math = AttnMath::kBF16;
    const auto f32 = Attend(q, G, 0.07f, s.view, nullptr, 150);
    const auto bf16 = Attend(q, G, 0.07f, b, nullptr, 150);
    ASSERT_NE(f32, bf16);  // the two paths differ, so the comparison below tells them apart
    EXPECT_EQ(Attend(q, G, 0.07f, a, nullptr, 150), latent && fast ? bf16 : f32);
    EXPECT_EQ(Bf16RowsMath(AttnMath::kAuto, latent),
              latent && fast ? AttnMath::kBF16 : AttnMath::kF32);
    const bool prev = attn_math_internal::SetNativeBf16ForTest(false);
    EXPECT_EQ(Bf16RowsMath(AttnMath::kAuto, latent), AttnMath::kF32);
    EXPECT_EQ(Attend(q, G, 0.07f, a, nullptr, 150), f32);
    attn_math_internal::SetNativeBf16ForTest(prev);
  }
}

TEST(AttnMathTest, ParseResolveAndCpuFeatures) {
  EXPECT_EQ(*ParseAttnMath("F32"), AttnMath::kF32);
  EXPECT_EQ(*ParseAttnMath("bf16"), AttnMath::kBF16);
  EXPECT_EQ(*ParseAttnMath("int8"), AttnMath::kInt8);
  EXPECT_EQ(*ParseAttnMath("auto"), AttnMath::kAuto);
  const auto bad = ParseAttnMath("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fp8'"), std::string::npos);
  const DotFeatures& f = CpuDotFeatures();
  // auto over GQA bf16 rows is the f32 path (bf16 misses the model-level contract on the
  // synthetic llama / qwen2), int8 their bf16; full-rate vdpbf16ps only on AVX512_BF16 CPUs.
  EXPECT_EQ(Bf16RowsMath(AttnMath::kAuto), AttnMath::kF32);
  if (!f.avx512_bf16) EXPECT_FALSE(f.bf16_dot_full_rate);
  // The benchmarks' CPU line says what auto does here.
  const std::string summary = CpuDotSummary();
  EXPECT_EQ(summary.rfind("cpu: ", 0), 0u) << summary;
  EXPECT_NE(summary.find(Bf16RowsMath(AttnMath::kAuto, true) == AttnMath::kBF16
                             ? "auto: bf16 for MLA rows, f32 for GQA rows"
                             : "auto: f32 for MLA rows, f32 for GQA rows"),
            std::string::npos)
      << summary;
  EXPECT_EQ(Bf16RowsMath(AttnMath::kF32), AttnMath::kF32);
  EXPECT_EQ(Bf16RowsMath(AttnMath::kBF16), AttnMath::kBF16);
  EXPECT_EQ(Bf16RowsMath(AttnMath::kInt8), AttnMath::kBF16);
  EXPECT_TRUE(AtLeast(AttnMath::kInt8, AttnMath::kBF16));
  EXPECT_FALSE(AtLeast(AttnMath::kF32, AttnMath::kBF16));
  EXPECT_FALSE(AtLeast(AttnMath::kAuto, AttnMath::kBF16));
  // The same answer cpuid gives /proc/cpuinfo's flags, where the file exists.
  FILE* fp = std::fopen("/proc/cpuinfo", "r");
  if (fp != nullptr) {
    std::string text;
    char buf[4096];
    size_t r;
    while ((r = std::fread(buf, 1, sizeof(buf), fp)) > 0) text.append(buf, r);
    std::fclose(fp);
    if (text.find(" avx512f") != std::string::npos) {
      EXPECT_EQ(f.avx512_bf16, text.find(" avx512_bf16") != std::string::npos);
      EXPECT_EQ(f.avx512_vnni, text.find(" avx512_vnni") != std::string::npos);
    }
    // Full rate: AMD family 0x1A (26) or later with AVX512_BF16.
    const size_t at = text.find("cpu family");
    if (at != std::string::npos && text.find("AuthenticAMD") != std::string::npos) {
      const int family = std::atoi(text.c_str() + text.find(':', at) + 1);
      EXPECT_EQ(f.bf16_dot_full_rate, f.avx512_bf16 && family >= 26) << "family " << family;
    } else if (text.find("GenuineIntel") != std::string::npos) {
      EXPECT_FALSE(f.bf16_dot_full_rate);
    }
  }
  const AttnMath prev = DefaultAttnMath();
  SetDefaultAttnMath(AttnMath::kAuto);
  EXPECT_EQ(DefaultAttnMath(), AttnMath::kAuto);
  SetDefaultAttnMath(prev);
}

}  // namespace
}  // namespace strata
