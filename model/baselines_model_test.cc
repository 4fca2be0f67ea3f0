// Model-level smoke test: every baseline runs a tiny synthetic llama (GQA) and deepseek2 (MLA)
// model through Prefill + Decode and reads fewer bytes per step than the full cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "kv/baselines/eviction.h"
#include "kv/baselines/test_util.h"
#include "model/gqa_prefill.h"
#include "model/mla.h"
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

// n random token ids of the model's vocabulary.
std::vector<int32_t> RandomTokens(const Model& model, uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> toks(n);
  for (auto& t : toks) t = static_cast<int32_t>(rng.Below(model.config().n_vocab));
  return toks;
}

// The smallest prefill chunk read staged (llama) or expanded (deepseek2); returns the previous.
int64_t SetStagedMinRows(bool mla, int64_t rows) {
  return mla ? mla_internal::SetExpandedMinRowsForTest(rows)
             : gqa_internal::SetStagedMinRowsForTest(rows);
}

TEST(BaselineModelTest, EveryPolicyRunsAndReadsLessThanFull) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  for (Arch arch : {Arch::kLlama, Arch::kDeepseek2}) {
    auto model = SynthModel(arch, seed);
    ASSERT_TRUE(model);
    const std::vector<int32_t> toks = RandomTokens(*model, seed, 300);
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

// Long prefill chunks (MLA's expanded form, GQA's staged form) deliver H2O's and SnapKV's
// observations as column sums (StagedColumnSums over the chunk's keys): the accumulated scores
// equal the per-query weights' up to f32 rounding (a missing query or row moves a score by a
// whole weight, ~10 % here), the same queries are counted, and layer 0 keeps the same rows.
TEST(BaselineModelTest, LongChunksObserveAsColumnSums) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  // deepseek2 twice: the column sums kept by the attention pass, and by a second pass over the
  // keys (as beyond 32k rows).
  for (int run : {0, 1, 2}) {
    const Arch arch = run < 2 ? Arch::kDeepseek2 : Arch::kLlama;
    const bool mla = arch == Arch::kDeepseek2;
    const int64_t observed_rows = mla_internal::SetObservedRowsForTest(run == 1 ? 0 : 32768);
    auto model = SynthModel(arch, seed);
    ASSERT_TRUE(model);
    const std::vector<int32_t> toks = RandomTokens(*model, seed, 290);
    for (const std::string name : {"h2o", "h2o-recent", "snapkv"}) {
      SCOPED_TRACE(name + (mla ? " deepseek2" : " llama") + (run == 1 ? " second pass" : ""));
      std::unique_ptr<KvCache> caches[2];
      for (int staged : {0, 1}) {
        const int64_t min_rows = staged ? 2 : -1;
        const int64_t prev = SetStagedMinRows(mla, min_rows);
        auto policy = MakePolicy(PolicySpec{name, SettingsFor(name, {{"ratio", "4"}})});
        ASSERT_TRUE(policy.ok()) << policy.status().ToString();
        auto cache = model->NewCache(std::move(policy).value());
        ASSERT_TRUE(cache.ok()) << cache.status().ToString();
        // Chunks of 100: later chunks' column sums cover the earlier chunks' rows too.
        Status st = model->Prefill(toks.data(), static_cast<int64_t>(toks.size()), 100,
                                   cache->get(), &pool, nullptr);
        SetStagedMinRows(mla, prev);
        ASSERT_TRUE(st.ok()) << st.ToString();
        caches[staged] = std::move(cache).value();
      }
      const auto& a = dynamic_cast<const EvictionPolicy&>(caches[0]->policy());
      const auto& b = dynamic_cast<const EvictionPolicy&>(caches[1]->policy());
      bool differs = false;
      for (int l = 0; l < caches[0]->n_layers(); ++l) {
        EXPECT_EQ(a.observed(l), b.observed(l)) << "layer " << l;
        for (int h = 0; h < caches[0]->geometry(l).n_kv_heads; ++h) {
          const std::vector<double>& sa = a.scores(l, h);
          const std::vector<double>& sb = b.scores(l, h);
          ASSERT_EQ(sa.size(), sb.size()) << "layer " << l;
          // Layer 0 sees the same queries and rows both ways: only the scores' f32 rounding
          // differs, 1e-4 relative per row. Later layers also see inputs that differ by the
          // previous layers' f32 rounding of the two attention forms, which this random model
          // amplifies on single small scores (up to 6 % relative seen, seed
          // 9717000669030301196), so there the scores are compared as a whole: the L1 distance
          // within 1e-3 of the total (at most 9.3e-5 seen over 26 seeds; one misplaced weight
          // of SnapKV's 32 window queries x 4 heads is ~8e-3), and the total (the query heads
          // of the KV head, per observed query) within 1e-6.
          double ta = 0, tb = 0, l1 = 0;
          for (size_t u = 0; u < sa.size(); ++u) {
            if (l == 0) {
              ASSERT_NEAR(sb[u], sa[u], 1e-4 * sa[u] + 1e-6) << "layer 0 row " << u;
            }
            differs = differs || sa[u] != sb[u];
            ta += sa[u];
            tb += sb[u];
            l1 += std::fabs(sb[u] - sa[u]);
          }
          EXPECT_LE(l1, 1e-3 * ta) << "layer " << l << " KV head " << h;
          EXPECT_NEAR(tb, ta, 1e-6 * ta) << "layer " << l << " KV head " << h;
        }
        if (l == 0) {
          EXPECT_EQ(a.kept(l, 0), b.kept(l, 0)) << "layer " << l;
        }
      }
      EXPECT_TRUE(differs) << "the column sums did not run";
    }
    mla_internal::SetObservedRowsForTest(observed_rows);
  }
}

