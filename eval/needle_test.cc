#include "eval/needle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "core/rng.h"
#include "eval/eval_testing.h"

namespace strata::eval {
namespace {

class NeedleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = testing::TinyTextModel();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    text_model_ = m->release();
    auto r = testing::RetrievalModel();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    retrieval_model_ = r->release();
  }
  static void TearDownTestSuite() {
    delete text_model_;
    delete retrieval_model_;
  }
  static Model* text_model_;
  static Model* retrieval_model_;
};
Model* NeedleTest::text_model_ = nullptr;
Model* NeedleTest::retrieval_model_ = nullptr;

NeedleOptions KvOptions() {
  NeedleOptions o;
  o.format = NeedleFormat::kKvTokens;
  o.ratios = {};
  o.policies = {"full"};
  o.lengths = {96};
  o.trials = 6;
  o.factory = testing::FactoryWithDestroy();
  return o;
}

TEST_F(NeedleTest, NeedleIsInThePrefixAtTheChosenDepth) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (NeedleFormat f : {NeedleFormat::kText, NeedleFormat::kKvTokens}) {
    NeedleOptions o;
    o.format = f;
    o.seed = seed;
    Model* m = f == NeedleFormat::kText ? text_model_ : retrieval_model_;
    auto b = NeedleBuilder::Create(*m, o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    Rng rng(seed);
    for (int it = 0; it < 40; ++it) {
      const int64_t T = 64 + static_cast<int64_t>(rng.Below(2000));
      auto t = b->Build(T, static_cast<int64_t>(rng.Below(1000)));
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(static_cast<int64_t>(t->prefix.size()), T);
      EXPECT_GE(t->depth, static_cast<int64_t>(std::ceil(0.1 * T)));
      EXPECT_LT(t->depth, static_cast<int64_t>(std::ceil(0.8 * T)));
      EXPECT_LT(static_cast<double>(t->depth), 0.8 * T);
      EXPECT_GE(static_cast<double>(t->depth), 0.1 * T);
      ASSERT_LE(t->depth + static_cast<int64_t>(t->needle.size()), T);
      for (size_t j = 0; j < t->needle.size(); ++j) {
        EXPECT_EQ(t->prefix[t->depth + j], t->needle[j]) << "needle token " << j;
      }
      if (f == NeedleFormat::kKvTokens) {
        EXPECT_EQ(t->prefix[0], 0);  // BOS
        ASSERT_EQ(t->needle.size(), 3u);
        EXPECT_EQ(t->needle[0], 1);  // KEY
        EXPECT_GE(t->needle[1], 2);
        EXPECT_LT(t->needle[1], 18);
        EXPECT_GE(t->needle[2], 18);
        EXPECT_LT(t->needle[2], 34);
        EXPECT_EQ(t->query, std::vector<int32_t>{1});
        EXPECT_EQ(t->answer, (std::vector<int32_t>{t->needle[1], t->needle[2]}));
        // The key and value tokens occur only in the needle; the filler is characters.
        int keys = 0;
        for (int32_t id : t->prefix) keys += id == 1;
        EXPECT_EQ(keys, 1);
      } else {
        EXPECT_EQ(t->prefix[0], m->tokenizer()->bos_id());
        EXPECT_EQ(t->key.size(), 5u);
        const std::string decoded = m->tokenizer()->Decode(t->needle);
        EXPECT_NE(decoded.find(t->key), std::string::npos) << decoded;
        EXPECT_NE(m->tokenizer()->Decode(t->answer).find(t->key), std::string::npos);
      }
    }
  }
}

