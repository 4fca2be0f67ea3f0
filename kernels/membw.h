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

// Bytes per second of streaming `bytes` bytes at `p` (already in memory: a mapped model's weights)
// with an integer SIMD reduction (no float assists on denormal bit patterns), best of `reps`
// passes with and without software prefetch, split across the pool's threads as above. A decode
// step reads these very bytes, so the floor built on this rate cannot be beaten by a better
// access pattern over a different buffer (the buffer probe read 16.5 GB/s on one host where a
// Q8_0 decode moved 22 GB/s).
double MeasureReadBandwidthOf(const void* p, size_t bytes, ThreadPool* pool = nullptr,
                              int reps = 3);

// The SIMD sum used by the probe (exposed for its test): sum of n floats, optionally with
// software prefetch ahead of the loads.
float StreamSum(const float* p, size_t n, bool prefetch = false);

}  // namespace strata
