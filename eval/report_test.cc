#include "eval/report.h"

#include <gtest/gtest.h>

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