// The multi-key form: n needles "KEY k v1 v2" with distinct names and values, at their recorded
// depths, in order and apart; the query names the asked one and the answer is its values; the
// KEY, key-name and value ids occur nowhere else; a trial is a function of (seed, index, T).
TEST_F(NeedleTest, MultikeyNeedlesAreDistinctAndTheAskedOneIsQueried) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  NeedleOptions o;
  o.format = NeedleFormat::kKvMultikey;
  o.seed = seed;
  auto b = NeedleBuilder::Create(*retrieval_model_, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Rng rng(seed);
  std::vector<int> asked(4, 0);
  for (int it = 0; it < 60; ++it) {
    const int64_t T = 64 + static_cast<int64_t>(rng.Below(2000));
    const int64_t index = static_cast<int64_t>(rng.Below(1000));
    auto t = b->Build(T, index);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_EQ(static_cast<int64_t>(t->prefix.size()), T);
    ASSERT_EQ(t->distractors.size(), 3u);
    std::vector<NeedleTrial::Insert> all = t->distractors;
    all.push_back({t->depth, t->needle});
    std::sort(all.begin(), all.end(), [](auto& x, auto& y) { return x.depth < y.depth; });
    std::set<int32_t> names, v1s, v2s;
    for (size_t i = 0; i < all.size(); ++i) {
      const auto& in = all[i];
      ASSERT_EQ(in.tokens.size(), 4u);
      if (i > 0) EXPECT_GE(in.depth, all[i - 1].depth + 4) << "needles overlap";
      ASSERT_LE(in.depth + 4, T);
      for (size_t j = 0; j < 4; ++j) EXPECT_EQ(t->prefix[in.depth + j], in.tokens[j]);
      EXPECT_EQ(in.tokens[0], 1);  // KEY
      EXPECT_GE(in.tokens[1], 34);
      EXPECT_LT(in.tokens[1], 50);
      EXPECT_GE(in.tokens[2], 2);
      EXPECT_LT(in.tokens[2], 18);
      EXPECT_GE(in.tokens[3], 18);
      EXPECT_LT(in.tokens[3], 34);
      names.insert(in.tokens[1]);
      v1s.insert(in.tokens[2]);
      v2s.insert(in.tokens[3]);
      // Inside [0.1, 0.8) of the prefix, give or take the needles before it.
      EXPECT_GE(static_cast<double>(in.depth), 0.1 * (T - 17));
      EXPECT_LT(static_cast<double>(in.depth), 0.8 * T + 16);
      if (in.depth == t->depth) asked[i]++;
    }
    EXPECT_EQ(names.size(), 4u);
    EXPECT_EQ(v1s.size(), 4u);
    EXPECT_EQ(v2s.size(), 4u);
    EXPECT_EQ(t->query, (std::vector<int32_t>{1, t->needle[1]}));
    EXPECT_EQ(t->answer, (std::vector<int32_t>{t->needle[2], t->needle[3]}));
    int specials = 0;
    for (int32_t id : t->prefix) specials += id >= 1 && id < 50;
    EXPECT_EQ(specials, 16) << "KEY, names and values occur only in the needles";
    auto again = b->Build(T, index);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->prefix, t->prefix);
    EXPECT_EQ(again->query, t->query);
  }
  for (int i = 0; i < 4; ++i) EXPECT_GT(asked[i], 0) << "needle " << i << " never asked";
  // Bad settings are named.
  o.kv.n_keys = 17;
  auto bad = NeedleBuilder::Create(*retrieval_model_, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--kv-keys 17"), std::string::npos)
      << bad.status().message();
  o.kv.n_keys = 4;
  auto short_len = NeedleBuilder::Create(*retrieval_model_, o)->Build(18, 0);
  ASSERT_FALSE(short_len.ok());
  EXPECT_NE(short_len.status().message().find("--len 18"), std::string::npos);
}

