// Deterministic RNG (SplitMix64-seeded xoshiro256**), uniform and normal draws; same stream on every machine.
#pragma once

#include <cmath>
#include <cstdint>

namespace strata {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x5eed) { Seed(seed); }
  void Seed(uint64_t seed) {
    uint64_t z = seed;
    for (auto& s : s_) s = SplitMix(z);
    has_spare_ = false;
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  float UniformF(float lo, float hi) { return lo + static_cast<float>(Uniform()) * (hi - lo); }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n) { return n ? Next() % n : 0; }
  // Standard normal (Box-Muller with a cached spare).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * Uniform() - 1.0;
      v = 2.0 * Uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix(uint64_t& z) {
    uint64_t x = (z += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

// A fresh seed for randomized tests: from the environment variable STRATA_TEST_SEED when set
// (to replay a failure), else from the clock. Tests print it on failure.
uint64_t TestSeed();

}  // namespace strata