// A GQA prompt read in the staged form (model/gqa_prefill.h) is `full`'s bit for bit under
// every policy whose prompt reads are dense until its compression point (they claim them,
// Policy::ClaimDenseReads): the prompt's logits, every row, equal full's. KIVI reads its
// quantized groups from the first complete group on, q8_0 / q4_0 every row quantized,
// turboquant every row before the running chunk coded and coldfp4 full pages after the first in
// FP4, so their prompts are not full's.
TEST(BaselineModelTest, DensePromptReadsAreStagedLikeFullOnGqa) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  auto model = SynthModel(Arch::kLlama, seed);
  ASSERT_TRUE(model);
  const std::vector<int32_t> toks = RandomTokens(*model, seed, 290);
  const int64_t prev = gqa_internal::SetStagedMinRowsForTest(2);
  auto run = [&](const std::string& name, std::vector<float>* all) {
    auto policy = MakePolicy(PolicySpec{name, SettingsFor(name, {{"ratio", "4"}})});
    ASSERT_TRUE(policy.ok()) << policy.status().ToString();
    auto cache = model->NewCache(std::move(policy).value());
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    Status st = model->Prefill(toks.data(), static_cast<int64_t>(toks.size()), 100, cache->get(),
                               &pool, nullptr, all);
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  std::vector<float> ref;
  run("full", &ref);
  std::vector<std::string> names = {"geodesia", "cquest"};
  for (const auto& n : testing::AllBaselines()) names.push_back(n);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    std::vector<float> all;
    run(name, &all);
    ASSERT_EQ(all.size(), ref.size());
    // KIVI, llama.cpp's q8_0 / q4_0, turboquant and coldfp4 read quantized rows during the
    // prompt.
    const bool quantized = name.rfind("kivi", 0) == 0 || name == "q8_0" || name == "q4_0" ||
                           name == "turboquant" || name == "coldfp4";
    size_t differ = 0;
    for (size_t i = 0; i < all.size(); ++i) differ += all[i] != ref[i];
    if (quantized) {
      EXPECT_GT(differ, 0u) << name << "'s prompt read its quantized rows";
    } else {
      EXPECT_EQ(differ, 0u) << "of " << all.size() << " logits";
    }
  }
  gqa_internal::SetStagedMinRowsForTest(prev);
}

// KIVI's claimed staged reads (Policy::ClaimStagedReads, StagePrefixRows) through
// GqaStagedPrefixAttention give, for each query of the open call, what the cache's own Attend
// (the packed kernel or the dequantize-then-attend loop) gives, within f32 rounding (outputs
// are convex combinations of values of size ~1: 2e-5 absolute, as the kernels' tests), and the
// claim counts the same bytes and rows as those m Attend calls. The call's first row's page
// lies before released pages' end (Build: a 100-row prompt call, then rows [100, 300)).
TEST(BaselineModelTest, KiviStagedReadsMatchItsReads) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  for (int dim : {48, 64}) {  // per-group arrays; packed slots
    for (const std::string name : {"kivi2", "kivi4"}) {
      SCOPED_TRACE(::testing::Message() << name << " head dim " << dim);
      const LayerGeometry g = testing::GqaGeometry(8, 2, dim);
      auto cache = testing::NewCache(g, PolicySpec{name, {{"attn-math", "f32"}}});
      ASSERT_TRUE(cache);
      testing::Build(cache.get(), seed, 100, 300);
      const int64_t p0 = 100;
      const int n = 200;
      Rng rng(seed);
      std::vector<float> q;
      for (int j = 0; j < n; ++j) {
        const std::vector<float> qj = testing::RandomQuery(g, rng, 2.f);
        q.insert(q.end(), qj.begin(), qj.end());
      }
      const CacheCounters before = cache->counters();
      StagedPrefixPlan plan;
      ASSERT_TRUE(cache->ClaimStagedReads(0, p0, n, &plan));
      const CacheCounters claimed = cache->counters();
      EXPECT_GT(plan.cap, p0) << "the call's own rows are partly quantized";
      KvCache* c = cache.get();
      StagedPrefix prefix{plan, [c](int h, int64_t s0, int64_t sn, float* k, float* v) {
                               c->StagePrefixRows(0, h, s0, sn, k, v);
                             }};
      const int64_t out = int64_t{g.n_q_heads} * g.v_dim;
      std::vector<float> att(n * out), one(out);
      GqaStagedPrefixAttention(cache->store(0), prefix, p0, n, q.data(), &pool, att.data());
      for (int j = 0; j < n; ++j) {
        ASSERT_OK(cache->Attend(0, &q[int64_t{j} * g.n_q_heads * g.k_dim], p0 + j, &pool,
                                one.data()));
        for (int64_t e = 0; e < out; ++e) {
          ASSERT_NEAR(att[j * out + e], one[e], 2e-5) << "query " << j << " split "
                                                      << plan.Split(p0 + j + 1);
        }
      }
      const CacheCounters& after = cache->counters();
      EXPECT_EQ(claimed.reads - before.reads, n);
      EXPECT_EQ(claimed.bytes_read_total - before.bytes_read_total,
                after.bytes_read_total - claimed.bytes_read_total);
      EXPECT_EQ(claimed.rows_attended_total - before.rows_attended_total,
                after.rows_attended_total - claimed.rows_attended_total);
      EXPECT_EQ(claimed.full_bytes_read_total - before.full_bytes_read_total,
                after.full_bytes_read_total - claimed.full_bytes_read_total);
    }
  }
}