TEST_F(NeedleTest, TrialIIsTheSameForAnyTrialCountAboveI) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t i = static_cast<int64_t>(rng.Below(4));
  NeedleOptions o;
  o.seed = seed;
  o.lengths = {48};
  o.ratios = {};
  o.policies = {"full"};
  o.baseline_gate_nats = 1e9;  // a random-weight model: keep every trial
  o.trials = i + 1;
  auto a = RunNeedle(*text_model_, o, nullptr);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  o.trials = 2 * i + 5;
  auto b = RunNeedle(*text_model_, o, nullptr);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(static_cast<int64_t>(a->trials.size()), i + 1);
  ASSERT_EQ(static_cast<int64_t>(b->trials.size()), 2 * i + 5);
  for (int64_t k = 0; k <= i; ++k) {
    const auto& x = a->trials[k];
    const auto& y = b->trials[k];
    EXPECT_EQ(x.index, y.index);
    EXPECT_EQ(x.depth, y.depth);
    EXPECT_EQ(x.key, y.key);
    EXPECT_EQ(x.reference_nll, y.reference_nll);  // bit-identical
    ASSERT_EQ(x.results.size(), y.results.size());
    for (size_t c = 0; c < x.results.size(); ++c) EXPECT_EQ(x.results[c].nll, y.results[c].nll);
  }
  // Token sequences too.
  auto builder = NeedleBuilder::Create(*text_model_, o);
  ASSERT_TRUE(builder.ok());
  auto t1 = builder->Build(48, i), t2 = builder->Build(48, i);
  ASSERT_TRUE(t1.ok() && t2.ok());
  EXPECT_EQ(t1->prefix, t2->prefix);
  // Different trials differ (key or depth or filler).
  auto t3 = builder->Build(48, i + 1);
  ASSERT_TRUE(t3.ok());
  EXPECT_NE(t1->prefix, t3->prefix);
}

