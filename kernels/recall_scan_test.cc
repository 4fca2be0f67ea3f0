// Tests of the recall scan kernels on plain views: the tile dots against a float64 reference on
// random sizes and fresh seeds (every SIMD target), the fire bits against the scalar score rule
// on those dots, and the three row sources (strided, row by row, branch sidecar) bit for bit.
#include "kernels/recall_scan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

// A random index over n rows of width d_c + d_r (bf16 rows in one contiguous buffer, tiled csk,
// eta, a random archive mask) and a random query for `heads` heads.
struct Index {
  int d_c = 0, d_r = 0, r = 0, heads = 0;
  int64_t n = 0, n_tiles = 0;
  std::vector<uint16_t> rows;     // [n, d_c + d_r] bf16
  std::vector<uint16_t> sidecar;  // [n, d_r] bf16 branch copy
  std::vector<uint16_t> csk;      // [n_tiles, r, 16] f16
  std::vector<float> eta;         // [n_tiles * 16]
  std::vector<uint16_t> mask;     // [n_tiles]
  std::vector<float> q;           // [pad heads / 16, d_r + r, 16]
  std::vector<float> cq, thr;     // [heads]
  int heads_pad = 0;
  int k_dim() const { return d_c + d_r; }
};

Index MakeIndex(Rng& rng, int d_c, int d_r, int r, int heads, int64_t n) {
  Index x;
  x.d_c = d_c;
  x.d_r = d_r;
  x.r = r;
  x.heads = heads;
  x.n = n;
  x.n_tiles = (n + kRecallTileRows - 1) / kRecallTileRows;
  const int k = d_c + d_r;
  x.rows.resize(static_cast<size_t>(n) * k);
  for (auto& v : x.rows) v = F32ToBf16(static_cast<float>(rng.Normal()));
  x.sidecar.resize(static_cast<size_t>(n) * d_r);
  for (int64_t u = 0; u < n; ++u) {
    std::memcpy(&x.sidecar[u * d_r], &x.rows[u * k + d_c], sizeof(uint16_t) * d_r);
  }
  x.csk.assign(static_cast<size_t>(x.n_tiles) * r * kRecallTileRows, 0);
  x.eta.assign(static_cast<size_t>(x.n_tiles) * kRecallTileRows, 0.f);
  for (int64_t u = 0; u < n; ++u) {
    for (int c = 0; c < r; ++c) x.csk[RecallCskAt(u, c, r)] = F32ToF16(3.f * rng.Normal());
    x.eta[u] = static_cast<float>(std::fabs(rng.Normal()));
  }
  x.mask.assign(x.n_tiles, 0);
  for (int64_t u = 0; u < n; ++u) {
    if (rng.Below(3) != 0) x.mask[u / kRecallTileRows] |= static_cast<uint16_t>(1u << (u % 16));
  }
  x.heads_pad = (heads + kRecallHeadPad - 1) / kRecallHeadPad * kRecallHeadPad;
  const int dd = d_r + r;
  x.q.assign(static_cast<size_t>(x.heads_pad) * dd, 0.f);
  std::vector<float> qh(dd);
  for (int h = 0; h < heads; ++h) {
    for (int c = 0; c < d_r; ++c) qh[c] = Bf16ToF32(F32ToBf16(static_cast<float>(rng.Normal())));
    for (int c = d_r; c < dd; ++c) qh[c] = F16ToF32(F32ToF16(static_cast<float>(rng.Normal())));
    RecallPutQuery(qh.data(), dd, h, x.q.data());
    x.cq.push_back(static_cast<float>(0.1 * std::fabs(rng.Normal())));
  }
  x.thr.assign(heads, 0.f);
  return x;
}

// Row sources over the index's buffer: strided (tile_row_stride = k_dim), row by row through a
// scratch copy, and the branch sidecar.
enum class Source { kStrided, kRowByRow, kSidecar };

