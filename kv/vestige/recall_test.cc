// Tests of the VestigeKV recall tier: index vs float64, certificate soundness, the fire rule,
// the gate, overflow, the csk range check, determinism, calibration flows and a planted recall.
//
// § numbers cite docs/reference/vestigekv.md (the reference behaviour).
#include "kv/vestige/recall.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kv/vestige/calibration.h"

namespace strata {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

LayerGeometry Mla(int heads, int d_c, int d_r) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = heads;
  g.n_kv_heads = 1;
  g.k_dim = d_c + d_r;
  g.v_dim = d_c;
  g.rope_dim = d_r;
  g.rope = false;
  g.scale = 1.f / std::sqrt(static_cast<float>(d_c / 4 + d_r));
  return g;
}

void FillRows(LayerStore* s, Rng& rng, int64_t n, float sd = 1.f) {
  const int k = s->geometry().k_dim;
  std::vector<float> row(k);
  for (int64_t i = 0; i < n; ++i) {
    for (auto& v : row) v = static_cast<float>(sd * rng.Normal());
    s->Append(row.data(), nullptr);
  }
}

std::vector<float> RandomQuery(Rng& rng, const LayerGeometry& g, float sd = 1.f) {
  std::vector<float> q(static_cast<size_t>(g.n_q_heads) * g.k_dim);
  for (auto& v : q) v = static_cast<float>(sd * rng.Normal());
  return q;
}

std::vector<int64_t> Range(int64_t b, int64_t e) {
  std::vector<int64_t> r;
  for (int64_t i = b; i < e; ++i) r.push_back(i);
  return r;
}

// A random orthonormal [r, d] basis (f64 Gram-Schmidt, stored f32).
std::vector<float> RandomBasis(Rng& rng, int r, int d) {
  std::vector<double> v(static_cast<size_t>(r) * d);
  for (auto& x : v) x = rng.Normal();
  for (int i = 0; i < r; ++i) {
    double* vi = v.data() + static_cast<size_t>(i) * d;
    for (int pass = 0; pass < 2; ++pass)
      for (int j = 0; j < i; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += vi[c] * v[j * d + c];
        for (int c = 0; c < d; ++c) vi[c] -= dot * v[j * d + c];
      }
    double n = 0;
    for (int c = 0; c < d; ++c) n += vi[c] * vi[c];
    for (int c = 0; c < d; ++c) vi[c] /= std::sqrt(n);
  }
  return std::vector<float>(v.begin(), v.end());
}

double TrueScore(const LayerStore& s, const float* qh, int64_t u) {
  const LayerGeometry& g = s.geometry();
  const uint16_t* row = s.key_row(0, u);
  double a = 0;
  for (int c = 0; c < g.k_dim; ++c) a += static_cast<double>(qh[c]) * Bf16ToF32(row[c]);
  return a * g.scale;
}

TEST(RecallIndex, CskAndEtaMatchFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla(4, 128, 32);
  LayerStore store(g);
  FillRows(&store, rng, 300);
  RecallOptions o;
  o.rank = 32;
  RecallTier t;
  ASSERT_TRUE(t.Configure(g, o).ok());
  const std::vector<float> v = RandomBasis(rng, 32, 128);
  ASSERT_TRUE(t.IndexClosedRows(store, 200).ok());
  ASSERT_TRUE(t.SetBasis(store, v.data()).ok());  // re-projects rows [0, 200)
  ASSERT_TRUE(t.IndexClosedRows(store, 300).ok());  // projects [200, 300) with the same basis
  for (int64_t u = 0; u < 300; ++u) {
    const uint16_t* row = store.key_row(0, u);
    std::vector<double> p(32, 0.0), res(128);
    for (int c = 0; c < 128; ++c) res[c] = Bf16ToF32(row[c]);
    for (int k = 0; k < 32; ++k)
      for (int c = 0; c < 128; ++c) p[k] += static_cast<double>(v[k * 128 + c]) * Bf16ToF32(row[c]);
    for (int k = 0; k < 32; ++k)
      for (int c = 0; c < 128; ++c) res[c] -= static_cast<double>(v[k * 128 + c]) * p[k];
    double eta = 0;
    for (double x : res) eta += x * x;
    eta = std::sqrt(eta);
    for (int k = 0; k < 32; ++k) {
      // f16 storage: half an ulp (2^-11 relative) + f32 accumulation over 128 terms.
      EXPECT_NEAR(F16ToF32(t.csk(u)[k]), p[k], std::fabs(p[k]) * 6e-4 + 1e-5) << u << "," << k;
    }
    EXPECT_NEAR(t.eta(u), eta, 1e-4 * (1 + eta)) << u;  // f32 projection and residual
  }
}

