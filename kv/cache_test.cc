#include "kv/cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/status_testing.h"

namespace strata {
namespace {

LayerGeometry Mla(int heads) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = heads;
  g.n_kv_heads = 1;
  g.k_dim = 40;
  g.v_dim = 32;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.3f;
  return g;
}

LayerGeometry Gqa() {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = 6;
  g.n_kv_heads = 2;
  g.k_dim = 16;
  g.v_dim = 16;
  g.rope_dim = 16;
  g.scale = 0.25f;
  return g;
}

// float64 reference of exact attention over rows [first, limit) for every head.
std::vector<double> Reference(const LayerStore& s, const std::vector<float>& q, int64_t limit,
                              int64_t first = 0) {
  const LayerGeometry& g = s.geometry();
  std::vector<double> out(static_cast<size_t>(g.n_q_heads) * g.v_dim, 0.0);
  for (int h = 0; h < g.n_q_heads; ++h) {
    const int kh = h / g.group_size();
    std::vector<double> sc(limit, -1e300);
    double mx = -1e300;
    for (int64_t u = first; u < limit; ++u) {
      double a = 0;
      const uint16_t* k = s.key_row(kh, u);
      for (int c = 0; c < g.k_dim; ++c) a += static_cast<double>(q[h * g.k_dim + c]) * Bf16ToF32(k[c]);
      sc[u] = a * g.scale;
      mx = std::max(mx, sc[u]);
    }
    double z = 0;
    for (int64_t u = first; u < limit; ++u) z += std::exp(sc[u] - mx);
    for (int64_t u = first; u < limit; ++u) {
      const double w = std::exp(sc[u] - mx) / z;
      const uint16_t* v = s.val_row(kh, u);
      for (int c = 0; c < g.v_dim; ++c) out[h * g.v_dim + c] += w * Bf16ToF32(v[c]);
    }
  }
  return out;
}

// Opens a call of n rows and appends them to every layer; the caller's queries follow, then
// EndCall.
void Fill(KvCache* cache, Rng& rng, int64_t n) {
  ASSERT_OK(cache->BeginCall(n, CallKind::kPrefill));
  for (int l = 0; l < cache->n_layers(); ++l) {
    const LayerGeometry& g = cache->geometry(l);
    std::vector<float> k(g.n_kv_heads * g.k_dim), v(g.n_kv_heads * g.v_dim);
    for (int64_t t = 0; t < n; ++t) {
      for (auto& x : k) x = static_cast<float>(rng.Normal());
      for (auto& x : v) x = static_cast<float>(rng.Normal());
      ASSERT_OK(cache->Append(l, k.data(), v.data()));
    }
  }
}

// The full policy is classic attention: equal to a float64 reference over the bf16 rows, for
// every query position, at 1 and 3 threads. Tolerance 2e-5: f32 accumulation of O(1) values over
// <= 300 rows.
TEST(KvCacheTest, FullPolicyMatchesFloat64Reference) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  auto cache = KvCache::Create({Mla(5), Gqa()}, std::make_unique<FullPolicy>());
  ASSERT_TRUE(cache.ok());
  KvCache& c = **cache;
  Fill(&c, rng, 300);
  ThreadPool pool(3);
  for (int l = 0; l < 2; ++l) {
    const LayerGeometry& g = c.geometry(l);
    for (int64_t pos : {0, 1, 63, 64, 65, 200, 299}) {
      std::vector<float> q(g.n_q_heads * g.k_dim), out(g.n_q_heads * g.v_dim);
      for (auto& x : q) x = static_cast<float>(rng.Normal());
      auto ref = Reference(c.store(l), q, pos + 1);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        ASSERT_OK(c.Attend(l, q.data(), pos, p, out.data()));
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(out[i], ref[i], 2e-5) << "seed " << seed << " layer " << l << " pos " << pos;
        }
      }
    }
  }
  ASSERT_OK(c.EndCall());
}

