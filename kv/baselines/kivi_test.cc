#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "core/status_testing.h"
#include "kv/baselines/baselines.h"
#include "kv/baselines/test_util.h"

namespace strata::baselines {
namespace {

using testing::Build;
using testing::GqaGeometry;
using testing::MlaGeometry;
using testing::RandomQuery;

struct Made {
  std::unique_ptr<KvCache> cache;
  KiviPolicy* policy = nullptr;
};

Made MakeKivi(const LayerGeometry& g, int bits, const std::string& math = "f32") {
  Made out;
  auto p = MakeKiviPolicy(PolicySpec{bits == 2 ? "kivi2" : "kivi4", {{"attn-math", math}}}, bits);
  EXPECT_TRUE(p.ok());
  out.policy = static_cast<KiviPolicy*>(p->get());
  auto c = KvCache::Create({g}, std::move(p).value());
  EXPECT_TRUE(c.ok());
  out.cache = std::move(c).value();
  return out;
}

// docs/reference/geodesia-kv.md §12.2-§12.4: codes in range, |x - x^| <= step / 2, packing
// LSB-first, constant groups.
TEST(KiviTest, QuantizationErrorBoundsAndPacking) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int bits : {2, 4}) {
    for (int t = 0; t < 500; ++t) {
      const int n = 1 + static_cast<int>(rng.Below(40));
      const float sd = std::pow(10.f, rng.UniformF(-3, 3));
      std::vector<float> x(n);
      for (auto& v : x) v = sd * static_cast<float>(rng.Normal()) + rng.UniformF(-2, 2) * sd;
      std::vector<uint8_t> codes(n);
      const KiviQuantParams p = KiviQuantize(x.data(), n, 1, bits, codes.data());
      const float lo = F16ToF32(p.lo), step = F16ToF32(p.step);
      for (int i = 0; i < n; ++i) {
        ASSERT_LE(codes[i], (1 << bits) - 1);
        const float xh = KiviDequant(codes[i], lo, step);
        // step / 2 plus f32 rounding of lo + code * step (a few ulps of the largest magnitude).
        ASSERT_LE(std::abs(x[i] - xh), step / 2 + 4e-7f * (std::abs(lo) + 16 * step))
            << "bits " << bits << " n " << n;
      }
      std::vector<uint8_t> packed((n * bits + 7) / 8), back(n);
      KiviPack(codes.data(), n, bits, packed.data());
      KiviUnpack(packed.data(), n, bits, back.data());
      ASSERT_EQ(back, codes);
    }
    // A constant group: step 0, code 0, exact reconstruction (no 0/0).
    std::vector<float> c(32, 1.5f);
    std::vector<uint8_t> codes(32, 9);
    const KiviQuantParams p = KiviQuantize(c.data(), 32, 1, bits, codes.data());
    EXPECT_EQ(p.step, 0);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(codes[i], 0);
      EXPECT_EQ(KiviDequant(codes[i], F16ToF32(p.lo), 0.f), 1.5f);
    }
  }
  uint8_t out[2];
  const uint8_t c2[4] = {1, 2, 3, 0};
  KiviPack(c2, 4, 2, out);
  EXPECT_EQ(out[0], 0x39);
  const uint8_t c4[2] = {0xA, 0x3};
  KiviPack(c4, 2, 4, out);
  EXPECT_EQ(out[0], 0x3A);
}