RecallRowSource MakeSource(const Index& x, Source s) {
  RecallRowSource v;
  v.ctx = &x;
  v.k_dim = x.k_dim();
  if (s == Source::kRowByRow) {
    v.row = [](const void* ctx, int64_t u, uint16_t* scratch) -> const uint16_t* {
      const Index& x = *static_cast<const Index*>(ctx);
      std::memcpy(scratch, &x.rows[u * x.k_dim()], sizeof(uint16_t) * x.k_dim());
      return scratch;
    };
  } else {
    v.row = [](const void* ctx, int64_t u, uint16_t*) -> const uint16_t* {
      const Index& x = *static_cast<const Index*>(ctx);
      return &x.rows[u * x.k_dim()];
    };
    v.tile_row_stride = x.k_dim();
  }
  if (s == Source::kSidecar) v.branch_sidecar = x.sidecar.data();
  return v;
}

RecallScanView MakeView(const Index& x, Source s, float lam, float z) {
  RecallScanView a;
  a.q = x.q.data();
  a.n_heads = x.heads;
  a.n_heads_pad = x.heads_pad;
  a.cq = x.cq.data();
  a.thr = x.thr.data();
  a.lam = lam;
  a.z = z;
  a.src = MakeSource(x, s);
  a.d_c = x.d_c;
  a.d_r = x.d_r;
  a.r = x.r;
  a.csk = x.csk.data();
  a.eta = x.eta.data();
  a.arch_mask = x.mask.data();
  return a;
}

// lam * dot + z * (cq * eta) > thr, with the sum rounded apart from its products (as the kernel).
bool Fires(float idx, float z, float cq, float eta, float thr) {
  volatile float cert = z * (cq * eta);
  volatile float score = idx + cert;
  return score > thr;
}

TEST(RecallScanKernel, DotsMatchFloat64AndFiresMatchTheScoreRule) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Shape {
    int d_c, d_r, r, heads;
  };
  // d_r = 64 and 32: the AVX3 in-register transpose; 7 and 10: the word copy (odd: a half word).
  const Shape shapes[] = {{64, 64, 32, 16}, {40, 32, 8, 3}, {24, 7, 16, 20}, {16, 10, 8, 1}};
  ForEachSimdTarget([&] {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "d_c " << sh.d_c << " d_r " << sh.d_r << " r " << sh.r
                                      << " heads " << sh.heads);
      const int64_t n = 16 * (1 + static_cast<int64_t>(rng.Below(6))) + rng.Below(16);
      Index x = MakeIndex(rng, sh.d_c, sh.d_r, sh.r, sh.heads, n);
      const float lam = 0.125f, z = 1.5f;
      std::vector<int64_t> all(n);
      for (int64_t u = 0; u < n; ++u) all[u] = u;
      // Dots of every row, in a shuffled order (rows gathered into arbitrary tiles).
      std::vector<int64_t> order = all;
      for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.Below(i + 1)]);
      const RecallScanView a = MakeView(x, Source::kStrided, lam, z);
      std::vector<float> idx(static_cast<size_t>(sh.heads) * n), idx_sh(idx.size());
      std::vector<double> ref(idx.size());
      RecallIndexDots(a, all.data(), n, idx.data(), n);
      RecallIndexDots(a, order.data(), n, idx_sh.data(), n);
      RecallIndexDotsRef(a, all.data(), n, ref.data(), n);
      for (int h = 0; h < sh.heads; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          // A row's dot does not depend on its place in a tile or the call: bit-identical.
          ASSERT_EQ(F32Bits(idx[h * n + order[i]]), F32Bits(idx_sh[h * n + i])) << h << " " << i;
          // f32 chain of n = d_r + r terms (mean lam |q_c k_c| ~0.25): the classic bound
          // n 2^-24 sum|terms| is ~1e-6 n here; 1e-4 n leaves a wide margin for the tails.
          ASSERT_NEAR(idx[h * n + i], ref[h * n + i], 1e-4 * (sh.d_r + sh.r)) << h << " " << i;
        }
        // Thresholds at the score of some row: that row must not fire (strict), higher ones do.
        const int64_t pick = static_cast<int64_t>(rng.Below(n));
        volatile float cert = z * (x.cq[h] * x.eta[pick]);
        x.thr[h] = idx[h * n + pick] + cert;
      }
      std::vector<uint16_t> want(x.n_tiles, 0);
      int64_t want_fired = 0;
      for (int h = 0; h < sh.heads; ++h) {
        for (int64_t u = 0; u < n; ++u) {
          if (!((x.mask[u / 16] >> (u % 16)) & 1)) continue;
          if (Fires(idx[h * n + u], z, x.cq[h], x.eta[u], x.thr[h])) {
            want[u / 16] |= static_cast<uint16_t>(1u << (u % 16));
            ++want_fired;
          }
        }
      }
      for (Source s : {Source::kStrided, Source::kRowByRow, Source::kSidecar}) {
        SCOPED_TRACE(static_cast<int>(s));
        const RecallScanView v = MakeView(x, s, lam, z);
        std::vector<uint16_t> fire(x.n_tiles, 0xFFFF);
        int64_t fired = 0;
        // Two calls over a split of the tiles, as the thread chunks do.
        const int64_t mid = x.n_tiles / 2;
        RecallScanTiles(v, 0, mid, fire.data(), &fired);
        RecallScanTiles(v, mid, x.n_tiles, fire.data() + mid, &fired);
        EXPECT_EQ(fire, want);
        EXPECT_EQ(fired, want_fired);
        std::vector<float> idx_s(idx.size());
        RecallIndexDots(v, all.data(), n, idx_s.data(), n);
        for (size_t i = 0; i < idx.size(); ++i) ASSERT_EQ(F32Bits(idx_s[i]), F32Bits(idx[i]));
      }
    }
  });
}

