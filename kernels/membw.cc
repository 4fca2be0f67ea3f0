// Memory read-bandwidth probe (streaming SIMD sum, best of a few passes).
//
// Version log:
//   v1  8 independent accumulators per thread (enough loads in flight to saturate a core's
//       bandwidth); the buffer is first touched in parallel by the threads that later read it.
#include "kernels/membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/buffer.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/membw.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float StreamSumImpl(const float* p, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  size_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
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

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(StreamSumImpl);

float StreamSum(const float* p, size_t n) { return HWY_DYNAMIC_DISPATCH(StreamSumImpl)(p, n); }

double MeasureReadBandwidth(size_t bytes, ThreadPool* pool, int reps) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1024);
  AlignedBuffer<float> buf;  // zeroed by Resize; then written again below so pages are backed
  buf.Resize(n);
  float* p = buf.data();
  const int T = pool ? pool->size() : 1;
  auto run = [&](const std::function<void(int64_t, int64_t, int)>& fn) {
    if (pool) {
      pool->ParallelFor(static_cast<int64_t>(n), fn);
    } else {
      fn(0, static_cast<int64_t>(n), 0);
    }
  };
  run([&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) p[i] = static_cast<float>(i & 7);
  });
  std::vector<float> sink(T, 0.f);
  double best = 0;
  for (int r = 0; r < std::max(1, reps); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run([&](int64_t b, int64_t e, int chunk) { sink[chunk] += StreamSum(p + b, e - b); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(float)) / s);
  }
  volatile float keep = 0;
  for (float v : sink) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace strata
#endif  // HWY_ONCE