TEST(RecallIndex, IdentityBasisAndSpanEquality) {
  // Provisional basis = the first r axes; a row inside span(V) has eta ~ 0 and idx = true score
  // up to the f16/bf16 roundings (§9.11).
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla(2, 64, 16);
  LayerStore store(g);
  std::vector<float> row(80);
  for (int i = 0; i < 50; ++i) {
    for (int c = 0; c < 80; ++c) row[c] = (c < 16 || c >= 64) ? rng.Normal() : 0.f;
    store.Append(row.data(), nullptr);
  }
  RecallOptions o;
  o.rank = 16;
  RecallTier t;
  ASSERT_TRUE(t.Configure(g, o).ok());
  for (int k = 0; k < 16; ++k)
    for (int c = 0; c < 64; ++c) EXPECT_EQ(t.basis()[k * 64 + c], k == c ? 1.f : 0.f);
  ASSERT_TRUE(t.IndexClosedRows(store, 50).ok());
  const std::vector<float> q = RandomQuery(rng, g);
  std::vector<int64_t> rows = Range(0, 50);
  std::vector<float> idx(2 * 50), cert(2 * 50);
  t.IndexScores(store, q.data(), rows.data(), 50, idx.data(), cert.data());
  for (int64_t u = 0; u < 50; ++u) {
    EXPECT_EQ(t.eta(u), 0.f);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(cert[h * 50 + u], 0.f);
      EXPECT_NEAR(idx[h * 50 + u], TrueScore(store, q.data() + h * 80, u), 0.02);  // bf16(q_r), f16
    }
  }
}

// Soundness with z = sqrt(d_c - r): certified >= true - rounding slack (the bound in recall.h).
TEST(RecallCertificate, SoundWithCauchySchwarzZ) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  int64_t checked = 0, tight = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int d_c = 64 * (1 + static_cast<int>(rng.Below(3)));  // 64, 128, 192
    const int d_r = 8 * (1 + static_cast<int>(rng.Below(4)));
    const int r = 8 * (1 + static_cast<int>(rng.Below(d_c / 16)));
    const LayerGeometry g = Mla(1 + static_cast<int>(rng.Below(6)), d_c, d_r);
    const float sd = static_cast<float>(std::exp(rng.Normal()));  // magnitudes vary
    LayerStore store(g);
    FillRows(&store, rng, 150, sd);
    RecallOptions o;
    o.rank = r;
    RecallTier t;
    ASSERT_TRUE(t.Configure(g, o).ok());
    ASSERT_TRUE(t.IndexClosedRows(store, 150).ok());
    if (trial % 3 != 0) {  // trial 0, 3, ...: the identity basis
      const std::vector<float> v = RandomBasis(rng, r, d_c);
      ASSERT_TRUE(t.SetBasis(store, v.data()).ok());
    }
    const float zs = std::sqrt(static_cast<float>(d_c - r));
    const std::vector<int64_t> rows = Range(0, 150);
    for (int qi = 0; qi < 8; ++qi) {
      std::vector<float> q = RandomQuery(rng, g, static_cast<float>(std::exp(rng.Normal())));
      if (qi == 0) {  // a query aligned with a row: large true score, the bound must still hold
        const uint16_t* row = store.key_row(0, 7);
        for (int h = 0; h < g.n_q_heads; ++h)
          for (int c = 0; c < g.k_dim; ++c) q[h * g.k_dim + c] = Bf16ToF32(row[c]);
      }
      std::vector<float> idx(g.n_q_heads * 150), cert(g.n_q_heads * 150);
      t.IndexScores(store, q.data(), rows.data(), 150, idx.data(), cert.data());
      for (int h = 0; h < g.n_q_heads; ++h) {
        const float* qh = q.data() + h * g.k_dim;
        // Per-head sketch operands in f64 for the slack.
        std::vector<double> qsk(r, 0.0);
        for (int k = 0; k < r; ++k)
          for (int c = 0; c < d_c; ++c) qsk[k] += static_cast<double>(t.basis()[k * d_c + c]) * qh[c];
        double qn = 0;
        for (int c = 0; c < d_c; ++c) qn += static_cast<double>(qh[c]) * qh[c];
        for (int64_t u = 0; u < 150; ++u) {
          const uint16_t* row = store.key_row(0, u);
          double br = 0, sk = 0, cn = 0;
          for (int c = 0; c < d_r; ++c) br += std::fabs(qh[d_c + c] * Bf16ToF32(row[d_c + c]));
          for (int k = 0; k < r; ++k) sk += std::fabs(qsk[k] * F16ToF32(t.csk(u)[k]));
          for (int c = 0; c < d_c; ++c) cn += static_cast<double>(Bf16ToF32(row[c])) * Bf16ToF32(row[c]);
          const double slack =
              g.scale * (std::ldexp(br, -8) + std::ldexp(sk, -10) + std::ldexp(std::sqrt(qn * cn), -16));
          const double certified = static_cast<double>(idx[h * 150 + u]) + zs * cert[h * 150 + u];
          const double truth = TrueScore(store, qh, u);
          ASSERT_GE(certified, truth - slack)
              << "trial " << trial << " q " << qi << " head " << h << " row " << u;
          ++checked;
          tight += certified - truth < 1e-2 * (std::fabs(truth) + 1e-3);
        }
      }
    }
  }
  EXPECT_GT(checked, 5000);
}

