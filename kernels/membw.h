// Memory read-bandwidth probe: the floor that memory-bound kernels (MatVec, AttendStream) are
// measured against in benchmarks.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "core/thread_pool.h"

namespace strata {

// Bytes per second of a streaming SIMD read (a running sum) over a huge-page buffer of `bytes`
// (default 512 MiB, larger than any last-level cache), best of `reps` passes each with and without
// software prefetch. With a pool, the buffer is split into pool->size() contiguous parts read
// concurrently (each first touched by its reader, all started together); null = the calling
// thread only.
// An error (naming the size) when the buffer cannot be allocated.
StatusOr<double> MeasureReadBandwidth(size_t bytes = size_t{512} << 20, ThreadPool* pool = nullptr,
                                      int reps = 3);

// The SIMD sum used by the probe (exposed for its test): sum of n floats, optionally with
// software prefetch ahead of the loads.
float StreamSum(const float* p, size_t n, bool prefetch = false);

}  // namespace strata
