#include "core/huge_region.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace strata {

HugeRegion::~HugeRegion() { Release(); }

HugeRegion::HugeRegion(HugeRegion&& o) noexcept
    : data_(o.data_), size_(o.size_), map_(o.map_), map_bytes_(o.map_bytes_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

HugeRegion& HugeRegion::operator=(HugeRegion&& o) noexcept {
  if (this != &o) {
    Release();
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(map_, o.map_);
    std::swap(map_bytes_, o.map_bytes_);
  }
  return *this;
}

void HugeRegion::Release() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  data_ = nullptr;
  size_ = 0;
  map_ = nullptr;
  map_bytes_ = 0;
}

StatusOr<HugeRegion> HugeRegion::Allocate(size_t bytes) {
  HugeRegion r;
  if (bytes == 0) return r;
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  if (rounded < bytes) return IoError("memory region of " + std::to_string(bytes) + " bytes is too large");
  // Over-allocate by one huge page and trim to a 2 MiB-aligned start.
  const size_t map_bytes = rounded + kHugePage;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    return IoError("cannot allocate " + std::to_string(bytes) +
                             " bytes of memory: " + std::strerror(errno));
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
  r.map_ = m;
  r.map_bytes_ = map_bytes;
  r.data_ = reinterpret_cast<uint8_t*>(start);
  r.size_ = bytes;
#ifdef MADV_HUGEPAGE
  (void)madvise(r.data_, rounded, MADV_HUGEPAGE);  // advice only
#endif
  return r;
}

}  // namespace strata