TEST(KvCacheTest, ReadRowsOfEveryRowEqualsReadPrefix) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  auto cache = KvCache::Create({Gqa()}, std::make_unique<FullPolicy>());
  ASSERT_TRUE(cache.ok());
  Fill(cache->get(), rng, 150);
  ASSERT_OK((*cache)->EndCall());
  const LayerStore& s = (*cache)->store(0);
  const LayerGeometry& g = s.geometry();
  std::vector<float> q(g.n_q_heads * g.k_dim);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  std::vector<int64_t> rows(150);
  for (int i = 0; i < 150; ++i) rows[i] = i;
  SoftmaxStateBuffer a(g.n_q_heads, g.v_dim), b(g.n_q_heads, g.v_dim);
  a.states().Reset();
  b.states().Reset();
  ReadStats sa, sb;
  ReadPrefix(s, q.data(), 150, nullptr, &a.states(), &sa);
  ReadRows(s, q.data(), rows.data(), 150, nullptr, &b.states(), &sb);
  std::vector<float> oa(g.n_q_heads * g.v_dim), ob(oa.size());
  FinalizeStates(a.states(), oa.data());
  FinalizeStates(b.states(), ob.data());
  for (size_t i = 0; i < oa.size(); ++i) ASSERT_NEAR(oa[i], ob[i], 1e-6) << "seed " << seed;
  EXPECT_EQ(sa.bytes_read, sb.bytes_read);
  EXPECT_EQ(sa.bytes_read, 150 * 2 * 2 * (16 + 16));
  // A subset equals the reference restricted to that subset (rows 0..9 only).
  std::vector<int64_t> sub = {0, 3, 9};
  SoftmaxStateBuffer c(g.n_q_heads, g.v_dim);
  c.states().Reset();
  ReadRows(s, q.data(), sub.data(), 3, nullptr, &c.states(), nullptr);
  std::vector<float> oc(oa.size());
  FinalizeStates(c.states(), oc.data());
  for (int h = 0; h < g.n_q_heads; ++h) {
    const int kh = h / g.group_size();
    double sc[3], mx = -1e300, z = 0;
    for (int i = 0; i < 3; ++i) {
      double acc = 0;
      for (int d = 0; d < g.k_dim; ++d) acc += q[h * g.k_dim + d] * Bf16ToF32(s.key_row(kh, sub[i])[d]);
      sc[i] = acc * g.scale;
      mx = std::max(mx, sc[i]);
    }
    for (double x : sc) z += std::exp(x - mx);
    for (int d = 0; d < g.v_dim; ++d) {
      double o = 0;
      for (int i = 0; i < 3; ++i) o += std::exp(sc[i] - mx) / z * Bf16ToF32(s.val_row(kh, sub[i])[d]);
      ASSERT_NEAR(oc[h * g.v_dim + d], o, 1e-5);
    }
  }
}

TEST(KvCacheTest, RowsAreStoredOnceInBf16AndPagesCanBeReleased) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  LayerStore s(Mla(2));
  std::vector<float> row(40);
  std::vector<std::vector<uint16_t>> expect;
  for (int t = 0; t < 130; ++t) {
    for (auto& x : row) x = static_cast<float>(rng.Normal());
    s.Append(row.data(), nullptr);
    std::vector<uint16_t> b(40);
    for (int i = 0; i < 40; ++i) b[i] = F32ToBf16(row[i]);
    expect.push_back(b);
  }
  for (int t = 0; t < 130; ++t) {
    ASSERT_EQ(0, std::memcmp(s.key_row(0, t), expect[t].data(), 80)) << t;
    ASSERT_EQ(s.val_row(0, t), s.key_row(0, t));  // MLA value = the row's first v_dim columns
  }
  EXPECT_EQ(s.n_pages(), 3);
  EXPECT_EQ(s.resident_bytes(), 3 * 64 * 40 * 2);
  s.ReleasePage(0, 0);
  EXPECT_FALSE(s.page_resident(0, 0));
  EXPECT_EQ(s.resident_bytes(), 2 * 64 * 40 * 2);
  ASSERT_EQ(0, std::memcmp(s.key_row(0, 64), expect[64].data(), 80));
}

