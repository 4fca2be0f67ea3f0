#include "kv/baselines/turboquant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "core/status_testing.h"
#include "kv/baselines/llamacpp_kv.h"
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
  TurboQuantPolicy* policy = nullptr;
};

Made MakeCache(const LayerGeometry& g, std::map<std::string, std::string> settings = {}) {
  Made out;
  auto p = MakePolicy(PolicySpec{"turboquant", std::move(settings)});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  out.policy = dynamic_cast<TurboQuantPolicy*>(p->get());
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

// H S as a matrix in float64 (column j = the rotation of e_j): M M^T = I to 1e-12, and
// Unrotate(Rotate(x)) = x. Head dims that are not a power of two rotate in blocks of the largest
// power of two dividing them (80: 16, 96: 32, 40: 8).
TEST(TurboQuantTest, RotationIsOrthogonal) {
  for (int dim : {64, 128, 80, 96, 40}) {
    SCOPED_TRACE(dim);
    const SignedHadamard R(dim, LargestPow2Divisor(dim));
    EXPECT_EQ(R.block(), dim == 80 ? 16 : dim == 96 ? 32 : dim == 40 ? 8 : dim);
    int minus = 0;
    for (int i = 0; i < dim; ++i) minus += R.sign(i) < 0;
    EXPECT_GT(minus, 0);
    EXPECT_LT(minus, dim);
    std::vector<double> m(static_cast<size_t>(dim) * dim);
    for (int j = 0; j < dim; ++j) {
      std::vector<double> e(dim, 0.0);
      e[j] = 1;
      R.Rotate(e.data());
      for (int i = 0; i < dim; ++i) m[i * dim + j] = e[i];
    }
    double worst = 0;
    for (int a = 0; a < dim; ++a) {
      for (int b = 0; b < dim; ++b) {
        double s = 0;
        for (int k = 0; k < dim; ++k) s += m[a * dim + k] * m[b * dim + k];
        worst = std::max(worst, std::abs(s - (a == b ? 1.0 : 0.0)));
      }
    }
    EXPECT_LT(worst, 1e-12);
    Rng rng(dim);
    std::vector<double> x(dim), y;
    for (auto& v : x) v = rng.Normal();
    y = x;
    R.Rotate(y.data());
    R.Unrotate(y.data());
    for (int i = 0; i < dim; ++i) EXPECT_NEAR(y[i], x[i], 1e-12);
  }
}

// The float64 Lloyd iteration reproduces the unit-Gaussian Lloyd-Max quantizers (Max 1960) and
// their mean squared errors.
TEST(TurboQuantTest, LloydMaxCodebooksAreTheGaussianOnes) {
  const std::map<int, std::vector<double>> known = {
      {2, {0.7979}},
      {4, {0.4528, 1.5104}},
      {8, {0.2451, 0.7560, 1.3440, 2.1520}},
      {16, {0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326}},
  };
  const std::map<int, double> mse = {{2, 0.3634}, {4, 0.1175}, {8, 0.03454}, {16, 0.009497}};
  for (const auto& [levels, half] : known) {
    SCOPED_TRACE(levels);
    const std::vector<double>& c = LloydMaxGaussian(levels);
    ASSERT_EQ(static_cast<int>(c.size()), levels);
    for (size_t i = 0; i < half.size(); ++i) {
      EXPECT_NEAR(c[levels / 2 + i], half[i], 1e-4);
      EXPECT_NEAR(c[levels / 2 - 1 - i], -half[i], 1e-4);
    }
    EXPECT_NEAR(LloydMaxDistortion(levels), mse.at(levels), 1e-4);
  }
}

TEST(TurboQuantTest, PackedCodesRoundTrip) {
  Rng rng(7);
  for (int bits : {2, 3, 4, 8}) {
    for (int n : {1, 5, 64, 80}) {
      std::vector<uint8_t> c(n), back(n), packed((n * bits + 7) / 8);
      for (auto& x : c) x = static_cast<uint8_t>(rng.Next() % (1u << bits));
      PackBits(c.data(), n, bits, packed.data());
      UnpackBits(packed.data(), n, bits, back.data());
      EXPECT_EQ(c, back) << bits << " bits, " << n;
    }
  }
  const uint8_t c3[3] = {5, 3, 7};  // 101, 011, 111 LSB-first: 0b11011101, 0b1
  uint8_t p3[2];
  PackBits(c3, 3, 3, p3);
  EXPECT_EQ(p3[0], 0xDD);
  EXPECT_EQ(p3[1], 0x01);
}

// Per-vector reconstruction bound. With z = y sqrt(D) / ||x|| (||z|| = sqrt(D)) and c the
// chosen centroids, ||x - x^|| / ||x|| = ||z - c|| / sqrt(D) (the rotation is orthogonal) up to
// the f16 norm (relative 2^-11). Every |z_i - c_i| is at most half the widest gap between
// neighbouring centroids inside [c_min, c_max] and |z_i| - c_max beyond it, so
//   ||x - x^|| / ||x|| <= sqrt(sum_i e_i^2 / D) + 2^-11,  e_i = those per-coordinate bounds;
// norm correction (x^ rescaled to ||x||) at most doubles the first term. At 8 bits (uniform)
// |y_i - y^_i| <= d / 2, d = max |y| / 127: the relative error is <= sqrt(D) d / (2 ||x||) + 2^-11.
// On Gaussian rows the mean relative squared error is the codebook's MSE (within 15%).
TEST(TurboQuantTest, ReconstructionErrorWithinTheBound) {
  const int D = 128;
  const SignedHadamard R(D, D);
  Rng rng(11);
  for (int bits : {2, 3, 4, 8}) {
    for (bool nc : {false, true}) {
      SCOPED_TRACE(::testing::Message() << bits << " bits, nc " << nc);
      const TurboRowCodec C{D, bits, nc};
      std::vector<double> cb;
      double gap = 0;
      if (bits < 8) {
        cb = LloydMaxGaussian(1 << bits);
        for (size_t i = 1; i < cb.size(); ++i) gap = std::max(gap, cb[i] - cb[i - 1]);
      }
      double sum_rel2 = 0;
      const int trials = 600;
      for (int t = 0; t < trials; ++t) {
        std::vector<float> x(D);
        for (auto& v : x) v = static_cast<float>(rng.Normal());
        if (t % 3 == 1) x[t % D] += 40.f;  // an outlier channel
        if (t % 3 == 2) {                  // a one-hot row
          std::fill(x.begin(), x.end(), 0.f);
          x[t % D] = 3.f;
        }
        double nx = 0;
        for (float v : x) nx += static_cast<double>(v) * v;
        nx = std::sqrt(nx);
        std::vector<float> y = x, yh(D);
        R.Rotate(y.data());
        std::vector<uint8_t> bytes(C.bytes());
        C.Encode(y.data(), static_cast<float>(nx), bytes.data());
        C.Decode(bytes.data(), yh.data());
        R.Unrotate(yh.data());
        double err = 0;
        for (int i = 0; i < D; ++i) err += (x[i] - yh[i]) * static_cast<double>(x[i] - yh[i]);
        const double rel = std::sqrt(err) / nx;
        double bound;
        if (bits == 8) {
          double amax = 0;
          for (float v : y) amax = std::max(amax, std::abs(static_cast<double>(v)));
          bound = std::sqrt(D) * (amax / 127) / (2 * nx) * (1 + 1e-3) + std::ldexp(1.0, -11);
        } else {
          double e2 = 0;
          for (int i = 0; i < D; ++i) {
            const double z = y[i] * std::sqrt(static_cast<double>(D)) / nx;
            const double e = std::abs(z) > cb.back() ? std::abs(z) - cb.back() : gap / 2;
            e2 += e * e;
          }
          bound = (nc ? 2 : 1) * std::sqrt(e2 / D) + std::ldexp(1.0, -11) + 1e-6;
        }
        ASSERT_LE(rel, bound) << "trial " << t;
        if (t % 3 == 0) sum_rel2 += rel * rel;
      }
      if (bits < 8 && !nc) {
        const double mean = sum_rel2 / (trials / 3);
        EXPECT_NEAR(mean, LloydMaxDistortion(1 << bits), 0.15 * LloydMaxDistortion(1 << bits));
      }
    }
  }
}

// Decode reads through the rotation: the output equals attention over the rows RowAsRead gives
// (the un-rotated dequantized rows) within f32 rounding (2e-5), and at 4 bits (the default
// preset) it is within the bound its rows' own errors give of full's
// (ExpectWithinQuantizedAttentionBound), head dims 64 and 80 (blocks of 16) and the MLA geometry,
// and within 0.1 on average over the channels.
TEST(TurboQuantTest, DecodeThroughTheRotationNearFull) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const LayerGeometry& g : {Gqa(64), Gqa(80), MlaGeometry()}) {
    SCOPED_TRACE(g.k_dim);
    Made m = MakeCache(g);
    const int64_t n0 = 200, n = 330;
    Build(m.cache.get(), seed, n0, n);
    const LayerStore& s = m.cache->store(0);
    // The open call is a multi-row decode call: every row is read coded.
    EXPECT_EQ(m.policy->exact_from(0), n);
    std::vector<std::vector<float>> ak(g.n_kv_heads), av(g.n_kv_heads), fk, fv;
    // The rows as bf16, from a full cache (the policy released its early pages).
    auto fc = testing::NewCache(g, PolicySpec{"full", {}});
    Build(fc.get(), seed, n0, n);
    StoreRows(fc->store(0), &fk, &fv);
    for (int h = 0; h < g.n_kv_heads; ++h) {
      std::vector<float> k(g.k_dim), v(g.v_dim);
      for (int64_t u = 0; u < n; ++u) {
        m.policy->RowAsRead(0, s, h, u, k.data(), v.data());
        ak[h].insert(ak[h].end(), k.begin(), k.end());
        av[h].insert(av[h].end(), v.begin(), v.end());
      }
    }
    std::vector<int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    Rng rng(seed);
    for (int t = 0; t < 4; ++t) {
      const std::vector<float> q = RandomQuery(g, rng);
      std::vector<float> out(g.n_q_heads * g.v_dim);
      ASSERT_OK(m.cache->Attend(0, q.data(), n - 1, nullptr, out.data()));
      const std::vector<double> ref = RefAttention(g, q.data(), ak, av, {all});
      EXPECT_LT(testing::MaxAbsDiff(out, ref), 2e-5);
      const std::vector<double> full = RefAttention(g, q.data(), fk, fv, {all});
      testing::ExpectWithinQuantizedAttentionBound(g, q.data(), ak, av, fk, fv, n, out, full,
                                                   /*mean_within=*/0.1);
    }
  }
}

