#include "kernels/membw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/test_util.h"

namespace strata {
namespace {

// Small integers sum exactly in f32 (totals < 2^24), so the SIMD sum must equal the exact sum for
// every length and misalignment.
TEST(MembwTest, StreamSumExactOnIntegers) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    for (int it = 0; it < 100; ++it) {
      const size_t n = it < 50 ? it : rng.Below(20000);
      const size_t off = rng.Below(4);
      std::vector<float> v(n + off);
      double want = 0;
      for (size_t i = 0; i < n; ++i) want += v[off + i] = static_cast<float>(rng.Below(9)) - 4.f;
      ASSERT_EQ(static_cast<double>(StreamSum(v.data() + off, n)), want) << "n=" << n;
      ASSERT_EQ(static_cast<double>(StreamSum(v.data() + off, n, /*prefetch=*/true)), want)
          << "n=" << n;
    }
  });
}

TEST(MembwTest, MeasureReturnsPlausibleRate) {
  ThreadPool pool(2);
  const double single = MeasureReadBandwidth(size_t{8} << 20, nullptr, 2).value();
  const double multi = MeasureReadBandwidth(size_t{8} << 20, &pool, 2).value();
  // Any machine reads 8 MiB at more than 100 MB/s and less than 10 TB/s.
  EXPECT_GT(single, 1e8);
  EXPECT_LT(single, 1e13);
  EXPECT_GT(multi, 1e8);
  EXPECT_LT(multi, 1e13);
}

TEST(MembwTest, MeasureOfGivenBytesIsPlausibleAtAnyAlignment) {
  ThreadPool pool(2);
  std::vector<uint8_t> buf((size_t{8} << 20) + 13, 1);
  for (size_t off : {size_t{0}, size_t{3}, size_t{13}}) {
    const double single = MeasureReadBandwidthOf(buf.data() + off, buf.size() - off, nullptr, 2);
    const double multi = MeasureReadBandwidthOf(buf.data() + off, buf.size() - off, &pool, 2);
    EXPECT_GT(single, 1e8) << off;
    EXPECT_LT(single, 1e13) << off;
    EXPECT_GT(multi, 1e8) << off;
    EXPECT_LT(multi, 1e13) << off;
  }
  // Too few bytes to time: 0, never a division by a zero duration.
  EXPECT_EQ(MeasureReadBandwidthOf(buf.data(), 40, nullptr, 1), 0.0);
}

}  // namespace
}  // namespace strata