// Observation weights: exact causal softmax rows that sum to 1 and are zero nowhere inside the
// causal window; delivered only for the last observation_queries() prompt positions.
class ObservingPolicy final : public Policy {
 public:
  std::string name() const override { return "observe"; }
  Status Bind(const std::vector<LayerGeometry>&) override { return OkStatus(); }
  int64_t observation_queries(int64_t) const override { return 3; }
  Status OnPrefillStats(int layer, const LayerStore& store, const PrefillObservation& o) override {
    seen.push_back(o.query_pos);
    for (int h = 0; h < o.n_q_heads; ++h) {
      double s = 0;
      for (int64_t u = 0; u < o.n_keys; ++u) s += o.weights[h * o.n_keys + u];
      sums.push_back(s);
    }
    return OkStatus();
  }
  Status OnCompress(int layer, const LayerStore&, CachePlan*, ThreadPool*) override {
    ++compressions;
    return OkStatus();
  }
  Status Read(int, const LayerStore& s, const float* q, int64_t limit, ThreadPool* p,
              SoftmaxStates* st, ReadStats* stats) override {
    ReadPrefix(s, q, limit, p, st, stats);
    return OkStatus();
  }
  std::vector<int64_t> seen;
  std::vector<double> sums;
  int compressions = 0;
};

TEST(KvCacheTest, PrefillObservationIsCausalAndNormalised) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  auto policy = std::make_unique<ObservingPolicy>();
  ObservingPolicy* p = policy.get();
  auto cache = KvCache::Create({Gqa()}, std::move(policy));
  ASSERT_TRUE(cache.ok());
  KvCache& c = **cache;
  c.BeginPrefill(0, 10);
  std::vector<float> q(6 * 16);
  Fill(&c, rng, 10);
  for (int64_t pos = 0; pos < 10; ++pos) {
    for (auto& x : q) x = static_cast<float>(rng.Normal());
    ASSERT_OK(c.ObserveQuery(0, pos, q.data()));
  }
  ASSERT_OK(c.EndCall());
  ASSERT_OK(c.EndPrefill(nullptr));
  EXPECT_EQ(p->seen, (std::vector<int64_t>{7, 8, 9}));
  for (double s : p->sums) EXPECT_NEAR(s, 1.0, 1e-5);
  EXPECT_EQ(p->compressions, 1);
}

class RejectingPolicy final : public Policy {
 public:
  std::string name() const override { return "needs-mla"; }
  Status Bind(const std::vector<LayerGeometry>&) override {
    return InvalidArgument("model has no MLA layers");
  }
  Status Read(int, const LayerStore&, const float*, int64_t, ThreadPool*, SoftmaxStates*,
              ReadStats*) override {
    return OkStatus();
  }
};

// Records every event with its call, and can return a plan or an error from one of them.
class ScriptedPolicy final : public Policy {
 public:
  std::string name() const override { return "scripted"; }
  Status Bind(const std::vector<LayerGeometry>&) override { return OkStatus(); }
  Status BeginCall(int layer, const LayerStore& s, const CacheCall& c, CachePlan* plan) override {
    Log("begin", layer, c, s.n_rows());
    if (release_at_begin >= 0) plan->release.push_back({0, release_at_begin});
    return OkStatus();
  }
  Status OnAppend(int layer, const LayerStore& s) override {
    ++appends;
    return OkStatus();
  }
  Status OnAppended(int layer, const LayerStore& s, const CacheCall& c, CachePlan* plan,
                    ThreadPool* pool) override {
    Log("appended", layer, c, s.n_rows());
    if (release_at_appended >= 0) plan->release.push_back({0, release_at_appended});
    return OkStatus();
  }
  Status EndCall(int layer, const LayerStore& s, const CacheCall& c, CachePlan* plan) override {
    Log("end", layer, c, s.n_rows());
    if (release_at_end >= 0) plan->release.push_back({0, release_at_end});
    return OkStatus();
  }
  Status Read(int layer, const LayerStore& s, const float* q, int64_t limit, ThreadPool* p,
              SoftmaxStates* st, ReadStats* stats) override {
    events.push_back("read " + std::to_string(layer) + " " + std::to_string(limit));
    if (!read_error.ok()) return read_error;
    ReadPrefix(s, q, limit, p, st, stats);
    return OkStatus();
  }
  void Log(const char* what, int layer, const CacheCall& c, int64_t rows) {
    events.push_back(std::string(what) + " " + std::to_string(layer) + " [" +
                     std::to_string(c.first) + "," + std::to_string(c.end) + ") " +
                     (c.kind == CallKind::kPrefill ? "prefill" : "decode") + " rows " +
                     std::to_string(rows));
  }
  std::vector<std::string> events;
  int64_t appends = 0;
  int64_t release_at_begin = -1, release_at_appended = -1, release_at_end = -1;
  Status read_error;
};

