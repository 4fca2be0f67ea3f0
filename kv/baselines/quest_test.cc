#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

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
  QuestPolicy* policy = nullptr;
};

Made MakeQuest(const LayerGeometry& g, std::map<std::string, std::string> s) {
  Made out;
  auto p = MakeQuestPolicy(PolicySpec{"quest", std::move(s)});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  out.policy = static_cast<QuestPolicy*>(p->get());
  auto c = KvCache::Create({g}, std::move(p).value());
  EXPECT_TRUE(c.ok());
  out.cache = std::move(c).value();
  return out;
}

// docs/reference/geodesia-kv.md §12.18: T = 1024, D = 32, 2 pages: resident 16.25 and read 3.25
// bits per value exactly (the last query: 2 selected pages + its full current page + the 16
// boxes).
TEST(QuestBaselineTest, ClosedFormRates) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = GqaGeometry(1, 1, 32);
  Made m = MakeQuest(g, {{"quest-pages", "2"}});
  const int64_t T = 1024;
  Build(m.cache.get(), seed, T, T);
  const double values_bits = static_cast<double>(T) * g.bytes_per_token() / 16.0;
  EXPECT_DOUBLE_EQ(m.cache->ResidentBytes() / values_bits, 16.25);
  Rng rng(seed);
  const std::vector<float> q = RandomQuery(g, rng);
  std::vector<float> out(g.v_dim);
  ASSERT_OK(m.cache->Attend(0, q.data(), T - 1, nullptr, out.data()));
  EXPECT_DOUBLE_EQ(m.cache->counters().last_step.bytes_read / values_bits, 3.25);
  EXPECT_EQ(m.policy->last_selection(0, 0).size(), 2u);
}

// The true maximum score (float64) of query head qh [k_dim] over page p of KV head h: what the
// Quest bound must not fall below.
double PageMaxScore(const LayerStore& s, const float* qh, int h, int64_t p) {
  const LayerGeometry& g = s.geometry();
  double best = -1e300;
  for (int64_t u = p * 64; u < (p + 1) * 64; ++u) {
    double a = 0;
    for (int c = 0; c < g.k_dim; ++c) {
      a += static_cast<double>(qh[c]) * Bf16ToF32(s.key_row(h, u)[c]);
    }
    best = std::max(best, a * g.scale);
  }
  return best;
}

// Boxes are f16 rounded outward, so U_b(q) bounds the true max logit of every page for random
// queries; and keep rules follow the reference (§4: ceil(F * n_cand), at least 1).
TEST(QuestBaselineTest, BoundIsAnUpperBound) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    Made m = MakeQuest(g, {});
    Build(m.cache.get(), seed, 640, 640);
    const LayerStore& s = m.cache->store(0);
    ASSERT_EQ(m.policy->n_boxes(0), 10);
    Rng rng(seed);
    for (int t = 0; t < 200; ++t) {
      const std::vector<float> q = RandomQuery(g, rng, 3.f);
      for (int hq = 0; hq < g.n_q_heads; ++hq) {
        const int h = hq / g.group_size();
        for (int64_t p = 0; p < 10; ++p) {
          const double best = PageMaxScore(s, q.data() + hq * g.k_dim, h, p);
          // f32 rounding of the bound's sum: 1e-5 relative slack.
          ASSERT_GE(m.policy->Bound(0, h, p, q.data() + hq * g.k_dim) + 1e-5 * std::abs(best) +
                        1e-6,
                    best);
        }
      }
    }
    for (int64_t p = 0; p < 10; ++p) {
      for (int c = 0; c < g.k_dim; ++c) {
        float mn = 1e30f, mx = -1e30f;
        for (int64_t u = p * 64; u < (p + 1) * 64; ++u) {
          mn = std::min(mn, Bf16ToF32(s.key_row(0, u)[c]));
          mx = std::max(mx, Bf16ToF32(s.key_row(0, u)[c]));
        }
        EXPECT_LE(F16ToF32(m.policy->box_min(0, 0, p)[c]), mn);
        EXPECT_GE(F16ToF32(m.policy->box_max(0, 0, p)[c]), mx);
        EXPECT_EQ(F16RoundDown(mn), m.policy->box_min(0, 0, p)[c]);
      }
    }
  }
  QuestConfig c;
  c.keep = 0.125;
  EXPECT_EQ(c.KeepPages(255), 32);
  EXPECT_EQ(c.KeepPages(3), 1);
  EXPECT_EQ(c.KeepPages(0), 0);
  QuestConfig r;
  r.ratio = 8;
  EXPECT_EQ(r.KeepPages(255), 32);
  EXPECT_EQ(r.KeepPages(3), 1);
}

