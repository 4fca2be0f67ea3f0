// Tests of issue 19's CLI defects: runs that must not mislead (EOS on the testbeds, the needle
// format, the thread cap, the context guard, the accounting line, the Geodesia budget, ratio-free
// policies run once) and help and docs that must be true (every documented flag exists).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "cli/cli_testing.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/model.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

std::string Source(const std::string& rel) { return std::string(STRATA_SOURCE_DIR) + "/" + rel; }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class TruthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_truth_test_" + std::to_string(getpid())));
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
  static nlohmann::json Json(const std::string& path) {
    return nlohmann::json::parse(ReadAll(path), nullptr, /*allow_exceptions=*/false);
  }
  static std::string* dir_;
};
std::string* TruthTest::dir_ = nullptr;

// Defect 1: the testbeds' EOS was llama.cpp's default id 2, the needle value <v0>, so generate
// stopped the moment the answer began.
TEST_F(TruthTest, TestbedsHaveNoEosAndGenerateAnswersV0) {
  for (const char* name : {"nope-mla", "rope-mla", "gqa"}) {
    auto m = Model::Load(Source(std::string("models/") + name + ".gguf"));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_NE((*m)->tokenizer(), nullptr) << name;
    EXPECT_EQ((*m)->tokenizer()->eos_id(), -1) << name;
    EXPECT_EQ((*m)->tokenizer()->TokenId("<v0>"), 2) << name;
  }
  // The needle <KEY> <v0> <v20>, then the question <KEY>: the answer starts with <v0>.
  const std::string json = Path("eos.json");
  CliResult r = Strata({"generate", "-m", Source("models/nope-mla.gguf"), "-p",
                        "<KEY><v0><v20>In the beginning<KEY>", "-n", "2", "--threads", "1",
                        "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(Has(r.err, "stopped at EOS")) << r.err;
  const nlohmann::json j = Json(json);
  EXPECT_EQ(j["text"], "<v0><v20>") << j.dump();
  EXPECT_EQ(j["generated_tokens"], 2);
  EXPECT_EQ(j["stopped_at_eos"], false);
}

// Defect 3: --threads 10000 started 10,001 threads and decoded nothing.
TEST_F(TruthTest, ThreadsAreCappedAtTheHardwareThreadsWithAWarning) {
  const std::string json = Path("threads.json");
  CliResult r = Strata({"generate", "-m", Path("tiny.gguf"), "-n", "2", "--threads", "10000",
                        "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  const int cores = HardwareThreads();
  EXPECT_TRUE(Has(r.err, "warning: --threads 10000 is more than the " + std::to_string(cores) +
                             " hardware thread"))
      << r.err;
  EXPECT_EQ(Json(json)["threads"], cores);
  CliResult e = Strata({"eval", "needle", "-m", Path("tiny.gguf"), "--policy", "full",
                        "--threads", "5000", "--trials", "1", "--len", "64"});
  EXPECT_TRUE(Has(e.err, "warning: --threads 5000 is more than the")) << e.err;
}

// Defect 4: -c/--ctx-size (default: the trained context), past it a warning, a prompt that does
// not fit an error, generation stops at it, and long prefills report progress.
TEST_F(TruthTest, ContextSizeGuardsGenerateAndDemo) {
  auto m = Model::Load(Path("tiny.gguf"));
  ASSERT_TRUE(m.ok());
  const int64_t trained = (*m)->config().n_ctx_train;
  ASSERT_GT(trained, 0);

  const std::string json = Path("ctx.json");
  CliResult r = Strata({"generate", "-m", Path("tiny.gguf"), "-c", "20", "-n", "100", "--json",
                        json});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = Json(json);
  EXPECT_EQ(j["stopped_at_ctx"], true);
  EXPECT_EQ(j["ctx_size"], 20);
  EXPECT_EQ(j["prompt_tokens"].get<int64_t>() + j["generated_tokens"].get<int64_t>(), 20);
  EXPECT_TRUE(Has(r.err, "(stopped at the context size 20, -c)")) << r.err;

  CliResult d = Strata({"generate", "-m", Path("tiny.gguf"), "-n", "1", "--json", json});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(Json(json)["ctx_size"], trained);

  CliResult small = Strata({"generate", "-m", Path("tiny.gguf"), "-c", "2", "-n", "1"});
  EXPECT_EQ(small.code, 2);
  EXPECT_TRUE(Has(small.err, "more than the context size 2 (-c/--ctx-size")) << small.err;

  CliResult past = Strata({"generate", "-m", Path("tiny.gguf"), "-n", "1", "-c",
                           std::to_string(trained * 2)});
  ASSERT_EQ(past.code, 0) << past.err;
  EXPECT_TRUE(Has(past.err, "warning: -c " + std::to_string(trained * 2) +
                                " is past the model's trained context of " +
                                std::to_string(trained)))
      << past.err;
  EXPECT_EQ(Strata({"generate", "-m", Path("tiny.gguf"), "-c", "-5"}).code, 2);

  // A prompt of more than kProgressMinTokens tokens: progress lines on stderr during prefill.
  std::string prompt;
  for (int i = 0; i < 3000; ++i) prompt += "ab cd ";
  CliResult lp = Strata({"generate", "-m", Path("tiny.gguf"), "-p", prompt, "-n", "1", "-c",
                         "100000", "--chunk", "1024"});
  ASSERT_EQ(lp.code, 0) << lp.err.substr(0, 2000);
  EXPECT_TRUE(Has(lp.err, "generate: prefill 1024 / ")) << lp.err.substr(0, 2000);
  EXPECT_TRUE(std::regex_search(lp.err, std::regex("generate: prefill (\\d+) / \\1 tokens "
                                                   "\\(100%\\)")))
      << lp.err.substr(0, 2000);

  // The demo: its prefix must fit the context (the testbeds are trained to 2048).
  const std::string nope = Source("models/nope-mla.gguf");
  CliResult dl = Strata({"demo", "-m", nope, "--len", "4096", "--policy", "full"});
  EXPECT_EQ(dl.code, 2);
  EXPECT_TRUE(Has(dl.err, "--len 4096 is more than the context size 2048 (-c/--ctx-size"))
      << dl.err;
  CliResult dc = Strata({"demo", "-m", nope, "--len", "4096", "-c", "4096", "--policy", "full",
                         "--gen", "0"});
  ASSERT_EQ(dc.code, 0) << dc.err;
  EXPECT_TRUE(Has(dc.err, "warning: -c 4096 is past the model's trained context of 2048"))
      << dc.err;
  EXPECT_TRUE(Has(dc.err, "demo: full: prefill 4096 / 4096 tokens (100%)")) << dc.err;
}

// Defect 5: with no decode step the "last step" line showed the whole prefill's reads.
TEST_F(TruthTest, LastStepReadsAreDecodeStepsOnly) {
  for (const char* n : {"0", "1"}) {
    const std::string json = Path(std::string("acct") + n + ".json");
    CliResult r = Strata({"generate", "-m", Path("tiny.gguf"), "-n", n, "--json", json});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(std::regex_search(r.err, std::regex("KV bytes read, last decode step +none "
                                                    "\\(no decode step\\)")))
        << r.err;
    EXPECT_TRUE(Json(json)["kv_bytes_read_last_step"].is_null());
  }
  const std::string json = Path("acct3.json");
  CliResult r = Strata({"generate", "-m", Path("tiny.gguf"), "-n", "3", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = Json(json);
  ASSERT_TRUE(j["kv_bytes_read_last_step"].is_number()) << j.dump();
  // One decode step of the full cache reads every row once: far less than the prefill did.
  EXPECT_GT(j["kv_bytes_read_last_step"].get<int64_t>(), 0);
  EXPECT_LE(j["kv_bytes_read_last_step"].get<int64_t>(), j["kv_bytes_resident"].get<int64_t>());
}

}  // namespace
}  // namespace strata::cli
