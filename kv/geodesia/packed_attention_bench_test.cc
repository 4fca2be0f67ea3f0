// Development benchmarks of the Geodesia packed kernel (DISABLED_: timing is never a unit test).
// Run with: kv_tests --gtest_also_run_disabled_tests --gtest_filter='GeodesiaPackedBench*'
// Each prints ratios measured in the same process (packed vs the bf16 full read) and per-token
// costs; docs/geodesia.md quotes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "hwy/targets.h"
#include "kernels/test_util.h"
#include "kv/geodesia/blocks.h"
#include "kv/geodesia/packed_attention.h"

namespace strata::geodesia {
namespace {

// Timing of PackedAttendLayer against AttendStream over the same tokens in bf16 (the full
// cache), on random data, in the same process.
struct PackedBenchConfig {
  int64_t ctx = 16384;
  int n_q_heads = 32;
  int n_kv_heads = 8;
  int head_dim = 128;
  int group_size = 64;
  // Fraction of closed blocks at levels 16, 8, 4, 2, 1 (the open block and the last 2 closed
  // blocks and block 0 stay exact, like the policy's hot set).
  std::array<double, kNumLevels> mix = {0, 0, 1, 0, 0};
  int n_splits = 0;  // 0: pool size
  int reps = 5;      // timed steps (best of)
  uint64_t seed = 1;
};
struct PackedBenchResult {
  double packed_ms = 0;  // best step time, PackedAttendLayer
  double full_ms = 0;    // best step time, AttendStream over bf16 (one call per KV head group)
  double speedup = 0;    // full_ms / packed_ms
  double resident_bpv = 0;  // resident bits per value of the graded layer (boxes included)
  double payload_bpv = 0;   // without the boxes
};

PackedBenchResult BenchPackedAttention(const PackedBenchConfig& c, ThreadPool* pool) {
  using Clock = std::chrono::steady_clock;
  GradedConfig gc;
  gc.n_kv_heads = c.n_kv_heads;
  gc.head_dim = c.head_dim;
  gc.group_size = c.group_size;
  GradedLayer layer = std::move(GradedLayer::Create(gc)).value();
  const int H = c.n_kv_heads, D = c.head_dim;
  Rng rng(c.seed);
  // Full cache: [H][ctx, D] bf16 K and V.
  std::vector<uint16_t> fk(static_cast<size_t>(H) * c.ctx * D), fv(fk.size());
  for (size_t i = 0; i < fk.size(); ++i) {
    fk[i] = F32ToBf16(static_cast<float>(rng.Normal()));
    fv[i] = F32ToBf16(static_cast<float>(rng.Normal()));
  }
  std::vector<uint16_t> kt(static_cast<size_t>(H) * D), vt(kt.size());
  for (int64_t t = 0; t < c.ctx; ++t) {
    for (int h = 0; h < H; ++h) {
      std::memcpy(kt.data() + h * D, fk.data() + (h * c.ctx + t) * D, D * 2);
      std::memcpy(vt.data() + h * D, fv.data() + (h * c.ctx + t) * D, D * 2);
    }
    layer.Append(kt.data(), vt.data());
  }
  // Level assignment: hot blocks stay exact; the rest by the mix, shuffled per head.
  const int64_t nc = layer.n_closed_blocks();
  for (int h = 0; h < H; ++h) {
    std::vector<int64_t> cold;
    for (int64_t b = 1; b < nc - 2; ++b) cold.push_back(b);
    for (int64_t i = static_cast<int64_t>(cold.size()) - 1; i > 0; --i) {
      std::swap(cold[i], cold[rng.Below(i + 1)]);
    }
    double acc = 0;
    size_t pos = 0;
    for (int li = 0; li < kNumLevels; ++li) {
      acc += c.mix[li];
      const size_t end =
          std::min(cold.size(), static_cast<size_t>(std::llround(acc * cold.size())));
      for (; pos < end; ++pos) {
        if (kLevels[li] != 16) STRATA_CHECK(layer.Demote(h, cold[pos], kLevels[li]).ok());
      }
    }
  }
  layer.Compact();
  PackedBenchResult r;
  const ResidentBytes rb = layer.resident_bytes();
  const double values = 2.0 * c.ctx * D * H;
  r.resident_bpv = 8.0 * rb.total() / values;
  r.payload_bpv = 8.0 * (rb.total() - rb.boxes) / values;

  const int n_splits = c.n_splits > 0 ? c.n_splits : (pool ? pool->size() : 1);
  const int Q = c.n_q_heads, G = Q / H;
  std::vector<float> q(static_cast<size_t>(Q) * D);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  SoftmaxStateBuffer st(Q, D);
  double best_p = 1e30, best_f = 1e30;
  // Full: the same task structure (KV head x row chunk), AttendStream over bf16 rows.
  const int n_tasks = H * n_splits;
  std::vector<SoftmaxStateBuffer> parts;
  for (int i = 0; i < n_tasks; ++i) parts.emplace_back(G, D);
  auto full_step = [&]() {
    auto run = [&](int task) {
      const int h = task / n_splits, s = task % n_splits;
      SoftmaxStates& ps = parts[task].states();
      ps.Reset();
      int64_t r0, r1;
      ChunkRange(c.ctx, 64, s, n_splits, &r0, &r1);
      KvStreamView kv;
      kv.keys = fk.data() + (static_cast<int64_t>(h) * c.ctx + r0) * D;
      kv.vals = fv.data() + (static_cast<int64_t>(h) * c.ctx + r0) * D;
      kv.k_stride = kv.v_stride = D;
      kv.dk = kv.dv = D;
      AttendStream(q.data() + static_cast<int64_t>(h) * G * D, G, scale, kv, nullptr, r1 - r0, &ps);
    };
    ParallelForEach(pool, n_tasks, [&](int64_t t, int) { run(static_cast<int>(t)); });
    st.states().Reset();
    for (int h = 0; h < H; ++h) {
      SoftmaxStates dst = HeadSlice(st.states(), h * G, G);
      for (int s = 0; s < n_splits; ++s) MergeStates(&dst, parts[h * n_splits + s].states());
    }
  };
  for (int rep = 0; rep < c.reps + 1; ++rep) {  // the first rep warms up
    auto t0 = Clock::now();
    st.states().Reset();
    PackedAttendLayer(layer, q.data(), Q, scale, n_splits, pool, &st.states());
    auto t1 = Clock::now();
    full_step();
    auto t2 = Clock::now();
    if (rep == 0) continue;
    best_p = std::min(best_p, std::chrono::duration<double, std::milli>(t1 - t0).count());
    best_f = std::min(best_f, std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  r.packed_ms = best_p;
  r.full_ms = best_f;
  r.speedup = best_f / best_p;
  return r;
}

// Timing figures; run with --gtest_also_run_disabled_tests.
TEST(GeodesiaPackedBench, DISABLED_BenchCtx16k) {
  ThreadPool pool(2);
  const std::array<double, kNumLevels> mix5 = {0, 0.25, 0.47, 0.18, 0.10};
  const std::array<double, kNumLevels> mix25 = {0, 0.02, 0.12, 0.64, 0.22};
  for (const auto& mix : {mix5, mix25}) {
    PackedBenchConfig c;
    c.mix = mix;
    const PackedBenchResult r = BenchPackedAttention(c, &pool);
    std::printf("mix [16 8 4 2 1] = [%.2f %.2f %.2f %.2f %.2f]: payload %.3f bpv (resident %.3f "
                "with boxes); packed %.3f ms, full bf16 %.3f ms, speedup %.2fx\n",
                mix[0], mix[1], mix[2], mix[3], mix[4], r.payload_bpv, r.resident_bpv, r.packed_ms,
                r.full_ms, r.speedup);
  }
}

// Kernel cost from cache: 16 blocks of one KV head at one level, G = 4, D = 128, read 4000 times.
TEST(GeodesiaPackedBench, DISABLED_BenchInCache) {
  const int D = 128, G = 4, nb = 16;
  Rng rng(7);
  for (int level : {16, 8, 4, 2}) {
    GradedLayer layer = std::move(GradedLayer::Create({1, D, 64, DemotionMode::kOnce})).value();
    std::vector<uint16_t> k(D), v(D);
    for (int t = 0; t < nb * 64 + 1; ++t) {
      for (int c = 0; c < D; ++c) {
        k[c] = F32ToBf16(static_cast<float>(rng.Normal()));
        v[c] = F32ToBf16(static_cast<float>(rng.Normal()));
      }
      layer.Append(k.data(), v.data());
    }
    for (int64_t b = 0; b < nb && level != 16; ++b) ASSERT_TRUE(layer.Demote(0, b, level).ok());
    const PackedHeadView view = layer.view(0);
    std::vector<float> q(G * D);
    for (auto& x : q) x = static_cast<float>(rng.Normal());
    SoftmaxStateBuffer st(G, D);
    ForEachSimdTarget([&] {
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < 800; ++it) {
          st.states().Reset();
          PackedAttend(view, q.data(), G, 0.1f, nullptr, nb, &st.states());
        }
        const double ns =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, ns / (800.0 * nb * 64 * G));
      }
      std::printf("level %d %s: %.3f ns per (token, query head) from cache\n", level,
                  hwy::TargetName(hwy::SupportedTargets() & -hwy::SupportedTargets()), best);
    });
  }
}

// One level at a time (hot blocks exact), one thread.
TEST(GeodesiaPackedBench, DISABLED_BenchLevels) {
  ThreadPool pool(1);
  for (int li = 0; li < kNumLevels; ++li) {
    PackedBenchConfig c;
    c.mix = {0, 0, 0, 0, 0};
    c.mix[li] = 1;
    c.reps = 10;
    const PackedBenchResult r = BenchPackedAttention(c, &pool);
    std::printf("level %d: payload %.3f bpv; packed %.3f ms, full bf16 %.3f ms, speedup %.2fx\n",
                kLevels[li], r.payload_bpv, r.packed_ms, r.full_ms, r.speedup);
  }
}

}  // namespace
}  // namespace strata::geodesia
