// RowChunks: fixed-width bf16 rows in chunks, for VestigeKV's attended tier.
//
// The tier is rebuilt at every rebalance (rows leave and enter the kept set) and grows at every
// release. A contiguous buffer would hold the old and the new copy at once during a rebuild and
// twice its size during a reallocation (35 MB per layer at 1M tokens of Kimi Linear's shape);
// chunks let a rebuild free the old rows as it consumes them, so the tier never exists twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace strata {

class RowChunks {
 public:
  // Rows per chunk. The first chunk starts at kFirstRows and doubles up to kChunkRows, so a small
  // tier holds at most twice its rows; a large one at most one chunk of slack.
  static constexpr size_t kChunkRows = 256;
  static constexpr size_t kFirstRows = 8;

  RowChunks() = default;
  explicit RowChunks(size_t width) : width_(width) {}

  size_t width() const { return width_; }
  size_t size() const { return n_; }
  // Row i (CHECK: i < size() and its chunk not released).
  const uint16_t* row(size_t i) const;
  void push_back(const uint16_t* r);
  // Frees every chunk all of whose rows are below i; rows >= i stay valid. For a rebuild that has
  // consumed rows [0, i) of this set.
  void ReleaseBelow(size_t i);
  // Bytes allocated.
  int64_t bytes() const;

 private:
  size_t width_ = 0, n_ = 0;
  size_t first_cap_ = 0;  // rows the first chunk holds now (< kChunkRows while it grows)
  std::vector<std::unique_ptr<uint16_t[]>> chunks_;  // null once released
};

}  // namespace strata