// recent = R: the running call's reads take rows [B - R, limit) from the store, bit for bit (B:
// a decode call's end, a prefill call's first row); a prefill chunk's own rows are exact.
TEST(TurboQuantTest, RecentRowsAreExactBitForBit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = Gqa(64);
  for (int64_t recent : {0, 16, 100}) {
    SCOPED_TRACE(recent);
    Made m = MakeCache(g, {{"recent", std::to_string(recent)}});
    const int64_t n0 = 200, n = 330;
    Build(m.cache.get(), seed, n0, n);
    const LayerStore& s = m.cache->store(0);
    const int64_t e = std::max<int64_t>(0, n - recent);
    EXPECT_EQ(m.policy->exact_from(0), e);
    std::vector<std::vector<float>> fk, fv;
    auto fc = testing::NewCache(g, PolicySpec{"full", {}});
    Build(fc.get(), seed, n0, n);
    StoreRows(fc->store(0), &fk, &fv);
    std::vector<float> k(g.k_dim), v(g.v_dim);
    int exact_rows = 0;
    for (int h = 0; h < g.n_kv_heads; ++h) {
      for (int64_t u = 0; u < n; ++u) {
        m.policy->RowAsRead(0, s, h, u, k.data(), v.data());
        bool same = true;
        for (int c = 0; c < g.k_dim; ++c) same &= k[c] == fk[h][u * g.k_dim + c];
        for (int c = 0; c < g.v_dim; ++c) same &= v[c] == fv[h][u * g.v_dim + c];
        if (u >= e) {
          ASSERT_TRUE(same) << "row " << u;
          ++exact_rows;
        } else {
          ASSERT_FALSE(same) << "row " << u;
        }
      }
    }
    EXPECT_EQ(exact_rows, recent * g.n_kv_heads);
  }
  // A prefill call: its own rows exact, the earlier ones coded.
  Made m = MakeCache(g);
  std::vector<float> k, v;
  ASSERT_OK(m.cache->BeginCall(100, CallKind::kPrefill));
  for (int64_t u = 0; u < 100; ++u) {
    testing::RowAt(g, seed, u, 0, &k, &v);
    ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
  }
  ASSERT_OK(m.cache->EndCall());
  EXPECT_EQ(m.policy->exact_from(0), 0);
  ASSERT_OK(m.cache->BeginCall(50, CallKind::kPrefill));
  for (int64_t u = 100; u < 150; ++u) {
    testing::RowAt(g, seed, u, 0, &k, &v);
    ASSERT_OK(m.cache->Append(0, k.data(), v.data()));
  }
  EXPECT_EQ(m.policy->exact_from(0), 100);
}

