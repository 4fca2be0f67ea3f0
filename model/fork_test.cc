// KvCache::Fork at the model level: a context prefilled (and compressed) once, forked, and each
// fork continued with its own question; every logit equals, bit for bit, that of a fresh cache
// that runs the whole sequence, and the forks and the original do not disturb each other.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::unique_ptr<Model> SynthModel(Arch arch, uint64_t seed) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("strata_fork_test_" + std::to_string(getpid()));
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

std::vector<int32_t> RandomTokens(const Model& model, uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));
  return toks;
}

// A question after the context: its prompt (a prefill, so a compression point of its own), then
// decoded tokens. Returns the logits after the question's prompt and after every decoded token.
StatusOr<std::vector<std::vector<float>>> Continue(Model& model, KvCache* cache,
                                                   const std::vector<int32_t>& question,
                                                   const std::vector<int32_t>& answer,
                                                   ThreadPool* pool) {
  std::vector<std::vector<float>> out;
  std::vector<float> logits(model.config().n_vocab);
  RETURN_IF_ERROR(model.Prefill(question.data(),
                                                    static_cast<int64_t>(question.size()), 16,
                                                    cache, pool, logits.data()));
  out.push_back(logits);
  for (int32_t t : answer) {
    RETURN_IF_ERROR(model.Decode(t, cache, pool, logits.data()));
    out.push_back(logits);
  }
  return out;
}

struct Case {
  Arch arch;
  std::string policy;
  std::map<std::string, std::string> settings;
};

TEST(ForkModelTest, ForksDecodeAsFreshRunsBitForBit) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  const std::vector<Case> cases = {
      {Arch::kLlama, "geodesia", {{"bits", "3"}}},
      {Arch::kLlama, "kivi2", {}},
      {Arch::kLlama, "snapkv", {{"ratio", "4"}}},
      {Arch::kDeepseek2, "vestige", {{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}}},
      {Arch::kDeepseek2, "snapkv", {{"ratio", "4"}}},
  };
  for (Arch arch : {Arch::kLlama, Arch::kDeepseek2}) {
    auto model = SynthModel(arch, seed);
    ASSERT_TRUE(model);
    const std::vector<int32_t> context = RandomTokens(*model, seed, 260);
    const std::vector<int32_t> q[2] = {RandomTokens(*model, seed + 1, 20),
                                       RandomTokens(*model, seed + 2, 27)};
    const std::vector<int32_t> a[2] = {RandomTokens(*model, seed + 3, 8),
                                       RandomTokens(*model, seed + 4, 8)};
    for (const Case& c : cases) {
      if (c.arch != arch) continue;
      SCOPED_TRACE(c.policy + (arch == Arch::kLlama ? " llama" : " deepseek2"));
      auto make = [&]() -> StatusOr<std::unique_ptr<KvCache>> {
        ASSIGN_OR_RETURN(auto p, MakePolicy(PolicySpec{c.policy, SettingsFor(c.policy,
                                                                             c.settings)}));
        return model->NewCache(std::move(p));
      };
      std::vector<float> logits(model->config().n_vocab);
      auto original = make();
      ASSERT_OK(original);
      ASSERT_OK(model->Prefill(context.data(), static_cast<int64_t>(context.size()), 64,
                               original->get(), &pool, logits.data()));
      std::unique_ptr<KvCache> forks[2];
      for (int w = 0; w < 2; ++w) {
        auto f = (*original)->Fork();
        ASSERT_OK(f);
        forks[w] = std::move(f).value();
      }
      std::vector<std::vector<float>> fresh[2];
      for (int w = 0; w < 2; ++w) {
        auto r = make();
        ASSERT_OK(r);
        ASSERT_OK(model->Prefill(context.data(), static_cast<int64_t>(context.size()), 64,
                                 r->get(), &pool, logits.data()));
        auto out = Continue(*model, r->get(), q[w], a[w], &pool);
        ASSERT_OK(out);
        fresh[w] = std::move(out).value();
      }
      for (int w = 0; w < 2; ++w) {
        auto out = Continue(*model, forks[w].get(), q[w], a[w], &pool);
        ASSERT_OK(out);
        ASSERT_EQ(out->size(), fresh[w].size());
        for (size_t i = 0; i < out->size(); ++i) {
          ASSERT_EQ(0, std::memcmp((*out)[i].data(), fresh[w][i].data(),
                                   (*out)[i].size() * sizeof(float)))
              << "fork " << w << ": logits of step " << i << " differ from a fresh run";
        }
      }
      // The original, after its forks moved on, answers the first question as a fresh run.
      auto out = Continue(*model, original->get(), q[0], a[0], &pool);
      ASSERT_OK(out);
      for (size_t i = 0; i < out->size(); ++i) {
        ASSERT_EQ(0, std::memcmp((*out)[i].data(), fresh[0][i].data(),
                                 (*out)[i].size() * sizeof(float)))
            << "the original: logits of step " << i << " differ from a fresh run";
      }
    }
  }
}

}  // namespace
}  // namespace strata