// A small tier with every closed row archived except `kept`.
struct Fixture {
  LayerGeometry g;
  LayerStore store;
  RecallTier tier;
  std::vector<int64_t> archived, attended;
  Fixture(Rng& rng, int heads, int64_t n, int64_t n_closed, int keep_every, RecallOptions o)
      : g(Mla(heads, 64, 16)), store(g) {
    FillRows(&store, rng, n);
    EXPECT_TRUE(tier.Configure(g, o).ok());
    EXPECT_TRUE(tier.IndexClosedRows(store, n_closed).ok());
    for (int64_t u = 0; u < n; ++u) {
      const bool kept = u >= n_closed || u < 4 || u % keep_every == 0;
      (kept ? attended : archived).push_back(u);
    }
    tier.SetArchive(archived.data(), static_cast<int64_t>(archived.size()));
  }
};

TEST(RecallFire, StrictUnionOverHeadsPositionOrder) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  RecallOptions o;
  o.rank = 16;
  Fixture f(rng, 4, 700, 640, 8, o);
  f.tier.SetCalibration(1.5f, -kInf);
  ThreadPool pool(2);
  for (int step = 0; step < 10; ++step) {
    const std::vector<float> q = RandomQuery(rng, f.g);
    const int64_t na = static_cast<int64_t>(f.archived.size());
    std::vector<float> idx(4 * na), cert(4 * na);
    f.tier.IndexScores(f.store, q.data(), f.archived.data(), na, idx.data(), cert.data());
    // max1 per head: head 0 exactly at the score of one archived row (strictness: it must not
    // fire for head 0), others at a random quantile of the archive's scores.
    std::vector<float> max1(4);
    const int64_t pivot = static_cast<int64_t>(rng.Below(na));
    for (int h = 0; h < 4; ++h) {
      std::vector<float> sc(na);
      for (int64_t i = 0; i < na; ++i) sc[i] = idx[h * na + i] + 1.5f * cert[h * na + i];
      if (h == 0) {
        max1[h] = sc[pivot];
      } else {
        std::vector<float> s2 = sc;
        std::sort(s2.begin(), s2.end());
        max1[h] = s2[na - 1 - static_cast<int64_t>(rng.Below(20))];
      }
    }
    std::set<int64_t> expect;
    std::vector<int64_t> per_head_pivot;
    for (int h = 0; h < 4; ++h)
      for (int64_t i = 0; i < na; ++i) {
        const float cz = 1.5f * cert[h * na + i];
        if (idx[h * na + i] + cz > max1[h]) expect.insert(f.archived[i]);
      }
    RecallScan s = f.tier.Scan(f.store, q.data(), 700, max1.data(), nullptr, &pool);
    ASSERT_FALSE(s.fallback);
    std::vector<int64_t> got(s.rows, s.rows + s.n);
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
    EXPECT_EQ(got, std::vector<int64_t>(expect.begin(), expect.end()));
    EXPECT_EQ(s.n_fired, static_cast<int64_t>(expect.size()));
    // Head 0 alone at its own pivot: the pivot row does not fire (strict >).
    bool pivot_other = false;
    for (int h = 1; h < 4; ++h)
      pivot_other |= idx[h * na + pivot] + 1.5f * cert[h * na + pivot] > max1[h];
    if (!pivot_other) {
      EXPECT_EQ(expect.count(f.archived[pivot]), 0u);
    }
  }
  EXPECT_EQ(f.tier.counters().scans, 10);
}