// Resident = the store's pages + every row's codes and f16 norms: at head dim 64, 4/4 bits,
// 2 + 32 bytes per K or V row of a head (4.25 bits per value); 3/3: 2 + 24; k8v4: 2 + 64 and
// 2 + 32. Bytes read = coded rows x those bytes + exact rows x the store's bytes.
TEST(TurboQuantTest, AccountingIsTheRealBytes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const LayerGeometry g = Gqa(64);
  for (const auto& [preset, row] : std::vector<std::pair<std::string, int64_t>>{
           {"4bit", 34 + 34}, {"3bit", 26 + 26}, {"k8v4", 66 + 34}, {"k3v4", 26 + 34}}) {
    SCOPED_TRACE(preset);
    Made m = MakeCache(g, {{"preset", preset}, {"recent", "10"}});
    const int64_t n0 = 150, n = 160;
    Build(m.cache.get(), seed, n0, n);
    const LayerStore& s = m.cache->store(0);
    EXPECT_EQ(m.policy->RowBytes(0), g.n_kv_heads * row);
    EXPECT_EQ(m.cache->ResidentBytes(), s.resident_bytes() + n * g.n_kv_heads * row);
    EXPECT_LE(m.cache->ResidentBytes(), m.policy->PeakResidentBytes(0, g, n));
    // Pages [0, 2) lie before the second call (row 150) and before E = 150: released.
    EXPECT_EQ(s.resident_bytes(), s.full_resident_bytes() - 2 * 64 * g.bytes_per_token());
    Rng rng(seed);
    const std::vector<float> q = RandomQuery(g, rng);
    std::vector<float> out(g.n_q_heads * g.v_dim);
    ASSERT_OK(m.cache->Attend(0, q.data(), n - 1, nullptr, out.data()));
    const ReadStats& st = m.cache->counters().last_step;
    EXPECT_EQ(st.rows_attended, n * g.n_kv_heads);
    EXPECT_EQ(st.bytes_read, (n - 10) * g.n_kv_heads * row + 10 * g.bytes_per_token());
  }
  // boundary-layers: a cache of 4 layers with boundary-layers=1 codes layers 1 and 2 only.
  auto p = MakePolicy(PolicySpec{"turboquant", {{"boundary-layers", "1"}}});
  ASSERT_OK(p.status());
  auto* tq = dynamic_cast<TurboQuantPolicy*>(p->get());
  auto c = KvCache::Create({g, g, g, g}, std::move(p).value());
  ASSERT_OK(c.status());
  EXPECT_TRUE(tq->exact_layer(0));
  EXPECT_FALSE(tq->exact_layer(1));
  EXPECT_FALSE(tq->exact_layer(2));
  EXPECT_TRUE(tq->exact_layer(3));
}

