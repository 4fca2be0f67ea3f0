#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/status_testing.h"
#include "core/thread_pool.h"
#include "kv/baselines/baselines.h"
#include "kv/baselines/common.h"
#include "kv/baselines/test_util.h"

namespace strata::baselines {
namespace {

using testing::AllBaselines;
using testing::Build;
using testing::GqaGeometry;
using testing::MlaGeometry;
using testing::NewCache;
using testing::RandomQuery;

PolicySpec Spec(const std::string& name, std::map<std::string, std::string> s = {}) {
  return PolicySpec{name, std::move(s)};
}

// Perturbing (+10) every key and value after position p changes nothing at p, for every
// baseline, on GQA and MLA layers, for positions after the compression point (reads before it
// are the full policy's). The outputs must be bit-identical.
TEST(BaselineTest, CausalityEveryPolicy) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n0 = 200, n = 330;
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    for (const std::string& name : AllBaselines()) {
      SCOPED_TRACE(name + (g.kind == AttnKind::kMla ? " mla" : " gqa"));
      for (int64_t p : {n0, n0 + 37, n0 + 63, n - 2}) {
        // The ratio reaches the policies that declare one (KIVI's rate is set by its bits).
        auto a = NewCache(g, Spec(name, SettingsFor(name, {{"ratio", "4"}})));
        auto b = NewCache(g, Spec(name, SettingsFor(name, {{"ratio", "4"}})));
        Build(a.get(), seed, n0, n);
        Build(b.get(), seed, n0, n, /*perturb_after=*/p);
        Rng rng(seed + p);
        const std::vector<float> q = RandomQuery(g, rng);
        std::vector<float> oa(g.n_q_heads * g.v_dim), ob(oa.size());
        ASSERT_OK(a->Attend(0, q.data(), p, nullptr, oa.data()));
        ASSERT_OK(b->Attend(0, q.data(), p, nullptr, ob.data()));
        ASSERT_EQ(oa, ob) << "position " << p;
      }
    }
  }
}

// Rows read per KV head after a compression point at n0 rows, g generated rows later, against
// each policy's documented budget (m = max(1, round(n0 / ratio))).
TEST(BaselineTest, BudgetRespected) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n0 = 1000, extra = 7;
  const double ratio = 8;
  const int64_t m = BudgetRows(n0, ratio);
  ASSERT_EQ(m, 125);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    struct Case {
      std::string name;
      int64_t rows;  // per KV head at limit n0 + extra
    };
    const int64_t w = 32;
    const std::vector<Case> cases = {
        {"streaming", 4 + m}, {"h2o", m + extra},         {"h2o-recent", m + extra},
        {"snapkv", w + m + extra}, {"random", m + extra},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      auto cache = NewCache(g, Spec(c.name, {{"ratio", "8"}}));
      Build(cache.get(), seed, n0, n0 + extra);
      Rng rng(seed);
      const std::vector<float> q = RandomQuery(g, rng);
      std::vector<float> out(g.n_q_heads * g.v_dim);
      ASSERT_OK(cache->Attend(0, q.data(), n0 + extra - 1, nullptr, out.data()));
      const ReadStats& st = cache->counters().last_step;
      EXPECT_EQ(st.rows_attended, c.rows * g.n_kv_heads);
      EXPECT_EQ(st.bytes_read, c.rows * g.bytes_per_token());
      EXPECT_LT(st.bytes_read, (n0 + extra) * g.bytes_per_token());
    }
    // Quest: k = round(n_cand / ratio) pages of the candidates + the current page's rows.
    {
      auto cache = NewCache(g, Spec("quest", {{"ratio", "8"}}));
      Build(cache.get(), seed, n0, n0 + extra);
      Rng rng(seed);
      const std::vector<float> q = RandomQuery(g, rng);
      std::vector<float> out(g.n_q_heads * g.v_dim);
      const int64_t pos = n0 + extra - 1;
      ASSERT_OK(cache->Attend(0, q.data(), pos, nullptr, out.data()));
      const int64_t cur = pos / 64, k = BudgetRows(cur, ratio);
      const int64_t rows = k * 64 + (pos + 1 - cur * 64);
      EXPECT_EQ(cache->counters().last_step.rows_attended, rows * g.n_kv_heads);
    }
  }
}

