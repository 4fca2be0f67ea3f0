#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

namespace strata {

namespace {
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
}  // namespace

Status SamplerOptions::Validate() const {
  if (!(temperature >= 0.f) || !std::isfinite(temperature)) {
    return InvalidArgument("--temp must be a finite number >= 0 (0 = greedy), got " +
                           Num(temperature));
  }
  if (top_k < 0) {
    return InvalidArgument("--top-k must be >= 0 (0 = off), got " + std::to_string(top_k));
  }
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return InvalidArgument("--top-p must be in (0, 1], got " + Num(top_p));
  }
  if (!(min_p >= 0.f && min_p <= 1.f)) {
    return InvalidArgument("--min-p must be in [0, 1] (0 = off), got " + Num(min_p));
  }
  if (!(repeat_penalty > 0.f) || !std::isfinite(repeat_penalty)) {
    return InvalidArgument("--repeat-penalty must be a finite number > 0 (1 = off), got " +
                           Num(repeat_penalty));
  }
  if (repeat_last_n < -1) {
    return InvalidArgument(
        "--repeat-last-n must be >= -1 (-1 = the whole context, 0 = off), got " +
        std::to_string(repeat_last_n));
  }
  if (!std::isfinite(presence_penalty) || !std::isfinite(frequency_penalty)) {
    return InvalidArgument("--presence-penalty and --frequency-penalty must be finite, got " +
                           Num(presence_penalty) + " and " + Num(frequency_penalty));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return InvalidArgument("--logit-bias: token " + std::to_string(id) + " bias " + Num(bias) +
                             ": the id must be >= 0 and the bias finite or -inf (a ban)");
    }
  }
  return OkStatus();
}

void Sampler::Accept(int32_t token) {
  if (!o_.penalizes()) return;
  window_.push_back(token);
  ++seen_[token];
  if (o_.repeat_last_n > 0 && static_cast<int64_t>(window_.size()) > o_.repeat_last_n) {
    const int32_t old = window_.front();
    window_.pop_front();
    if (--seen_[old] == 0) seen_.erase(old);
  }
}

void Sampler::ResetHistory() {
  window_.clear();
  seen_.clear();
}

float Sampler::Penalized(int32_t id, float logit) const {
  auto it = seen_.find(id);
  if (it == seen_.end()) return logit;
  // Dividing a negative logit would raise it; multiplying lowers it (llama.cpp's rule, <= 0).
  if (o_.repeat_penalty != 1.f) {
    logit = logit <= 0.f ? logit * o_.repeat_penalty : logit / o_.repeat_penalty;
  }
  if (o_.frequency_penalty != 0.f || o_.presence_penalty != 0.f) {
    logit -= static_cast<float>(it->second) * o_.frequency_penalty + o_.presence_penalty;
  }
  return logit;
}

const float* Sampler::Biased(const float* logits, int64_t n) {
  if (o_.logit_bias.empty()) return logits;
  biased_.assign(logits, logits + n);
  for (const auto& [id, bias] : o_.logit_bias) {
    if (id < n) biased_[id] += bias;
  }
  return biased_.data();
}

int32_t Sampler::Argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  if (seen_.empty()) {
    // The pre-penalty greedy path, unchanged: the first maximum wins.
    for (int64_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return static_cast<int32_t>(best);
  }
  float best_v = Penalized(0, logits[0]);
  for (int64_t i = 1; i < n; ++i) {
    const float v = Penalized(static_cast<int32_t>(i), logits[i]);
    if (v > best_v) {
      best = i;
      best_v = v;
    }
  }
  return static_cast<int32_t>(best);
}

double Sampler::RunChain(const float* logits, int64_t n) {
  // 1. Repetition penalty (on a copy of the logits).
  scratch_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    scratch_[i] = {seen_.empty() ? logits[i] : Penalized(id, logits[i]), id};
  }
  // Descending logit, ties by id, so every cut and the draw are reproducible.
  const auto before = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  // 2. Top-k: only the k best need sorting.
  int64_t keep = n;
  if (o_.top_k > 0 && o_.top_k < n) {
    keep = o_.top_k;
    std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), before);
  } else {
    std::sort(scratch_.begin(), scratch_.end(), before);
  }
  // Banned tokens (a logit of -inf, from logit_bias) are no candidates at all.
  while (keep > 1 && scratch_[keep - 1].first == -std::numeric_limits<float>::infinity()) --keep;
  const float max_logit = scratch_[0].first;
  // 3. Top-p, on the softmax of the (penalized) logits at temperature 1, as llama.cpp's chain
  // applies the temperature last.
  if (o_.top_p < 1.f) {
    double sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += std::exp(double(scratch_[i].first) - max_logit);
    double acc = 0;
    for (int64_t i = 0; i < keep; ++i) {
      acc += std::exp(double(scratch_[i].first) - max_logit) / sum;
      if (acc >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  // 4. Min-p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p). The top token
  // always stays.
  if (o_.min_p > 0.f) {
    const float min_logit = max_logit + std::log(o_.min_p);
    int64_t i = 1;
    while (i < keep && scratch_[i].first >= min_logit) ++i;
    keep = i;
  }
  // 5. Temperature, then the weights the draw uses.
  scratch_.resize(keep);
  weights_.resize(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    weights_[i] = std::exp((double(scratch_[i].first) - max_logit) / o_.temperature);
    total += weights_[i];
  }
  return total;
}

Status Sampler::CheckLogits(const float* logits, int64_t n, int64_t position) {
  // The common case in one branch-free pass that vectorizes: a float is NaN or infinite exactly
  // when its exponent bits are all ones.
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &logits[i], sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return OkStatus();
  int64_t first = -1, bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(logits[i])) continue;
    if (first < 0) first = i;
    ++bad;
  }
  return DataLoss("non-finite logits at position " + std::to_string(position) +
                  " (the token index in the sequence, prompt included): token " +
                  std::to_string(first) + "'s logit is " + Num(logits[first]) + ", " +
                  std::to_string(bad) + " of " + std::to_string(n) +
                  " logits are NaN or infinite; the model file is likely corrupt (e.g. NaN "
                  "block scales in a quantized tensor)");
}

StatusOr<int32_t> Sampler::Next(const float* logits, int64_t n, int64_t position) {
  RETURN_IF_ERROR(CheckLogits(logits, n, position));
  return Sample(logits, n);
}

int32_t Sampler::Sample(const float* logits, int64_t n) {
  logits = Biased(logits, n);
  if (o_.temperature == 0.f) return Argmax(logits, n);
  const double total = RunChain(logits, n);
  const double r = rng_.Uniform() * total;
  double acc = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    acc += weights_[i];
    if (r < acc) return scratch_[i].second;
  }
  return scratch_.back().second;
}

std::vector<Sampler::Candidate> Sampler::Distribution(const float* logits, int64_t n) {
  logits = Biased(logits, n);
  if (o_.temperature == 0.f) return {{Argmax(logits, n), 1.0}};
  const double total = RunChain(logits, n);
  std::vector<Candidate> out;
  for (size_t i = 0; i < weights_.size(); ++i) {
    out.push_back({scratch_[i].second, weights_[i] / total});
  }
  return out;
}

}  // namespace strata
