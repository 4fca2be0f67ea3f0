#include "model/gqa_prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace strata {
namespace {

LayerGeometry Geometry(int H, int KV, int dk, int dv, DType kv_type) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = H;
  g.n_kv_heads = KV;
  g.k_dim = dk;
  g.v_dim = dv;
  g.rope_dim = dk;
  g.rope = true;
  g.scale = 1.f / std::sqrt(static_cast<float>(dk));
  g.kv_type = kv_type;
  return g;
}

LayerStore Store(const LayerGeometry& g, int64_t n, Rng& rng) {
  LayerStore s(g);
  std::vector<float> k(g.n_kv_heads * g.k_dim), v(g.n_kv_heads * g.v_dim);
  for (int64_t u = 0; u < n; ++u) {
    for (float& x : k) x = static_cast<float>(rng.Normal());
    for (float& x : v) x = static_cast<float>(rng.Normal());
    s.Append(k.data(), v.data());
  }
  return s;
}

// Queries [n, H, dk] as a model forms them (unscaled): scores of a few units, far from uniform.
std::vector<float> Queries(const LayerGeometry& g, int64_t n, Rng& rng) {
  std::vector<float> q(n * g.n_q_heads * g.k_dim);
  for (float& x : q) x = static_cast<float>(rng.Normal()) * 2.f;
  return q;
}

// Float64 attention of query head `head` at position pos over the store's rows (as stored):
// the output [dv] and every row's weight [pos + 1].
void Reference(const LayerStore& s, const float* q, int64_t pos, int head, std::vector<double>* o,
               std::vector<double>* w) {
  const LayerGeometry& g = s.geometry();
  const int h = head / g.group_size();
  std::vector<float> key(g.k_dim), val(g.v_dim);
  std::vector<double> sc(pos + 1);
  double mx = -1e300;
  for (int64_t u = 0; u <= pos; ++u) {
    s.KeyRowF32(h, u, key.data());
    double acc = 0;
    for (int c = 0; c < g.k_dim; ++c) acc += double{q[c]} * g.scale * key[c];
    sc[u] = acc;
    mx = std::max(mx, acc);
  }
  double d = 0;
  for (double x : sc) d += std::exp(x - mx);
  o->assign(g.v_dim, 0.0);
  w->assign(pos + 1, 0.0);
  for (int64_t u = 0; u <= pos; ++u) {
    (*w)[u] = std::exp(sc[u] - mx) / d;
    ToF32(g.kv_type, s.val_row(h, u), val.data(), g.v_dim);
    for (int c = 0; c < g.v_dim; ++c) (*o)[c] += (*w)[u] * val[c];
  }
}

struct Result {
  std::vector<float> att;
  std::vector<double> col;
};

Result Staged(const LayerStore& s, int64_t p0, int n, const std::vector<float>& q, ThreadPool* pool,
           int64_t obs_a = 0, int64_t obs_b = 0) {
  const LayerGeometry& g = s.geometry();
  Result r;
  r.att.assign(static_cast<size_t>(n) * g.n_q_heads * g.v_dim, 0.f);
  if (obs_b > obs_a) r.col.assign(g.n_kv_heads * (p0 + obs_b), 0.0);
  GqaStagedAttention(s, p0, n, q.data(), pool, r.att.data(), obs_a, obs_b,
                     r.col.empty() ? nullptr : r.col.data());
  return r;
}