// Issue 19 defect 12: the report JSON and the --dump-trials file rebuild every trial without
// the engine's RNG: the prefix from the recorded filler offset, depth and needle ids (by the
// documented recipe, implemented here independently), equal to what the run fed; and the
// dumped tokens, scored again, give the recorded reference NLL bit for bit.
TEST_F(NeedleTest, RecordedTrialsRebuildAndReproduce) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (NeedleFormat f :
       {NeedleFormat::kText, NeedleFormat::kKvTokens, NeedleFormat::kKvMultikey}) {
    SCOPED_TRACE(NeedleFormatName(f));
    Model* m = f == NeedleFormat::kText ? text_model_ : retrieval_model_;
    NeedleOptions o = f == NeedleFormat::kText ? NeedleOptions() : KvOptions();
    o.format = f;
    o.seed = seed;
    o.lengths = {64, 100};
    o.trials = 3;
    o.ratios = {};
    o.policies = {"full"};
    o.baseline_gate_nats = 1e9;  // keep every trial (the text model has random weights)
    o.dump_trials = (std::filesystem::temp_directory_path() /
                     ("strata_needle_dump_" + std::to_string(getpid()) + ".jsonl"))
                        .string();
    auto r = RunNeedle(*m, o, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const nlohmann::json j = NeedleJson(*r);
    std::ifstream in(o.dump_trials);
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    const nlohmann::json head = nlohmann::json::parse(line);
    const std::vector<int32_t> filler = head["filler"].get<std::vector<int32_t>>();
    ASSERT_FALSE(filler.empty());
    EXPECT_EQ(head["bos"], j["trial_recipe"]["bos"]);
    EXPECT_EQ(j["trial_recipe"]["filler_tokens"].get<size_t>(), filler.size());
    EXPECT_EQ(j["trial_recipe"]["filler_hash"], TokenHash(filler));
    const int32_t bos = j["trial_recipe"]["bos"].get<int32_t>();
    ASSERT_EQ(j["trials"].size(), 6u);
    auto builder = NeedleBuilder::Create(*m, o);
    ASSERT_TRUE(builder.ok());
    for (const auto& rec : j["trials"]) {
      ASSERT_TRUE(std::getline(in, line));
      const nlohmann::json d = nlohmann::json::parse(line);
      const int64_t T = rec["length"], depth = rec["depth"], off = rec["filler_offset"];
      EXPECT_EQ(d["length"], T);
      EXPECT_EQ(d["trial"], rec["trial"]);
      const auto needle = rec["needle_ids"].get<std::vector<int32_t>>();
      // The recipe, independently: BOS, filler from the offset, each needle at its depth (the
      // asked one and the distractors, in depth order), filler.
      std::vector<std::pair<int64_t, std::vector<int32_t>>> inserts = {{depth, needle}};
      for (const auto& d : rec["distractors"]) {
        inserts.push_back({d["depth"].get<int64_t>(), d["tokens"].get<std::vector<int32_t>>()});
      }
      EXPECT_EQ(inserts.size(), f == NeedleFormat::kKvMultikey ? 4u : 1u);
      std::sort(inserts.begin(), inserts.end());
      std::vector<int32_t> rebuilt;
      size_t fi = static_cast<size_t>(off);
      if (bos >= 0) rebuilt.push_back(bos);
      for (const auto& [at, tokens] : inserts) {
        while (static_cast<int64_t>(rebuilt.size()) < at) {
          rebuilt.push_back(filler[fi]);
          fi = (fi + 1) % filler.size();
        }
        for (int32_t id : tokens) rebuilt.push_back(id);
      }
      while (static_cast<int64_t>(rebuilt.size()) < T) {
        rebuilt.push_back(filler[fi]);
        fi = (fi + 1) % filler.size();
      }
      const auto prefix = d["prefix"].get<std::vector<int32_t>>();
      EXPECT_EQ(rebuilt, prefix) << "T=" << T << " trial " << rec["trial"];
      auto t = builder->Build(T, rec["trial"].get<int64_t>());
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->prefix, prefix);
      EXPECT_EQ(t->query, rec["query_ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(t->answer, rec["answer_ids"].get<std::vector<int32_t>>());
      // The dumped tokens alone reproduce the recorded reference NLL.
      NeedleTrial replay;
      replay.prefix = prefix;
      replay.query = d["query"].get<std::vector<int32_t>>();
      replay.answer = d["answer"].get<std::vector<int32_t>>();
      auto ref = SingleConfig("full", std::nullopt, {});
      ASSERT_TRUE(ref.ok());
      ThreadPool pool(1);
      auto sc = ScoreNeedleTrial(*m, replay, RegistryFactory(), *ref, o.chunk, &pool);
      ASSERT_TRUE(sc.ok()) << sc.status().ToString();
      EXPECT_EQ(sc->nll, rec["reference_nll"].get<double>());
    }
    EXPECT_FALSE(std::getline(in, line)) << "one dump line per trial";
    std::filesystem::remove(o.dump_trials);
  }
  // An unwritable dump path is an error naming it.
  NeedleOptions bad = KvOptions();
  bad.dump_trials = "/nonexistent-dir/trials.jsonl";
  auto r = RunNeedle(*retrieval_model_, bad, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent-dir/trials.jsonl"), std::string::npos);
}

// Integrity gate 1: the identity policy gives dNLL exactly 0 and every kept trial intact.
TEST_F(NeedleTest, GateIdentityPolicyHasZeroDelta) {
  NeedleOptions o = KvOptions();
  o.seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->lengths.size(), 1u);
  EXPECT_EQ(r->lengths[0].dropped, 0);  // the retrieval model answers uncompressed
  for (const auto& t : r->trials) {
    EXPECT_LT(t.reference_nll, 1e-3) << "the hand-built model should retrieve the needle";
    ASSERT_EQ(t.results.size(), 1u);
    EXPECT_EQ(t.results[0].delta, 0.0);
    EXPECT_TRUE(t.results[0].intact);
  }
  ASSERT_EQ(r->cells.size(), 1u);
  EXPECT_EQ(r->cells[0].intact, o.trials);
  EXPECT_EQ(r->cells[0].rate.point, 1.0);
  // Greedy answers: the identity policy answers every trial the reference answers.
  for (const auto& t : r->trials) {
    EXPECT_TRUE(t.reference_answered);
    EXPECT_EQ(t.answer_tokens, 2);
    EXPECT_TRUE(t.results[0].answered);
    EXPECT_EQ(t.results[0].tokens_right, 2);
  }
  EXPECT_EQ(r->cells[0].answered, o.trials);
  EXPECT_EQ(r->cells[0].answer_rate.point, 1.0);
  EXPECT_EQ(r->cells[0].token_accuracy, 1.0);
}

// Integrity gate 2: a policy that destroys the cache gives 0.00 intact (the leakage floor).
TEST_F(NeedleTest, GateDestroyedCacheGivesZeroIntact) {
  NeedleOptions o = KvOptions();
  o.seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  o.policies = {"destroy", "full"};
  o.ratios = {"8"};  // passed through as settings["ratio"]; both policies ignore it
  auto r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->configs.size(), 2u);
  EXPECT_EQ(r->configs[0].policy, "destroy");
  for (const auto& c : r->cells) {
    ASSERT_EQ(c.n, o.trials);
    if (r->configs[c.config].policy == "destroy") {
      EXPECT_EQ(c.intact, 0);
      EXPECT_EQ(c.rate.point, 0.0);
      // Flat logits: the first maximum (id 0, BOS) wins, never an answer token.
      EXPECT_EQ(c.answered, 0);
      EXPECT_EQ(c.token_accuracy, 0.0);
      EXPECT_EQ(c.answer_rate.point, 0.0);
      EXPECT_GT(c.mean_delta, 2 * std::log(512.0) - 0.1);  // both answer tokens at chance
    } else {
      EXPECT_EQ(c.intact, c.n);
    }
  }
}

