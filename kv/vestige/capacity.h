// Copies of the vestige structures for a forked cache keep their vectors' capacities: the
// policy's resident bytes and its growth steps are measured on capacities, so a fork reports and
// grows exactly as the original would.
#pragma once

#include <vector>

namespace strata {

// *dst (already a copy of src) grows its capacity to src's.
template <typename T>
void ReserveAsIn(std::vector<T>* dst, const std::vector<T>& src) {
  if (dst->capacity() < src.capacity()) dst->reserve(src.capacity());
}

}  // namespace strata
