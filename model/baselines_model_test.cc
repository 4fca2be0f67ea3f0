// Model-level smoke test: every baseline runs a tiny synthetic llama (GQA) and deepseek2 (MLA)
// model through Prefill + Decode and reads fewer bytes per step than the full cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "kv/baselines/test_util.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata::baselines {
namespace {

std::unique_ptr<Model> SynthModel(Arch arch, uint64_t seed) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_baselines_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  SynthOptions o;
  o.arch = arch;
  o.seed = seed;
  o.dtype = DType::kF32;
  const std::string path = dir + "/" + (arch == Arch::kLlama ? "llama" : "ds2") + ".gguf";
  Status s = SynthGguf(o, path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  std::filesystem::remove_all(dir);
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(BaselineModelTest, EveryPolicyRunsAndReadsLessThanFull) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  for (Arch arch : {Arch::kLlama, Arch::kDeepseek2}) {
    auto model = SynthModel(arch, seed);
    ASSERT_TRUE(model);
    Rng rng(seed);
    std::vector<int32_t> toks(300);
    for (auto& t : toks) t = static_cast<int32_t>(rng.Below(model->config().n_vocab));
    const int64_t n_prompt = 290;
    int64_t full_bytes = 0;
    std::vector<std::string> names = {"full"};
    for (const auto& n : testing::AllBaselines()) names.push_back(n);
    for (const std::string& name : names) {
      SCOPED_TRACE(name + (arch == Arch::kLlama ? " llama" : " deepseek2"));
      auto policy = MakePolicy(PolicySpec{name, SettingsFor(name, {{"ratio", "4"}})});
      ASSERT_TRUE(policy.ok()) << policy.status().ToString();
      auto cache = model->NewCache(std::move(policy).value());
      ASSERT_TRUE(cache.ok()) << cache.status().ToString();
      std::vector<float> logits(model->config().n_vocab);
      ASSERT_TRUE(model->Prefill(toks.data(), n_prompt, 64, cache->get(), &pool, logits.data())
                      .ok());
      for (int64_t i = n_prompt; i < static_cast<int64_t>(toks.size()); ++i) {
        ASSERT_TRUE(model->Decode(toks[i], cache->get(), &pool, logits.data()).ok());
        for (float x : logits) ASSERT_TRUE(std::isfinite(x));
      }
      const int64_t bytes = (*cache)->counters().last_step.bytes_read;
      if (name == "full") {
        full_bytes = bytes;
        EXPECT_EQ(bytes, static_cast<int64_t>(toks.size()) * (*cache)->FullBytesPerToken());
      } else {
        EXPECT_LT(bytes, full_bytes);
      }
    }
  }
}

}  // namespace
}  // namespace strata::baselines
