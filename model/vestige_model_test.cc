// VestigeKV at model level (kv/vestige/policy.h): lives in model_tests because it needs a model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::unique_ptr<Model> NopeModel(uint64_t seed) {
  SynthOptions o;
  o.arch = Arch::kDeepseek2;
  o.nope = true;
  o.seed = seed;
  o.dtype = DType::kF32;
  EXPECT_TRUE(o.ApplyDims("kv_lora=32,rope_dim=8").ok());
  const std::string dir =
      std::filesystem::temp_directory_path() / ("strata_vestige_model_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/nope_" + std::to_string(seed) + ".gguf";
  Status st = SynthGguf(o, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<KvCache> Cache(const Model& m, const PolicySpec& spec) {
  auto p = MakePolicy(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  auto c = m.NewCache(std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// Prefill `prompt` in chunks of 37, then decode `decode` tokens; returns every logit produced.
std::vector<float> RunModel(Model& m, KvCache* c, const std::vector<int32_t>& toks, int prompt,
                            ThreadPool* pool) {
  const int64_t V = m.config().n_vocab;
  std::vector<float> all;
  EXPECT_TRUE(m.Prefill(toks.data(), prompt, 37, c, pool, nullptr, &all).ok());
  std::vector<float> logits(V);
  for (size_t i = prompt; i < toks.size(); ++i) {
    EXPECT_TRUE(m.Decode(toks[i], c, pool, logits.data()).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// deepseek2 NoPE tiny model: vestige at ratio 1 (block 64: blocks do close) gives bit-identical
// logits to full over a chunked prefill and decode; at ratio 4, block 64, kappa 2 it decodes
// without error, archives rows and reads fewer bytes, with the recall tier on and off.
TEST(VestigeModelTest, RatioOneIsFullAndRatioFourReadsLess) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto m = NopeModel(seed);
  ASSERT_TRUE(m);
  const int n = 260, prompt = 150;
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng.Below(m->config().n_vocab));
  ThreadPool pool(2);
  auto full = Cache(*m, {"full", {}});
  const std::vector<float> ref = RunModel(*m, full.get(), toks, prompt, &pool);
  {
    auto v = Cache(*m, {"vestige", {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}});
    const std::vector<float> got = RunModel(*m, v.get(), toks, prompt, &pool);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), 4 * ref.size()));
    auto& p = dynamic_cast<VestigePolicy&>(v->policy());
    EXPECT_EQ(p.n_closed(0), 256);
    EXPECT_EQ(v->counters().bytes_read_total, full->counters().bytes_read_total);
  }
  for (const char* recall : {"off", "on"}) {
    SCOPED_TRACE(std::string("recall ") + recall);
    auto v = Cache(
        *m, {"vestige", {{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}, {"recall", recall}}});
    const std::vector<float> got = RunModel(*m, v.get(), toks, prompt, &pool);
    ASSERT_EQ(got.size(), ref.size());
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    auto& p = dynamic_cast<VestigePolicy&>(v->policy());
    EXPECT_GT(p.selector(0).archived().size(), 0u);
    if (std::string(recall) == "off") {  // with recall on, a wide scan on random weights may not
      EXPECT_LT(v->counters().bytes_read_total, full->counters().bytes_read_total);
      EXPECT_LT(v->counters().last_step.bytes_read, full->counters().last_step.bytes_read);
    }
    if (p.recall_hook()) {
      EXPECT_TRUE(p.recall_hook()->status().ok()) << p.recall_hook()->status().ToString();
    }
  }
}

}  // namespace
}  // namespace strata
