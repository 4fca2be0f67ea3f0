#include "core/rng.h"

#include <chrono>
#include <cstdlib>

namespace strata {

uint64_t TestSeed() {
  if (const char* s = std::getenv("STRATA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  static uint64_t counter = 0;
  const uint64_t t = static_cast<uint64_t>(
      std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return t ^ (0x9e3779b97f4a7c15ull * ++counter);
}

}  // namespace strata