TEST(TurboQuantTest, PresetsAndSettingErrors) {
  auto config = [](const std::string& text) {
    auto spec = ParsePolicySpec(text);
    EXPECT_TRUE(spec.ok()) << text;
    auto c = TurboQuantConfigFrom(*spec);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TurboQuantConfig{};
  };
  struct Want {
    std::string text;
    int k, v;
    bool nc;
  };
  for (const Want& w : std::vector<Want>{{"turboquant", 4, 4, true},
                                         {"turboquant:preset=4bit", 4, 4, true},
                                         {"turboquant:preset=k8v4", 8, 4, false},
                                         {"turboquant:preset=k3v4", 3, 4, true},
                                         {"turboquant:preset=3bit", 3, 3, true},
                                         {"turboquant:preset=3bit:value-bits=2", 3, 2, true},
                                         {"turboquant:key-bits=8:norm-correction=off", 8, 4,
                                          false}}) {
    const TurboQuantConfig c = config(w.text);
    EXPECT_EQ(c.key_bits, w.k) << w.text;
    EXPECT_EQ(c.value_bits, w.v) << w.text;
    EXPECT_EQ(c.norm_correction, w.nc) << w.text;
  }
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto parsed = ParsePolicySpec(text);
    Status st = parsed.status();
    if (parsed.ok()) st = MakePolicy(*parsed).status();
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_NE(st.ToString().find(needle), std::string::npos) << st.ToString();
  };
  expect_error("turboquant:key-bits=5", "key-bits");
  expect_error("turboquant:value-bits=1", "value-bits");
  expect_error("turboquant:preset=2bit", "preset");
  expect_error("turboquant:bogus=1", "turboquant");
  expect_error("turboquant:bogus=1", "bogus");
  expect_error("turboquant:ratio=8", "turboquant does not take 'ratio'");
  expect_error("turboquant:recent=-1", "recent");
}

}  // namespace
}  // namespace strata::baselines
