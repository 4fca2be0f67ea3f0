// gemma3 on tiny synthetic models (model/synth.h: local, global, local layers with an 8-position
// window): the config's layer kinds, prefill in chunks across the window equal to token by token,
// every policy governing the global layer while the sliding-window layers keep only their window,
// and an all-local model refused for any policy but full. The logits themselves are checked
// against a PyTorch float64 forward in tools/gemma3/parity.py (ctest gemma3_parity).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::string TinyGemma(uint64_t seed, const std::string& dims, const std::string& name) {
  SynthOptions o;
  o.SetArch(Arch::kGemma3, "tiny");
  o.seed = seed;
  o.dtype = DType::kF32;
  EXPECT_TRUE(o.ApplyDims(dims).ok());
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_gemma3_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + ".gguf";
  const Status st = SynthGguf(o, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return path;
}

TEST(Gemma3ModelTest, ConfigNamesTheLayerKinds) {
  auto m = Model::Load(TinyGemma(TestSeed(), "", "kinds"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.arch, Arch::kGemma3);
  EXPECT_EQ(c.sliding_window, 8);
  ASSERT_EQ(c.layer_local.size(), 3u);
  EXPECT_TRUE(c.is_local_layer(0));
  EXPECT_FALSE(c.is_local_layer(1));
  EXPECT_TRUE(c.is_local_layer(2));
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_FLOAT_EQ(c.rope_base_local, 10000.f);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.f / std::sqrt(32.f));
  const std::vector<LayerGeometry> g = (*m)->CacheLayers();
  EXPECT_EQ(g[0].window, 8);
  EXPECT_EQ(g[1].window, 0);
  EXPECT_NE(c.Summary().find("2 sliding-window (8) + 1 global layers"), std::string::npos)
      << c.Summary();
}

// The window slides across chunk boundaries: a prompt fed in chunks of 5 (smaller than the
// window) and of 64 (the whole prompt at once) gives the logits a token-by-token feed gives.
TEST(Gemma3ModelTest, ChunkedPrefillEqualsTokenByToken) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = Model::Load(TinyGemma(seed, "", "chunks"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Model& model = **m;
  Rng rng(seed);
  const int n = 40;
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));
  auto run = [&](int chunk) {
    auto c = model.NewCache(std::make_unique<FullPolicy>(), DType::kF32);
    EXPECT_TRUE(c.ok());
    std::vector<float> all;
    EXPECT_TRUE(model.Prefill(toks.data(), n, chunk, c->get(), nullptr, nullptr, &all).ok());
    return all;
  };
  const std::vector<float> ref = run(1), five = run(5), whole = run(64);
  ASSERT_EQ(ref.size(), five.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    // The same f32 products in another grouping (GEMM vs GEMV): rounding only.
    ASSERT_NEAR(five[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
    ASSERT_NEAR(whole[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
  }
}

// Each policy governs the global layer alone: the sliding-window layers hold at most their window
// (plus partial pages) after a long prompt, whatever the policy, and every logit is finite.
TEST(Gemma3ModelTest, PoliciesGovernTheGlobalLayersOnly) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = Model::Load(TinyGemma(seed, "head_dim=64,d_model=128", "policies"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Model& model = **m;
  Rng rng(seed);
  const int P = 700;
  std::vector<int32_t> prompt(P);
  for (auto& t : prompt) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));
  ThreadPool pool(2);
  for (const char* name : {"full", "h2o", "snapkv", "streaming", "geodesia", "kivi2", "quest"}) {
    SCOPED_TRACE(name);
    auto spec = ParsePolicySpec(name);
    ASSERT_TRUE(spec.ok());
    auto p = MakePolicy(*spec);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto c = model.NewCache(std::move(p).value());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    KvCache& cache = **c;
    EXPECT_EQ(cache.n_local_layers(), 2);
    std::vector<float> logits(model.config().n_vocab);
    ASSERT_TRUE(model.Prefill(prompt.data(), P, 128, &cache, &pool, logits.data()).ok());
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(model.Decode(i + 3, &cache, &pool, logits.data()).ok());
      for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    }
    const int64_t row = cache.geometry(0).bytes_per_token();
    for (int l : {0, 2}) {
      EXPECT_LE(cache.store(l).resident_bytes(), 3 * LayerStore::kPageRows * row) << l;
    }
    EXPECT_EQ(cache.store(1).n_rows(), P + 8);
  }
}

TEST(Gemma3ModelTest, AllLocalModelTakesOnlyTheFullPolicy) {
  auto m = Model::Load(TinyGemma(TestSeed(), "layers=2,swa_period=5", "all_local"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->config().n_local_layers(), 2);
  EXPECT_TRUE((*m)->NewCache(std::make_unique<FullPolicy>()).ok());
  auto p = MakePolicy(*ParsePolicySpec("h2o"));
  ASSERT_TRUE(p.ok());
  auto c = (*m)->NewCache(std::move(p).value());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("policy 'h2o'"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("sliding-window"), std::string::npos);
}

}  // namespace
}  // namespace strata