// The flush schedule: once a call's rows are in, a cache of t tokens holds exactly
// floor((t - 32) / 32) quantized groups (0 below 32), the newest [32, 64) tokens are exact; calls
// of assorted sizes, inline or on a pool. Then each quantized row is within step / 2 of its bf16
// row (keys per channel per group, values per token per 32 channels).
TEST(KiviTest, IncrementalFlushScheduleAndRowErrors) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  const int64_t sizes[] = {1, 30, 1, 33, 64, 7, 100, 2, 62, 1, 1, 31};
  for (const LayerGeometry& g : {GqaGeometry(4, 2, 48), GqaGeometry(4, 2, 64), MlaGeometry()}) {
    for (int bits : {2, 4}) {
      std::vector<float> k, v;
      {
        Made m = MakeKivi(g, bits);
        int64_t t = 0;
        for (int call = 0; t < 300; ++call) {
          const int64_t n = std::min<int64_t>(sizes[call % std::size(sizes)], 300 - t);
          ASSERT_OK(m.cache->BeginCall(n, CallKind::kPrefill, call % 2 ? &pool : nullptr));
          for (int64_t i = 0; i < n; ++i) {
            // Until the call's last row is in, the groups complete before the call.
            ASSERT_EQ(m.policy->quantized_groups(0), KiviPolicy::GroupsAfter(t)) << "t " << t;
            testing::RowAt(g, seed, t + i, 0.f, &k, &v);
            ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
          }
          t += n;
          const int64_t want = t < 32 ? 0 : (t - 32) / 32;
          ASSERT_EQ(m.policy->quantized_groups(0), want) << "t " << t;
          ASSERT_EQ(KiviPolicy::GroupsAfter(t), want);
          const int64_t exact = t - 32 * want;
          ASSERT_TRUE(exact >= std::min<int64_t>(t, 32) && exact < 64);
          ASSERT_OK(m.cache->EndCall());
        }
      }
      // One call, so the store keeps every exact row to compare with.
      Made m = MakeKivi(g, bits);
      ASSERT_OK(m.cache->BeginCall(300, CallKind::kPrefill));
      for (int64_t t = 0; t < 300; ++t) {
        testing::RowAt(g, seed, t, 0.f, &k, &v);
        ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
      }
      ASSERT_EQ(m.policy->quantized_groups(0), KiviPolicy::GroupsAfter(300));
      const LayerStore& s = m.cache->store(0);
      const int64_t nq = m.policy->quantized_groups(0) * 32;
      for (int h = 0; h < g.n_kv_heads; ++h) {
        for (int64_t g0 = 0; g0 < nq; g0 += 32) {
          std::vector<float> kh(g.k_dim);
          for (int c = 0; c < g.k_dim; ++c) {
            float mn = 1e30f, mx = -1e30f;
            for (int64_t u = g0; u < g0 + 32; ++u) {
              mn = std::min(mn, Bf16ToF32(s.key_row(h, u)[c]));
              mx = std::max(mx, Bf16ToF32(s.key_row(h, u)[c]));
            }
            // step <= range / levels rounded up in f16 (+ the lo rounding), so the error bound
            // is about range / (2 * levels); allow the f16 roundings (1e-3 relative).
            const float bound = (mx - mn) / ((1 << bits) - 1) * 0.5f * 1.01f + 1e-3f * std::abs(mn);
            for (int64_t u = g0; u < g0 + 32; ++u) {
              m.policy->DequantKey(0, h, u, kh.data());
              ASSERT_LE(std::abs(kh[c] - Bf16ToF32(s.key_row(h, u)[c])), bound + 1e-6f);
            }
          }
          if (g.kind == AttnKind::kGqa) {
            std::vector<float> vh(g.v_dim);
            for (int64_t u = g0; u < g0 + 32; ++u) {
              m.policy->DequantValue(0, h, u, vh.data());
              for (int c0 = 0; c0 < g.v_dim; c0 += 32) {
                float mn = 1e30f, mx = -1e30f;
                const int c1 = std::min(g.v_dim, c0 + 32);
                for (int c = c0; c < c1; ++c) {
                  mn = std::min(mn, Bf16ToF32(s.val_row(h, u)[c]));
                  mx = std::max(mx, Bf16ToF32(s.val_row(h, u)[c]));
                }
                const float bound =
                    (mx - mn) / ((1 << bits) - 1) * 0.5f * 1.01f + 1e-3f * std::abs(mn) + 1e-6f;
                for (int c = c0; c < c1; ++c) {
                  ASSERT_LE(std::abs(vh[c] - Bf16ToF32(s.val_row(h, u)[c])), bound);
                }
              }
            }
          }
        }
      }
    }
  }
}

