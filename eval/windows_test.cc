#include "eval/windows.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "eval/corpus.h"
#include "eval/eval_testing.h"

namespace strata::eval {
namespace {

class WindowsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = testing::TinyTextModel();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = m->release();
    auto t = TokenizeCorpus(*model_, std::string(BuiltinHaystack()));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tokens_ = new std::vector<int32_t>(std::move(*t));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokens_;
  }
  static Model* model_;
  static std::vector<int32_t>* tokens_;
};
Model* WindowsTest::model_ = nullptr;
std::vector<int32_t>* WindowsTest::tokens_ = nullptr;

WindowOptions SmallWindows() {
  WindowOptions w;
  w.length = 80;
  w.eval_tokens = 9;
  w.windows = 3;
  w.chunk = 32;
  return w;
}

TEST_F(WindowsTest, OffsetsAreEvenlySpacedAndChecked) {
  WindowOptions w = SmallWindows();
  auto o = ResolveOffsets(1000, w);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(*o, (std::vector<int64_t>{0, 460, 920}));
  w.offsets = {0, 921};
  auto bad = ResolveOffsets(1000, w);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("921"), std::string::npos);
  w = SmallWindows();
  w.eval_tokens = 1;
  EXPECT_FALSE(ResolveOffsets(1000, w).ok());
  w = SmallWindows();
  EXPECT_FALSE(ResolveOffsets(50, w).ok());
}

// The Q = 1 loop scores exactly E - 1 targets per window, and on the full cache it matches a
// single exact prefill of the window (the decode path reads every row).
TEST_F(WindowsTest, FullPolicyQ1MatchesAllLogitsPrefill) {
  const WindowOptions w = SmallWindows();
  ThreadPool pool(1);
  const PolicyConfig full{"full", std::nullopt, {}, ""};
  auto r = RunPplWindow(*model_, *tokens_, 17, w, RegistryFactory(), full, &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->nll.size(), static_cast<size_t>(w.eval_tokens - 1));
  auto cache = NewConfigCache(*model_, RegistryFactory(), full);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE(
      model_->Prefill(tokens_->data() + 17, w.length, 1, cache->get(), &pool, nullptr, &logits)
          .ok());
  const int64_t v = model_->config().n_vocab;
  const int64_t n_prefix = w.length - w.eval_tokens;
  for (int64_t i = 0; i + 1 < w.eval_tokens; ++i) {
    const int64_t pos = n_prefix + i;  // the position that fed target i
    const double ref = TokenNll(logits.data() + pos * v, v, (*tokens_)[17 + pos + 1]);
    // Tolerance: the decode and prefill paths may differ in float summation order.
    EXPECT_NEAR(r->nll[i], ref, 1e-4) << "target " << i;
  }
  // The full cache reads 16 bits per value; resident storage is allocated in 64-row pages, so
  // 79 cached tokens hold 2 pages = 128 rows.
  const int64_t n_cached = w.length - 1;
  EXPECT_DOUBLE_EQ(r->resident_bits_per_value, 16.0 * 128 / n_cached);
  EXPECT_DOUBLE_EQ(r->read_bits_per_value, 16.0);
}

// Integrity gates on the windows machinery: full vs full is a PPL ratio of exactly 1 with a
// degenerate interval, and KL(full || full) is exactly 0.
TEST_F(WindowsTest, GateIdentityPolicyIsExactlyNeutral) {
  PplOptions p;
  p.w = SmallWindows();
  p.policies = {"full"};
  p.policy2 = "full";
  p.draws = 2000;
  auto r = RunPpl(*model_, *tokens_, p, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->configs.size(), 2u);
  ASSERT_EQ(r->comparisons.size(), 1u);
  const BootstrapResult& b = r->comparisons[0].boot;
  EXPECT_EQ(b.mean_delta, 0.0);
  EXPECT_EQ(b.ratio, 1.0);
  EXPECT_EQ(b.ratio_lo, 1.0);
  EXPECT_EQ(b.ratio_hi, 1.0);
  EXPECT_EQ(b.wins_a + b.wins_b, 0);
  EXPECT_EQ(r->configs[0].n_targets, 3 * (p.w.eval_tokens - 1));
  EXPECT_GT(r->configs[0].ppl, 1.0);

  KlOptions k;
  k.w = SmallWindows();
  k.policies = {"full"};
  auto kl = RunKl(*model_, *tokens_, k, nullptr);
  ASSERT_TRUE(kl.ok()) << kl.status().ToString();
  ASSERT_EQ(kl->configs.size(), 1u);
  EXPECT_EQ(kl->configs[0].mean_kl, 0.0);
  EXPECT_EQ(kl->configs[0].median_kl, 0.0);
  EXPECT_EQ(kl->configs[0].p99_kl, 0.0);
  EXPECT_EQ(kl->configs[0].max_kl, 0.0);
  EXPECT_EQ(kl->configs[0].n_positions, 3 * (k.w.eval_tokens - 1));
  EXPECT_EQ(kl->configs[0].same_top1, kl->configs[0].n_positions);
  // The perplexities: the policy's equals the reference's, and both equal eval ppl's.
  EXPECT_EQ(kl->configs[0].ppl, kl->reference_ppl);
  EXPECT_DOUBLE_EQ(kl->reference_ppl, r->configs[0].ppl);
  // A policy that changes nothing (Quest with a page budget over every page attends to every
  // row) is exactly 0 too.
  KlOptions q = k;
  q.policies = {"quest:quest-pages=1000"};
  auto ql = RunKl(*model_, *tokens_, q, nullptr);
  ASSERT_TRUE(ql.ok()) << ql.status().ToString();
  EXPECT_EQ(ql->configs[0].max_kl, 0.0);
  EXPECT_EQ(ql->configs[0].same_top1, ql->configs[0].n_positions);
  EXPECT_EQ(ql->configs[0].ppl, ql->reference_ppl);
}

