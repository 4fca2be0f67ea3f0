#include "kv/vestige/row_chunks.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace strata {

const uint16_t* RowChunks::row(size_t i) const {
  STRATA_CHECK(i < n_);
  const auto& c = chunks_[i / kChunkRows];
  STRATA_CHECK(c != nullptr);
  return c.get() + (i % kChunkRows) * width_;
}

void RowChunks::push_back(const uint16_t* r) {
  if (n_ == 0) {
    first_cap_ = kFirstRows;
    chunks_.push_back(std::make_unique<uint16_t[]>(first_cap_ * width_));
  } else if (n_ < kChunkRows && n_ == first_cap_) {
    // The first chunk doubles (one copy of at most kChunkRows / 2 rows).
    const size_t cap = std::min(kChunkRows, 2 * first_cap_);
    auto bigger = std::make_unique<uint16_t[]>(cap * width_);
    std::memcpy(bigger.get(), chunks_[0].get(), n_ * width_ * sizeof(uint16_t));
    chunks_[0] = std::move(bigger);
    first_cap_ = cap;
  } else if (n_ % kChunkRows == 0) {
    chunks_.push_back(std::make_unique<uint16_t[]>(kChunkRows * width_));
  }
  std::memcpy(chunks_.back().get() + (n_ % kChunkRows) * width_, r, width_ * sizeof(uint16_t));
  ++n_;
}

void RowChunks::ReleaseBelow(size_t i) {
  for (size_t c = 0; c < chunks_.size() && (c + 1) * kChunkRows <= i; ++c) chunks_[c].reset();
}

int64_t RowChunks::bytes() const {
  int64_t b = static_cast<int64_t>(chunks_.capacity() * sizeof(chunks_[0]));
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c]) b += static_cast<int64_t>((c == 0 ? first_cap_ : kChunkRows) * width_ * 2);
  }
  return b;
}

}  // namespace strata
