#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace strata {

Status SamplerOptions::Validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return InvalidArgument("--temp must be a finite number >= 0, got " + std::to_string(temperature));
  }
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return InvalidArgument("--top-p must be in (0, 1], got " + std::to_string(top_p));
  }
  return OkStatus();
}

int32_t Sampler::Sample(const float* logits, int64_t n) {
  if (o_.temperature == 0.f) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return static_cast<int32_t>(best);
  }
  scratch_.resize(n);
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float p = std::exp((logits[i] - mx) / o_.temperature);
    scratch_[i] = {p, static_cast<int32_t>(i)};
    sum += p;
  }
  // Descending probability, ties by id, so the draw is reproducible.
  std::sort(scratch_.begin(), scratch_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  int64_t keep = n;
  if (o_.top_p < 1.f) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += scratch_[i].first / sum;
      if (acc >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_sum = 0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += scratch_[i].first;
  const double r = rng_.Uniform() * kept_sum;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += scratch_[i].first;
    if (r < acc) return scratch_[i].second;
  }
  return scratch_[keep - 1].second;
}

}  // namespace strata