TEST(QuantileTest, LinearInterpolationBetweenClosestRanks) {
  EXPECT_EQ(Quantile({}, 0.99), 0.0);
  EXPECT_EQ(Quantile({3.0}, 0.99), 3.0);
  // 101 values 0..100: the p-th quantile is p.
  std::vector<double> v;
  for (int i = 100; i >= 0; --i) v.push_back(i);
  EXPECT_DOUBLE_EQ(Quantile(v, 0.99), 99.0);
  EXPECT_DOUBLE_EQ(Quantile(v, 0.5), 50.0);
  EXPECT_DOUBLE_EQ(Quantile(v, 1.0), 100.0);
  // Between ranks: {0, 10}: 0.25 -> 2.5.
  EXPECT_DOUBLE_EQ(Quantile({10.0, 0.0}, 0.25), 2.5);
}

// The destroying policy changes the distributions: positive KL, a different PPL, and far fewer
// bytes read than the full cache.
TEST_F(WindowsTest, DestroyedCacheShowsUpInKlAndReadBits) {
  KlOptions k;
  k.w = SmallWindows();
  k.policies = {"destroy"};
  k.factory = testing::FactoryWithDestroy();
  auto kl = RunKl(*model_, *tokens_, k, nullptr);
  ASSERT_TRUE(kl.ok()) << kl.status().ToString();
  const KlConfigResult& d = kl->configs[0];
  EXPECT_GT(d.mean_kl, 0.0);
  EXPECT_LE(d.median_kl, d.p99_kl);
  EXPECT_LE(d.p99_kl, d.max_kl);
  EXPECT_LT(d.same_top1, d.n_positions);
  EXPECT_NE(d.ppl, kl->reference_ppl);

  PplOptions p;
  p.w = SmallWindows();
  p.policies = {"destroy"};
  p.policy2 = "full";
  p.draws = 1000;
  p.factory = testing::FactoryWithDestroy();
  auto r = RunPpl(*model_, *tokens_, p, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->configs[0].mean_nll, r->configs[1].mean_nll);
  EXPECT_LT(r->configs[0].read_bits_per_value, 1.0);  // one row of ~T per step
  EXPECT_DOUBLE_EQ(r->configs[1].read_bits_per_value, 16.0);
}

// PPL and KL configs carry the achieved compression over the scored steps and warn where the
// label promises more: kivi2 holds fewer bytes than full (no warning); quest with a page budget
// covering every page reads all of them (compressed nothing).
TEST_F(WindowsTest, ConfigsReportAchievedCompressionAndWarn) {
  PplOptions p;
  p.w = SmallWindows();
  p.w.length = 400;  // KIVI releases the pages of whole quantized groups: a few pages needed
  p.policies = {"full", "kivi2", "quest:quest-pages=1000"};
  auto pr = RunPpl(*model_, *tokens_, p, nullptr);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  ASSERT_EQ(pr->configs.size(), 3u);
  const auto& full = pr->configs[0];
  EXPECT_TRUE(full.achieved.policy.reference);
  EXPECT_EQ(full.achieved.bytes_read, full.achieved.full_bytes_read);
  EXPECT_EQ(full.achieved.reads, 3 * 8 * model_->config().n_layers);  // windows x steps x layers
  EXPECT_EQ(full.check.warning, "");
  const auto& kivi = pr->configs[1];
  EXPECT_TRUE(kivi.check.compressed);
  EXPECT_LT(kivi.achieved.resident_bytes, kivi.achieved.full_resident_bytes);
  EXPECT_GT(kivi.achieved.policy.blocks_closed, 0);
  const auto& quest = pr->configs[2];
  EXPECT_FALSE(quest.check.compressed);
  EXPECT_EQ(quest.check.warning.rfind(
                "quest:quest-pages=1000: compressed nothing on this run (every page read", 0),
            0u)
      << quest.check.warning;
  EXPECT_EQ(pr->warnings, std::vector<std::string>{quest.check.warning});
  const nlohmann::json pj = PplJson(*pr);
  EXPECT_EQ(pj["warnings"].size(), 1u);
  EXPECT_EQ(pj["configs"][2]["compressed"], false);
  EXPECT_EQ(pj["configs"][1]["achieved"]["blocks_closed"], kivi.achieved.policy.blocks_closed);

  KlOptions k;
  k.w = p.w;
  k.policies = {"kivi2", "quest:quest-pages=1000"};
  auto kr = RunKl(*model_, *tokens_, k, nullptr);
  ASSERT_TRUE(kr.ok()) << kr.status().ToString();
  EXPECT_TRUE(kr->configs[0].check.compressed);
  EXPECT_EQ(kr->configs[1].check.warning, quest.check.warning);
  EXPECT_EQ(kr->warnings.size(), 1u);
}

TEST_F(WindowsTest, ChunkedModeScoresTheSameTargets) {
  PplOptions p;
  p.w = SmallWindows();
  p.w.chunked = true;
  auto r = RunPpl(*model_, *tokens_, p, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->configs[0].n_targets, 3 * (p.w.eval_tokens - 1));
  EXPECT_TRUE(PplJson(*r)["screening_only"].get<bool>());
}

}  // namespace
}  // namespace strata::eval