TEST(RecallFire, MarginGateAndEmptyKeptSet) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  RecallOptions o;
  o.rank = 16;
  o.margin = 0.25f;
  Fixture f(rng, 3, 400, 384, 5, o);
  f.tier.SetCalibration(0.f, 1.0f);  // gate on: open iff entropy > 1
  ASSERT_TRUE(f.tier.needs_entropy());
  const std::vector<float> q = RandomQuery(rng, f.g);
  const int64_t na = static_cast<int64_t>(f.archived.size());
  std::vector<float> idx(3 * na), cert(3 * na);
  f.tier.IndexScores(f.store, q.data(), f.archived.data(), na, idx.data(), cert.data());
  std::vector<float> max1 = {0.f, 0.f, 0.f};
  std::vector<float> ent = {0.5f, 1.0f, 2.0f};  // heads 0 and 1 closed (1.0 is not > 1.0)
  std::set<int64_t> expect;
  for (int64_t i = 0; i < na; ++i)
    if (idx[2 * na + i] > max1[2] - 0.25f) expect.insert(f.archived[i]);
  RecallScan s = f.tier.Scan(f.store, q.data(), 400, max1.data(), ent.data(), nullptr);
  EXPECT_EQ(std::vector<int64_t>(s.rows, s.rows + s.n),
            std::vector<int64_t>(expect.begin(), expect.end()));
  EXPECT_EQ(f.tier.counters().gated_heads, 2);
  // All heads closed: nothing fires.
  ent = {0.f, 0.f, 0.f};
  s = f.tier.Scan(f.store, q.data(), 400, max1.data(), ent.data(), nullptr);
  EXPECT_EQ(s.n, 0);
  // Empty kept set: max1 = -inf, gate open -> every archived row fires.
  f.tier.SetCalibration(0.f, -kInf);
  std::vector<float> none(3, -kInf);
  s = f.tier.Scan(f.store, q.data(), 400, none.data(), nullptr, nullptr);
  EXPECT_EQ(std::vector<int64_t>(s.rows, s.rows + s.n), f.archived);
}

TEST(RecallOverflow, FallbackAndTruncate) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (bool truncate : {false, true}) {
    RecallOptions o;
    o.rank = 16;
    o.capacity = 50;
    o.truncate = truncate;
    Fixture f(rng, 2, 300, 256, 4, o);
    f.tier.SetCalibration(8.f, -kInf);
    const std::vector<float> q = RandomQuery(rng, f.g);
    std::vector<float> none(2, -kInf);
    RecallScan s = f.tier.Scan(f.store, q.data(), 300, none.data(), nullptr, nullptr);
    EXPECT_TRUE(s.overflow);
    EXPECT_EQ(s.n_fired, static_cast<int64_t>(f.archived.size()));
    if (!truncate) {
      EXPECT_TRUE(s.fallback);
      EXPECT_EQ(s.n, 0);
      EXPECT_EQ(f.tier.counters().fallbacks, 1);
    } else {
      EXPECT_FALSE(s.fallback);
      ASSERT_EQ(s.n, 50);
      EXPECT_EQ(std::vector<int64_t>(s.rows, s.rows + 50),
                std::vector<int64_t>(f.archived.begin(), f.archived.begin() + 50));
      EXPECT_EQ(f.tier.counters().truncations, 1);
      EXPECT_EQ(f.tier.counters().fetched, 50);
    }
    // Exactly at capacity: no overflow.
    std::vector<float> idx(2 * f.archived.size()), cert(idx.size());
    const int64_t na = static_cast<int64_t>(f.archived.size());
    f.tier.IndexScores(f.store, q.data(), f.archived.data(), na, idx.data(), cert.data());
    std::vector<float> sc0(na);
    for (int64_t i = 0; i < na; ++i) {
      const float cz = 8.f * cert[i];
      sc0[i] = std::max(idx[i] + cz, idx[na + i] + 8.f * cert[na + i]);
    }
    std::vector<float> sorted = sc0;
    std::sort(sorted.begin(), sorted.end());
    std::vector<float> m(2, sorted[na - 51]);  // exactly 50 rows strictly above (distinct scores)
    s = f.tier.Scan(f.store, q.data(), 300, m.data(), nullptr, nullptr);
    if (sorted[na - 51] < sorted[na - 50]) {
      EXPECT_FALSE(s.overflow);
      EXPECT_EQ(s.n, 50);
    }
  }
}

