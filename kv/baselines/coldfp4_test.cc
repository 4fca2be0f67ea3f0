#include "kv/baselines/coldfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/status_testing.h"
#include "kv/baselines/test_util.h"

namespace strata::baselines {
namespace {

using testing::Build;
using testing::GqaGeometry;
using testing::MlaGeometry;
using testing::RandomQuery;
using testing::RefAttention;
using testing::StoreRows;

struct Made {
  std::unique_ptr<KvCache> cache;
  ColdFp4Policy* policy = nullptr;
};

Made MakeCache(const LayerGeometry& g) {
  Made out;
  auto p = MakePolicy(PolicySpec{"coldfp4", {}});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  out.policy = dynamic_cast<ColdFp4Policy*>(p->get());
  EXPECT_NE(out.policy, nullptr);
  auto c = KvCache::Create({g}, std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  out.cache = std::move(c).value();
  return out;
}

LayerGeometry Gqa(int dim) {
  LayerGeometry g = GqaGeometry(/*q_heads=*/4, /*kv_heads=*/2, dim);
  g.scale = 1.f / std::sqrt(static_cast<float>(dim));
  return g;
}

// Round to nearest on {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, saturating at 6.
TEST(ColdFp4Test, E2M1RoundsToNearestEven) {
  const std::vector<std::pair<float, float>> fixture = {
      {0.f, 0.f},    {0.2f, 0.f},   {0.25f, 0.f},  {0.3f, 0.5f},   {0.75f, 1.f},
      {1.2f, 1.f},   {1.25f, 1.f},  {1.75f, 2.f},  {2.4f, 2.f},    {2.5f, 2.f},
      {2.6f, 3.f},   {3.5f, 4.f},   {4.9f, 4.f},   {5.f, 4.f},     {5.1f, 6.f},
      {7.f, 6.f},    {100.f, 6.f},  {-0.75f, -1.f}, {-3.2f, -3.f}, {-5.5f, -6.f}};
  for (const auto& [x, want] : fixture) {
    const uint8_t c = E2M1FromFloat(x);
    EXPECT_EQ(E2M1ToFloat(c), want) << x;
  }
  EXPECT_EQ(E2M1FromFloat(6.f), 7);
  EXPECT_EQ(E2M1FromFloat(-1.5f), 8 | 3);
}

// E4M3: every positive code decodes and re-encodes to itself; 448 is the largest, 2^-9 the
// smallest; values between round to nearest even and saturate.
TEST(ColdFp4Test, E4M3ScaleCodes) {
  for (int b = 1; b <= 0x7E; ++b) {
    EXPECT_EQ(E4M3FromFloat(E4M3ToFloat(static_cast<uint8_t>(b))), b) << b;
  }
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.f);
  EXPECT_EQ(E4M3ToFloat(0x38), 1.f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(E4M3FromFloat(1000.f), 0x7E);
  EXPECT_EQ(E4M3ToFloat(E4M3FromFloat(1.0625f)), 1.f);     // tie: to the even mantissa 0
  EXPECT_EQ(E4M3ToFloat(E4M3FromFloat(1.1875f)), 1.25f);   // tie: to the even mantissa 2
  EXPECT_EQ(E4M3ToFloat(E4M3FromFloat(0.55f)), 0.5625f);
}

// A hand-computed row of 20 values (a block of 16 and a zero-padded block of 4) with page scale
// g = 0.5: block 1's amax 3 gives the scale E4M3(3 / 6 / 0.5) = 1 and x / (1 x 0.5) on the
// grid; block 2's amax 0.9 gives E4M3(0.3) = 0.3125 (0.3 = 1.2 x 2^-2, mantissa 1.25 nearest),
// so x / 0.15625.
TEST(ColdFp4Test, BlockScaleAndCodesByHand) {
  const float x[20] = {3.f, -1.5f, 0.7f, 0.1f, 0.f, 2.f, -2.9f, 1.f,
                       0.3f, 0.2f, -0.6f, 1.2f, 0.4f, -0.25f, 2.5f, 1.75f,
                       0.9f, -0.2f, 0.45f, 0.05f};
  std::vector<uint8_t> row(Fp4RowBytes(20));
  ASSERT_EQ(row.size(), 10u + 2u);
  Fp4EncodeRow(x, 20, 0.5f, row.data());
  EXPECT_EQ(E4M3ToFloat(row[10]), 1.f);
  EXPECT_EQ(E4M3ToFloat(row[11]), 0.3125f);
  std::vector<float> back(20);
  Fp4DecodeRow(row.data(), 20, 0.5f, back.data());
  // Block 1: x / 0.5 = 6, -3, 1.4, 0.2, 0, 4, -5.8, 2, 0.6, 0.4, -1.2, 2.4, 0.8, -0.5, 5, 3.5
  //   -> 6, -3, 1.5, 0, 0, 4, -6, 2, 0.5, 0.5, -1, 2, 1, -0.5, 4, 4 (x 0.5).
  const float want1[16] = {6, -3, 1.5f, 0, 0, 4, -6, 2, 0.5f, 0.5f, -1, 2, 1, -0.5f, 4, 4};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(back[i], want1[i] * 0.5f) << i;
  // Block 2: x / 0.15625 = 5.76, -1.28, 2.88, 0.32 -> 6, -1.5, 3, 0.5 (x 0.15625).
  const float want2[4] = {6, -1.5f, 3, 0.5f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[16 + i], want2[i] * 0.15625f) << i;
  // The page scale is NVFP4's: amax(page) / (448 x 6).
}

// Pages: after 330 rows (a 200-row prefill, then a 130-row call), pages 1-4 are FP4, page 0
// and page 5 (rows 320-329) exact. A read at limit 330 takes pages 0 and 5 from the store bit for
// bit and pages 1-4 as FP4; its output equals attention over those rows (2e-5) and is within the
// bound the rows' own quantization errors give of full's (below); the page scales are
// amax / 2688.
TEST(ColdFp4Test, FirstAndLastPagesExactBitForBit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {Gqa(64), MlaGeometry()}) {
    SCOPED_TRACE(g.k_dim);
    Made m = MakeCache(g);
    const int64_t n0 = 200, n = 330;
    Build(m.cache.get(), seed, n0, n);
    const LayerStore& s = m.cache->store(0);
    EXPECT_EQ(m.policy->demoted_pages(0), 4);
    std::vector<std::vector<float>> ak(g.n_kv_heads), av(g.n_kv_heads), fk, fv;
    // The rows as bf16, from a full cache (the policy released its early pages).
    auto fc = testing::NewCache(g, PolicySpec{"full", {}});
    Build(fc.get(), seed, n0, n);
    StoreRows(fc->store(0), &fk, &fv);
    std::vector<float> k(g.k_dim), v(g.v_dim);
    for (int h = 0; h < g.n_kv_heads; ++h) {
      for (int64_t u = 0; u < n; ++u) {
        m.policy->RowAsRead(0, s, h, u, n, k.data(), v.data());
        const bool exact = u < 64 || u >= 320;
        bool same = true;
        for (int c = 0; c < g.k_dim; ++c) same &= k[c] == fk[h][u * g.k_dim + c];
        for (int c = 0; c < g.v_dim; ++c) same &= v[c] == fv[h][u * g.v_dim + c];
        ASSERT_EQ(same, exact) << "row " << u;
        ak[h].insert(ak[h].end(), k.begin(), k.end());
        av[h].insert(av[h].end(), v.begin(), v.end());
      }
      for (int64_t p = 1; p <= 4; ++p) {
        float amax = 0;
        for (int64_t u = p * 64; u < (p + 1) * 64; ++u) {
          for (int c = 0; c < g.k_dim; ++c) amax = std::max(amax, std::abs(fk[h][u * g.k_dim + c]));
        }
        EXPECT_EQ(m.policy->page_scale(0, h, p, false), amax / (448.f * 6.f));
      }
    }
    std::vector<int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    Rng rng(seed);
    for (int t = 0; t < 3; ++t) {
      const std::vector<float> q = RandomQuery(g, rng);
      std::vector<float> out(g.n_q_heads * g.v_dim);
      ASSERT_OK(m.cache->Attend(0, q.data(), n - 1, nullptr, out.data()));
      EXPECT_LT(testing::MaxAbsDiff(out, RefAttention(g, q.data(), ak, av, {all})), 2e-5);
      const std::vector<double> full = RefAttention(g, q.data(), fk, fv, {all});
      testing::ExpectWithinQuantizedAttentionBound(g, q.data(), ak, av, fk, fv, n, out, full,
                                                   /*mean_within=*/0.1);
    }
  }
}

// Resident = the store's pages still held + demoted pages x PageBytes: at head dim 64 a page of
// one KV head is 64 x (32 + 4) bytes per K or V + 8 bytes of f32 page scales (4.5 bits per value
// + 64 bits per page). Bytes read at limit L = exact rows x the store's bytes per row + FP4
// pages x PageBytes.
TEST(ColdFp4Test, AccountingIsTheRealBytes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = Gqa(64);
  EXPECT_EQ(ColdFp4Policy::PageBytes(g), 2 * (64 * (36 + 36) + 8));
  EXPECT_EQ(ColdFp4Policy::DemotedAfter(127), 0);
  EXPECT_EQ(ColdFp4Policy::DemotedAfter(128), 1);
  Made m = MakeCache(g);
  const int64_t n0 = 200, n = 330;
  Build(m.cache.get(), seed, n0, n);
  const LayerStore& s = m.cache->store(0);
  // Demoted pages wholly before row 200 (pages 1 and 2) are released; page 0 never is.
  EXPECT_EQ(s.resident_bytes(), s.full_resident_bytes() - 2 * 64 * g.bytes_per_token());
  EXPECT_EQ(m.cache->ResidentBytes(), s.resident_bytes() + 4 * ColdFp4Policy::PageBytes(g));
  EXPECT_LE(m.cache->ResidentBytes(), m.policy->PeakResidentBytes(0, g, n));
  Rng rng(seed);
  const std::vector<float> q = RandomQuery(g, rng);
  std::vector<float> out(g.n_q_heads * g.v_dim);
  ASSERT_OK(m.cache->Attend(0, q.data(), n - 1, nullptr, out.data()));
  const ReadStats& st = m.cache->counters().last_step;
  EXPECT_EQ(st.rows_attended, n * g.n_kv_heads);
  EXPECT_EQ(st.bytes_read, (64 + 10) * g.bytes_per_token() + 4 * ColdFp4Policy::PageBytes(g));
  EXPECT_EQ(st.bytes_read, ColdFp4Policy::ReadBytes(g, n));
  // A query at 256 (L = 257): pages 1-3 FP4, page 4's first row exact.
  const int64_t before = m.cache->counters().bytes_read_total;
  ASSERT_OK(m.cache->Attend(0, q.data(), 256, nullptr, out.data()));
  EXPECT_EQ(m.cache->counters().bytes_read_total - before,
            (64 + 1) * g.bytes_per_token() + 3 * ColdFp4Policy::PageBytes(g));
}

TEST(ColdFp4Test, SettingErrors) {
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {"coldfp4:ratio=8", "coldfp4 does not take 'ratio'"},
           {"coldfp4:bits=4", "coldfp4 does not take 'bits'"},
           {"coldfp4:page=32", "page"}}) {
    auto parsed = ParsePolicySpec(text);
    Status st = parsed.status();
    if (parsed.ok()) st = MakePolicy(*parsed).status();
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_NE(st.ToString().find(needle), std::string::npos) << st.ToString();
  }
}

}  // namespace
}  // namespace strata::baselines
