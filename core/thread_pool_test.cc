#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, GrainAlignsChunkBoundaries) {
  ThreadPool pool(3);
  std::vector<std::pair<int64_t, int64_t>> chunks(3, {-1, -1});
  pool.ParallelForGrain(1000, 64, [&](int64_t b, int64_t e, int k) { chunks[k] = {b, e}; });
  int64_t covered = 0;
  for (auto [b, e] : chunks) {
    if (b < 0) continue;
    EXPECT_EQ(b % 64, 0);
    covered += e - b;
  }
  EXPECT_EQ(covered, 1000);
}

// Thousands of back-to-back jobs (the decode pattern: the spin handoff) and jobs after idle gaps
// (the blocking handoff) each run every index exactly once.
TEST(ThreadPoolTest, BackToBackAndAfterIdleJobs) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<int64_t> sum(4000, 0);
    for (int j = 0; j < 4000; ++j) {
      const int64_t n = 1 + j % 37;
      std::atomic<int64_t> acc{0};
      pool.ParallelFor(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) acc += i + 1;
      });
      sum[j] = acc.load();
      ASSERT_EQ(sum[j], n * (n + 1) / 2) << "job " << j;
      if (j % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

TEST(ThreadPoolTest, ChunkingIsDeterministic) {
  int64_t b, e;
  ChunkRange(10, 1, 1, 3, &b, &e);
  EXPECT_EQ(b, 3);
  EXPECT_EQ(e, 6);
}

// Without a pool the work runs inline as one chunk 0; with a pool it is the pool's chunking (one
// thread or n <= grain: inline chunk 0 too). ParallelForEach visits every item once.
TEST(ThreadPoolTest, ParallelForOrInline) {
  std::vector<std::array<int64_t, 3>> calls;
  auto record = [&](int64_t b, int64_t e, int k) { calls.push_back({b, e, k}); };
  ParallelForOrInline(nullptr, 10, 4, record);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], (std::array<int64_t, 3>{0, 10, 0}));
  calls.clear();
  ParallelForOrInline(nullptr, 0, 1, record);
  EXPECT_TRUE(calls.empty());
  ThreadPool pool(3);
  std::vector<std::array<int64_t, 3>> chunks(3, {-1, -1, -1});
  ParallelForOrInline(&pool, 10, 4, [&](int64_t b, int64_t e, int k) { chunks[k] = {b, e, k}; });
  for (int k = 0; k < 3; ++k) {
    int64_t b, e;
    ChunkRange(10, 4, k, 3, &b, &e);
    EXPECT_EQ(chunks[k], (std::array<int64_t, 3>{b, e, k}));
  }
  std::vector<std::atomic<int>> seen(50);
  ParallelForEach(&pool, 50, [&](int64_t i, int k) {
    EXPECT_LT(k, 3);
    ++seen[i];
  });
  for (auto& x : seen) EXPECT_EQ(x.load(), 1);
}

}  // namespace
}  // namespace strata