// KIVI's prompt chunks read staged (Policy::ClaimStagedReads; GQA: GqaStagedPrefixAttention,
// MLA: the expanded form, MlaModel::ExpandedPrefixAttention): each query's quantized groups as
// f32 rows and its newest rows exactly, what its Read computes, up to f32 rounding (on MLA also
// the expanded form's: the latent rows decompressed per head instead of absorbed queries); and
// the cache counts the same reads, rows and bytes as the per-query path.
// Chunks of 100 over 290 tokens: later chunks read groups whose store pages were released.
// Tolerance: the logits' largest difference relative to their largest magnitude. The two forms
// differ by f32 rounding, but a later layer quantizes rows computed from an earlier layer's
// attention, so a rounding difference that moves a value across a code boundary costs a whole
// quantization step there, and the step carries to the positions after it: 40 seeds gave a
// largest difference up to 0.11 of the largest logit (kivi4, llama; 3 seeds over 5e-3), so the
// bounds are on the 90th percentile of the differences (5e-3) and the largest (0.25). The exact check is KiviStagedReadsMatchItsReads; this one sees the model
// path run.
TEST(BaselineModelTest, KiviPromptReadsStagedAsItsReads) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ThreadPool pool(2);
  for (const Arch arch : {Arch::kLlama, Arch::kDeepseek2}) {
    const bool mla = arch == Arch::kDeepseek2;
    auto model = SynthModel(arch, seed);
    ASSERT_TRUE(model);
    const std::vector<int32_t> toks = RandomTokens(*model, seed, 290);
    for (const std::string name : {"kivi2", "kivi4"}) {
      SCOPED_TRACE(name + (mla ? " deepseek2" : " llama"));
      std::vector<float> logits[2];
      CacheCounters counters[2];
      for (int staged : {0, 1}) {
        const int64_t min_rows = staged ? 2 : -1;
        const int64_t prev = SetStagedMinRows(mla, min_rows);
        auto policy = MakePolicy(PolicySpec{name, SettingsFor(name, {})});
        ASSERT_TRUE(policy.ok()) << policy.status().ToString();
        auto cache = model->NewCache(std::move(policy).value());
        ASSERT_TRUE(cache.ok()) << cache.status().ToString();
        Status st = model->Prefill(toks.data(), static_cast<int64_t>(toks.size()), 100,
                                   cache->get(), &pool, nullptr, &logits[staged]);
        SetStagedMinRows(mla, prev);
        ASSERT_TRUE(st.ok()) << st.ToString();
        counters[staged] = (*cache)->counters();
      }
      ASSERT_EQ(logits[0].size(), logits[1].size());
      double scale = 0, worst = 0;
      size_t differ = 0;
      std::vector<double> diffs;
      for (size_t i = 0; i < logits[0].size(); ++i) {
        scale = std::max(scale, std::fabs(double{logits[0][i]}));
        diffs.push_back(std::fabs(double{logits[1][i]} - logits[0][i]));
        worst = std::max(worst, diffs.back());
        differ += logits[0][i] != logits[1][i];
      }
      // Most logits agree to f32 rounding; a code-boundary crossing moves the positions after it
      // (over 61 seeds the largest difference reached 11 % of the largest logit).
      std::sort(diffs.begin(), diffs.end());
      const double p90 = diffs[diffs.size() * 9 / 10];
      EXPECT_LE(p90, 5e-3 * scale) << "largest |logit| " << scale;
      EXPECT_LE(worst, 0.25 * scale) << "largest |logit| " << scale;
      EXPECT_GT(differ, 0u) << "the staged form did not run (its f32 rounding differs)";
      EXPECT_EQ(counters[1].reads, counters[0].reads);
      EXPECT_EQ(counters[1].rows_attended_total, counters[0].rows_attended_total);
      EXPECT_EQ(counters[1].bytes_read_total, counters[0].bytes_read_total);
      EXPECT_EQ(counters[1].full_bytes_read_total, counters[0].full_bytes_read_total);
    }
  }
}

}  // namespace
}  // namespace strata::baselines