// Ratio 1 keeps every row: the read is the full policy's, bit for bit.
TEST(BaselineTest, RatioOneEqualsFull) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n0 = 150, n = 153;
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    auto full = NewCache(g, Spec("full"));
    Build(full.get(), seed, n0, n);
    for (const char* name :
         {"streaming", "h2o", "h2o-recent", "snapkv", "quest", "random"}) {
      SCOPED_TRACE(name);
      auto c = NewCache(g, Spec(name, {{"ratio", "1"}}));
      Build(c.get(), seed, n0, n);
      Rng rng(seed);
      const std::vector<float> q = RandomQuery(g, rng);
      std::vector<float> a(g.n_q_heads * g.v_dim), b(a.size());
      ASSERT_OK(full->Attend(0, q.data(), n0, nullptr, a.data()));
      ASSERT_OK(c->Attend(0, q.data(), n0, nullptr, b.data()));
      EXPECT_EQ(a, b);
    }
  }
}

TEST(BaselineTest, InvalidSettingsAreClearErrors) {
  auto expect_error = [](const PolicySpec& s, const std::string& needle) {
    auto p = MakePolicy(s);
    ASSERT_FALSE(p.ok()) << s.name;
    EXPECT_NE(p.status().ToString().find(needle), std::string::npos) << p.status().ToString();
  };
  for (const std::string& name : AllBaselines()) {
    if (!FindPolicy(name)->settings.Takes("ratio")) {
      // A setting the policy does not declare is an error, not a silent no-op.
      expect_error(Spec(name, {{"ratio", "8"}}), name + " does not take 'ratio'");
      continue;
    }
    expect_error(Spec(name, {{"ratio", "0.5"}}), "--ratio = 0.5");
    expect_error(Spec(name, {{"ratio", "abc"}}), "--ratio = 'abc'");
  }
  expect_error(Spec("streaming", {{"bits", "5"}}), "streaming does not take 'bits'");
  expect_error(Spec("h2o", {{"sinks", "2"}}), "h2o does not take 'sinks'");
  expect_error(Spec("snapkv", {{"snap-windw", "8"}}), "did you mean 'snap-window'?");
  expect_error(Spec("quest", {{"quest-keep", "1.5"}}), "--quest-keep = 1.5");
  expect_error(Spec("quest", {{"quest-keep", "0"}}), "--quest-keep = 0");
  expect_error(Spec("quest", {{"quest-pages", "-2"}}), "--quest-pages = -2");
  expect_error(Spec("quest", {{"quest-pages", "2"}, {"quest-keep", "0.5"}}), "not both");
  expect_error(Spec("quest", {{"quest-heads", "some"}}), "--quest-heads = 'some'");
  expect_error(Spec("snapkv", {{"snap-kernel", "4"}}), "--snap-kernel = 4");
  expect_error(Spec("snapkv", {{"snap-window", "0"}}), "--snap-window = 0");
  expect_error(Spec("h2o", {{"h2o-queries", "-1"}}), "--h2o-queries = -1");
  expect_error(Spec("streaming", {{"sinks", "-1"}}), "--sinks = -1");
  expect_error(Spec("h2o-old"), "unknown policy 'h2o-old'");
  // Every baseline binds to GQA and MLA layers alike.
  for (const std::string& name : AllBaselines()) {
    for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
      auto p = MakePolicy(Spec(name));
      ASSERT_TRUE(p.ok());
      EXPECT_TRUE(KvCache::Create({g}, std::move(p).value()).ok()) << name;
    }
  }
}

// The observer's weights are the exact causal softmax: against a float64 reference, and the same
// with a 3-thread pool. Tolerance 2e-6 absolute + 1e-5 relative: f32 dot products of O(1) values
// over 40 channels (score error ~1e-6), the max and the sum are f64.
class CapturePolicy final : public Policy {
 public:
  std::string name() const override { return "capture"; }
  Status Bind(const std::vector<LayerGeometry>&) override { return OkStatus(); }
  int64_t observation_queries(int64_t prompt_len) const override { return 5; }
  Status OnPrefillStats(int layer, const LayerStore& store, const PrefillObservation& o) override {
    pos.push_back(o.query_pos);
    n_keys.push_back(o.n_keys);
    q.emplace_back(o.q, o.q + o.n_q_heads * o.k_dim);
    w.emplace_back(o.weights, o.weights + o.n_q_heads * o.n_keys);
    return OkStatus();
  }
  Status Read(int layer, const LayerStore& store, const float* qq, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override {
    ReadPrefix(store, qq, limit, pool, st, stats);
    return OkStatus();
  }
  std::vector<int64_t> pos, n_keys;
  std::vector<std::vector<float>> q, w;
};

TEST(BaselineObserverTest, WeightsAreExactAndCausal) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(3);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    std::vector<std::vector<float>> first;
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      auto owned = std::make_unique<CapturePolicy>();
      CapturePolicy* cap = owned.get();
      auto c = KvCache::Create({g}, std::move(owned));
      ASSERT_TRUE(c.ok());
      Build(c->get(), seed, 300, 300, -1, p);
      ASSERT_EQ(cap->pos.size(), 5u);
      const LayerStore& s = (*c)->store(0);
      for (size_t i = 0; i < cap->pos.size(); ++i) {
        EXPECT_EQ(cap->pos[i], 295 + static_cast<int64_t>(i));
        EXPECT_EQ(cap->n_keys[i], cap->pos[i] + 1);
        const int64_t n = cap->n_keys[i];
        for (int hq = 0; hq < g.n_q_heads; ++hq) {
          const int h = hq / g.group_size();
          std::vector<double> sc(n);
          double mx = -1e300;
          for (int64_t u = 0; u < n; ++u) {
            double a = 0;
            for (int c2 = 0; c2 < g.k_dim; ++c2) {
              a += static_cast<double>(cap->q[i][hq * g.k_dim + c2]) *
                   Bf16ToF32(s.key_row(h, u)[c2]);
            }
            sc[u] = a * g.scale;
            mx = std::max(mx, sc[u]);
          }
          double z = 0;
          for (double x : sc) z += std::exp(x - mx);
          for (int64_t u = 0; u < n; ++u) {
            const double ref = std::exp(sc[u] - mx) / z;
            ASSERT_NEAR(cap->w[i][hq * n + u], ref, 2e-6 + 1e-5 * ref) << "query " << i;
          }
        }
      }
      if (first.empty()) {
        first = cap->w;
      } else {
        EXPECT_EQ(first, cap->w);  // the pool only splits queries, never a sum
      }
    }
  }
}

