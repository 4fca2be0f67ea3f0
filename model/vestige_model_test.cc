// VestigeKV at model level (kv/vestige/policy.h): lives in model_tests because it needs a model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"
#include "model/mla.h"
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

std::vector<int32_t> RandomTokens(const Model& m, uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng.Below(m.config().n_vocab));
  return toks;
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
  auto m = NopeModel(seed);
  ASSERT_TRUE(m);
  const int n = 260, prompt = 150;
  const std::vector<int32_t> toks = RandomTokens(*m, seed, n);
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


// Prefix calibration observes only every s-th prompt query of [T/2, T) (the ones its tier keeps:
// RecallTier::PrefixObservationStride); an expanded prefill chunk forms the absorbed queries of
// those rows alone, gathered. Layer 0 sees the same inputs either way, so its calibrated tier
// (basis, z, gate) is the same bit for bit when the prompt is read in the expanded form (the
// gather) and query by query (every row absorbed, the cache dropping the unobserved ones).
TEST(VestigeModelTest, StridedObservationsCalibrateLikeEveryQueryAbsorbed) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = NopeModel(seed);
  ASSERT_TRUE(m);
  const int prompt = 600;
  const std::vector<int32_t> toks = RandomTokens(*m, seed, prompt);
  const PolicySpec spec{"vestige",
                        {{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}, {"calib-queries", "8"}}};
  // 300 observed queries, at most 2 x 8 kept: every 32nd.
  ASSERT_EQ(RecallTier::PrefixObservationStride(300, 8), 32);
  ThreadPool pool(2);
  std::unique_ptr<KvCache> caches[2];
  for (int expanded : {0, 1}) {
    const int64_t prev = mla_internal::SetExpandedMinRowsForTest(expanded ? 2 : -1);
    caches[expanded] = Cache(*m, spec);
    Status st = m->Prefill(toks.data(), prompt, prompt, caches[expanded].get(), &pool, nullptr);
    mla_internal::SetExpandedMinRowsForTest(prev);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const auto& a = dynamic_cast<const VestigePolicy&>(caches[0]->policy());
  const auto& b = dynamic_cast<const VestigePolicy&>(caches[1]->policy());
  const RecallTier* ta = a.recall_tier(0);
  const RecallTier* tb = b.recall_tier(0);
  ASSERT_TRUE(ta && tb);
  ASSERT_TRUE(ta->calibrated() && tb->calibrated());
  EXPECT_EQ(ta->counters().calibrations, 1);
  EXPECT_EQ(ta->z(), tb->z());
  EXPECT_EQ(ta->gate_threshold(), tb->gate_threshold());
  bool identity = true;
  for (int64_t i = 0; i < int64_t{ta->rank()} * ta->d_c(); ++i) {
    ASSERT_EQ(ta->basis()[i], tb->basis()[i]) << i;
    identity = identity && ta->basis()[i] == (i / ta->d_c() == i % ta->d_c() ? 1.f : 0.f);
  }
  EXPECT_FALSE(identity) << "the basis was not fitted";
}

}  // namespace
}  // namespace strata