// Whole-row scores lam * q_h . row against float64, for listed rows and for a range, from the
// strided and the row-by-row sources (bit-identical to each other).
TEST(RecallScanKernel, ScoreRowsMatchFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (int it = 0; it < 6; ++it) {
      const int d_c = 8 + static_cast<int>(rng.Below(60));
      const int d_r = 1 + static_cast<int>(rng.Below(20));
      const int G = 1 + static_cast<int>(rng.Below(9));
      const int64_t n = 1 + static_cast<int64_t>(rng.Below(100));
      Index x = MakeIndex(rng, d_c, d_r, 8, 1, n);
      const int k = x.k_dim();
      std::vector<float> q(static_cast<size_t>(G) * k);
      for (auto& v : q) v = static_cast<float>(rng.Normal());
      std::vector<int64_t> rows;
      for (int64_t u = n - 1; u >= 0; u -= 2) rows.push_back(u);
      const int64_t m = static_cast<int64_t>(rows.size());
      const float lam = 0.3f;
      std::vector<float> a(static_cast<size_t>(G) * m), b(a.size()), c(static_cast<size_t>(G) * n);
      RecallScoreRows(q.data(), G, MakeSource(x, Source::kStrided), rows.data(), 0, m, lam,
                      a.data(), m);
      RecallScoreRows(q.data(), G, MakeSource(x, Source::kRowByRow), rows.data(), 0, m, lam,
                      b.data(), m);
      RecallScoreRows(q.data(), G, MakeSource(x, Source::kStrided), nullptr, 0, n, lam, c.data(),
                      n);
      for (int h = 0; h < G; ++h) {
        for (int64_t i = 0; i < m; ++i) {
          double s = 0, mag = 0;
          for (int j = 0; j < k; ++j) {
            const double t = static_cast<double>(q[h * k + j]) * Bf16ToF32(x.rows[rows[i] * k + j]);
            s += t;
            mag += std::fabs(t);
          }
          ASSERT_EQ(F32Bits(a[h * m + i]), F32Bits(b[h * m + i]));
          ASSERT_EQ(F32Bits(a[h * m + i]), F32Bits(c[h * n + rows[i]]));
          // f32 accumulation over k terms: k * 2^-23 relative to sum |terms|.
          ASSERT_NEAR(a[h * m + i], lam * s, lam * mag * k * 1.2e-7 + 1e-30);
        }
      }
    }
  });
}

}  // namespace
}  // namespace strata