TEST(RecallIndex, CskRangeCheck) {
  const LayerGeometry g = Mla(1, 64, 16);
  LayerStore store(g);
  std::vector<float> row(80, 1.f);
  for (int i = 0; i < 10; ++i) {
    row[3] = i == 6 ? 7e4f : 1.f;  // identity basis: csk channel 3 = row[3]
    store.Append(row.data(), nullptr);
  }
  RecallOptions o;
  o.rank = 16;
  RecallTier t;
  ASSERT_TRUE(t.Configure(g, o).ok());
  Status s = t.IndexClosedRows(store, 10);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("row 6"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("channel 3"), std::string::npos) << s.message();
  EXPECT_EQ(t.n_indexed(), 6);
  // 6e4 - epsilon is fine (f16 max is 65504).
  LayerStore ok(g);
  row[3] = 5.9e4f;
  ok.Append(row.data(), nullptr);
  RecallTier t2;
  ASSERT_TRUE(t2.Configure(g, o).ok());
  EXPECT_TRUE(t2.IndexClosedRows(ok, 1).ok());
}

TEST(RecallScanQuery, OutOfF16RangeQueryFallsBack) {
  Rng rng(1);
  RecallOptions o;
  o.rank = 16;
  Fixture f(rng, 2, 100, 64, 4, o);
  f.tier.SetCalibration(2.f, -kInf);
  std::vector<float> q = RandomQuery(rng, f.g);
  q[0] = 1e5f;  // qsk channel 0 of head 0 under the identity basis
  std::vector<float> max1(2, 0.f);
  RecallScan s = f.tier.Scan(f.store, q.data(), 100, max1.data(), nullptr, nullptr);
  EXPECT_TRUE(s.fallback);
  EXPECT_TRUE(s.overflow);
}

TEST(RecallOptions, ParseAndValidate) {
  PolicySpec spec{"vestige", {{"recall-rank", "32"}, {"recall-capacity", "100"},
                              {"recall-overflow", "truncate"}, {"calibration", "decode"},
                              {"z-floor", "none"}, {"recall-margin", "0.5"}}};
  StatusOr<RecallOptions> o = RecallOptions::FromSpec(spec);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 32);
  EXPECT_EQ(o->capacity, 100);
  EXPECT_TRUE(o->truncate);
  EXPECT_EQ(o->calibration, RecallCalibration::kDecode);
  EXPECT_EQ(o->z_floor, RecallZFloor::kNone);
  EXPECT_FLOAT_EQ(o->margin, 0.5f);
  StatusOr<RecallOptions> d = RecallOptions::FromSpec(PolicySpec{"vestige", {}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->rank, 64);
  EXPECT_EQ(d->capacity, 4096);
  EXPECT_EQ(d->z_floor, RecallZFloor::kZero);
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"recall-rank", "12"}, {"z-floor", "1"}, {"calibration", "both"},
           {"recall-overflow", "drop"}}) {
    StatusOr<RecallOptions> bad = RecallOptions::FromSpec(PolicySpec{"vestige", {{k, v}}});
    ASSERT_FALSE(bad.ok()) << k;
    EXPECT_NE(bad.status().message().find(v), std::string::npos) << bad.status().message();
  }
  RecallOptions big;
  big.rank = 128;
  EXPECT_FALSE(big.Validate(64).ok());
  RecallTier t;
  LayerGeometry gqa;
  gqa.kind = AttnKind::kGqa;
  EXPECT_FALSE(t.Configure(gqa, RecallOptions()).ok());
}

TEST(RecallStats, AttendedScoreStatsMatchesFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla(5, 64, 16);
  LayerStore store(g);
  FillRows(&store, rng, 333);
  const std::vector<float> q = RandomQuery(rng, g, 2.f);
  std::vector<int64_t> rows;
  for (int64_t u = 0; u < 333; u += 1 + rng.Below(3)) rows.push_back(u);
  std::vector<float> m(5), e(5);
  ThreadPool pool(2);
  AttendedScoreStats(store, q.data(), rows.data(), rows.size(), &pool, m.data(), e.data());
  for (int h = 0; h < 5; ++h) {
    std::vector<double> s;
    for (int64_t u : rows) s.push_back(TrueScore(store, q.data() + h * 80, u));
    const double mx = *std::max_element(s.begin(), s.end());
    double d = 0, ent = 0;
    for (double x : s) d += std::exp(x - mx);
    for (double x : s) {
      const double p = std::exp(x - mx) / d;
      ent -= p * std::log(std::max(p, 1e-12));
    }
    EXPECT_NEAR(m[h], mx, 1e-4 * (1 + std::fabs(mx)));  // f32 dot of 80 terms
    EXPECT_NEAR(e[h], ent, 1e-4 * (1 + ent));
  }
  AttendedScoreStats(store, q.data(), nullptr, 0, &pool, m.data(), e.data());
  EXPECT_EQ(m[0], -kInf);
  EXPECT_EQ(e[0], 0.f);
}

