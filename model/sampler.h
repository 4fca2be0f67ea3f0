// Token sampling: greedy, temperature, nucleus (top-p), reproducible from a seed.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/status.h"

namespace strata {

struct SamplerOptions {
  float temperature = 0.f;  // 0: greedy (argmax; ties to the lowest id)
  float top_p = 1.f;        // keep the smallest set of top tokens whose probability >= top_p
  uint64_t seed = 0;
  Status Validate() const;  // temperature >= 0 and finite; top_p in (0, 1]
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {}
  int32_t Sample(const float* logits, int64_t n_vocab);

 private:
  SamplerOptions o_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace strata
