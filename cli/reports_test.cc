// CLI tests of what the reports say (issue 19, defects 8, 9, 11, 12, 13): table legends, bench
// caveats, inspect's metadata listing, replayable needle trials and the KV storage type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "cli/common.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

class ReportsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_reports_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    CliResult r = Strata({"synth", "--arch", "llama", "--seed", "7", "-o", Path("tiny.gguf")});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  static std::string Shipped(const std::string& name) {
    return std::string(STRATA_SOURCE_DIR) + "/models/" + name;
  }
  static std::string* dir_;
};
std::string* ReportsTest::dir_ = nullptr;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The column names of the first table in `text` whose header contains `first_col`: the rule
// line under the header ("----  -------") gives each column's span, which slices the header.
std::vector<std::string> TableColumns(const std::string& text, const std::string& first_col) {
  const std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].rfind(first_col, 0) != 0 || lines[i + 1].rfind("--", 0) != 0) continue;
    std::vector<std::string> cols;
    const std::string& h = lines[i];
    const std::string& rule = lines[i + 1];
    for (size_t b = 0; b < rule.size();) {
      size_t e = rule.find(' ', b);
      if (e == std::string::npos) e = rule.size();
      std::string name = b < h.size() ? h.substr(b, e - b) : "";
      while (!name.empty() && name.back() == ' ') name.pop_back();
      cols.push_back(name);
      b = rule.find('-', e);
      if (b == std::string::npos) break;
    }
    return cols;
  }
  return {};
}

// Every column of the table is a line "  NAME  meaning" of the legend under it.
void ExpectLegendDefinesEveryColumn(const std::string& out, const std::string& first_col) {
  const std::vector<std::string> cols = TableColumns(out, first_col);
  ASSERT_FALSE(cols.empty()) << out;
  const size_t legend = out.find("\ncolumns:\n");
  ASSERT_NE(legend, std::string::npos) << "no legend:\n" << out;
  const std::string tail = out.substr(legend);
  for (const std::string& c : cols) {
    EXPECT_NE(tail.find("\n  " + c + "  "), std::string::npos) << "column '" << c
                                                               << "' undefined in:\n" << tail;
  }
}

// Defect 9: bench attention's table defines every column; --kind names both kinds; GQA accepts
// a context list like MLA.
TEST_F(ReportsTest, BenchAttentionLegendKindAndContextLists) {
  CliResult g = Strata({"bench", "attention", "--kind", "gqa", "--ctx", "256,320", "--q-heads",
                        "4", "--kv-heads", "2", "--head-dim", "32", "--policy", "full,kivi2",
                        "--steps", "2", "--warmup", "1", "--threads", "1"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.out.find("\n256  full"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("\n320  full"), std::string::npos) << g.out;
  ExpectLegendDefinesEveryColumn(g.out, "ctx");
  const std::vector<std::string> cols = TableColumns(g.out, "ctx");
  for (const char* c : {"fetched/step", "rows kept", "compressed", "% blocks 16/8/4/2/1"}) {
    EXPECT_NE(std::find(cols.begin(), cols.end(), std::string(c)), cols.end()) << c;
  }
  CliResult bad = Strata({"bench", "attention", "--kind", "nosuch"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_NE(bad.err.find("mla"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("gqa"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("'nosuch'"), std::string::npos) << bad.err;
}

// Defect 9: bench decode defines its columns and says when the model fits in the CPU cache
// (the tiny model's ~1 MB working set fits in any cache sysfs reports; without sysfs no claim).
TEST_F(ReportsTest, BenchDecodeLegendAndCacheCaveat) {
  const std::string json = Path("decode.json");
  CliResult r = Strata({"bench", "decode", "-m", Path("tiny.gguf"), "--ctx", "16", "--threads",
                        "1", "--tokens", "2", "--bw-mib", "8", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectLegendDefinesEveryColumn(r.out, "ctx");
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  if (j["cpu_cache_bytes"].get<int64_t>() == 0) GTEST_SKIP() << "sysfs reports no CPU cache";
  EXPECT_TRUE(j["fits_in_cpu_cache"].get<bool>());
  EXPECT_NE(r.out.find("fits in the CPU cache"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not a bound"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace strata::cli