// Decode calibration: provisional until the window (8 queries) is full, then a fitted basis,
// z <= Z_MAX (floor 0) and a gate; the same inputs give the same tier and fetch sets.
TEST(RecallCalibrate, DecodeModeDeterministicAcrossThreadCounts) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  RecallOptions o;
  o.rank = 16;
  o.calibration = RecallCalibration::kDecode;
  Rng r1(seed), r2(seed);
  Fixture a(r1, 4, 600, 512, 16, o), b(r2, 4, 600, 512, 16, o);
  ThreadPool p1(1), p2(2);
  Rng qr(seed ^ 0x1234);
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> q = RandomQuery(qr, a.g);
    std::vector<float> m1(4), e1(4), m2(4), e2(4);
    AttendedScoreStats(a.store, q.data(), a.attended.data(), a.attended.size(), &p1, m1.data(),
                       e1.data());
    AttendedScoreStats(b.store, q.data(), b.attended.data(), b.attended.size(), &p2, m2.data(),
                       e2.data());
    ASSERT_EQ(m1, m2);
    RecallScan s1 = a.tier.Scan(a.store, q.data(), 600, m1.data(), e1.data(), &p1);
    EXPECT_EQ(a.tier.calibrated(), step >= 7) << step;  // the 8th query completes the window
    RecallScan s2 = b.tier.Scan(b.store, q.data(), 600, m2.data(), e2.data(), &p2);
    EXPECT_EQ(std::vector<int64_t>(s1.rows, s1.rows + s1.n),
              std::vector<int64_t>(s2.rows, s2.rows + s2.n));
    EXPECT_EQ(s1.fallback, s2.fallback);
    EXPECT_EQ(a.tier.z(), b.tier.z());
    EXPECT_EQ(a.tier.gate_threshold(), b.tier.gate_threshold());
  }
  EXPECT_TRUE(a.tier.calibrated());
  EXPECT_GE(a.tier.z(), 0.f);
  EXPECT_LE(a.tier.z(), kRecallZMax);
  EXPECT_GE(a.tier.counters().calibrations, 1);
  // Basis is no longer the identity, and orthonormal.
  const float* v = a.tier.basis();
  bool identity = true;
  for (int k = 0; k < 16; ++k)
    for (int c = 0; c < 64; ++c) identity &= v[k * 64 + c] == (k == c ? 1.f : 0.f);
  EXPECT_FALSE(identity);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double d = 0;
      for (int c = 0; c < 64; ++c) d += static_cast<double>(v[i * 64 + c]) * v[j * 64 + c];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-5);
    }
  for (int64_t u = 0; u < 512; ++u) ASSERT_EQ(a.tier.eta(u), b.tier.eta(u));
}

// Two prefix-calibration tiers (rank 16, at most `cap` labelled queries) over the same random
// rows: 600 rows, 512 closed, every 16th kept.
struct PrefixPair {
  Rng r1, r2;
  Fixture a, b;
  PrefixPair(uint64_t seed, int cap)
      : r1(seed),
        r2(seed),
        a(r1, 4, 600, 512, 16, Options(cap)),
        b(r2, 4, 600, 512, 16, Options(cap)) {}
  static RecallOptions Options(int cap) {
    RecallOptions o;
    o.rank = 16;
    o.prefix_max_queries = cap;
    return o;
  }
  // Both calibrated (b on `pool_b`): the same threshold, gate, basis and index.
  void CalibrateAndCompare(ThreadPool* pool_b) {
    ASSERT_TRUE(a.tier.CalibratePrefix(a.store, nullptr).ok());
    ASSERT_TRUE(b.tier.CalibratePrefix(b.store, pool_b).ok());
    ASSERT_TRUE(a.tier.calibrated() && b.tier.calibrated());
    EXPECT_EQ(a.tier.z(), b.tier.z());
    EXPECT_EQ(a.tier.gate_threshold(), b.tier.gate_threshold());
    for (int i = 0; i < 16 * 64; ++i) ASSERT_EQ(a.tier.basis()[i], b.tier.basis()[i]) << i;
    for (int64_t u = 0; u < 512; ++u) ASSERT_EQ(a.tier.eta(u), b.tier.eta(u)) << u;
  }
};