// Integrity gate 3: trials the uncompressed reference cannot answer are dropped and counted.
TEST_F(NeedleTest, GateTrialsTheReferenceMissesAreDroppedAndCounted) {
  NeedleOptions o = KvOptions();
  o.seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  o.reference = "destroy";  // a reference that cannot answer
  auto r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->lengths[0].dropped, o.trials);
  for (const auto& t : r->trials) {
    EXPECT_TRUE(t.dropped);
    EXPECT_GE(t.reference_nll, 1.0);
    EXPECT_TRUE(t.results.empty());
  }
  EXPECT_EQ(r->cells[0].n, 0);
  // A random-weight text model cannot answer either: everything is dropped at the 1-nat gate.
  NeedleOptions t;
  t.lengths = {48};
  t.trials = 3;
  t.ratios = {};
  auto rt = RunNeedle(*text_model_, t, nullptr);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  EXPECT_EQ(rt->lengths[0].dropped, 3);
}

// A policy item's own settings (name:k=v:k=v) reach only that config; the label shows them.
// Each cell carries what its policy achieved, from the cache counters beside the full cache's,
// and a warning exactly when the label promises more than that.
TEST_F(NeedleTest, CellsReportAchievedCompressionAndWarn) {
  NeedleOptions o = KvOptions();
  // quest with a page budget above the page count reads every page: nothing compressed. (A
  // per-item setting: the other policies do not take it.)
  o.policies = {"full", "h2o", "quest:quest-pages=1000"};
  o.ratios = {"4"};
  o.trials = 3;
  auto r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->cells.size(), 3u);
  const NeedleCell& full = r->cells[0];
  EXPECT_TRUE(full.achieved.policy.reference);
  EXPECT_EQ(full.achieved.bytes_read, full.achieved.full_bytes_read);
  EXPECT_EQ(full.achieved.resident_bytes, full.achieved.full_resident_bytes);
  EXPECT_FALSE(full.check.compressed);
  EXPECT_EQ(full.check.warning, "");
  const NeedleCell& h2o = r->cells[1];
  EXPECT_TRUE(h2o.check.compressed);
  EXPECT_GT(h2o.achieved.reads, 0);
  EXPECT_LT(h2o.achieved.bytes_read, h2o.achieved.full_bytes_read);
  EXPECT_LT(h2o.achieved.kept_fraction(), 0.5);
  const NeedleCell& quest = r->cells[2];
  EXPECT_FALSE(quest.check.compressed);
  EXPECT_EQ(quest.check.warning.rfind(
                "quest:quest-pages=1000@4 T=96: compressed nothing on this run (every page read", 0),
            0u)
      << quest.check.warning;
  // The report's list holds exactly the cells' warnings, and the JSON carries them.
  std::vector<std::string> want;
  for (const NeedleCell& c : r->cells) {
    if (!c.check.warning.empty()) want.push_back(c.check.warning);
  }
  EXPECT_EQ(r->warnings, want);
  const nlohmann::json j = NeedleJson(*r);
  EXPECT_EQ(j["cells"][2]["compressed"], false);
  EXPECT_EQ(j["cells"][2]["warnings"][0], quest.check.warning);
  EXPECT_EQ(j["cells"][1]["achieved"]["rows_kept"], h2o.achieved.policy.rows_kept);
  EXPECT_TRUE(j["cells"][2]["achieved"]["rows_kept"].is_null());
  EXPECT_EQ(j["warnings"].size(), want.size());
}

