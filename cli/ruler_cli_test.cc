// `strata eval ruler` on the shipped testbed: the table per length, the full-tasks line and the
// JSON report (validated against eval/report_schema.json).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "eval/report.h"

namespace strata::cli {
namespace {

TEST(EvalRulerCliTest, TableAndJsonOnTheTestbed) {
  const std::string gqa = std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf";
  const std::string json =
      (std::filesystem::temp_directory_path() / ("ruler_" + std::to_string(getpid()) + ".json"))
          .string();
  CliResult r = Strata({"eval", "ruler", "-m", gqa, "--task", "niah_single_1,fwe", "--len", "1500",
                        "--samples", "2", "--policy", "full,streaming", "--ratio", "4", "--threads",
                        "1", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("T=1500:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("s1"), std::string::npos);
  EXPECT_NE(r.out.find("fwe"), std::string::npos);
  EXPECT_NE(r.out.find("streaming"), std::string::npos);
  EXPECT_NE(r.out.find("full scores >= 0.3 on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("95% CI (Wilson)"), std::string::npos);
  // Progress on stderr, one line per sample.
  EXPECT_NE(r.err.find("ruler T=1500 niah_single_1 sample 2/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ruler T=1500 fwe sample 1/2"), std::string::npos);

  std::ifstream f(json);
  ASSERT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  std::ifstream sf(std::string(STRATA_SOURCE_DIR) + "/eval/report_schema.json");
  const nlohmann::json schema = nlohmann::json::parse(sf);
  const Status st = eval::ValidateJsonSchema(schema, j);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(j["command"], "ruler");
  const nlohmann::json& ru = j["ruler"];
  EXPECT_EQ(ru["tasks"], nlohmann::json({"niah_single_1", "fwe"}));
  ASSERT_EQ(ru["samples"].size(), 4u);
  for (const auto& s : ru["samples"]) {
    EXPECT_EQ(s["results"].size(), 2u);
    EXPECT_LE(s["prompt_tokens"].get<int64_t>() +
                  ru["max_new_tokens"][s["task"].get<std::string>()].get<int64_t>(),
              1500);
    for (const auto& x : s["results"]) {
      EXPECT_GE(x["score"].get<double>(), 0.0);
      EXPECT_LE(x["score"].get<double>(), 1.0);
    }
  }
  EXPECT_EQ(ru["cells"].size(), 4u);     // 2 configs x 2 tasks
  EXPECT_EQ(ru["averages"].size(), 2u);  // 2 configs x 1 length
  for (const auto& a : ru["averages"]) {
    // Every answer's decode steps were timed: at most max_new_tokens - 1 per sample.
    EXPECT_GT(a["decode_tokens"].get<int64_t>(), 0) << a;
    EXPECT_GT(a["decode_tokens_per_s"].get<double>(), 0) << a;
  }
  EXPECT_EQ(ru["samples"][0]["seed"], 1);
  std::filesystem::remove(json);

  // The same seed gives the same samples and scores (the decode speed column is a timing).
  CliResult again =
      Strata({"eval", "ruler", "-m", gqa, "--task", "niah_single_1,fwe", "--len", "1500",
              "--samples", "2", "--policy", "full,streaming", "--ratio", "4", "--threads", "1"});
  ASSERT_EQ(again.code, 0) << again.err;
  // The averages table's rows (and its header) end with the decode speed: drop that field.
  auto without_speed = [](const std::string& out) {
    std::istringstream in(out.substr(0, out.find("process peak RSS")));
    std::string line, kept;
    while (std::getline(in, line)) {
      const bool avg_row = (line.rfind("full ", 0) == 0 || line.rfind("streaming ", 0) == 0) &&
                           line.find('[') == std::string::npos &&
                           line.find("scores") == std::string::npos;
      if (avg_row || line.rfind("policy ", 0) == 0 || line.rfind("---", 0) == 0) {
        line = line.substr(0, line.find_last_of(' '));
        line.erase(line.find_last_not_of(' ') + 1);
      }
      kept += line + "\n";
    }
    return kept;
  };
  EXPECT_EQ(without_speed(again.out), without_speed(r.out));
}

TEST(EvalRulerCliTest, TooShortLengthIsAnErrorNamingTheMinimum) {
  const std::string gqa = std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf";
  CliResult r = Strata(
      {"eval", "ruler", "-m", gqa, "--task", "niah_single_1", "--len", "256", "--samples", "2"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--len 256 is too short for niah_single_1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the minimum --len is"), std::string::npos) << r.err;
  CliResult bad = Strata({"eval", "ruler", "-m", gqa, "--task", "niah_single_7"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("niah_single_7"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace strata::cli