void AppendRows(KvCache* c, int layer, int64_t n) {
  const LayerGeometry& g = c->geometry(layer);
  std::vector<float> k(g.n_kv_heads * g.k_dim, 0.5f), v(g.n_kv_heads * g.v_dim, 0.25f);
  for (int64_t i = 0; i < n; ++i) ASSERT_OK(c->Append(layer, k.data(), v.data()));
}

// The cache tells the policy where each call begins and ends, delivers OnAppended once per layer
// right after the call's last row (before its first query), and EndCall after the last query.
TEST(KvCacheTest, CallBoundariesAreDeliveredInOrder) {
  auto policy = std::make_unique<ScriptedPolicy>();
  ScriptedPolicy* p = policy.get();
  auto made = KvCache::Create({Gqa(), Gqa()}, std::move(policy));
  ASSERT_OK(made);
  KvCache& c = **made;
  std::vector<float> q(6 * 16, 0.1f), out(6 * 16);
  ASSERT_OK(c.BeginCall(3, CallKind::kPrefill));
  for (int l = 0; l < 2; ++l) {
    AppendRows(&c, l, 3);
    for (int64_t pos = 0; pos < 3; ++pos) ASSERT_OK(c.Attend(l, q.data(), pos, nullptr, out.data()));
  }
  ASSERT_OK(c.EndCall());
  ASSERT_OK(c.BeginCall(1, CallKind::kDecode));
  for (int l = 0; l < 2; ++l) AppendRows(&c, l, 1);
  ASSERT_OK(c.Attend(1, q.data(), 3, nullptr, out.data()));
  ASSERT_OK(c.EndCall());
  ASSERT_OK(c.BeginCall(0, CallKind::kDecode));  // a call that only reads
  ASSERT_OK(c.Attend(0, q.data(), 3, nullptr, out.data()));
  ASSERT_OK(c.EndCall());
  const std::vector<std::string> want = {
      "begin 0 [0,3) prefill rows 0", "begin 1 [0,3) prefill rows 0",
      "appended 0 [0,3) prefill rows 3", "read 0 1", "read 0 2", "read 0 3",
      "appended 1 [0,3) prefill rows 3", "read 1 1", "read 1 2", "read 1 3",
      "end 0 [0,3) prefill rows 3", "end 1 [0,3) prefill rows 3",
      "begin 0 [3,4) decode rows 3", "begin 1 [3,4) decode rows 3",
      "appended 0 [3,4) decode rows 4", "appended 1 [3,4) decode rows 4", "read 1 4",
      "end 0 [3,4) decode rows 4", "end 1 [3,4) decode rows 4",
      "begin 0 [4,4) decode rows 4", "appended 0 [4,4) decode rows 4",
      "begin 1 [4,4) decode rows 4", "appended 1 [4,4) decode rows 4", "read 0 4",
      "end 0 [4,4) decode rows 4", "end 1 [4,4) decode rows 4"};
  EXPECT_EQ(p->events, want);
  EXPECT_EQ(p->appends, 8);
  EXPECT_EQ(c.counters().calls, 3);
}