// Prefix calibration at the compression point runs on the cache's pool (the labels' scores,
// the basis re-projection, each head's label): the tier it installs is the same on one thread
// and on two, and the index scores of a batch of rows are each row's own (the calibration
// scores each query's hard targets together).
TEST(RecallCalibrate, PrefixModeDeterministicAcrossThreadCounts) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  PrefixPair t(seed, 24);
  Fixture& a = t.a;
  Rng qr(seed ^ 0x5678);
  for (int64_t p = 300; p < 600; ++p) {
    const std::vector<float> q = RandomQuery(qr, a.g);
    t.a.tier.ObserveQuery(p, q.data());
    t.b.tier.ObserveQuery(p, q.data());
  }
  ThreadPool pool(2);
  t.CalibrateAndCompare(&pool);
  const std::vector<float> q = RandomQuery(qr, a.g);
  const std::vector<int64_t> rows = {3, 40, 41, 200, 511};
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> idx(4 * n), cert(4 * n), i1(4), c1(4);
  a.tier.IndexScores(a.store, q.data(), rows.data(), n, idx.data(), cert.data());
  for (int64_t j = 0; j < n; ++j) {
    a.tier.IndexScores(a.store, q.data(), &rows[j], 1, i1.data(), c1.data());
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(idx[h * n + j], i1[h]) << "row " << rows[j] << " head " << h;
      EXPECT_EQ(cert[h * n + j], c1[h]) << "row " << rows[j] << " head " << h;
    }
  }
}

// Planted needle: one archived row has a high true score for the test query; after calibration
// (both modes, both z floors) tier 2 fetches it, in every trial.
TEST(RecallPlanted, ArchivedNeedleIsFetchedAfterCalibration) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  int fetched = 0, trials = 0;
  for (RecallCalibration mode : {RecallCalibration::kPrefix, RecallCalibration::kDecode}) {
    for (RecallZFloor floor : {RecallZFloor::kNone, RecallZFloor::kZero}) {
      for (int trial = 0; trial < 3; ++trial) {
        const int H = 4, d_c = 128, d_r = 32, n = 1100, n_closed = 1024;
        const LayerGeometry g = Mla(H, d_c, d_r);
        LayerStore store(g);
        // Queries live near a low-rank subspace (a shared direction set), rows are random.
        std::vector<float> dirs(8 * d_c);
        for (auto& x : dirs) x = rng.Normal();
        auto query = [&](Rng& r) {
          std::vector<float> q(H * g.k_dim);
          for (int h = 0; h < H; ++h) {
            for (int c = 0; c < g.k_dim; ++c) q[h * g.k_dim + c] = 0.2f * r.Normal();
            for (int k = 0; k < 8; ++k) {
              const float a = r.Normal();
              for (int c = 0; c < d_c; ++c) q[h * g.k_dim + c] += a * dirs[k * d_c + c];
            }
          }
          return q;
        };
        const std::vector<float> target_q = query(rng);
        int64_t needle = 200 + rng.Below(700);
        if (needle % 32 == 5) ++needle;  // archived (kept rows are u % 32 == 5)
        std::vector<float> row(g.k_dim);
        for (int64_t u = 0; u < n; ++u) {
          for (auto& x : row) x = rng.Normal();
          if (u == needle) {  // aligned with head 1's query: a large true score
            const float* qh = target_q.data() + 1 * g.k_dim;
            double nq = 0;
            for (int c = 0; c < g.k_dim; ++c) nq += qh[c] * qh[c];
            for (int c = 0; c < g.k_dim; ++c) row[c] = 4.f * qh[c] / std::sqrt(nq) * std::sqrt(g.k_dim) ;
          }
          store.Append(row.data(), nullptr);
        }
        RecallOptions o;
        o.rank = 32;
        o.calibration = mode;
        o.z_floor = floor;
        RecallTier t;
        ASSERT_TRUE(t.Configure(g, o).ok());
        ASSERT_TRUE(t.IndexClosedRows(store, n_closed).ok());
        std::vector<int64_t> arch, att;
        for (int64_t u = 0; u < n; ++u)
          ((u < n_closed && u >= 4 && u % 32 != 5) ? arch : att).push_back(u);
        t.SetArchive(arch.data(), arch.size());
        ThreadPool pool(2);
        Rng cr(rng.Next());
        std::vector<float> m(H), e(H);
        if (mode == RecallCalibration::kPrefix) {
          for (int64_t p = n / 2; p < n; p += 7) t.ObserveQuery(p, query(cr).data());
          ASSERT_TRUE(t.CalibratePrefix(store, &pool).ok());
        } else {
          for (int s = 0; s < 8; ++s) {
            const std::vector<float> q = query(cr);
            AttendedScoreStats(store, q.data(), att.data(), att.size(), &pool, m.data(), e.data());
            t.Scan(store, q.data(), n, m.data(), t.needs_entropy() ? e.data() : nullptr, &pool);
          }
        }
        ASSERT_TRUE(t.calibrated());
        if (floor == RecallZFloor::kZero) {
          EXPECT_GE(t.z(), 0.f);
        }
        EXPECT_LE(t.z(), kRecallZMax);
        AttendedScoreStats(store, target_q.data(), att.data(), att.size(), &pool, m.data(),
                           e.data());
        ASSERT_TRUE(std::binary_search(arch.begin(), arch.end(), needle));
        ASSERT_GT(TrueScore(store, target_q.data() + g.k_dim, needle), m[1] + 1.0);
        RecallScan s = t.Scan(store, target_q.data(), n, m.data(),
                              t.needs_entropy() ? e.data() : nullptr, &pool);
        ++trials;
        const bool hit = s.fallback || std::binary_search(s.rows, s.rows + s.n, needle);
        fetched += hit;
        std::vector<float> di(H), dc(H);
        t.IndexScores(store, target_q.data(), &needle, 1, di.data(), dc.data());
        EXPECT_TRUE(hit) << "idx " << di[1] << " cert " << dc[1] << " true "
                         << TrueScore(store, target_q.data() + g.k_dim, needle) << " max1 " << m[1]
                         << " eta " << t.eta(needle) << " mode " << RecallCalibrationName(mode) << " floor "
                         << RecallZFloorName(floor) << " z " << t.z() << " thr "
                         << t.gate_threshold() << " fired " << s.n_fired;
        EXPECT_FALSE(s.fallback);  // selective: the needle is found by the scan itself
        EXPECT_LT(s.n, static_cast<int64_t>(arch.size()) / 4);
      }
    }
  }
  EXPECT_EQ(fetched, trials);
}

