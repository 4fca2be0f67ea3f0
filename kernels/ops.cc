// Elementwise and small vector kernels (RmsNorm, Rope, Softmax, SwiGlu, GeluTanhGlu, Axpy, Dot).
//
// Version log:
//   v1  Scalar RmsNorm/Rope/Softmax/SwiGlu (not on the bandwidth path: O(d) per token against
//       O(d^2) matvecs). Rope angles in double so theta stays accurate at position 1e5+.
//       Dot and Axpy are Highway SIMD (4 accumulators in Dot).
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float DotImpl(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * N), hn::LoadU(df, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * N), hn::LoadU(df, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float DotAcc2Impl(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void AxpyImpl(float a, const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(DotImpl);
HWY_EXPORT(DotAcc2Impl);
HWY_EXPORT(AxpyImpl);

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
  }
}

void RopeFactors(int dim, int64_t pos, const RopeParams& p, float* cs) {
  const int half = dim / 2;
  const double log_base = std::log(static_cast<double>(p.freq_base));
  for (int i = 0; i < half; ++i) {
    // theta_i = pos * base^(-2i/dim) * freq_scale [/ freq_factors[i]], all in double.
    double theta = static_cast<double>(pos) * std::exp(-2.0 * i / dim * log_base) *
                   static_cast<double>(p.freq_scale);
    if (p.freq_factors) theta /= static_cast<double>(p.freq_factors[i]);
    cs[2 * i] = static_cast<float>(std::cos(theta) * p.attn_factor);
    cs[2 * i + 1] = static_cast<float>(std::sin(theta) * p.attn_factor);
  }
}

void RopeApply(float* x, int dim, RopeStyle style, const float* cs) {
  const int half = dim / 2;
  for (int i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const int i0 = style == RopeStyle::kNorm ? 2 * i : i;
    const int i1 = style == RopeStyle::kNorm ? 2 * i + 1 : i + half;
    const float a = x[i0], b = x[i1];
    x[i0] = a * c - b * s;
    x[i1] = a * s + b * c;
  }
}

void Rope(float* x, int dim, int64_t pos, RopeStyle style, const RopeParams& p) {
  std::vector<float> cs(dim);
  RopeFactors(dim, pos, p, cs.data());
  RopeApply(x, dim, style, cs.data());
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (m == -std::numeric_limits<float>::infinity()) {  // all masked: no mass anywhere
    std::fill(x, x + n, 0.f);
    return;
  }
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGlu(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = x[i];
    x[i] = g / (1.f + std::exp(-g)) * y[i];
  }
}

void GeluTanhGlu(float* x, const float* y, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = x[i];
    x[i] = 0.5f * g * (1.f + std::tanh(kSqrt2OverPi * g * (1.f + 0.044715f * g * g))) * y[i];
  }
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(a, x, y, n);
}

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}

float DotAcc2(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotAcc2Impl)(a, b, n);
}

}  // namespace strata
#endif  // HWY_ONCE