// Keys beyond the f16 range (|k| = 1e6, bf16 999424): the boxes round outward to +-inf instead of
// clamping to +-65504, so U_b(q) still bounds every row of the page (it was below the true score
// of a 1e6 key for q_c > 0 when the box max was clamped). Pages: 0 ordinary, 1 one +1e6 key,
// 2 one -1e6 key, 3 mixed (+1e6 and -1e6 in one channel, -1e6 in another on every row).
TEST(QuestBaselineTest, BoundHoldsBeyondF16Range) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    Made m = MakeQuest(g, {{"quest-pages", "1"}});
    const int64_t n = 4 * 64 + 10;
    m.cache->BeginPrefill(0, n);
    ASSERT_OK(m.cache->BeginCall(n, CallKind::kPrefill));
    std::vector<float> k, v;
    for (int64_t u = 0; u < n; ++u) {
      testing::RowAt(g, seed, u, 0.f, &k, &v);
      for (int h = 0; h < g.n_kv_heads; ++h) {
        float* kh = k.data() + static_cast<int64_t>(h) * g.k_dim;
        if (u == 64 + 5) kh[3] = 1e6f;
        if (u == 128 + 9) kh[3] = -1e6f;
        if (u == 192 + 1) kh[0] = 1e6f;
        if (u == 192 + 2) kh[0] = -1e6f;
        if (u >= 192 && u < 256) kh[1] = -1e6f;
      }
      ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
    }
    ASSERT_OK(m.cache->EndCall());
    ASSERT_OK(m.cache->EndPrefill(nullptr));
    const LayerStore& s = m.cache->store(0);
    ASSERT_EQ(m.policy->n_boxes(0), 4);
    EXPECT_EQ(F16ToF32(m.policy->box_max(0, 0, 1)[3]), std::numeric_limits<float>::infinity());
    EXPECT_EQ(F16ToF32(m.policy->box_min(0, 0, 2)[3]), -std::numeric_limits<float>::infinity());
    Rng rng(seed);
    for (int t = 0; t < 100; ++t) {
      std::vector<float> q = RandomQuery(g, rng, 1.f);
      if (t % 4 == 1) {  // a zero channel must not make the bound NaN (0 * inf)
        for (int hq = 0; hq < g.n_q_heads; ++hq) q[hq * g.k_dim + 3] = 0.f;
      }
      for (int hq = 0; hq < g.n_q_heads; ++hq) {
        const int h = hq / g.group_size();
        for (int64_t p = 0; p < 4; ++p) {
          const double best = PageMaxScore(s, q.data() + hq * g.k_dim, h, p);
          const float b = m.policy->Bound(0, h, p, q.data() + hq * g.k_dim);
          ASSERT_FALSE(std::isnan(b)) << "page " << p;
          // f32 rounding of the bound's sum: 1e-5 relative slack (as above).
          ASSERT_GE(b + 1e-5 * std::abs(best) + 1e-6, best) << "page " << p << " head " << hq;
        }
      }
    }
    // A query along +channel 3 must select page 1 (its +1e6 key dominates every score).
    std::vector<float> q(static_cast<size_t>(g.n_q_heads) * g.k_dim, 0.f);
    for (int hq = 0; hq < g.n_q_heads; ++hq) q[hq * g.k_dim + 3] = 1.f;
    std::vector<float> out(static_cast<size_t>(g.n_q_heads) * g.v_dim);
    ASSERT_OK(m.cache->BeginCall(0, CallKind::kDecode));
    ASSERT_OK(m.cache->Attend(0, q.data(), n - 1, nullptr, out.data()));
    ASSERT_OK(m.cache->EndCall());
    ASSERT_EQ(m.policy->last_selection(0, 0).size(), 1u);
    EXPECT_EQ(m.policy->last_selection(0, 0)[0], 1);
  }
}

// The read is exact attention over the selected pages and the current page's rows (unselected
// pages get no weight), for shared and per-head selection. Tolerance 2e-5: f32 accumulation.
TEST(QuestBaselineTest, ReadsSelectedPagesExactly) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    for (const std::string heads : {"shared", "each"}) {
      SCOPED_TRACE(heads);
      Made m = MakeQuest(g, {{"quest-keep", "0.25"}, {"quest-heads", heads}});
      const int64_t n = 700;
      Build(m.cache.get(), seed, 600, n);
      std::vector<std::vector<float>> keys, vals;
      testing::StoreRows(m.cache->store(0), &keys, &vals);
      Rng rng(seed);
      for (int64_t pos : {int64_t{600}, int64_t{640}, n - 1}) {
        const std::vector<float> q = RandomQuery(g, rng, 2.f);
        std::vector<float> out(g.n_q_heads * g.v_dim);
        ASSERT_OK(m.cache->Attend(0, q.data(), pos, nullptr, out.data()));
        const int64_t cur = pos / 64;
        const int64_t k = static_cast<int64_t>(std::ceil(0.25 * cur));
        for (int hq = 0; hq < g.n_q_heads; ++hq) {
          const int h = hq / g.group_size();
          const auto& sel = m.policy->last_selection(0, heads == "each" ? hq : h);
          ASSERT_EQ(static_cast<int64_t>(sel.size()), k);
          std::vector<int64_t> rows;
          for (int64_t p : sel) {
            ASSERT_LT(p, cur);
            for (int64_t u = p * 64; u < (p + 1) * 64; ++u) rows.push_back(u);
          }
          for (int64_t u = cur * 64; u <= pos; ++u) rows.push_back(u);
          std::vector<std::vector<int64_t>> per(g.n_kv_heads, rows);
          const std::vector<double> ref = testing::RefAttention(g, q.data(), keys, vals, per);
          for (int c = 0; c < g.v_dim; ++c) {
            ASSERT_NEAR(out[hq * g.v_dim + c], ref[hq * g.v_dim + c], 2e-5) << "pos " << pos;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::baselines