TEST(PolicyGridTest, ItemSettingsOverrideSharedOnesForThatItemOnly) {
  auto g = ExpandGrid({"vestige:recall=off:block=1024", "vestige", "h2o"}, {"8", "32"},
                      {{"block", "2048"}, {"kappa", "4"}, {"ratio", "99"}});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->size(), 6u);
  const PolicyConfig& a = (*g)[0];
  EXPECT_EQ(a.policy, "vestige");
  EXPECT_EQ(a.variant, "recall=off:block=1024");
  EXPECT_EQ(a.Label(), "vestige:recall=off:block=1024@8");
  EXPECT_EQ(a.Spec().settings.at("recall"), "off");
  EXPECT_EQ(a.Spec().settings.at("block"), "1024");
  EXPECT_EQ(a.Spec().settings.at("kappa"), "4");
  EXPECT_EQ(a.Spec().settings.at("ratio"), "8");  // the grid's ratio, not the shared "99"
  const PolicyConfig& b = (*g)[3];
  EXPECT_EQ(b.Label(), "vestige@32");
  EXPECT_EQ(b.Spec().settings.count("recall"), 0u);
  EXPECT_EQ(b.Spec().settings.at("block"), "2048");
  EXPECT_EQ((*g)[4].Name(), "h2o");
  for (const char* bad : {"vestige:recall", "vestige:=1", "vestige:recall=", ":k=v",
                          "vestige:ratio=4", "vestige:a=1:"}) {
    auto e = ExpandGrid({bad}, {"8"}, {});
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find(bad), std::string::npos) << e.status().message();
  }
}

TEST_F(NeedleTest, ErrorsNameTheBadValue) {
  NeedleOptions o = KvOptions();
  o.policies = {"no-such-policy"};
  auto r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no-such-policy"), std::string::npos);
  o = KvOptions();
  o.lengths = {9};
  o.kv.key = 5000;
  r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--kv-key = 5000"), std::string::npos);
  o = KvOptions();
  o.policies = {"all"};
  o.skip_unsupported = true;  // e.g. MLA-only policies on this GQA model are skipped, not fatal
  o.trials = 1;
  o.lengths = {64};
  r = RunNeedle(*retrieval_model_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->configs.size() + r->skipped.size(), Policies().size());
  NeedleOptions text;
  EXPECT_FALSE(NeedleBuilder::Create(*retrieval_model_, text).ok());  // no tokenizer
}

}  // namespace
}  // namespace strata::eval
