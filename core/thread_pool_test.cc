#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

TEST(ThreadPoolTest, ChunkingIsDeterministic) {
  int64_t b, e;
  ChunkRange(10, 1, 1, 3, &b, &e);
  EXPECT_EQ(b, 3);
  EXPECT_EQ(e, 6);
}

}  // namespace
}  // namespace strata