// A prompt quantized in chunks on a pool holds the same bytes as one quantized a token per call
// on one thread (each group from its own exact rows, whatever quantizes it): every dequantized
// key and value row is equal bit for bit.
TEST(KiviTest, ChunkedPooledFlushEqualsTokenByToken) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  constexpr int64_t kT = 450;
  for (const LayerGeometry& g : {GqaGeometry(8, 4, 48), GqaGeometry(8, 2, 64), MlaGeometry()}) {
    for (int bits : {2, 4}) {
      Made one = MakeKivi(g, bits), chunked = MakeKivi(g, bits);
      std::vector<float> k, v;
      for (int64_t t = 0; t < kT; ++t) {
        ASSERT_OK(one.cache->BeginCall(1, CallKind::kDecode));
        testing::RowAt(g, seed, t, 0.f, &k, &v);
        ASSERT_OK(one.cache->Append(0, k.data(), v.data()));
        ASSERT_OK(one.cache->EndCall());
      }
      for (int64_t t0 = 0; t0 < kT; t0 += 200) {
        const int64_t n = std::min<int64_t>(200, kT - t0);
        ASSERT_OK(chunked.cache->BeginCall(n, CallKind::kPrefill, &pool));
        for (int64_t t = t0; t < t0 + n; ++t) {
          testing::RowAt(g, seed, t, 0.f, &k, &v);
          ASSERT_OK(chunked.cache->Append(0, k.data(), v.data()));
        }
        ASSERT_OK(chunked.cache->EndCall());
      }
      const int64_t nq = chunked.policy->quantized_groups(0) * KiviPolicy::kGroup;
      ASSERT_EQ(one.policy->quantized_groups(0), chunked.policy->quantized_groups(0));
      ASSERT_EQ(nq, KiviPolicy::GroupsAfter(kT) * KiviPolicy::kGroup);
      std::vector<float> a(g.k_dim), b(g.k_dim), av(g.v_dim), bv(g.v_dim);
      for (int h = 0; h < g.n_kv_heads; ++h) {
        for (int64_t u = 0; u < nq; ++u) {
          one.policy->DequantKey(0, h, u, a.data());
          chunked.policy->DequantKey(0, h, u, b.data());
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * g.k_dim))
              << "key, head " << h << " row " << u << " bits " << bits;
          one.policy->DequantValue(0, h, u, av.data());
          chunked.policy->DequantValue(0, h, u, bv.data());
          ASSERT_EQ(0, std::memcmp(av.data(), bv.data(), sizeof(float) * g.v_dim))
              << "value, head " << h << " row " << u << " bits " << bits;
        }
      }
    }
  }
}

// Attention through the policy equals a float64 softmax over the dequantized rows of complete
// groups before the query and the exact rows after them. Tolerance 2e-5: f32 accumulation.
// D = 48 and MLA: the dequantize-then-attend loop; D = 64: packed slots read by PackedAttend
// (f32; int8: the integer dot products, within 2e-3 here, their own bound in
// kernels/packed_attention_test.cc).
TEST(KiviTest, AttentionMatchesDequantizedReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(3);
  struct Case {
    LayerGeometry g;
    const char* math;
    double tol;
  };
  for (const Case& cs : {Case{GqaGeometry(4, 2, 48), "f32", 2e-5}, Case{MlaGeometry(), "f32", 2e-5},
                         Case{GqaGeometry(4, 2, 64), "f32", 2e-5},
                         Case{GqaGeometry(4, 2, 64), "int8", 2e-3}}) {
    const LayerGeometry& g = cs.g;
    SCOPED_TRACE(::testing::Message() << "k_dim " << g.k_dim << " " << cs.math);
    Made m = MakeKivi(g, 4, cs.math);
    EXPECT_EQ(m.policy->packed(0), g.kind != AttnKind::kMla && g.k_dim % 32 == 0);
    // The queries sit in the last call (rows [100, 300)): KIVI serves a call's queries from the
    // exact rows its first row still needs (pages wholly before it inside quantized groups go).
    Build(m.cache.get(), seed, 100, 300);
    // The exact rows, from a full cache of the same rows (KIVI released some of its pages).
    auto full = testing::NewCache(g, PolicySpec{"full", {}});
    Build(full.get(), seed, 100, 300);
    std::vector<std::vector<float>> keys, vals;
    testing::StoreRows(full->store(0), &keys, &vals);
    Rng rng(seed);
    for (int64_t pos : {int64_t{100}, int64_t{255}, int64_t{299}}) {
      const int64_t qrows = std::min(m.policy->quantized_groups(0), (pos + 1) / 32) * 32;
      auto k2 = keys;
      auto v2 = vals;
      for (int h = 0; h < g.n_kv_heads; ++h) {
        for (int64_t u = 0; u < qrows; ++u) {
          m.policy->DequantKey(0, h, u, k2[h].data() + u * g.k_dim);
          m.policy->DequantValue(0, h, u, v2[h].data() + u * g.v_dim);
        }
      }
      std::vector<int64_t> rows(pos + 1);
      for (int64_t u = 0; u <= pos; ++u) rows[u] = u;
      const std::vector<float> q = RandomQuery(g, rng);
      const std::vector<double> ref = testing::RefAttention(g, q.data(), k2, v2, {rows});
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> out(g.n_q_heads * g.v_dim);
        const int64_t before = m.cache->counters().bytes_read_total;
        ASSERT_OK(m.cache->Attend(0, q.data(), pos, p, out.data()));
        EXPECT_LT(testing::MaxAbsDiff(out, ref), cs.tol) << "pos " << pos;
        EXPECT_EQ(m.cache->counters().bytes_read_total - before,
                  (qrows / 32) * m.policy->GroupBytes(0) + (pos + 1 - qrows) * g.bytes_per_token());
      }
    }
  }
}