// H2O column sums: every observed query's weights sum to 1 per query head, so the scores of all
// KV heads total H x T (H query heads, T observed queries). Tolerance 1e-3
// (docs/reference/vestigekv.md §5.4).
TEST(H2oTest, ColumnSumsEqualHeadsTimesQueries) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    for (const char* name : {"h2o", "h2o-recent"}) {
      auto owned = MakeEvictionPolicy(Spec(name, {{"ratio", "8"}}),
                                      name == std::string("h2o") ? EvictionKind::kH2o
                                                                 : EvictionKind::kH2oRecent);
      ASSERT_TRUE(owned.ok());
      auto* pol = static_cast<EvictionPolicy*>(owned->get());
      auto c = KvCache::Create({g}, std::move(owned).value());
      ASSERT_TRUE(c.ok());
      const int64_t T = 260;
      Build(c->get(), seed, T, T);
      double total = 0;
      for (int h = 0; h < g.n_kv_heads; ++h) {
        for (double x : pol->scores(0, h)) total += x;
      }
      EXPECT_NEAR(total, static_cast<double>(g.n_q_heads) * T, 1e-3);
      // The kept set: h2o = top m by score; h2o-recent = last floor(m/2) + top of the rest.
      const int64_t m = BudgetRows(T, 8);
      for (int s = 0; s < pol->n_sets(0); ++s) {
        std::vector<double> sc(T, 0.0);
        for (int h = 0; h < g.n_kv_heads; ++h) {
          if (pol->n_sets(0) > 1 && h != s) continue;
          for (int64_t u = 0; u < T; ++u) sc[u] += pol->scores(0, h)[u];
        }
        std::vector<int64_t> want;
        if (name == std::string("h2o")) {
          want = TopK(sc.data(), T, m);
        } else {
          const int64_t r = m / 2;
          want = TopK(sc.data(), T - r, m - r);
          for (int64_t u = T - r; u < T; ++u) want.push_back(u);
        }
        EXPECT_EQ(pol->kept(0, s), want);
      }
    }
  }
}

// The observed weights are computed over the pool (tasks per KV head and page, then per query
// head): the scores do not depend on it, bit for bit.
TEST(H2oTest, ObservationOnAPoolIsBitIdentical) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    std::vector<std::vector<double>> ref;
    for (int threads : {0, 2, 3}) {
      auto owned = MakeEvictionPolicy(Spec("h2o", {{"ratio", "8"}}), EvictionKind::kH2o);
      ASSERT_TRUE(owned.ok());
      auto* pol = static_cast<EvictionPolicy*>(owned->get());
      auto c = KvCache::Create({g}, std::move(owned).value());
      ASSERT_TRUE(c.ok());
      std::unique_ptr<ThreadPool> pool;
      if (threads > 0) pool = std::make_unique<ThreadPool>(threads);
      Build(c->get(), seed, 300, 300, -1, pool.get());  // 5 pages
      for (int h = 0; h < g.n_kv_heads; ++h) {
        if (threads == 0) {
          ref.push_back(pol->scores(0, h));
          continue;
        }
        ASSERT_EQ(pol->scores(0, h).size(), ref[h].size());
        EXPECT_EQ(0, std::memcmp(pol->scores(0, h).data(), ref[h].data(), 8 * ref[h].size()))
            << threads << " threads, KV head " << h;
      }
    }
  }
}