// Plans are applied by the cache: a page released at the end of a call is gone; a plan that
// would free a row the running call's queries may still read is refused with an Internal error
// naming the page (the store is left untouched), and the cache is failed from then on.
TEST(KvCacheTest, PlansAreCheckedBeforeTheyApply) {
  {
    auto policy = std::make_unique<ScriptedPolicy>();
    ScriptedPolicy* p = policy.get();
    auto made = KvCache::Create({Gqa()}, std::move(policy));
    ASSERT_OK(made);
    KvCache& c = **made;
    p->release_at_end = 0;
    ASSERT_OK(c.BeginCall(130, CallKind::kPrefill));
    AppendRows(&c, 0, 130);
    ASSERT_OK(c.EndCall());
    EXPECT_FALSE(c.store(0).page_resident(0, 0));
    EXPECT_TRUE(c.store(0).page_resident(0, 1));
  }
  for (const char* when : {"begin", "appended"}) {
    SCOPED_TRACE(when);
    auto policy = std::make_unique<ScriptedPolicy>();
    ScriptedPolicy* p = policy.get();
    auto made = KvCache::Create({Gqa()}, std::move(policy));
    ASSERT_OK(made);
    KvCache& c = **made;
    ASSERT_OK(c.BeginCall(100, CallKind::kPrefill));
    AppendRows(&c, 0, 100);
    ASSERT_OK(c.EndCall());
    // Page 1 (rows [64, 128)) holds the next call's rows [100, 128).
    (std::string(when) == "begin" ? p->release_at_begin : p->release_at_appended) = 1;
    const Status begin = c.BeginCall(28, CallKind::kPrefill);
    if (std::string(when) == "begin") {
      ASSERT_FALSE(begin.ok());
    } else {
      ASSERT_OK(begin);
      const LayerGeometry& g = c.geometry(0);
      std::vector<float> k(g.n_kv_heads * g.k_dim), v(g.n_kv_heads * g.v_dim);
      for (int i = 0; i < 27; ++i) ASSERT_OK(c.Append(0, k.data(), v.data()));
      const Status s = c.Append(0, k.data(), v.data());  // the last row: OnAppended
      ASSERT_FALSE(s.ok());
    }
    const Status s = c.status();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("policy 'scripted': layer 0"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("page 1 of KV head 0"), std::string::npos) << s.ToString();
    EXPECT_TRUE(c.store(0).page_resident(0, 1));
    EXPECT_EQ(c.EndCall().message(), s.message());
  }
}

// A policy's read error reaches the caller with the policy, the layer and the query position.
TEST(KvCacheTest, ReadErrorsReachTheCaller) {
  auto policy = std::make_unique<ScriptedPolicy>();
  ScriptedPolicy* p = policy.get();
  auto made = KvCache::Create({Gqa()}, std::move(policy));
  ASSERT_OK(made);
  KvCache& c = **made;
  p->read_error = DataLoss("row 7 is gone");
  ASSERT_OK(c.BeginCall(10, CallKind::kPrefill));
  AppendRows(&c, 0, 10);
  std::vector<float> q(6 * 16, 0.1f), out(6 * 16);
  const Status s = c.Attend(0, q.data(), 9, nullptr, out.data());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "policy 'scripted': layer 0, read: query at position 9: row 7 is gone");
  EXPECT_EQ(c.Attend(0, q.data(), 9, nullptr, out.data()).message(), s.message());
}

TEST(KvCacheTest, CreateErrorsNameTheProblem) {
  auto a = KvCache::Create({Gqa()}, std::make_unique<RejectingPolicy>());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(), "policy 'needs-mla': model has no MLA layers");
  LayerGeometry bad = Gqa();
  bad.n_q_heads = 5;  // not a multiple of 2 KV heads
  auto b = KvCache::Create({bad}, std::make_unique<FullPolicy>());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("layer 0"), std::string::npos);
  auto c = KvCache::Create({}, std::make_unique<FullPolicy>());
  EXPECT_FALSE(c.ok());
}

LayerGeometry Windowed(int window) {
  LayerGeometry g = Gqa();
  g.window = window;
  return g;
}

