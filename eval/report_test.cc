#include "eval/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "eval/corpus.h"
#include "eval/eval_testing.h"
#include "eval/needle.h"
#include "eval/svg.h"
#include "eval/windows.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

namespace strata::eval {
namespace {

using testing::XmlWellFormedError;

nlohmann::json LoadSchema() {
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/eval/report_schema.json");
  EXPECT_TRUE(f.good()) << "cannot open eval/report_schema.json";
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

class ReportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = testing::TinyTextModel();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = m->release();
    auto r = testing::RetrievalModel();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    retrieval_ = r->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete retrieval_;
  }
  static Model* model_;
  static Model* retrieval_;
};
Model* ReportTest::model_ = nullptr;
Model* ReportTest::retrieval_ = nullptr;

NeedleReport SmallNeedle(Model* m) {
  NeedleOptions o;
  o.format = NeedleFormat::kKvTokens;
  o.lengths = {64, 96};
  o.trials = 4;
  o.policies = {"destroy", "full"};
  o.ratios = {"4", "16"};
  o.factory = testing::FactoryWithDestroy();
  auto r = RunNeedle(*m, o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

// Issue 18, finding 3: graded block levels are in the reports. Every config's "achieved" has
// "block_levels": null for a policy without graded blocks; for Geodesia-KV per-layer, per-head
// histograms summed over the trials (windows), whose totals count every block of every trial
// (window); and with block_levels set, each trial result (window) lists every block's level,
// whose counts add up to the histograms. The report still validates against the schema.
TEST_F(ReportTest, GradedBlockLevelsInNeedleAndPplJson) {
  const nlohmann::json schema = LoadSchema();
  const std::vector<int> ladder = {16, 8, 4, 2, 1};
  // Adds the per-block levels of `blocks` ([layer][head][block]) into hist [layer][head][level].
  auto count = [&](const nlohmann::json& blocks, std::vector<std::vector<std::vector<int64_t>>>* h) {
    h->resize(blocks.size());
    for (size_t l = 0; l < blocks.size(); ++l) {
      (*h)[l].resize(blocks[l].size(), std::vector<int64_t>(5, 0));
      for (size_t kv = 0; kv < blocks[l].size(); ++kv) {
        for (const auto& x : blocks[l][kv]) {
          const auto it = std::find(ladder.begin(), ladder.end(), x.get<int>());
          ASSERT_NE(it, ladder.end()) << x;
          (*h)[l][kv][it - ladder.begin()]++;
        }
      }
    }
  };
  for (bool per_block : {false, true}) {
    SCOPED_TRACE(per_block ? "per block" : "histograms only");
    NeedleOptions o;
    o.format = NeedleFormat::kKvTokens;
    o.lengths = {448};
    o.trials = 2;
    o.policies = {"full", "geodesia"};
    o.ratios = {};
    o.settings = {{"bits", "2"}};
    o.block_levels = per_block;
    auto nr = RunNeedle(*retrieval_, o, nullptr);
    ASSERT_TRUE(nr.ok()) << nr.status().ToString();
    const nlohmann::json needle = MakeReport("needle", "retrieval", *retrieval_, 0.5, {},
                                             SkippedJson(nr->skipped), NeedleJson(*nr));
    Status st = ValidateJsonSchema(schema, needle);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const nlohmann::json& cells = needle["needle"]["cells"];
    ASSERT_EQ(cells.size(), 2u);
    EXPECT_TRUE(cells[0]["achieved"]["block_levels"].is_null()) << cells[0]["policy"];
    const nlohmann::json& bl = cells[1]["achieved"]["block_levels"];
    ASSERT_TRUE(bl.is_object()) << cells[1]["policy"];
    EXPECT_EQ(bl["levels"], nlohmann::json(ladder));
    ASSERT_EQ(bl["per_layer_head"].size(), 1u);     // one layer
    ASSERT_EQ(bl["per_layer_head"][0].size(), 2u);  // two KV heads
    // Every block of both trials counted once per head: the cache holds the prefix, the
    // question and the teacher-forced answer (ceil(n / 64) blocks each).
    int64_t total = 0, below16 = 0;
    for (size_t i = 0; i < 5; ++i) {
      total += bl["total"][i].get<int64_t>();
      if (i > 0) below16 += bl["total"][i].get<int64_t>();
    }
    int64_t want = 0;
    for (const auto& t : needle["needle"]["trials"]) {
      const int64_t n = t["length"].get<int64_t>() + static_cast<int64_t>(t["query_ids"].size()) +
                        static_cast<int64_t>(t["answer_ids"].size()) - 1;
      want += 2 * ((n + 63) / 64);
    }
    EXPECT_EQ(total, want);
    EXPECT_GT(below16, 0);  // 2 bits: blocks were demoted
    EXPECT_EQ(bl["per_layer"][0], bl["total"]);
    std::vector<std::vector<std::vector<int64_t>>> from_blocks;
    for (const auto& t : needle["needle"]["trials"]) {
      EXPECT_FALSE(t["results"][0].contains("block_levels"));  // full: no graded blocks
      ASSERT_EQ(t["results"][1].contains("block_levels"), per_block);
      if (per_block) {
        std::vector<std::vector<std::vector<int64_t>>> h;
        count(t["results"][1]["block_levels"], &h);
        if (from_blocks.empty()) {
          from_blocks = h;
        } else {
          for (size_t kv = 0; kv < 2; ++kv) {
            for (size_t i = 0; i < 5; ++i) from_blocks[0][kv][i] += h[0][kv][i];
          }
        }
      }
    }
    if (per_block) {
      EXPECT_EQ(nlohmann::json(from_blocks), bl["per_layer_head"]);
    }

    auto tokens = TokenizeCorpus(*model_, std::string(BuiltinHaystack()));
    ASSERT_TRUE(tokens.ok());
    PplOptions p;
    p.w.length = 400;
    p.w.eval_tokens = 9;
    p.w.windows = 2;
    p.w.block_levels = per_block;
    p.policies = {"geodesia"};
    p.settings = {{"bits", "2"}};
    auto pr = RunPpl(*model_, *tokens, p, nullptr);
    ASSERT_TRUE(pr.ok()) << pr.status().ToString();
    const nlohmann::json ppl =
        MakeReport("ppl", "tiny", *model_, 0.1, {}, SkippedJson(pr->skipped), PplJson(*pr));
    st = ValidateJsonSchema(schema, ppl);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const nlohmann::json& c = ppl["ppl"]["configs"][0];
    const nlohmann::json& pb = c["achieved"]["block_levels"];
    ASSERT_TRUE(pb.is_object());
    const int64_t n_layers = static_cast<int64_t>(pb["per_layer_head"].size());
    EXPECT_EQ(n_layers, model_->config().n_layers);
    int64_t ptotal = 0;
    for (const auto& x : pb["total"]) ptotal += x.get<int64_t>();
    // Two windows of 399 rows (T - 1: the last target is not fed): 7 blocks per head and layer.
    int64_t n_kv = 0;
    for (const auto& layer : pb["per_layer_head"]) n_kv += static_cast<int64_t>(layer.size());
    EXPECT_EQ(ptotal, 2 * 7 * n_kv);
    std::vector<std::vector<std::vector<int64_t>>> wsum;
    for (const auto& w : c["windows"]) {
      ASSERT_EQ(w.contains("block_levels"), per_block);
      if (!per_block) continue;
      std::vector<std::vector<std::vector<int64_t>>> h;
      count(w["block_levels"], &h);
      if (wsum.empty()) {
        wsum = h;
      } else {
        for (size_t l = 0; l < h.size(); ++l) {
          for (size_t kv = 0; kv < h[l].size(); ++kv) {
            for (size_t i = 0; i < 5; ++i) wsum[l][kv][i] += h[l][kv][i];
          }
        }
      }
    }
    if (per_block) {
      EXPECT_EQ(nlohmann::json(wsum), pb["per_layer_head"]);
    }
  }
}

TEST_F(ReportTest, EveryCommandValidatesAgainstTheSchema) {
  const nlohmann::json schema = LoadSchema();
  const NeedleReport nr = SmallNeedle(retrieval_);
  const nlohmann::json needle = MakeReport("needle", "retrieval", *retrieval_, 0.5, {"a note"},
                                           SkippedJson(nr.skipped), NeedleJson(nr));
  Status st = ValidateJsonSchema(schema, needle);
  EXPECT_TRUE(st.ok()) << st.ToString();
  // (destroy x 2 ratios + full, which takes no ratio) x 2 lengths.
  EXPECT_EQ(needle["needle"]["cells"].size(), 6u);
  EXPECT_EQ(needle["needle"]["trials"].size(), 8u);
  EXPECT_EQ(needle["needle"]["trials"][0]["results"].size(), 3u);

  auto tokens = TokenizeCorpus(*model_, std::string(BuiltinHaystack()));
  ASSERT_TRUE(tokens.ok());
  PplOptions p;
  p.w.length = 48;
  p.w.eval_tokens = 5;
  p.w.windows = 2;
  p.policies = {"streaming"};
  p.ratios = {"8"};
  p.settings = {{"sinks", "2"}};
  p.policy2 = "full";
  p.draws = 500;
  auto pr = RunPpl(*model_, *tokens, p, nullptr);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  const nlohmann::json ppl =
      MakeReport("ppl", "tiny", *model_, 0.1, {}, SkippedJson(pr->skipped), PplJson(*pr));
  st = ValidateJsonSchema(schema, ppl);
  EXPECT_TRUE(st.ok()) << st.ToString();
  // The settings the policy received.
  EXPECT_EQ(ppl["ppl"]["configs"][0]["settings"],
            nlohmann::json({{"ratio", "8"}, {"sinks", "2"}}));
  EXPECT_TRUE(ppl["ppl"]["configs"][1]["ratio"].is_null());

  KlOptions k;
  k.w = p.w;
  auto kr = RunKl(*model_, *tokens, k, nullptr);
  ASSERT_TRUE(kr.ok()) << kr.status().ToString();
  const nlohmann::json kl =
      MakeReport("kl", "tiny", *model_, 0.1, {}, SkippedJson(kr->skipped), KlJson(*kr));
  st = ValidateJsonSchema(schema, kl);
  EXPECT_TRUE(st.ok()) << st.ToString();

  // The validator rejects what the schema forbids, naming where.
  nlohmann::json bad = needle;
  bad["needle"]["cells"][1].erase("wilson_lo");
  st = ValidateJsonSchema(schema, bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("wilson_lo"), std::string::npos) << st.message();
  bad = ppl;
  bad["ppl"]["configs"][0]["ppl"] = "high";
  st = ValidateJsonSchema(schema, bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/ppl/configs/0/ppl"), std::string::npos) << st.message();
  bad = kl;
  bad["command"] = "ppl";  // the section does not match the command
  EXPECT_FALSE(ValidateJsonSchema(schema, bad).ok());
  bad = kl;
  bad["kl"]["mode"] = "batched";
  EXPECT_FALSE(ValidateJsonSchema(schema, bad).ok());
}

TEST(SvgTest, CheckerAcceptsGoodXmlAndRejectsBadXml) {
  EXPECT_EQ(
      XmlWellFormedError("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/><c y='2'>t &amp; u</c></a>"), "");
  EXPECT_NE(XmlWellFormedError("<a><b></a></b>"), "");
  EXPECT_NE(XmlWellFormedError("<a x=1></a>"), "");
  EXPECT_NE(XmlWellFormedError("<a>fish & chips</a>"), "");
  EXPECT_NE(XmlWellFormedError("<a>1 < 2</a>"), "");
  EXPECT_NE(XmlWellFormedError("<a></a><b></b>"), "");
  EXPECT_NE(XmlWellFormedError("<a>"), "");
  EXPECT_NE(XmlWellFormedError("<a x=\"1\" x=\"2\"/>"), "");
}

TEST(SvgTest, WriterEscapesText) {
  Svg svg(100, 50);
  svg.Text(1, 2, "a < b & \"c\" > 'd'");
  svg.Rect(0, 0, 10, 10, "#fff\"><script>", "none");
  const std::string s = svg.Finish();
  EXPECT_EQ(XmlWellFormedError(s), "") << s;
  EXPECT_NE(s.find("viewBox=\"0 0 100.0 50.0\""), std::string::npos);
  EXPECT_EQ(s.find("<script>"), std::string::npos);
}

TEST_F(ReportTest, ChartsAreWellFormedSvg) {
  const NeedleReport nr = SmallNeedle(retrieval_);
  for (const std::string policy : {"destroy", "full"}) {
    const std::string s = NeedleHeatmapSvg(nr, policy);
    EXPECT_EQ(XmlWellFormedError(s), "") << s;
    EXPECT_NE(s.find("viewBox="), std::string::npos);
    EXPECT_NE(s.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
    EXPECT_NE(s.find("T = 64"), std::string::npos);
    // full takes no ratio: one column, not one per ratio of the grid.
    EXPECT_EQ(s.find("r=16") != std::string::npos, policy == "destroy") << s;
  }
  auto tokens = TokenizeCorpus(*model_, std::string(BuiltinHaystack()));
  ASSERT_TRUE(tokens.ok());
  PplOptions p;
  p.w.length = 40;
  p.w.eval_tokens = 5;
  p.w.windows = 2;
  p.policies = {"full", "destroy"};
  p.factory = testing::FactoryWithDestroy();
  auto pr = RunPpl(*model_, *tokens, p, nullptr);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  const std::string s = PplParetoSvg(*pr);
  EXPECT_EQ(XmlWellFormedError(s), "") << s;
  EXPECT_NE(s.find("viewBox="), std::string::npos);
  EXPECT_NE(s.find("resident bits per cached value"), std::string::npos);
  EXPECT_NE(s.find("<polyline"), std::string::npos);
}

}  // namespace
}  // namespace strata::eval