// SnapKV keeps the observation window and the top m of the rows before it by the 7-wide
// average pool (zero padding, divided by 7) of the window queries' column sums.
TEST(SnapKvTest, KeepsWindowAndTopPooled) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {GqaGeometry(), MlaGeometry()}) {
    auto owned = MakeEvictionPolicy(Spec("snapkv", {{"ratio", "10"}}), EvictionKind::kSnapKv);
    ASSERT_TRUE(owned.ok());
    auto* pol = static_cast<EvictionPolicy*>(owned->get());
    auto c = KvCache::Create({g}, std::move(owned).value());
    ASSERT_TRUE(c.ok());
    const int64_t T = 300, w = 32, m = 30;
    Build(c->get(), seed, T, T);
    double total = 0;
    for (int h = 0; h < g.n_kv_heads; ++h) {
      for (double x : pol->scores(0, h)) total += x;
    }
    EXPECT_NEAR(total, static_cast<double>(g.n_q_heads) * w, 1e-3);
    for (int s = 0; s < pol->n_sets(0); ++s) {
      std::vector<double> col(T - w, 0.0), pooled(T - w, 0.0);
      for (int h = 0; h < g.n_kv_heads; ++h) {
        if (pol->n_sets(0) > 1 && h != s) continue;
        for (int64_t u = 0; u < T - w; ++u) col[u] += pol->scores(0, h)[u];
      }
      for (int64_t u = 0; u < T - w; ++u) {
        for (int64_t j = u - 3; j <= u + 3; ++j) {
          if (j >= 0 && j < T - w) pooled[u] += col[j] / 7.0;
        }
      }
      std::vector<int64_t> want = TopK(pooled.data(), T - w, m);
      for (int64_t u = T - w; u < T; ++u) want.push_back(u);
      const std::vector<int64_t>& got = pol->kept(0, s);
      ASSERT_EQ(got.size(), want.size());
      // Pooled sums in a different order may flip exact near-ties: compare scores, not indices.
      for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] == want[i]) continue;
        ASSERT_LT(got[i], T - w);
        ASSERT_LT(want[i], T - w);
        EXPECT_NEAR(pooled[got[i]], pooled[want[i]], 1e-12);
      }
    }
  }
}

// docs/reference/geodesia-kv.md §12.20: StreamingLLM keeps {0..3} + the last 2048 rows; at
// T = 16384 the rate is 16 * 2052 / 16384 bits per value, and the output is exact attention over
// those rows.
TEST(StreamingTest, ClosedFormRateAndKeptSet) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = GqaGeometry(1, 1, 8);
  auto c = NewCache(g, Spec("streaming", {{"ratio", "8"}}));
  const int64_t T = 16384;
  Build(c.get(), seed, T - 1, T);  // m = round(16383 / 8) = 2048
  Rng rng(seed);
  const std::vector<float> q = RandomQuery(g, rng);
  std::vector<float> out(g.n_q_heads * g.v_dim);
  ASSERT_OK(c->Attend(0, q.data(), T - 1, nullptr, out.data()));
  const ReadStats& st = c->counters().last_step;
  EXPECT_EQ(st.rows_attended, 2052);
  const double rate = 16.0 * st.bytes_read / (static_cast<double>(T) * g.bytes_per_token());
  EXPECT_DOUBLE_EQ(rate, 16.0 * 2052 / 16384);
  EXPECT_NEAR(rate, 2.0039, 1e-4);
  std::vector<std::vector<float>> keys, vals;
  testing::StoreRows(c->store(0), &keys, &vals);
  std::vector<int64_t> rows = {0, 1, 2, 3};
  for (int64_t u = T - 2048; u < T; ++u) rows.push_back(u);
  const std::vector<double> ref = testing::RefAttention(g, q.data(), keys, vals, {rows});
  EXPECT_LT(testing::MaxAbsDiff(out, ref), 2e-5);  // f32 accumulation over 2052 rows
}

TEST(RandomBaselineTest, SeededUniformAndBudget) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = GqaGeometry();
  auto kept = [&](const std::string& s) {
    auto owned = MakeEvictionPolicy(Spec("random", {{"ratio", "5"}, {"seed", s}}),
                                    EvictionKind::kRandom);
    auto* pol = static_cast<EvictionPolicy*>(owned->get());
    auto c = KvCache::Create({g}, std::move(owned).value());
    Build(c->get(), seed, 500, 500);
    EXPECT_EQ(pol->n_sets(0), 1);
    return pol->kept(0, 0);
  };
  const auto a = kept("7"), b = kept("7"), d = kept("8");
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, d);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
}

}  // namespace
}  // namespace strata::baselines