// A sliding-window layer reads exactly its last `window` rows (a float64 reference over them),
// holds no more than the window, a partial page and the running call's rows, and a global layer
// beside it keeps every row.
TEST(KvCacheTest, SlidingWindowLayersReadTheirWindowAndHoldNoMore) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  constexpr int kWindow = 100;
  auto made = KvCache::Create({Windowed(kWindow), Gqa(), Windowed(kWindow)},
                              std::make_unique<FullPolicy>());
  ASSERT_OK(made);
  KvCache& c = **made;
  EXPECT_EQ(c.n_local_layers(), 2);
  EXPECT_EQ(c.policy_layer(1), 0);
  EXPECT_TRUE(c.is_local(0) && c.is_local(2));
  ThreadPool pool(2);
  auto check = [&](int64_t pos) {
    for (int l = 0; l < 3; ++l) {
      const LayerGeometry& g = c.geometry(l);
      std::vector<float> q(g.n_q_heads * g.k_dim), out(g.n_q_heads * g.v_dim);
      for (auto& x : q) x = static_cast<float>(rng.Normal());
      const int64_t first = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1) : 0;
      const std::vector<double> ref = Reference(c.store(l), q, pos + 1, first);
      ASSERT_OK(c.Attend(l, q.data(), pos, &pool, out.data()));
      for (size_t i = 0; i < out.size(); ++i) {
        // f32 scores and an online softmax over <= 300 bf16 rows against float64
        ASSERT_NEAR(out[i], ref[i], 2e-5) << "layer " << l << " pos " << pos;
      }
    }
  };
  Fill(&c, rng, 300);  // one prefill call: its queries read across the window's edge
  for (int64_t pos : {0, 1, 63, 99, 100, 101, 164, 299}) check(pos);
  ASSERT_OK(c.EndCall());
  const int64_t row_bytes = Gqa().bytes_per_token() / Gqa().n_kv_heads;
  const int64_t page_bytes = LayerStore::kPageRows * row_bytes * Gqa().n_kv_heads;
  for (int step = 0; step < 200; ++step) {
    Fill(&c, rng, 1);
    check(c.n_tokens() - 1);
    ASSERT_OK(c.EndCall());
    for (int l : {0, 2}) {
      // The window plus the partial pages at both ends.
      EXPECT_LE(c.store(l).resident_bytes(), (kWindow / LayerStore::kPageRows + 2) * page_bytes)
          << "step " << step;
    }
  }
  EXPECT_EQ(c.store(1).resident_bytes(), c.store(1).full_resident_bytes());  // global: every row
  EXPECT_LT(c.store(0).resident_bytes(), c.store(0).full_resident_bytes() / 2);
  EXPECT_EQ(c.LocalResidentBytes(), c.store(0).resident_bytes() + c.store(2).resident_bytes());
  EXPECT_EQ(c.ResidentBytes(), c.store(1).resident_bytes() + c.LocalResidentBytes());
  EXPECT_EQ(c.FullBytesPerToken(), Gqa().bytes_per_token());  // the global layer's
  const ResidentParts parts = c.ResidentBreakdown();
  bool named = false;
  for (const auto& part : parts.parts) named |= part.first == "sliding-window layers";
  EXPECT_TRUE(named);
}

// The policy is bound to the global layers alone and sees them under its own indices; local
// layers never reach it. Every layer local: any policy but full is refused, naming it.
TEST(KvCacheTest, PolicySeesOnlyGlobalLayers) {
  auto policy = std::make_unique<ScriptedPolicy>();
  ScriptedPolicy* p = policy.get();
  auto made = KvCache::Create({Windowed(4), Gqa(), Windowed(4)}, std::move(policy));
  ASSERT_OK(made);
  KvCache& c = **made;
  std::vector<float> q(6 * 16, 0.1f), out(6 * 16);
  ASSERT_OK(c.BeginCall(3, CallKind::kPrefill));
  for (int l = 0; l < 3; ++l) {
    AppendRows(&c, l, 3);
    for (int64_t pos = 0; pos < 3; ++pos) ASSERT_OK(c.Attend(l, q.data(), pos, nullptr, out.data()));
    if (c.is_local(l)) {
      EXPECT_FALSE(c.ClaimDenseReads(l, 0, 3));  // read per query
    }
  }
  ASSERT_OK(c.EndCall());
  const std::vector<std::string> want = {"begin 0 [0,3) prefill rows 0",
                                         "appended 0 [0,3) prefill rows 3", "read 0 1",
                                         "read 0 2", "read 0 3", "end 0 [0,3) prefill rows 3"};
  EXPECT_EQ(p->events, want);
  EXPECT_EQ(p->appends, 3);

  auto all_local = KvCache::Create({Windowed(8), Windowed(8)}, std::make_unique<ScriptedPolicy>());
  ASSERT_FALSE(all_local.ok());
  EXPECT_NE(all_local.status().message().find("policy 'scripted'"), std::string::npos)
      << all_local.status().message();
  EXPECT_NE(all_local.status().message().find("every layer of this model is a sliding-window"),
            std::string::npos);
  EXPECT_OK(KvCache::Create({Windowed(8), Windowed(8)}, std::make_unique<FullPolicy>()));
  LayerGeometry mla_window = Mla(2);
  mla_window.window = 8;
  EXPECT_FALSE(KvCache::Create({mla_window, Gqa()}, std::make_unique<FullPolicy>()).ok());
}

}  // namespace
}  // namespace strata
