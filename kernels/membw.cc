// Memory read-bandwidth probe (streaming SIMD sum, best of a few passes).
//
// Version log:
//   v1  8 independent accumulators per thread (enough loads in flight to saturate a core's
//       bandwidth); the buffer is first touched in parallel by the threads that later read it.
//   v2  Two readers read less than one (33.7 vs 38.6 GB/s on the 2-core dev host) while 2-thread
//       decode moved ~50 GB/s: over 4 KiB pages the hardware prefetchers restart at every page
//       and two streams starve each other. Now: a huge-page buffer, best of plain and
//       software-prefetched reads, readers started together by a barrier and timed each
//       (measured in a standalone test: 1 reader 43 GB/s, 2 readers 51.5-52.4 GB/s).
#include "kernels/membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include <atomic>

#include "core/huge_region.h"
#include "hwy/cache_control.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/membw.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kPrefetch: software prefetch kPrefetch bytes ahead of the loads (0: none).
template <int kPrefetch>
float StreamSumT(const float* p, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  size_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    if constexpr (kPrefetch > 0) {
      const char* ahead = reinterpret_cast<const char*>(p + i) + kPrefetch;
      for (size_t b = 0; b < 8 * N * sizeof(float); b += 64) hwy::Prefetch(ahead + b);
    }
    a0 = hn::Add(a0, hn::LoadU(df, p + i));
    a1 = hn::Add(a1, hn::LoadU(df, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(df, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(df, p + i + 3 * N));
    a4 = hn::Add(a4, hn::LoadU(df, p + i + 4 * N));
    a5 = hn::Add(a5, hn::LoadU(df, p + i + 5 * N));
    a6 = hn::Add(a6, hn::LoadU(df, p + i + 6 * N));
    a7 = hn::Add(a7, hn::LoadU(df, p + i + 7 * N));
  }
  a0 =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  float s = hn::GetLane(hn::SumOfLanes(df, a0));
  for (; i < n; ++i) s += p[i];
  return s;
}

// Xor of n u64 words with 8 independent accumulators (the integer twin of StreamSumT).
template <int kPrefetch>
uint64_t StreamXorT(const uint64_t* p, size_t n) {
  const hn::ScalableTag<uint64_t> du;
  const size_t N = hn::Lanes(du);
  auto a0 = hn::Zero(du), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  size_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    if constexpr (kPrefetch > 0) {
      const char* ahead = reinterpret_cast<const char*>(p + i) + kPrefetch;
      for (size_t b = 0; b < 8 * N * sizeof(uint64_t); b += 64) hwy::Prefetch(ahead + b);
    }
    a0 = hn::Xor(a0, hn::LoadU(du, p + i));
    a1 = hn::Xor(a1, hn::LoadU(du, p + i + N));
    a2 = hn::Xor(a2, hn::LoadU(du, p + i + 2 * N));
    a3 = hn::Xor(a3, hn::LoadU(du, p + i + 3 * N));
    a4 = hn::Xor(a4, hn::LoadU(du, p + i + 4 * N));
    a5 = hn::Xor(a5, hn::LoadU(du, p + i + 5 * N));
    a6 = hn::Xor(a6, hn::LoadU(du, p + i + 6 * N));
    a7 = hn::Xor(a7, hn::LoadU(du, p + i + 7 * N));
  }
  a0 = hn::Xor(hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3)), hn::Xor(hn::Xor(a4, a5), hn::Xor(a6, a7)));
  uint64_t s = 0;
  for (size_t j = 0; j < N; ++j) s ^= hn::ExtractLane(a0, j);
  for (; i < n; ++i) s ^= p[i];
  return s;
}

uint64_t StreamXorImpl(const uint64_t* p, size_t n, int prefetch) {
  return prefetch ? StreamXorT<1024>(p, n) : StreamXorT<0>(p, n);
}

