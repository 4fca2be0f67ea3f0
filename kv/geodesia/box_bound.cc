// The compressed-Quest page bound (see BoxUpperBound in blocks.h), Highway SIMD with runtime
// dispatch: f16 box rows promoted to f64, f64 products, max and sums in vector lanes.
//
// Every caller goes through the same dispatched kernel, so the page ranking the policy uses and the
// one a test recomputes agree bit for bit.
#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/geodesia/blocks.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/geodesia/box_bound.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::geodesia {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// u[r] = scale * sum_c max(q[r*D + c] kmin_c, q[r*D + c] kmax_c) for r < n_q.
void BoxBoundsImpl(const uint16_t* kmin, const uint16_t* kmax, const float* q, int n_q, int D,
                   float scale, double* u) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const hn::Rebind<hwy::float16_t, decltype(dd)> dh;
  const int N = static_cast<int>(hn::Lanes(dd));
  const auto* lo16 = reinterpret_cast<const hwy::float16_t*>(kmin);
  const auto* hi16 = reinterpret_cast<const hwy::float16_t*>(kmax);
  for (int r = 0; r < n_q; ++r) {
    const float* qr = q + static_cast<int64_t>(r) * D;
    auto acc = hn::Zero(dd);
    int c = 0;
    for (; c + N <= D; c += N) {
      const auto lo = hn::PromoteTo(dd, hn::PromoteTo(df, hn::LoadU(dh, lo16 + c)));
      const auto hi = hn::PromoteTo(dd, hn::PromoteTo(df, hn::LoadU(dh, hi16 + c)));
      const auto qv = hn::PromoteTo(dd, hn::LoadU(df, qr + c));
      // A channel with q_c = 0 adds 0 even when its box is infinite (keys beyond the f16 range
      // round outward to +-inf): 0 * inf would make the bound NaN.
      acc = hn::Add(acc, hn::IfThenZeroElse(hn::Eq(qv, hn::Zero(dd)),
                                            hn::Max(hn::Mul(qv, lo), hn::Mul(qv, hi))));
    }
    double tail = 0;
    for (; c < D; ++c) {
      if (qr[c] == 0.f) continue;
      const double a = static_cast<double>(qr[c]) * F16ToF32(kmin[c]);
      const double b = static_cast<double>(qr[c]) * F16ToF32(kmax[c]);
      tail += a > b ? a : b;
    }
    u[r] = static_cast<double>(scale) * (hn::GetLane(hn::SumOfLanes(dd, acc)) + tail);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata::geodesia
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::geodesia {

HWY_EXPORT(BoxBoundsImpl);

double BoxUpperBound(const uint16_t* kmin, const uint16_t* kmax, const float* q, int head_dim,
                     float scale) {
  double u = 0;
  HWY_DYNAMIC_DISPATCH(BoxBoundsImpl)(kmin, kmax, q, 1, head_dim, scale, &u);
  return u;
}

void BoxUpperBounds(const uint16_t* kmin, const uint16_t* kmax, const float* q, int n_q,
                    int head_dim, float scale, double* u) {
  STRATA_CHECK(n_q >= 0 && head_dim >= 0);
  HWY_DYNAMIC_DISPATCH(BoxBoundsImpl)(kmin, kmax, q, n_q, head_dim, scale, u);
}

}  // namespace strata::geodesia
#endif  // HWY_ONCE
