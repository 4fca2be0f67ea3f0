// Geodesia-KV on a tiny synthetic llama (model/synth.h): decoding at 4 and 2 bits runs, keeps
// every layer's block levels within the budget, and reads fewer bytes than the full cache.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "core/rng.h"
#include "kv/geodesia/accounting.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

TEST(GeodesiaModelTest, TinyLlamaDecodesWithinBudgetAndReadsLess) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  SynthOptions o;
  o.arch = Arch::kLlama;
  o.seed = seed;
  o.dtype = DType::kF32;
  // Head dim 64 so that the default group (64) divides it.
  ASSERT_TRUE(o.ApplyDims("d_model=128,heads=4,kv_heads=2,head_dim=64,layers=2").ok());
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_geodesia_model_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/tiny.gguf";
  ASSERT_TRUE(SynthGguf(o, path).ok());
  auto m = Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Model& model = **m;
  ThreadPool pool(2);
  Rng rng(seed);
  // Long enough that the three exact hot blocks fit a 2-bit budget (3 x 16 + rest x 0.25 <= 2 nb).
  const int P = 2500, n_dec = 40;
  std::vector<int32_t> prompt(P);
  for (auto& t : prompt) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));
  std::vector<int32_t> next(n_dec);
  for (auto& t : next) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));

  auto run = [&](const PolicySpec& spec, int64_t* bytes_read) -> std::unique_ptr<KvCache> {
    auto p = MakePolicy(spec);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    auto c = model.NewCache(std::move(p).value());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::unique_ptr<KvCache> cache = std::move(c).value();
    std::vector<float> logits(model.config().n_vocab);
    EXPECT_TRUE(model.Prefill(prompt.data(), P, 128, cache.get(), &pool, logits.data()).ok());
    const int64_t before = cache->counters().bytes_read_total;
    for (int i = 0; i < n_dec; ++i) {
      EXPECT_TRUE(model.Decode(next[i], cache.get(), &pool, logits.data()).ok());
      for (float x : logits) EXPECT_TRUE(std::isfinite(x));
    }
    *bytes_read = cache->counters().bytes_read_total - before;
    return cache;
  };
  int64_t full_read = 0;
  auto full = run(PolicySpec{"full", {}}, &full_read);
  // The paper's method at 4 and 2 bits, and the default profile (retrieval: no block below 2
  // bits, only the query's block exact) at 4, where its floor leaves the allocator room.
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"reference", "4"}, {"reference", "2"}, {"retrieval", "4"}};
  for (const auto& [profile, bits] : runs) {
    SCOPED_TRACE("profile " + profile + " bits " + bits);
    int64_t read = 0;
    auto cache = run(PolicySpec{"geodesia", {{"profile", profile}, {"bits", bits}}}, &read);
    auto& geo = dynamic_cast<GeodesiaPolicy&>(cache->policy());
    const double B = std::stod(bits);
    for (int l = 0; l < cache->n_layers(); ++l) {
      const auto& gl = geo.graded(l);
      const auto rb = gl.resident_bytes();
      // Levels (payload + scales) within B over the padded blocks of every head.
      EXPECT_LE(8.0 * (rb.payload + rb.scales),
                B * 2 * gl.n_blocks() * 64 * gl.head_dim() * gl.n_kv_heads())
          << "layer " << l;
    }
    EXPECT_GT(geo.stats().demotions, 0);
    EXPECT_LT(read, full_read);
    EXPECT_LT(cache->ResidentBytes(), full->ResidentBytes());
    // Over real tokens: the budget counts the padded last block, hence the 64 / T slack.
    EXPECT_LE(geo.stats().resident_bpv(), B * (1 + 64.0 / (P + 1)));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