// PrefixObservationStride is the stride ObserveQuery's doubling ends with, and a tier offered
// only the queries on it installs the same calibration as one offered every query (the cache
// then delivers only those: Policy::observation_stride).
TEST(RecallCalibrate, PrefixObservationStrideKeepsTheSameQueries) {
  for (int64_t cap : {1, 3, 10, 64}) {
    for (int64_t n = 1; n <= 700; ++n) {
      int64_t stride = 1, kept = 0;  // the doubling rule, simulated
      for (int64_t i = 0; i < n; ++i) {
        if (i % stride != 0) continue;
        if (++kept > 2 * cap) {
          stride *= 2;
          kept = i / stride + 1;
        }
      }
      ASSERT_EQ(RecallTier::PrefixObservationStride(n, cap), stride) << "n " << n << " cap " << cap;
    }
  }
  EXPECT_EQ(RecallTier::PrefixObservationStride(5000, 0), 1);  // calib-queries 0: all
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  PrefixPair t(seed, 6);
  const int64_t first = 300, n = 300;
  const int64_t s = RecallTier::PrefixObservationStride(n, 6);
  ASSERT_EQ(s, 32);
  Rng qr(seed ^ 0x9abc);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> q = RandomQuery(qr, t.a.g);
    t.a.tier.ObserveQuery(first + i, q.data());
    if (i % s == 0) t.b.tier.ObserveQuery(first + i, q.data());
  }
  t.CalibrateAndCompare(nullptr);
}

// Prefix observation keeps at most 2 * cap evenly strided queries and uses <= cap.
TEST(RecallCalibrate, PrefixObservationSubsampling) {
  Rng rng(7);
  RecallOptions o;
  o.rank = 16;
  o.prefix_max_queries = 10;
  Fixture f(rng, 2, 300, 256, 8, o);
  for (int64_t p = 150; p < 300; ++p) f.tier.ObserveQuery(p, RandomQuery(rng, f.g).data());
  EXPECT_LE(f.tier.ResidentBytes(), 256 * (2 * 16 + 4 + 8) + 16 * 64 * 4 + 21 * 2 * 80 * 4 + 21 * 8 + 4096);
  ASSERT_TRUE(f.tier.CalibratePrefix(f.store, nullptr).ok());
  EXPECT_TRUE(f.tier.calibrated());
  bool rung = false;
  for (float z : kRecallZLadder) rung |= f.tier.z() == z;
  EXPECT_TRUE(rung) << f.tier.z();
  // Decode mode refuses prefix calibration.
  RecallOptions d = o;
  d.calibration = RecallCalibration::kDecode;
  Fixture g(rng, 2, 100, 64, 8, d);
  EXPECT_EQ(g.tier.CalibratePrefix(g.store, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