float StreamSumImpl(const float* p, size_t n, int prefetch) {
  return prefetch ? StreamSumT<1024>(p, n) : StreamSumT<0>(p, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(StreamSumImpl);
HWY_EXPORT(StreamXorImpl);

float StreamSum(const float* p, size_t n, bool prefetch) {
  return HWY_DYNAMIC_DISPATCH(StreamSumImpl)(p, n, prefetch ? 1 : 0);
}

namespace {
// Runs fn(k) for reader k = 0..T-1 on the pool's threads (the caller alone when T == 1).
void EachReader(ThreadPool* pool, int T, const std::function<void(int)>& fn) {
  if (T == 1) {
    fn(0);
    return;
  }
  pool->ParallelForGrain(T, 1, [&](int64_t a, int64_t z, int) {
    for (int64_t k = a; k < z; ++k) fn(static_cast<int>(k));
  });
}

// Best bytes/s over `reps` passes without and with software prefetch: read(k, prefetch) reads
// reader k's part. All readers start together (a spin barrier); a pass lasts from the first start
// to the last end, so a reader that runs late (descheduled) counts against the figure.
double BestPass(ThreadPool* pool, int T, int reps, double bytes,
                const std::function<void(int, int)>& read) {
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> start(T), end(T);
  double best = 0;
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    for (int r = 0; r < std::max(1, reps); ++r) {
      std::atomic<int> arrived{0};
      EachReader(pool, T, [&](int k) {
        arrived.fetch_add(1, std::memory_order_acq_rel);
        while (arrived.load(std::memory_order_acquire) < T) {
        }
        start[k] = Clock::now();
        read(k, prefetch);
        end[k] = Clock::now();
      });
      const double s = std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                                     *std::min_element(start.begin(), start.end()))
                           .count();
      if (s > 0) best = std::max(best, bytes / s);
    }
  }
  return best;
}
}  // namespace

StatusOr<double> MeasureReadBandwidth(size_t bytes, ThreadPool* pool, int reps) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1024);
  const int T = pool ? pool->size() : 1;
  // A huge-page region (where the kernel grants them): the best case for a streaming reader,
  // which is what the engine's weight and KV buffers are measured against.
  auto region = HugeRegion::Allocate(n * sizeof(float));
  if (!region.ok()) return region.status().WithContext("bandwidth probe buffer");
  float* p = reinterpret_cast<float*>(region->data());
  // Each reader's part, first touched by that reader.
  EachReader(pool, T, [&](int k) {
    for (size_t i = n * k / T; i < n * (k + 1) / T; ++i) p[i] = static_cast<float>(i & 7);
  });
  std::vector<float> sink(T, 0.f);
  const double best = BestPass(pool, T, reps, static_cast<double>(n * sizeof(float)),
                               [&](int k, int prefetch) {
                                 const size_t b = n * k / T, e = n * (k + 1) / T;
                                 sink[k] += StreamSum(p + b, e - b, prefetch != 0);
                               });
  volatile float keep = 0;
  for (float v : sink) keep = keep + v;
  (void)keep;
  return best;
}

double MeasureReadBandwidthOf(const void* data, size_t bytes, ThreadPool* pool, int reps) {
  // Whole u64 words from the first 8-byte boundary (a mapped file's data is page aligned).
  const uintptr_t a = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (a + 7) & ~uintptr_t{7};
  if (bytes < (first - a) + 64) return 0;
  const uint64_t* p = reinterpret_cast<const uint64_t*>(first);
  const size_t n = (bytes - (first - a)) / 8;
  const int T = pool ? pool->size() : 1;
  std::vector<uint64_t> sink(T, 0);
  const double best = BestPass(pool, T, reps, static_cast<double>(n * 8), [&](int k, int prefetch) {
    const size_t b = n * k / T, e = n * (k + 1) / T;
    sink[k] ^= HWY_DYNAMIC_DISPATCH(StreamXorImpl)(p + b, e - b, prefetch);
  });
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep ^ v;
  (void)keep;
  return best;
}

}  // namespace strata
#endif  // HWY_ONCE