// §12.19: KIVI-4, D = 128, T = 16352, Q = 1: the rate is the closed form of §8
// (5.0215), the last 32 tokens are exact; after the next call the exact pages of the quantized
// prefix are released, so resident memory is the quantized bytes + the one page still exact.
TEST(KiviTest, ClosedFormRateAndMemoryShrinks) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = GqaGeometry(1, 1, 128);
  Made m = MakeKivi(g, 4);
  const int64_t T = 16352, D = 128;
  Build(m.cache.get(), seed, 64, T);
  const int64_t n_res = 32, nb2 = (T - n_res + 63) / 64;
  const double closed = (2.0 * n_res * D * 16 + nb2 * ((4 + 4) * 64 * D + 2 * D * 32 +
                                                       64 * (D / 32) * 32)) /
                        (2.0 * T * D);
  EXPECT_NEAR(closed, 5.0215, 1e-4);
  EXPECT_EQ(m.policy->quantized_groups(0) * 32, T - 32);
  const double counted =
      (m.policy->QuantizedBytes(0) + n_res * g.bytes_per_token()) * 8.0 / (2.0 * T * D);
  EXPECT_DOUBLE_EQ(counted, closed);
  Rng rng(seed);
  const std::vector<float> q = RandomQuery(g, rng);
  std::vector<float> out(g.v_dim);
  ASSERT_OK(m.cache->Attend(0, q.data(), T - 1, nullptr, out.data()));
  EXPECT_DOUBLE_EQ(m.cache->counters().last_step.bytes_read * 8.0 / (2.0 * T * D), closed);
  const int64_t full = m.cache->store(0).resident_bytes();
  EXPECT_EQ(full, (T + 63) / 64 * 64 * g.bytes_per_token());
  // The next token: a new call; once its row is in, pages entirely inside the quantized prefix
  // go (before the call's first query).
  ASSERT_OK(m.cache->EndCall());
  ASSERT_OK(m.cache->BeginCall(1, CallKind::kDecode));
  std::vector<float> k, v;
  testing::RowAt(g, seed, T, 0.f, &k, &v);
  ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
  ASSERT_OK(m.cache->Attend(0, q.data(), T, nullptr, out.data()));  // readable after the release
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  const int64_t kept_pages = (T + 1 + 63) / 64 - (T - 32) / 64;
  EXPECT_EQ(m.cache->store(0).resident_bytes(), kept_pages * 64 * g.bytes_per_token());
  EXPECT_EQ(m.cache->ResidentBytes(),
            m.policy->QuantizedBytes(0) + kept_pages * 64 * g.bytes_per_token());
  EXPECT_LT(m.cache->ResidentBytes(), full / 3);
  // A query before the call's first row would need exact rows that are gone: an error, not a
  // crash or a read of freed memory.
  Status old = m.cache->Attend(0, q.data(), 100, nullptr, out.data());
  EXPECT_EQ(old.code(), StatusCode::kOutOfRange) << old.ToString();
  EXPECT_NE(old.message().find("released"), std::string::npos) << old.ToString();
}


// The `attn-math` setting's default, `cache`, takes the packed read's arithmetic from the cache's
// --attn-math (LayerGeometry::attn_math, set by Model::NewCache): int8 -> the integer path; f32,
// bf16 and auto -> f32 (kernels/packed_attention.h, PackedCodesMath). An explicit setting wins.
TEST(KiviTest, AttnMathFollowsTheCacheUnlessSet) {
  for (AttnMath m : {AttnMath::kF32, AttnMath::kBF16, AttnMath::kInt8, AttnMath::kAuto}) {
    LayerGeometry g = GqaGeometry(4, 2, 64);
    g.attn_math = m;
    for (const char* setting : {"cache", "f32", "int8"}) {
      SCOPED_TRACE(std::string(AttnMathName(m)) + " / " + setting);
      Made k = MakeKivi(g, 2, setting);
      const std::string name = setting;
      const geodesia::PackedMath want =
          name == "int8" || (name == "cache" && m == AttnMath::kInt8)
              ? geodesia::PackedMath::kInt8
              : geodesia::PackedMath::kF32;
      EXPECT_EQ(k.policy->math(), want);
    }
  }
}

}  // namespace
}  // namespace strata::baselines