// Every query head's output matches float64 over the rows as stored (bf16, f16, f32), and the
// observed queries' column sums match the float64 weights' sums per KV head, within f32
// rounding: outputs are convex combinations of values of size ~1, so 2e-5 absolute (as
// AttendStaged's own test; a missing or extra row moves an output by ~1e-3); a weight's relative
// error is that of its f32 score and exponential, bounded by 1e-5 here, and each sum takes up to
// obs x G of them.
TEST(GqaStagedAttentionTest, MatchesFloat64OnEveryKvType) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Case {
    int H, KV, dk, dv;
  };
  for (const Case& c : {Case{6, 2, 64, 64}, Case{2, 2, 40, 24}, Case{8, 1, 32, 48}}) {
    for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
      const LayerGeometry g = Geometry(c.H, c.KV, c.dk, c.dv, t);
      const int64_t rows = 200 + static_cast<int64_t>(rng.Below(100));
      const LayerStore s = Store(g, rows, rng);
      for (int64_t p0 : {int64_t{0}, rows / 3}) {
        SCOPED_TRACE(testing::Message() << "H " << c.H << " KV " << c.KV << " dk " << c.dk
                                        << " type " << DTypeName(t) << " p0 " << p0);
        const int n = static_cast<int>(rows - p0);
        const std::vector<float> q = Queries(g, n, rng);
        const int64_t obs_a = n - 17, obs_b = n;
        ThreadPool pool(2);
        const Result r = Staged(s, p0, n, q, &pool, obs_a, obs_b);
        const int64_t n_keys = p0 + obs_b;
        std::vector<double> col(c.KV * n_keys, 0.0), o, w;
        for (int j = 0; j < n; ++j) {
          for (int hq = 0; hq < c.H; ++hq) {
            const int64_t k = int64_t{j} * c.H + hq;
            Reference(s, &q[k * c.dk], p0 + j, hq, &o, &w);
            for (int e = 0; e < c.dv; ++e) {
              ASSERT_NEAR(r.att[k * c.dv + e], o[e], 2e-5) << "query " << j << " head " << hq;
            }
            if (j < obs_a) continue;
            const int h = hq / g.group_size();
            for (int64_t u = 0; u <= p0 + j; ++u) col[h * n_keys + u] += w[u];
          }
        }
        for (int64_t i = 0; i < c.KV * n_keys; ++i) {
          ASSERT_NEAR(r.col[i], col[i], 1e-5 * col[i] + 1e-9) << "KV head " << i / n_keys
                                                                << " row " << i % n_keys;
        }
      }
    }
  }
}

// A query's output depends on its query, position and the rows only: not on the pool or its
// size, nor on how the prompt is cut into chunks (also across a segment boundary), bit for bit.
TEST(GqaStagedAttentionTest, ChunksAndPoolsGiveTheSameBits) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const LayerGeometry g = Geometry(6, 2, 16, 16, DType::kBF16);
  const int64_t rows = kGqaSegmentRows + 100;
  const LayerStore s = Store(g, rows, rng);
  const int64_t p0 = kGqaSegmentRows - 150;  // the chunk crosses the segment boundary
  const int n = static_cast<int>(rows - p0);
  const std::vector<float> q = Queries(g, n, rng);
  const Result one = Staged(s, p0, n, q, nullptr);
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const Result r = Staged(s, p0, n, q, &pool);
    EXPECT_EQ(0, std::memcmp(r.att.data(), one.att.data(), 4 * one.att.size()))
        << threads << " threads";
  }
  // The same queries in two chunks: [p0, p0 + 90) and [p0 + 90, rows).
  const int64_t per = int64_t{g.n_q_heads} * g.k_dim, out = int64_t{g.n_q_heads} * g.v_dim;
  const int a = 90;
  const std::vector<float> qa(q.begin(), q.begin() + a * per), qb(q.begin() + a * per, q.end());
  ThreadPool pool(2);
  const Result ra = Staged(s, p0, a, qa, &pool), rb = Staged(s, p0 + a, n - a, qb, &pool);
  EXPECT_EQ(0, std::memcmp(ra.att.data(), one.att.data(), 4 * a * out));
  EXPECT_EQ(0, std::memcmp(rb.att.data(), &one.att[a * out], 4 * (n - a) * out));
}

// Beyond kGqaObservedRows rows the column sums take a second pass over the keys
// (StagedColumnSums): the same contract as the fused pass.
TEST(GqaStagedAttentionTest, LongContextsSumColumnsInASecondPass) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const LayerGeometry g = Geometry(4, 2, 16, 16, DType::kBF16);
  const int64_t rows = kGqaObservedRows + 70;
  const LayerStore s = Store(g, rows, rng);
  const int n = 40;
  const int64_t p0 = rows - n;
  const std::vector<float> q = Queries(g, n, rng);
  const int64_t obs_a = 25, obs_b = 38, n_keys = p0 + obs_b;
  ThreadPool pool(2);
  const Result r = Staged(s, p0, n, q, &pool, obs_a, obs_b);
  std::vector<double> col(g.n_kv_heads * n_keys, 0.0), o, w;
  for (int j = 0; j < n; ++j) {
    for (int hq = 0; hq < g.n_q_heads; ++hq) {
      const int64_t k = int64_t{j} * g.n_q_heads + hq;
      Reference(s, &q[k * g.k_dim], p0 + j, hq, &o, &w);
      for (int e = 0; e < g.v_dim; ++e) {
        ASSERT_NEAR(r.att[k * g.v_dim + e], o[e], 2e-5) << "query " << j << " head " << hq;
      }
      if (j < obs_a || j >= obs_b) continue;
      const int h = hq / g.group_size();
      for (int64_t u = 0; u <= p0 + j; ++u) col[h * n_keys + u] += w[u];
    }
  }
  for (int64_t i = 0; i < g.n_kv_heads * n_keys; ++i) {
    ASSERT_NEAR(r.col[i], col[i], 1e-5 * col[i] + 1e-9) << "KV head " << i / n_keys << " row "
                                                        << i % n_keys;
  }
}

