// RowChunks: rows read back through the first chunk's growth and after releases.
#include "kv/vestige/row_chunks.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata {
namespace {

std::vector<uint16_t> RowOf(size_t i, size_t w) {
  std::vector<uint16_t> r(w);
  for (size_t c = 0; c < w; ++c) r[c] = static_cast<uint16_t>(i * 31 + c);
  return r;
}

TEST(RowChunksTest, RowsSurviveGrowthAndReleaseBelow) {
  const size_t w = 5;
  RowChunks a(w);
  const size_t n = 3 * RowChunks::kChunkRows + 17;
  for (size_t i = 0; i < n; ++i) {
    a.push_back(RowOf(i, w).data());
    // Every row so far reads back through the first chunk's doublings.
    if (i < RowChunks::kChunkRows + 2) {
      for (size_t j = 0; j <= i; ++j) {
        ASSERT_EQ(RowOf(j, w), std::vector<uint16_t>(a.row(j), a.row(j) + w));
      }
    }
  }
  ASSERT_EQ(a.size(), n);
  // At most one chunk of slack, and at most twice the rows while the first chunk grows.
  const int64_t row_bytes = static_cast<int64_t>(w * 2);
  EXPECT_LE(a.bytes(), static_cast<int64_t>(n + RowChunks::kChunkRows) * row_bytes + 256);
  RowChunks small(w);
  for (size_t i = 0; i < 9; ++i) small.push_back(RowOf(i, w).data());
  EXPECT_LE(small.bytes(), 2 * 9 * row_bytes + 64);
  // Released chunks free their bytes; later rows stay valid.
  const int64_t before = a.bytes();
  a.ReleaseBelow(2 * RowChunks::kChunkRows + 3);
  EXPECT_EQ(a.bytes(), before - 2 * static_cast<int64_t>(RowChunks::kChunkRows) * row_bytes);
  for (size_t j = 2 * RowChunks::kChunkRows; j < n; ++j) {
    ASSERT_EQ(RowOf(j, w), std::vector<uint16_t>(a.row(j), a.row(j) + w)) << j;
  }
}

}  // namespace
}  // namespace strata