// A policy's staged prefix (GqaStagedPrefixAttention): every query head matches float64 over
// rows [0, Split(limit)) as the prefix gives them and the rest as stored, with the same f32
// rounding bound as above. The prefix rows here are the stored ones shifted (keys + 0.5, values
// - 0.75), so a row read from the wrong side moves an output by far more than the bound. Cases:
// a first chunk (p0 = 0) and a chunk past a segment boundary whose splits stop at the cap.
TEST(GqaStagedAttentionTest, StagedPrefixMatchesFloat64OverBothParts) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Case {
    int H, KV, dk, dv;
    int64_t rows, p0, unit, cap;
  };
  const Case cases[] = {{6, 2, 64, 64, 260, 0, 32, 192},
                        {4, 1, 32, 48, 270, 100, 32, 64},
                        {4, 2, 16, 16, kGqaSegmentRows + 120, kGqaSegmentRows - 60, 32,
                         kGqaSegmentRows + 40}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " p0 " << c.p0 << " cap " << c.cap);
    const LayerGeometry g = Geometry(c.H, c.KV, c.dk, c.dv, DType::kBF16);
    const LayerStore s = Store(g, c.rows, rng);
    const int n = static_cast<int>(c.rows - c.p0);
    const std::vector<float> q = Queries(g, n, rng);
    auto key = [&](int h, int64_t u, bool prefix, float* out) {
      s.KeyRowF32(h, u, out);
      if (prefix) for (int e = 0; e < g.k_dim; ++e) out[e] += 0.5f;
    };
    auto val = [&](int h, int64_t u, bool prefix, float* out) {
      ToF32(g.kv_type, s.val_row(h, u), out, g.v_dim);
      if (prefix) for (int e = 0; e < g.v_dim; ++e) out[e] -= 0.75f;
    };
    StagedPrefix prefix;
    prefix.plan.unit = c.unit;
    prefix.plan.cap = c.cap;
    prefix.stage = [&](int h, int64_t s0, int64_t sn, float* k, float* v) {
      ASSERT_LE(s0 + sn, c.cap);
      for (int64_t i = 0; i < sn; ++i) {
        key(h, s0 + i, true, k + i * g.k_dim);
        val(h, s0 + i, true, v + i * g.v_dim);
      }
    };
    std::vector<float> att(static_cast<size_t>(n) * g.n_q_heads * g.v_dim);
    ThreadPool pool(2);
    GqaStagedPrefixAttention(s, prefix, c.p0, n, q.data(), &pool, att.data());
    std::vector<float> kr(g.k_dim), vr(g.v_dim);
    for (int j = 0; j < n; j += (j < 40 ? 1 : 7)) {
      const int64_t limit = c.p0 + j + 1, b = prefix.plan.Split(limit);
      for (int hq = 0; hq < g.n_q_heads; ++hq) {
        const int h = hq / g.group_size();
        const float* qh = &q[(int64_t{j} * g.n_q_heads + hq) * g.k_dim];
        std::vector<double> sc(limit);
        double mx = -1e300;
        for (int64_t u = 0; u < limit; ++u) {
          key(h, u, u < b, kr.data());
          double acc = 0;
          for (int e = 0; e < g.k_dim; ++e) acc += double{qh[e]} * g.scale * kr[e];
          sc[u] = acc;
          mx = std::max(mx, acc);
        }
        double d = 0;
        for (double x : sc) d += std::exp(x - mx);
        std::vector<double> o(g.v_dim, 0.0);
        for (int64_t u = 0; u < limit; ++u) {
          val(h, u, u < b, vr.data());
          for (int e = 0; e < g.v_dim; ++e) o[e] += std::exp(sc[u] - mx) / d * vr[e];
        }
        for (int e = 0; e < g.v_dim; ++e) {
          ASSERT_NEAR(att[(int64_t{j} * g.n_q_heads + hq) * g.v_dim + e], o[e], 2e-5)
              << "query " << j << " head " << hq << " split " << b;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
