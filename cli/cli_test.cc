// In-process tests of the strata commands (through RunStrata, so flag parsing is covered), plus
// a smoke test of the built binary's exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/tokenizer.h"
#include "kv/cache.h"
#include "kv/registry.h"
#include "model/model.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

using Result = CliResult;

// A command line that must fail: exit code 2 with `expect` in its stderr.
struct UsageCase {
  std::vector<std::string> args;
  std::string expect;
};
void ExpectUsageErrors(const std::vector<UsageCase>& cases) {
  for (const UsageCase& c : cases) {
    Result r = Strata(c.args);
    std::string cmd;
    for (const auto& a : c.args) cmd += a + " ";
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << cmd << "\nstderr: " << r.err;
  }
}

class CliTest : public TinyModelSuite<CliTest> {
 public:
  static constexpr const char* kDirPrefix = "strata_cli_test_";
};

TEST_F(CliTest, HelpListsCommandsAndUnknownCommandIsAnError) {
  Result h = Strata({"--help"});
  EXPECT_EQ(h.code, 0);
  for (const char* c : {"demo", "inspect", "generate", "synth", "bench"}) {
    EXPECT_NE(h.out.find(c), std::string::npos) << c;
  }
  Result g = Strata({"generate", "--help"});
  EXPECT_EQ(g.code, 0);
  EXPECT_NE(g.out.find("--top-p"), std::string::npos);
  EXPECT_NE(g.out.find("--policy"), std::string::npos);
  Result b = Strata({"bench", "decode", "--help"});
  EXPECT_EQ(b.code, 0);
  EXPECT_NE(b.out.find("--ctx"), std::string::npos);

  Result u = Strata({"frobnicate"});
  EXPECT_EQ(u.code, 2);
  EXPECT_NE(u.err.find("unknown command 'frobnicate'"), std::string::npos) << u.err;
  EXPECT_NE(u.err.find("demo, inspect, generate, synth, convert, logits, quantize, bench"), std::string::npos)
      << u.err;
  Result d = Strata({"demo", "--help"});
  EXPECT_EQ(d.code, 0);
  for (const char* f : {"--len", "--seed", "--ratio", "--threads", "--policy", "--json",
                        "--gen", "nope-mla.gguf",
                        "full,vestige:recall=off,vestige,vestige:archive=file,streaming,h2o,snapkv"}) {
    EXPECT_NE(d.out.find(f), std::string::npos) << f << "\n" << d.out;
  }
  Result ub = Strata({"bench", "preload"});
  EXPECT_EQ(ub.code, 2);
  EXPECT_NE(ub.err.find("decode"), std::string::npos) << ub.err;
  EXPECT_EQ(Strata({}).code, 2);
  EXPECT_EQ(Strata({"generate", "--no-such-flag"}).code, 2);
}

TEST_F(CliTest, InspectPrintsArchitectureAndKvBytesPerToken) {
  const std::string json = Path("inspect.json");
  Result r = Strata({"inspect", Path("tiny.gguf"), "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("llama"), std::string::npos);
  EXPECT_NE(r.out.find("token_embd.weight"), std::string::npos);
  // tiny llama: 2 layers x 2 kv heads x (16 + 16) dims x 2 bytes = 128 per layer, 256 in all.
  EXPECT_NE(r.out.find("KV bytes per token (all layers): 256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sentencepiece"), std::string::npos);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["kv_bytes_per_token"], 256);
  EXPECT_EQ(j["kv_layers"].size(), 2u);
  EXPECT_EQ(j["config"]["architecture"], "llama");
}

TEST_F(CliTest, InspectMlaModelShowsLatentRows) {
  const std::string path = Path("ds.gguf");
  ASSERT_EQ(Strata({"synth", "--arch", "deepseek2", "--nope", "-o", path}).code, 0);
  Result r = Strata({"inspect", path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("deepseek2"), std::string::npos);
  EXPECT_NE(r.out.find("MLA"), std::string::npos);
  EXPECT_NE(r.out.find("NoPE"), std::string::npos);
  // tiny deepseek2: latent row kv_lora 32 + rope 8 = 40 bf16 values = 80 bytes, 2 layers.
  EXPECT_NE(r.out.find("KV bytes per token (all layers): 160"), std::string::npos) << r.out;
}

TEST_F(CliTest, GenerateGreedyIsDeterministicAndSeededSamplingReproducible) {
  const std::vector<std::string> greedy = {
      "generate", "-m", Path("tiny.gguf"), "-p", "hello there", "-n", "12",
      "--temp",   "0",  "--threads",       "2",  "--chunk",     "3"};
  Result a = Strata(greedy), b = Strata(greedy);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.rfind("hello there", 0), 0u) << a.out;  // the prompt is echoed first
  EXPECT_GT(a.out.size(), std::string("hello there\n").size());
  for (const char* s : {"prompt tokens", "generated tokens", "prefill tokens/s", "decode tokens/s",
                        "KV bytes resident", "KV bytes read, last decode step"}) {
    EXPECT_NE(a.err.find(s), std::string::npos) << s;
  }
  // Greedy output does not depend on the thread count or chunking.
  Result c = Strata(
      {"generate", "-m", Path("tiny.gguf"), "-p", "hello there", "-n", "12", "--threads", "1"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(a.out, c.out);

  const std::vector<std::string> sampled = {"generate", "-m",  Path("tiny.gguf"), "-n",  "16",
                                            "--temp",   "0.8", "--top-p",         "0.9", "--seed",
                                            "42"};
  Result s1 = Strata(sampled), s2 = Strata(sampled);
  ASSERT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  EXPECT_EQ(s1.out.rfind("The quick brown fox", 0), 0u);  // the default prompt

  const std::string json = Path("gen.json");
  Result z = Strata({"generate", "-m", Path("tiny.gguf"), "-n", "0", "--json", json});
  ASSERT_EQ(z.code, 0) << z.err;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["generated_tokens"], 0);
  EXPECT_GT(j["kv_bytes_resident"].get<int64_t>(), 0);
}

TEST_F(CliTest, BadFlagsExitTwoNamingTheProblem) {
  const std::string m = Path("tiny.gguf");
  {
    std::ofstream g(Path("garbage.gguf"), std::ios::binary);
    for (int i = 0; i < 4096; ++i) g.put(static_cast<char>((i * 131 + 17) & 0xff));
    std::ofstream t(Path("truncated.gguf"), std::ios::binary);
    t.write("GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff", 16);
  }
  const std::vector<UsageCase> cases = {
      {{"generate", "-m", m, "-n", "-1"}, "-n must be >= 0, got -1"},
      {{"generate", "-m", m, "--top-p", "2"}, "--top-p must be in (0, 1], got 2"},
      {{"generate", "-m", m, "--temp", "-0.5"}, "--temp"},
      {{"generate", "-m", m, "--threads", "0"}, "--threads must be >= 1, got 0"},
      {{"generate", "-m", m, "--chunk", "0"}, "--chunk"},
      {{"generate", "-m", m, "--policy", "nosuch"}, "available: full"},
      {{"generate", "-m", m, "--policy-set", "ratio"}, "--policy-set"},
      {{"generate", "-m", m, "-n", "many"}, "many"},
      {{"generate", "-m", Path("missing.gguf")}, "missing.gguf"},
      {{"generate", "-m", Path("garbage.gguf")}, "garbage.gguf"},
      {{"inspect", Path("truncated.gguf")}, "truncated.gguf"},
      {{"inspect", Path("missing.gguf")}, "missing.gguf"},
      {{"synth", "--dtype", "f8", "-o", Path("x.gguf")}, "--dtype 'f8'"},
      {{"synth", "--arch", "gpt9", "-o", Path("x.gguf")}, "gpt9"},
      {{"synth", "--dims", "layers=zero", "-o", Path("x.gguf")}, "layers"},
      {{"synth", "--preset", "7b", "-o", Path("x.gguf")}, "7b"},
      {{"synth", "--format", "onnx", "-o", Path("x.gguf")}, "onnx"},
      {{"synth"}, "--out"},
      {{"bench", "decode", "-m", m, "--ctx", "0,x"}, "--ctx"},
      {{"bench", "decode", "-m", m, "--threads", "0"}, "--threads"},
      {{"bench", "decode", "-m", m, "--tokens", "0"}, "--tokens"},
      {{"bench", "decode", "-m", m, "--bw-mib", "0"}, "--bw-mib"},
      {{"bench", "prefill", "-m", m, "--rounds", "0"}, "--rounds must be >= 1, got 0"},
      {{"bench", "prefill", "-m", m, "--tokens", "-3"}, "--tokens must be >= 0, got -3"},
      {{"bench", "prefill", "-m", m, "--chunk", "0"}, "--chunk must be >= 1, got 0"},
      {{"bench", "prefill", "-m", m, "--tokens", "100000000000"}, "lower --tokens"},
      {{"bench", "prefill", "-m", m, "--policy", "full,kivi9"}, "kivi9"},
      {{"bench", "prefill", "-m", m, "--policy", "full,,h2o"}, "empty item"},
      {{"bench", "prefill", "-m", m, "--policy", "h2o:budgit=64"}, "budgit"},
      {{"bench", "prefill", "-m", m, "-f", Path("no-such-prompt.txt")}, "no-such-prompt.txt"},
      // Passes the range check, but 1 PiB exceeds any x86-64 address space whatever the
      // overcommit policy: the probe's allocation error.
      {{"bench", "decode", "-m", m, "--ctx", "0", "--bw-mib", "1073741824"},
       "--bw-mib 1073741824"},
  };
  ExpectUsageErrors(cases);
}

// Every way of naming a policy setting goes through the one declared schema: a misspelt key names
// the closest valid one, a setting the policy does not take names the policy and what it takes,
// a key given twice is an error; all before any model is loaded.
TEST_F(CliTest, PolicySettingsAreValidatedAgainstTheDeclaration) {
  const std::string m = Path("tiny.gguf");
  const std::vector<UsageCase> cases = {
      {{"generate", "-m", m, "--policy", "vestige", "--policy-set", "recal=off", "-p", "x"},
       "unknown setting 'recal' for vestige; did you mean 'recall'?"},
      {{"generate", "-m", m, "--policy", "vestige:recal=off", "-p", "x"},
       "unknown setting 'recal' for vestige; did you mean 'recall'?"},
      {{"generate", "-m", m, "--policy", "streaming", "--bits", "5", "-p", "x"},
       "streaming does not take 'bits' (a setting of geodesia, cquest); streaming takes: ratio, "
       "sinks"},
      {{"generate", "-m", m, "--policy", "full", "--ratio", "8", "-p", "x"},
       "full does not take 'ratio'"},
      {{"generate", "-m", m, "--policy", "vestige:kappa=2", "--kappa", "4", "-p", "x"},
       "'kappa' is given twice"},
      {{"generate", "-m", m, "--policy", "vestige:rank=16:recall-rank=8", "-p", "x"},
       "'recall-rank' is given twice"},
      {{"generate", "-m", m, "--policy", "vestige", "--block", "abc", "-p", "x"},
       "--block = 'abc' is not an integer"},
      {{"generate", "-m", m, "--policy", "geodesia:decay=2", "-p", "x"},
       "--decay = 2 must be in [0, 1]"},
      {{"generate", "-m", m, "--policy", "full@8", "-p", "x"}, "full has no budget setting"},
      {{"eval", "needle", "-m", m, "--policy", "vestige:recal=off", "--trials", "1"},
       "did you mean 'recall'?"},
      {{"eval", "needle", "-m", m, "--policy", "streaming", "--bits", "5", "--trials", "1"},
       "--bits 5 applies to none of the policies (streaming); it is a setting of geodesia, "
       "cquest"},
      {{"eval", "ppl", "-m", m, "--policy", "full", "--ratio", "8"},
       "--ratio 8 applies to none of the policies (full)"},
      {{"eval", "needle", "-m", m, "--policy", "h2o", "--set", "snap-window=4", "--trials", "1"},
       "applies to none of the policies (h2o)"},
      {{"eval", "needle", "-m", m, "--policy", "vestige", "--set", "kappa=2", "--kappa", "4"},
       "'kappa' is given twice"},
      {{"demo", "-m", m, "--policy", "vestige:recal=off"}, "did you mean 'recall'?"},
      {{"bench", "attention", "--kind", "gqa", "--ctx", "256", "--policy", "streaming", "--bits",
        "5"},
       "--bits 5 applies to none of the policies (full, streaming)"},
      {{"bench", "attention", "--kind", "gqa", "--ctx", "256", "--policy", "geodesia:bitz=5"},
       "did you mean 'bits'?"},
      {{"bench", "attention", "--kind", "tpu"}, "--kind must be mla or gqa"},
      {{"policies", "nosuch"}, "unknown policy 'nosuch'"},
  };
  ExpectUsageErrors(cases);
  // The acceptance command lines, on the repository's NoPE-MLA testbed when it is there.
  const std::string nope = std::string(STRATA_SOURCE_DIR) + "/models/nope-mla.gguf";
  if (fs::exists(nope)) {
    ExpectUsageErrors({
        {{"generate", "-m", nope, "--policy", "vestige", "--policy-set", "recal=off", "-p", "x"},
         "did you mean 'recall'?"},
        {{"eval", "needle", "-m", nope, "--policy", "vestige:recal=off", "--trials", "1"},
         "did you mean 'recall'?"},
        {{"eval", "needle", "-m", nope, "--policy", "streaming", "--bits", "5"}, "--bits 5"},
    });
  }
  // The same settings given correctly run: shorthand, NAME:k=v and the deprecated --policy-set.
  for (const std::vector<std::string>& ok :
       {std::vector<std::string>{"--policy", "streaming", "--ratio", "4"},
        {"--policy", "streaming:sinks=2", "--ratio", "4"},
        {"--policy", "streaming@4", "--policy-set", "sinks=2"}}) {
    std::vector<std::string> args = {"generate", "-m", m, "-n", "2", "-p", "ab"};
    args.insert(args.end(), ok.begin(), ok.end());
    Result r = Strata(args);
    EXPECT_EQ(r.code, 0) << ok[1] << "\n" << r.err;
  }
}

// `strata policies` lists every registered policy with its settings; --json carries the same.
TEST_F(CliTest, PoliciesListsEveryPolicyWithItsSettings) {
  Result r = Strata({"policies"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const PolicyInfo& p : Policies()) {
    EXPECT_NE(r.out.find(p.name + ": "), std::string::npos) << p.name;
    for (const SettingDecl& d : p.settings.settings) {
      EXPECT_NE(r.out.find(d.name), std::string::npos) << p.name << " " << d.name;
    }
  }
  EXPECT_NE(r.out.find("auto: the largest power of two dividing 64 and the head dim"),
            std::string::npos);
  Result j = Strata({"policies", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json js = nlohmann::json::parse(j.out);
  ASSERT_EQ(js.at("policies").size(), Policies().size());
  for (size_t i = 0; i < Policies().size(); ++i) {
    const PolicyInfo& p = Policies()[i];
    const nlohmann::json& e = js["policies"][i];
    EXPECT_EQ(e.at("name"), p.name);
    ASSERT_EQ(e.at("settings").size(), p.settings.settings.size()) << p.name;
    for (size_t k = 0; k < p.settings.settings.size(); ++k) {
      const SettingDecl& d = p.settings.settings[k];
      const nlohmann::json& s = e["settings"][k];
      EXPECT_EQ(s.at("name"), d.name);
      EXPECT_EQ(s.at("type"), std::string(SettingTypeName(d.type)));
      EXPECT_EQ(s.at("default_text"), d.DefaultText());
      EXPECT_EQ(s.at("range"), d.RangeText());
      EXPECT_EQ(s.at("shared"), d.shared);
    }
  }
  // --help of a command that builds a policy: the shorthands' help comes from the declarations.
  Result h = Strata({"generate", "--help"});
  ASSERT_EQ(h.code, 0);
  EXPECT_NE(h.out.find(SharedSettingHelp("bits").substr(0, 40)), std::string::npos) << h.out;
  EXPECT_NE(SharedSettingHelp("bits").find("default 3.4 (geodesia); 16 (cquest)"),
            std::string::npos)
      << SharedSettingHelp("bits");
}

// README.md's and docs/'s settings tables are `strata policies` output between marker comments
// (scripts/update-policy-tables.py regenerates them); they must match the declarations.
TEST_F(CliTest, PolicyTablesInDocsMatchTheDeclarations) {
  const std::string begin = "<!-- BEGIN generated: strata ";
  const std::string end = "<!-- END generated -->";
  std::vector<std::string> covered;
  for (const char* file : {"README.md", "docs/vestige.md", "docs/geodesia.md",
                           "docs/baselines.md"}) {
    SCOPED_TRACE(file);
    std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/" + file);
    ASSERT_TRUE(f) << "cannot open " << file;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    int blocks = 0;
    for (size_t at = text.find(begin); at != std::string::npos; at = text.find(begin, at + 1)) {
      const size_t args_end = text.find(" -->\n", at);
      ASSERT_NE(args_end, std::string::npos);
      std::vector<std::string> args;
      std::stringstream as(text.substr(at + begin.size(), args_end - at - begin.size()));
      for (std::string a; as >> a;) args.push_back(a);
      const size_t body = args_end + 5;
      const size_t stop = text.find(end, body);
      ASSERT_NE(stop, std::string::npos) << "unterminated block at byte " << at;
      Result r = Strata(args);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(text.substr(body, stop - body), r.out)
          << file << ": the table of `strata " << text.substr(at + begin.size(),
                                                              args_end - at - begin.size())
          << "` differs from the declarations; run scripts/update-policy-tables.py";
      for (size_t i = 2; i < args.size(); ++i) covered.push_back(args[i]);
      ++blocks;
    }
    EXPECT_GE(blocks, 1) << file << " has no generated policy table";
  }
  // Every registered policy has its settings table in docs/.
  for (const PolicyInfo& p : Policies()) {
    if (p.name == "full") continue;  // no settings
    EXPECT_NE(std::find(covered.begin(), covered.end(), p.name), covered.end()) << p.name;
  }
}

// Geodesia's and Compressed-Quest's defaults run on the repository's GQA testbed (head dim 32:
// the group defaults to 32) with no extra flag.
TEST_F(CliTest, GeodesiaDefaultsRunOnTheGqaTestbed) {
  const std::string gqa = std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf";
  if (!fs::exists(gqa)) GTEST_SKIP() << gqa << " is not there";
  Result r = Strata({"eval", "needle", "-m", gqa, "--needle-format", "kv-tokens", "--policy",
                     "geodesia,cquest", "--trials", "1", "--len", "256", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("geodesia"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cquest"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipped"), std::string::npos) << r.out;
}

// Issue 18: `generate --verbose` prints one block-level histogram row per layer for a graded
// policy (blocks over the layer's KV heads at 16/8/4/2/1 bits, adding up to its blocks), and
// none without --verbose or for a policy without graded blocks.
TEST_F(CliTest, GenerateVerbosePrintsBlockLevelHistograms) {
  const std::string gqa = std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf";
  if (!fs::exists(gqa)) GTEST_SKIP() << gqa << " is not there";
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "In the beginning God created the heaven and the earth. ";
  Result r = Strata({"generate", "-m", gqa, "--policy", "geodesia:bits=2", "-p", prompt, "-n",
                     "4", "--threads", "1", "--verbose"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string row = "block levels, layer 0 (16/8/4/2/1 bits)";
  const size_t at = r.err.find(row);
  ASSERT_NE(at, std::string::npos) << r.err;
  // The counts on that row: five numbers, at least one block below 16 bits at a 2-bit budget.
  std::istringstream line(r.err.substr(at + row.size(), r.err.find('\n', at) - at - row.size()));
  std::vector<int64_t> n;
  std::string tok;
  while (line >> tok) {
    if (tok != "/") n.push_back(std::stoll(tok));
  }
  ASSERT_EQ(n.size(), 5u) << r.err;
  EXPECT_GT(n[1] + n[2] + n[3] + n[4], 0) << r.err;
  Result quiet = Strata({"generate", "-m", gqa, "--policy", "geodesia:bits=2", "-p", prompt,
                         "-n", "4", "--threads", "1"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("block levels"), std::string::npos) << quiet.err;
  Result full = Strata({"generate", "-m", gqa, "-p", prompt, "-n", "4", "--threads", "1",
                        "--verbose"});
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_EQ(full.err.find("block levels"), std::string::npos) << full.err;
}

// `bench attention` runs registered policies through the registry for both layer kinds.
TEST_F(CliTest, BenchAttentionRunsRegisteredPolicies) {
  Result g = Strata({"bench", "attention", "--kind", "gqa", "--rows", "random", "--ctx", "512",
                     "--q-heads", "4",
                     "--kv-heads", "2", "--head-dim", "32", "--steps", "1", "--warmup", "0",
                     "--threads", "1", "--policy", "geodesia@5,cquest,streaming", "--ratio",
                     "4", "--attn-math", "f32"});
  ASSERT_EQ(g.code, 0) << g.err;
  for (const char* p : {"full", "geodesia@5", "cquest", "streaming"}) {
    EXPECT_NE(g.out.find(p), std::string::npos) << p << "\n" << g.out;
  }
  EXPECT_NE(g.out.find("group 32 (auto: head dim 32)"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("streaming: streaming"), std::string::npos) << g.out;
  Result m = Strata({"bench", "attention", "--kind", "mla", "--rows", "random", "--ctx", "256",
                     "--heads", "2",
                     "--d-c", "64", "--d-r", "16", "--steps", "1", "--warmup", "0", "--threads",
                     "1", "--policy", "vestige:recall=off:block=64:kappa=2", "--ratio", "4",
                     "--attn-math", "f32", "--json", Path("bench_attention.json")});
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_NE(m.out.find("vestige: ratio 4, block 64, kappa 2"), std::string::npos) << m.out;
  std::ifstream f(Path("bench_attention.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.at("results").size(), 2u);
  EXPECT_EQ(j["results"][1].at("policy"), "vestige:recall=off:block=64:kappa=2");
  // A quarter of the closed rows (+ sinks and the tail) is read: less than full.
  EXPECT_LT(j["results"][1].at("kv_bytes_read_per_step").get<double>(),
            j["results"][0].at("kv_bytes_read_per_step").get<double>());
}

// The shared flag checks produce the commands' messages word for word.
TEST(FlagChecks, MessagesNameTheFlagTheBoundAndTheValue) {
  EXPECT_TRUE(CheckAtLeast("--threads", 1, 1).ok());
  EXPECT_EQ(CheckAtLeast("--threads", 0, 1).message(), "--threads must be >= 1, got 0");
  EXPECT_EQ(CheckAtLeast("-n", -1, 0).message(), "-n must be >= 0, got -1");
  EXPECT_EQ(CheckAtLeast("--len", 4, 8).message(), "--len must be >= 8, got 4");
  const auto ratio = [](const std::string& text) {
    return CheckNumberAtLeast("--ratio", text, 1, "32", "keep 1/R of the rows");
  };
  for (const char* ok : {"1", "32", "2.5", "1e3"}) EXPECT_TRUE(ratio(ok).ok()) << ok;
  EXPECT_EQ(ratio("abc").message(), "--ratio 'abc' is not a number (e.g. --ratio 32)");
  EXPECT_EQ(ratio("").message(), "--ratio '' is not a number (e.g. --ratio 32)");
  EXPECT_EQ(ratio("8x").message(), "--ratio '8x' is not a number (e.g. --ratio 32)");
  EXPECT_EQ(ratio("1e999").message(), "--ratio '1e999' is not a number (e.g. --ratio 32)");
  EXPECT_EQ(ratio("0.5").message(),
            "--ratio 0.5 must be a finite number >= 1 (keep 1/R of the rows)");
  EXPECT_EQ(ratio("inf").message(),
            "--ratio inf must be a finite number >= 1 (keep 1/R of the rows)");
  EXPECT_EQ(ratio("nan").message(),
            "--ratio nan must be a finite number >= 1 (keep 1/R of the rows)");
}

TEST_F(CliTest, SynthSafetensorsWritesAnHfDirectoryThatInspectReads) {
  const std::string dir = Path("hf");
  Result r = Strata({"synth", "--arch", "qwen2", "--format", "safetensors", "--dtype", "bf16",
                     "--dims", "layers=3", "-o", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_NE(r.out.find("parameters"), std::string::npos);
  Result i = Strata({"inspect", dir});
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("qwen2"), std::string::npos);
  EXPECT_NE(i.out.find("3 layers"), std::string::npos);
  // Without a tokenizer generate refuses with a clear message.
  Result g = Strata({"generate", "-m", dir, "-n", "2"});
  EXPECT_EQ(g.code, 2);
  EXPECT_NE(g.err.find("no tokenizer"), std::string::npos) << g.err;
}

TEST_F(CliTest, BenchDecodePrintsFractionOfTheFloor) {
  const std::string json = Path("bench.json");
  Result r = Strata({"bench", "decode", "-m", Path("tiny.gguf"), "--ctx", "0,64", "--threads",
                     "1,2", "--tokens", "2", "--bw-mib", "8", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("fraction"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("floor tok/s"), std::string::npos) << r.out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["results"].size(), 4u);
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["tok_per_s"].get<double>(), 0);
    EXPECT_GT(row["fraction"].get<double>(), 0);
    EXPECT_GT(row["read_bandwidth_bytes_per_s"].get<double>(), 0);
  }
  // The full cache reads every row: at ctx 64 (+1 warmup, +1 or +2 for the timed token) the KV
  // bytes per token exceed ctx * the 256 bytes per token of this model.
  EXPECT_EQ(j["results"][0]["ctx"], 0);
  EXPECT_GE(j["results"][1]["kv_bytes_read_per_token"].get<double>(), 64.0 * 256);
}

// bench prefill: every listed policy once per round beside its own run of full (added when not
// listed), each ratio against that run; full's own ratios are 1, the table and legend name the
// columns, the JSON holds a rate, the paired full rate and a ratio per round. The prompt: random
// ids, or a file's tokens cut to --tokens.
TEST_F(CliTest, BenchPrefillAlternatesPoliciesAgainstFull) {
  const std::string json = Path("prefill.json");
  Result r = Strata({"bench", "prefill", "-m", Path("tiny.gguf"), "--tokens", "80", "--chunk",
                     "32", "--policy", "kivi2,h2o,kivi2", "--rounds", "3", "--threads", "2",
                     "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"x full median", "x full min", "x full per round", "kivi2", "h2o",
                        "between its runs", "reference"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["prompt_tokens"], 80);
  ASSERT_EQ(j["results"].size(), 3u);  // full, kivi2, h2o (kivi2 once)
  EXPECT_EQ(j["results"][0]["policy"], "full");
  EXPECT_EQ(j["results"][1]["policy"], "kivi2");
  EXPECT_EQ(j["results"][2]["policy"], "h2o");
  // full ran beside each of the two other policies in each of the 3 rounds.
  ASSERT_EQ(j["results"][0]["tok_per_s"].size(), 6u);
  std::multiset<double> full_runs;
  for (const auto& x : j["results"][0]["tok_per_s"]) full_runs.insert(x.get<double>());
  for (size_t i = 1; i < 3; ++i) {
    const auto& row = j["results"][i];
    ASSERT_EQ(row["tok_per_s"].size(), 3u);
    ASSERT_EQ(row["ratio_to_full"].size(), 3u);
    ASSERT_EQ(row["paired_full_tok_per_s"].size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      const double rate = row["tok_per_s"][k].get<double>();
      const double full = row["paired_full_tok_per_s"][k].get<double>();
      EXPECT_GT(rate, 0);
      EXPECT_GE(full_runs.count(full), 1u) << "the paired full rate is one of full's runs";
      EXPECT_DOUBLE_EQ(row["ratio_to_full"][k].get<double>(), rate / full);
    }
    EXPECT_GT(row["resident_bytes"].get<int64_t>(), 0);
  }
  EXPECT_DOUBLE_EQ(j["results"][0]["ratio_median"].get<double>(), 1.0);
  // From a file: its tokens, at most --tokens of them.
  const std::string prompt = Path("prompt.txt");
  {
    std::ofstream p(prompt);
    for (int i = 0; i < 40; ++i) p << "the quick brown fox jumps over the lazy dog ";
  }
  Result fr = Strata({"bench", "prefill", "-m", Path("tiny.gguf"), "-f", prompt, "--tokens",
                      "50", "--rounds", "1", "--json", json});
  ASSERT_EQ(fr.code, 0) << fr.err;
  std::ifstream f2(json);
  const nlohmann::json j2 = nlohmann::json::parse(f2);
  EXPECT_EQ(j2["prompt_tokens"], 50);
  EXPECT_EQ(j2["results"].size(), 1u);
  EXPECT_NE(fr.out.find("one round gives no measure"), std::string::npos) << fr.out;
}

// --batch (issue 16): aggregate tok/s of B sequences per DecodeBatch step and the ratio to B = 1
// (added when not asked for), per ctx and thread count; bad batch sizes are usage errors.
TEST_F(CliTest, BenchDecodeBatchReportsAggregateAndRatio) {
  const std::string json = Path("bench_batch.json");
  Result r = Strata({"bench", "decode", "-m", Path("tiny.gguf"), "--ctx", "0,32", "--threads",
                     "2", "--tokens", "2", "--bw-mib", "8", "--batch", "3,5", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("aggregate tok/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x B=1"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("adding B = 1"), std::string::npos) << r.err;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["results"].size(), 6u);  // 2 ctx x batches 1, 3, 5
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["tok_per_s"].get<double>(), 0);
    EXPECT_NEAR(row["tok_per_s"].get<double>(),
                row["steps_per_s"].get<double>() * row["batch"].get<int>(), 1e-6);
  }
  EXPECT_EQ(j["results"][0]["batch"], 1);
  EXPECT_DOUBLE_EQ(j["results"][0]["ratio_to_batch_1"].get<double>(), 1.0);
  // Every sequence's full cache is read: at ctx 32, 5 sequences read more than 5x one.
  EXPECT_GT(j["results"][5]["kv_bytes_read_per_step"].get<double>(),
            4.9 * j["results"][3]["kv_bytes_read_per_step"].get<double>());
  for (const char* bad : {"0", "1,-4", "x"}) {
    Result e = Strata({"bench", "decode", "-m", Path("tiny.gguf"), "--ctx", "0", "--batch", bad});
    EXPECT_EQ(e.code, 2) << bad;
    EXPECT_NE(e.err.find("--batch"), std::string::npos) << e.err;
  }
}

TEST_F(CliTest, DefaultModelIsGeneratedOnceAndReused) {
  const std::string cache = Path("cache");
  std::ostringstream e1, e2;
  auto p1 = ResolveDefaultModel(Path("no_models_here"), cache, e1);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  EXPECT_TRUE(fs::exists(*p1));
  EXPECT_NE(e1.str().find("generating"), std::string::npos);
  auto p2 = ResolveDefaultModel(Path("no_models_here"), cache, e2);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(*p1, *p2);
  EXPECT_EQ(e2.str().find("generating"), std::string::npos);
  EXPECT_NE(e2.str().find(*p1), std::string::npos);

  // A models/ folder with a GGUF wins; of several, the first by name...
  fs::create_directories(Path("models"));
  fs::copy_file(Path("tiny.gguf"), Path("models/trained.gguf"));
  fs::copy_file(Path("tiny.gguf"), Path("models/zz-other.gguf"));
  std::ostringstream e3;
  auto p3 = ResolveDefaultModel(Path("models"), cache, e3);
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(*p3, Path("models/trained.gguf"));
  // ...unless the NoPE-MLA testbed is there (sorted after "trained.gguf", still preferred).
  fs::copy_file(Path("tiny.gguf"), Path("models/nope-mla.gguf"));
  std::ostringstream e4;
  auto p4 = ResolveDefaultModel(Path("models"), cache, e4);
  ASSERT_TRUE(p4.ok());
  EXPECT_EQ(*p4, Path("models/nope-mla.gguf"));
  EXPECT_NE(e4.str().find("nope-mla.gguf"), std::string::npos) << e4.str();

  // And generate without -m uses it.
  GenerateOptions o;
  o.n_predict = 3;
  o.threads = 1;
  o.models_dir = Path("no_models_here");
  o.cache_dir = cache;
  std::ostringstream out, err;
  EXPECT_EQ(RunGenerate(o, out, err), 0) << err.str();
  EXPECT_NE(err.str().find("built-in"), std::string::npos) << err.str();
}

// A random-weight NoPE-MLA model with the char-level testbed's vocabulary layout and tokenizer
// (tools/testbed/README.md): 0 <s>, 1 <KEY>, 2..49 <v0>..<v47>, 50..121 the 72 characters (space
// is "\u2581"), then unused tokens up to synth's vocabulary of 512. Latent rows of d_c 128 + d_r 16
// (288 B per layer), so VestigeKV's recall scan (2 x rank 64 + 4 + 2 x 16 = 164 B per archived
// row) costs less than reading the row. The demo's answers are noise; its accounting is not.
std::string MakeTestbedLikeModel(const std::string& dir, const std::string& gguf) {
  Result s = Strata({"synth", "--arch", "deepseek2", "--nope", "--format", "safetensors",
                     "--dims", "kv_lora=128,rope_dim=16", "-o", dir});
  if (s.code != 0) return "synth: " + s.err;
  const std::string chars =
      " !'(),-.0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWYZabcdefghijklmnopqrstuvwxyz";
  nlohmann::json tokens = nlohmann::json::array(), types = nlohmann::json::array();
  tokens.push_back("<s>");
  types.push_back(3);
  tokens.push_back("<KEY>");
  types.push_back(4);
  for (int v = 0; v < 48; ++v) {
    tokens.push_back("<v" + std::to_string(v) + ">");
    types.push_back(4);
  }
  for (char c : chars) {
    tokens.push_back(c == ' ' ? std::string("\u2581") : std::string(1, c));
    types.push_back(1);
  }
  for (int u = 0; tokens.size() < 512; ++u) {
    tokens.push_back("<unused_" + std::to_string(u) + ">");
    types.push_back(5);
  }
  const nlohmann::json tj = {{"model", "llama"},        {"tokens", tokens},
                             {"token_types", types},    {"bos_token_id", 0},
                             {"eos_token_id", -1},      {"add_bos_token", false},
                             {"add_space_prefix", false}};
  std::ofstream(dir + "/strata_tokenizer.json") << tj.dump();
  Result c = Strata({"convert", dir, "-o", gguf});
  if (c.code != 0) return "convert: " + c.err;
  return "";
}

TEST_F(CliTest, DemoAnswersTheNeedleWithEveryPolicyAndAccountsBytes) {
  const std::string gguf = Path("testbed-like.gguf");
  ASSERT_EQ(MakeTestbedLikeModel(Path("hf_testbed"), gguf), "");
  const std::string json = Path("demo.json");
  Result r = Strata({"demo", "-m", gguf, "--json", json, "--gen", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"policy", "answer", "correct?", "resident KiB", "read KiB/step",
                        "decode tok/s", "full", "vestige:recall=off@32", "vestige@32",
                        "streaming@32", "h2o@32", "snapkv@32",
                        "expected answer: <v", "2048 tokens"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  // The first lines say in plain words what each policy saved and whether it answered, and
  // the warnings, with the setting that would fix a RAM archive, come before the table.
  const size_t table = r.out.find("policy    ");
  ASSERT_NE(table, std::string::npos) << r.out;
  const size_t in_short = r.out.find("in short:\n  full: the uncompressed reference, answered");
  EXPECT_LT(in_short, table) << r.out;
  EXPECT_LT(r.out.find("  vestige@32: answered "), table) << r.out;
  const size_t warn = r.out.find("warning: vestige@32: holds ");
  EXPECT_LT(warn, table) << r.out;
  EXPECT_NE(r.out.find("archive=file keeps the archived rows on disk", warn), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("demo: vestige@32: prefill 2048 tokens"), std::string::npos) << r.err;

  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["len"], 2048);
  ASSERT_EQ(j["expected"].size(), 2u);
  const int depth = j["depth"].get<int>();
  EXPECT_GE(depth, 0.1 * 2048);
  EXPECT_LT(depth, 0.8 * 2048);
  const auto& res = j["results"];
  ASSERT_EQ(res.size(), 7u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& row : res) {
    by[row["label"].get<std::string>()] = row;
    EXPECT_EQ(row["answer"].size(), 2u) << row;
    EXPECT_EQ(row["decode_steps"], 3) << row;  // <KEY>, then both answer tokens (--gen 0)
    EXPECT_GT(row["decode_seconds"].get<double>(), 0) << row;
    EXPECT_GT(row["read_bytes_per_step"].get<double>(), 0) << row;
    EXPECT_FALSE(row["read_bytes_derived"].get<bool>()) << row;
    EXPECT_EQ(row["correct"].get<bool>(), row["answer"] == j["expected"]) << row;
  }
  ASSERT_EQ(by.size(), 7u);
  // The file archive: the same answer and reads as the RAM archive, every closed page out of RAM
  // (what stays: the tail's pages, the kept rows, the index with its branch copy, the metadata),
  // the rows in the file; the parts add up to the resident bytes.
  const nlohmann::json& ram = by["vestige@32"];
  const nlohmann::json& file = by["vestige:archive=file@32"];
  EXPECT_EQ(file["answer"], ram["answer"]);
  EXPECT_EQ(file["read_bytes_per_step"], ram["read_bytes_per_step"]);
  EXPECT_LT(file["resident_bytes"].get<double>(), ram["resident_bytes"].get<double>());
  int64_t parts = 0;
  for (const auto& [name, bytes] : file["achieved"]["resident_parts"].items()) {
    parts += bytes.get<int64_t>();
  }
  EXPECT_EQ(parts, file["resident_bytes"].get<int64_t>());
  EXPECT_LT(file["achieved"]["resident_parts"]["tail and pages"].get<int64_t>(),
            ram["achieved"]["resident_parts"]["tail and pages"].get<int64_t>() / 10);
  EXPECT_GE(file["achieved"]["archive_file_bytes"].get<int64_t>(), 2 * 2048 * 144);
  EXPECT_NE(r.out.find("resident by part"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in archive files (disk, not resident)"), std::string::npos) << r.out;
  // The full cache: 2 layers x (d_c 128 + d_r 16) bf16 = 576 B per token; 2048 + 3 tokens
  // resident (the pages hold up to 2112 rows), and the 2049..2051 visible rows read per step.
  const double full_res = by["full"]["resident_bytes"].get<double>();
  const double full_read = by["full"]["read_bytes_per_step"].get<double>();
  EXPECT_GE(full_res, 2051.0 * 576);
  EXPECT_LE(full_res, 2112.0 * 576);
  EXPECT_EQ(full_read, 2050.0 * 576);  // the mean of 2049, 2050 and 2051 rows
  for (const char* p : {"vestige:recall=off@32", "vestige@32", "streaming@32", "h2o@32"}) {  // RAM
    EXPECT_LT(by[p]["read_bytes_per_step"].get<double>(), full_read) << p;
    // Nothing here frees rows: vestige's RAM archive and the baselines' evicted rows stay
    // resident and are counted (docs/vestige.md, docs/baselines.md), plus indexes and tables.
    EXPECT_GE(by[p]["resident_bytes"].get<double>(), full_res) << p;
  }
  // The eviction baselines read ~1/32 of the prefix rows (+ sinks and the new tokens).
  EXPECT_LT(by["streaming@32"]["read_bytes_per_step"].get<double>(), full_read / 16);
  EXPECT_LT(by["h2o@32"]["read_bytes_per_step"].get<double>(), full_read / 16);
  EXPECT_LT(by["vestige:recall=off@32"]["read_bytes_per_step"].get<double>(), full_read / 16);
  // The achieved compression beside the full cache's, and warnings exactly where it falls short.
  for (const char* c : {"x full", "rows kept"}) {
    EXPECT_NE(r.out.find(c), std::string::npos) << c << "\n" << r.out;
  }
  EXPECT_EQ(by["full"]["compressed"], false);
  EXPECT_TRUE(by["full"]["warnings"].empty()) << by["full"];
  EXPECT_EQ(by["full"]["achieved"]["resident_vs_full"], 1.0);
  EXPECT_EQ(by["full"]["achieved"]["read_vs_full"], 1.0);
  nlohmann::json all = nlohmann::json::array();
  for (const auto& row : res) {
    EXPECT_EQ(row["achieved"]["resident_bytes"], row["resident_bytes"]) << row;
    for (const auto& w : row["warnings"]) {
      all.push_back(w);
      EXPECT_NE(r.out.find("warning: " + w.get<std::string>()), std::string::npos) << w;
      EXPECT_NE(r.err.find("warning: " + w.get<std::string>()), std::string::npos) << w;
    }
  }
  EXPECT_EQ(j["warnings"], all);
  for (const char* p : {"vestige:recall=off@32", "streaming@32", "h2o@32"}) {
    EXPECT_EQ(by[p]["compressed"], true) << p;
    EXPECT_LT(by[p]["achieved"]["kept_fraction"].get<double>(), 0.1) << p;
  }

  // Deterministic: the same seed gives the same trial and answers; another seed another trial.
  Result again = Strata({"demo", "-m", gguf, "--policy", "full", "--json", Path("demo2.json")});
  ASSERT_EQ(again.code, 0) << again.err;
  std::ifstream f2(Path("demo2.json"));
  const nlohmann::json j2 = nlohmann::json::parse(f2);
  EXPECT_EQ(j2["depth"], j["depth"]);
  EXPECT_EQ(j2["expected"], j["expected"]);
  ASSERT_EQ(j2["results"].size(), 1u);
  EXPECT_EQ(j2["results"][0]["answer"], by["full"]["answer"]);
  // --gen adds greedy decode steps after the answer.
  Result gen = Strata({"demo", "-m", gguf, "--policy", "full", "--gen", "5", "--json",
                       Path("demo4.json")});
  ASSERT_EQ(gen.code, 0) << gen.err;
  std::ifstream f4(Path("demo4.json"));
  EXPECT_EQ(nlohmann::json::parse(f4)["results"][0]["decode_steps"], 8);
  EXPECT_EQ(Strata({"demo", "-m", gguf, "--gen", "-1"}).code, 2);
  Result other = Strata({"demo", "-m", gguf, "--policy", "full", "--seed", "2", "--len", "512",
                         "--json", Path("demo3.json")});
  ASSERT_EQ(other.code, 0) << other.err;
  std::ifstream f3(Path("demo3.json"));
  const nlohmann::json j3 = nlohmann::json::parse(f3);
  EXPECT_EQ(j3["len"], 512);
  EXPECT_NE(j3["depth"], j["depth"]);

  // Without -m the demo loads <models>/nope-mla.gguf.
  fs::create_directories(Path("demo_models"));
  fs::copy_file(gguf, Path("demo_models/nope-mla.gguf"));
  DemoOptions o;
  o.models_dir = Path("demo_models");
  o.policy = "full";
  o.len = 256;
  std::ostringstream out, err;
  ASSERT_EQ(RunDemo(o, out, err), 0) << err.str();
  EXPECT_NE(out.str().find(Path("demo_models/nope-mla.gguf")), std::string::npos) << out.str();
}

// A label that promises compression the run did not achieve is flagged: with the default block
// (4096) a 300-token prefix closes no VestigeKV block, so "vestige:recall=off@32" reads every
// row; the table, stderr and the JSON all say so. With a block that closes, no such warning.
TEST_F(CliTest, EvalNeedleWarnsWhenNothingWasCompressed) {
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/nope-mla.gguf";
  ASSERT_TRUE(fs::exists(model)) << model;
  const std::string json = Path("needle_nothing.json");
  Result r = Strata({"eval", "needle", "-m", model, "--needle-format", "kv-tokens", "--policy",
                     "vestige:recall=off", "--ratio", "32", "--len", "300", "--trials", "2",
                     "--threads", "1", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string want =
      "warning: vestige:recall=off@32 T=300: compressed nothing on this run (no block closed: ";
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("compressed"), std::string::npos) << r.out;  // the table's column
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["warnings"].size(), 1u) << j["warnings"];
  EXPECT_EQ(("warning: " + j["warnings"][0].get<std::string>()).rfind(want, 0), 0u)
      << j["warnings"][0];
  const nlohmann::json& cell = j["needle"]["cells"][0];
  EXPECT_EQ(cell["compressed"], false);
  EXPECT_EQ(cell["warnings"], j["warnings"]);
  EXPECT_EQ(cell["achieved"]["blocks_closed"], 0);
  EXPECT_EQ(cell["achieved"]["bytes_read"], cell["achieved"]["full_bytes_read"]);
  EXPECT_EQ(cell["achieved"]["kept_fraction"], 1.0);
  EXPECT_EQ(cell["read_bits_per_value"], 16.0);

  const std::string json2 = Path("needle_closed.json");
  Result c = Strata({"eval", "needle", "-m", model, "--needle-format", "kv-tokens", "--policy",
                     "vestige:recall=off", "--ratio", "32", "--len", "300", "--trials", "2",
                     "--block", "256", "--kappa", "4", "--threads", "1", "--json", json2});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out.find("compressed nothing"), std::string::npos) << c.out;
  std::ifstream f2(json2);
  const nlohmann::json j2 = nlohmann::json::parse(f2);
  const nlohmann::json& cell2 = j2["needle"]["cells"][0];
  EXPECT_EQ(cell2["compressed"], true);
  EXPECT_EQ(cell2["achieved"]["blocks_closed"], 4);  // 256-row blocks: 2 layers x 2 trials
  EXPECT_LT(cell2["achieved"]["bytes_read"], cell2["achieved"]["full_bytes_read"]);
}

TEST_F(CliTest, GenerateSaysWhatThePolicyAchieved) {
  const std::string model = std::string(STRATA_SOURCE_DIR) + "/models/nope-mla.gguf";
  ASSERT_TRUE(fs::exists(model)) << model;
  const std::string json = Path("generate_achieved.json");
  Result r = Strata({"generate", "-m", model, "--policy", "vestige", "--policy-set", "recall=off",
                     "-p", "In the beginning", "-n", "4", "--threads", "1", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: vestige: compressed nothing on this run (no block closed: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("KV read vs full, decode steps"), std::string::npos) << r.err;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["compressed"], false);
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["achieved"]["reads"], 3 * 2);  // 3 decode steps x 2 layers
  EXPECT_EQ(j["achieved"]["bytes_read"], j["achieved"]["full_bytes_read"]);

  Result full = Strata({"generate", "-m", model, "-p", "In the beginning", "-n", "4",
                        "--threads", "1", "--json", json});
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_EQ(full.err.find("warning:"), std::string::npos) << full.err;
  std::ifstream f2(json);
  const nlohmann::json j2 = nlohmann::json::parse(f2);
  EXPECT_TRUE(j2["warnings"].empty());
  EXPECT_TRUE(j2["achieved"]["reference"].get<bool>());
}

// bench attention says when the VestigeKV plan closes no block (ctx < block 4096: the "vestige"
// figures are then full's) and does not say so when it does.
TEST_F(CliTest, BenchAttentionWarnsWhenNoBlockCloses) {
  const std::string json = Path("bench_attention.json");
  Result r = Strata({"bench", "attention", "--rows", "random", "--ctx", "2048,4160", "--policy",
                     "full,vestige",
                     "--steps", "1", "--threads", "1", "--attn-math", "f32", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  // 2048 rows + the 2 untimed and 1 timed decode steps: no 4096-row block closes.
  const std::string want =
      "vestige ctx 2048: compressed nothing on this run (no block closed: 2051 rows < block 4096)";
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("no block closed: 416"), std::string::npos) << r.out;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_GE(j["warnings"].size(), 1u) << j["warnings"];
  EXPECT_NE(j["warnings"][0].get<std::string>().find(want), std::string::npos);
  for (const auto& row : j["results"]) {
    if (row["policy"] != "vestige") continue;
    EXPECT_EQ(row["compressed"], false) << row;  // at 4160: the recall index costs more
    EXPECT_EQ(row["achieved"]["policy_compressed"], row["ctx"] == 4160) << row;
    EXPECT_EQ(row.contains("ms_per_block_close"), row["ctx"] == 4160) << row;
  }
}

TEST_F(CliTest, DemoErrorsNameTheProblem) {
  // No -m and no models/nope-mla.gguf: the error names the path and how to make the model.
  DemoOptions o;
  o.models_dir = Path("no_models_here");
  std::ostringstream out, err;
  EXPECT_EQ(RunDemo(o, out, err), 2);
  EXPECT_NE(err.str().find(Path("no_models_here") + "/nope-mla.gguf"), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("strata convert models/hf/nope-mla -o models/nope-mla.gguf --dtype f32"),
            std::string::npos)
      << err.str();

  const std::string m = Path("tiny.gguf");
  const std::vector<UsageCase> cases = {
      {{"demo", "-m", m, "--ratio", "0"}, "--ratio 0 must be a finite number >= 1"},
      {{"demo", "-m", m, "--ratio", "abc"}, "--ratio 'abc' is not a number"},
      {{"demo", "-m", m, "--ratio", ""}, "--ratio '' is not a number"},
      {{"demo", "-m", m, "--ratio", "0.5"}, "--ratio 0.5 must be"},
      {{"demo", "-m", m, "--len", "4"}, "--len must be >= 8, got 4"},
      {{"demo", "-m", m, "--threads", "0"}, "--threads must be >= 1, got 0"},
      {{"demo", "-m", m, "--policy", "full,nosuch"}, "unknown policy 'nosuch'"},
      {{"demo", "-m", m, "--policy", ","}, "names no policy"},
      {{"demo", "-m", Path("missing.gguf")}, "missing.gguf"},
      // A model whose tokenizer is not the testbed's (synth's byte-fallback vocabulary).
      {{"demo", "-m", m}, "char-level testbed vocabulary"},
      {{"demo", "--no-such-flag"}, "--no-such-flag"},
  };
  ExpectUsageErrors(cases);
}

// logits --dump-kv: the file is layers x tokens x row bytes of raw little-endian bf16, and every
// row equals what the full cache stores after the same prefill (GQA: K heads then V heads; MLA:
// the latent row [c_hat ; r]); 70 tokens cross a 64-row page. A compressing policy is refused.
TEST_F(CliTest, LogitsDumpKvWritesTheCacheRows) {
  const std::string ds = Path("dump_ds.gguf");
  ASSERT_EQ(Strata({"synth", "--arch", "deepseek2", "--seed", "3", "-o", ds}).code, 0);
  const std::string ids_path = Path("dump_ids.txt");
  std::vector<int32_t> ids;
  {
    std::ofstream t(ids_path);
    for (int i = 0; i < 70; ++i) {
      ids.push_back((i * 37 + 11) % 200);
      t << ids.back() << "\n";
    }
  }
  for (const std::string& model : {Path("tiny.gguf"), ds}) {
    const std::string dump = Path("kv.bin");
    Result r = Strata({"logits", "-m", model, "--tokens", ids_path, "--out", Path("dl.f32"),
                       "--dump-kv", dump});
    ASSERT_EQ(r.code, 0) << model << "\n" << r.err;
    EXPECT_NE(r.out.find("wrote the KV cache"), std::string::npos) << r.out;
    // The same run in-process, through the full policy.
    auto m = Model::Load(model);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto policy = MakeCliPolicy("full", "");
    ASSERT_TRUE(policy.ok());
    auto cache = (*m)->NewCache(std::move(policy).value());
    ASSERT_TRUE(cache.ok());
    ASSERT_TRUE((*m)->Prefill(ids.data(), static_cast<int64_t>(ids.size()), 512, cache->get(),
                              nullptr, nullptr)
                    .ok());
    const KvCache& kv = **cache;
    ASSERT_EQ(kv.n_tokens(), 70);
    int64_t expect_bytes = 0;
    for (int l = 0; l < kv.n_layers(); ++l) {
      const LayerGeometry& g = kv.geometry(l);
      EXPECT_EQ(g.kind == AttnKind::kMla, model == ds);
      expect_bytes += 70 * g.bytes_per_token();  // = 2 x the row width of the dump
    }
    ASSERT_EQ(static_cast<int64_t>(fs::file_size(dump)), expect_bytes) << model;
    std::ifstream f(dump, std::ios::binary);
    std::vector<unsigned char> raw(expect_bytes);
    f.read(reinterpret_cast<char*>(raw.data()), expect_bytes);
    ASSERT_TRUE(f.good());
    int64_t at = 0;  // next u16 of the file
    auto next = [&]() {
      const uint16_t v = static_cast<uint16_t>(raw[2 * at] | (raw[2 * at + 1] << 8));
      ++at;
      return v;
    };
    int64_t nonzero = 0;
    for (int l = 0; l < kv.n_layers(); ++l) {
      const LayerStore& s = kv.store(l);
      const LayerGeometry& g = s.geometry();
      for (int64_t u = 0; u < 70; ++u) {
        for (int h = 0; h < g.n_kv_heads; ++h) {
          const uint16_t* k = s.key_row(h, u);
          for (int i = 0; i < g.k_dim; ++i) {
            const uint16_t got = next();
            ASSERT_EQ(got, k[i]) << model << " layer " << l << " row " << u << " K head " << h
                                 << " dim " << i;
            nonzero += got != 0;
          }
        }
        if (g.kind == AttnKind::kMla) continue;
        for (int h = 0; h < g.n_kv_heads; ++h) {
          const uint16_t* v = s.val_row(h, u);
          for (int i = 0; i < g.v_dim; ++i) {
            ASSERT_EQ(next(), v[i]) << model << " layer " << l << " row " << u << " V head "
                                    << h << " dim " << i;
          }
        }
      }
    }
    EXPECT_EQ(at * 2, expect_bytes);
    EXPECT_GT(nonzero, expect_bytes / 8);  // real rows, not a zeroed buffer
  }
  Result h = Strata({"logits", "--help"});
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--dump-kv"), std::string::npos);
  EXPECT_NE(h.out.find("[c_hat ; r]"), std::string::npos) << h.out;
  Result bad = Strata({"logits", "-m", ds, "--tokens", ids_path, "--out", Path("dl.f32"),
                       "--dump-kv", Path("kv2.bin"), "--policy", "vestige"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--dump-kv needs --policy full"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(Path("kv2.bin")));
}

#ifdef STRATA_BIN
int System(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// convert: an HF directory with a strata_tokenizer.json becomes a GGUF that loads with its
// tokenizer; logits: every position's logits as raw f32, equal to what generate's prefill sees.
TEST_F(CliTest, ConvertAndLogits) {
  const std::string hf = Path("hf_ds");
  Result s = Strata({"synth", "--arch", "deepseek2", "--nope", "--format", "safetensors",
                     "--dtype", "f32", "-o", hf});
  ASSERT_EQ(s.code, 0) << s.err;
  {
    std::ofstream t(hf + "/strata_tokenizer.json");
    t << R"({"model": "llama", "tokens": [)";
    for (int i = 0; i < 512; ++i) t << (i ? "," : "") << "\"t" << i << "\"";
    t << R"(], "bos_token_id": 0, "eos_token_id": -1, "add_bos_token": false,
             "add_space_prefix": false})";
  }
  const std::string gguf = Path("conv.gguf");
  Result c = Strata({"convert", hf, "-o", gguf, "--dtype", "f32"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("tokenizer: strata_tokenizer.json"), std::string::npos) << c.out;
  Result i = Strata({"inspect", gguf});
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("deepseek2"), std::string::npos);
  {
    std::ofstream t(Path("ids.txt"));
    t << "0 5 17\n300 2 9 511\n";
  }
  Result l = Strata({"logits", "-m", gguf, "--tokens", Path("ids.txt"), "--out", Path("l.f32"),
                     "--chunk", "3"});
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_EQ(fs::file_size(Path("l.f32")), 7u * 512u * 4u);
  // The same logits with another chunk size, bit for bit up to f32 summation order.
  Result l2 = Strata({"logits", "-m", hf, "--tokens", Path("ids.txt"), "--out", Path("l2.f32")});
  ASSERT_EQ(l2.code, 0) << l2.err;
  std::ifstream a(Path("l.f32"), std::ios::binary), b(Path("l2.f32"), std::ios::binary);
  std::vector<float> va(7 * 512), vb(7 * 512);
  a.read(reinterpret_cast<char*>(va.data()), va.size() * 4);
  b.read(reinterpret_cast<char*>(vb.data()), vb.size() * 4);
  for (size_t k = 0; k < va.size(); ++k) ASSERT_NEAR(va[k], vb[k], 2e-4) << k;
  // Bad inputs: a non-numeric id, an id outside the vocabulary, a missing directory.
  {
    std::ofstream t(Path("bad.txt"));
    t << "0 five\n";
  }
  Result b1 = Strata({"logits", "-m", gguf, "--tokens", Path("bad.txt"), "--out", Path("x.f32")});
  EXPECT_EQ(b1.code, 2);
  EXPECT_NE(b1.err.find("'five' is not a token id"), std::string::npos) << b1.err;
  {
    std::ofstream t(Path("big.txt"));
    t << "0 512\n";
  }
  Result b2 = Strata({"logits", "-m", gguf, "--tokens", Path("big.txt"), "--out", Path("x.f32")});
  EXPECT_EQ(b2.code, 2);
  EXPECT_NE(b2.err.find("outside the vocabulary"), std::string::npos) << b2.err;
  Result b3 = Strata({"convert", Path("nope_dir"), "-o", Path("x.gguf")});
  EXPECT_EQ(b3.code, 2);
  EXPECT_NE(b3.err.find("nope_dir"), std::string::npos) << b3.err;
}

// convert without a strata_tokenizer.json writes tokenizer.ggml.model = "none": llama.cpp refuses
// a file without the key (issue 17 part 5) and reads "none" as no vocabulary; Strata loads it as
// a model without a tokenizer (generate from text is refused, logits from ids work).
TEST_F(CliTest, ConvertWithoutTokenizerWritesVocabNone) {
  const std::string hf = Path("hf_notok");
  Result s = Strata({"synth", "--format", "safetensors", "--dtype", "f32", "-o", hf});
  ASSERT_EQ(s.code, 0) << s.err;
  const std::string gguf = Path("notok.gguf");
  Result c = Strata({"convert", hf, "-o", gguf});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("tokenizer: none"), std::string::npos) << c.out;
  auto f = GgufFile::Open(gguf);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->GetString("tokenizer.ggml.model").value(), "none");
  auto m = Model::Load(gguf);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->tokenizer(), nullptr);
  Result g = Strata({"generate", "-m", gguf, "-p", "hi", "-n", "1"});
  EXPECT_EQ(g.code, 2);
  EXPECT_NE(g.err.find("has no tokenizer"), std::string::npos) << g.err;
  {
    std::ofstream t(Path("notok_ids.txt"));
    t << "1 5 17\n";
  }
  Result l = Strata({"logits", "-m", gguf, "--tokens", Path("notok_ids.txt"), "--out",
                     Path("notok.f32")});
  EXPECT_EQ(l.code, 0) << l.err;
}

TEST_F(CliTest, BinaryExitCodes) {
  const std::string bin = STRATA_BIN;
  EXPECT_EQ(System(bin + " --help > /dev/null"), 0);
  EXPECT_EQ(System(bin + " nonsense 2> /dev/null"), 2);
  EXPECT_EQ(System(bin + " generate -m " + Path("tiny.gguf") + " -n -1 2> /dev/null"), 2);
  EXPECT_EQ(System(bin + " inspect " + Path("tiny.gguf") + " > /dev/null"), 0);
}
#endif

// convert with an HF tokenizer.json (no strata_tokenizer.json): a byte-level BPE written as
// llama.cpp's converter writes it; the model's tokenizer then tokenizes as the tokenizer.json.
// A Unigram tokenizer.json is refused with the reason.
TEST_F(CliTest, ConvertWithHfTokenizerJson) {
  const std::string hf = Path("hf_hftok");
  Result s = Strata({"synth", "--format", "safetensors", "--dtype", "f32", "-o", hf});
  ASSERT_EQ(s.code, 0) << s.err;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2ByteChar(static_cast<uint8_t>(b))] = b;
  vocab["he"] = 256;
  vocab["hel"] = 257;
  vocab["\xC4\xA0w"] = 258;  // " w"
  auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id},         {"content", content}, {"special", true},
                          {"normalized", false}, {"lstrip", false},  {"rstrip", false},
                          {"single_word", false}};
  };
  const nlohmann::json tok = {
      {"added_tokens", {added(259, "<|begin_of_text|>"), added(260, "<|eot_id|>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                       "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}}}},
                    {{"Sequence", {{"id", "A"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"h e", "he l", "\xC4\xA0 w"}}}}};
  std::ofstream(hf + "/tokenizer.json") << tok.dump();
  std::ofstream(hf + "/tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
             "chat_template": "{{ bos_token }}{{ messages }}"})";
  const std::string gguf = Path("hftok.gguf");
  Result c = Strata({"convert", hf, "-o", gguf});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("tokenizer: tokenizer.json (gpt2, pre=llama-bpe)"), std::string::npos)
      << c.out;
  auto f = GgufFile::Open(gguf);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->GetString("tokenizer.ggml.pre").value(), "llama-bpe");
  EXPECT_EQ((*f)->GetInt("tokenizer.ggml.bos_token_id").value(), 259);
  EXPECT_EQ((*f)->GetInt("tokenizer.ggml.eos_token_id").value(), 260);
  EXPECT_TRUE((*f)->GetBool("tokenizer.ggml.add_bos_token").value());
  EXPECT_EQ((*f)->GetString("tokenizer.chat_template").value(), "{{ bos_token }}{{ messages }}");
  auto m = Model::Load(gguf);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_NE((*m)->tokenizer(), nullptr);
  auto ref = Tokenizer::FromHfJson(hf + "/tokenizer.json");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const std::string text : {"hello world", "<|begin_of_text|>hel<|eot_id|>", "tab\there 12345",
                                 "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80"}) {
    EXPECT_EQ((*m)->tokenizer()->Encode(text, true, true), (*ref)->Encode(text, true, true))
        << text;
  }
  EXPECT_EQ((*m)->tokenizer()->Encode("hello world", false, false),
            (std::vector<int32_t>{257, 108, 111, 258, 111, 114, 108, 100}));

  // A Unigram tokenizer.json: a clear error naming the model type.
  const std::string hf2 = Path("hf_unigram");
  ASSERT_EQ(Strata({"synth", "--format", "safetensors", "--dtype", "f32", "-o", hf2}).code, 0);
  std::ofstream(hf2 + "/tokenizer.json")
      << R"({"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}})";
  Result u = Strata({"convert", hf2, "-o", Path("unigram.gguf")});
  EXPECT_EQ(u.code, 2);
  EXPECT_NE(u.err.find("model type \"Unigram\""), std::string::npos) << u.err;
}

// kimi-linear (issue 15): eval needle / ppl and demo split the resident bytes by layer kind, the
// KDA recurrent state (fixed per sequence, the same under every policy) beside the MLA layer's
// rows; in text (a table) and JSON ("achieved"."resident_by_layer_kind", adding up to
// resident_bytes). A one-kind model prints no such table.
TEST_F(CliTest, EvalAndDemoSplitResidentBytesByLayerKind) {
  const std::string kimi = std::string(STRATA_SOURCE_DIR) + "/models/kimi-linear.gguf";
  const std::string nope = std::string(STRATA_SOURCE_DIR) + "/models/nope-mla.gguf";
  ASSERT_TRUE(fs::exists(kimi)) << kimi;
  // Every "achieved" block: the kinds add up to the resident bytes, the KDA state is `runs`
  // times the model's bytes per sequence, and the MLA part is there.
  auto check = [](const nlohmann::json& a, int64_t kda_per_seq, int64_t runs,
                  const std::string& what) {
    const nlohmann::json& k = a.at("resident_by_layer_kind");
    int64_t sum = 0;
    for (const auto& [name, bytes] : k.items()) sum += bytes.get<int64_t>();
    EXPECT_EQ(sum, a.at("resident_bytes").get<int64_t>()) << what << " " << a;
    ASSERT_TRUE(k.contains("kda")) << what << " " << a;
    ASSERT_TRUE(k.contains("mla")) << what << " " << a;
    EXPECT_EQ(k.at("kda").get<int64_t>(), runs * kda_per_seq) << what;
    EXPECT_GT(k.at("mla").get<int64_t>(), 0) << what;
    EXPECT_EQ(a.at("resident_parts").at("recurrent state").get<int64_t>(), runs * kda_per_seq)
        << what;
  };
  {
    const std::string json = Path("needle-kimi.json");
    Result r = Strata({"eval", "needle", "-m", kimi, "--needle-format", "kv-tokens", "--len", "256",
                       "--trials", "2", "--policy", "full,streaming", "--ratio", "8", "--threads",
                       "1", "--json", json});
    ASSERT_EQ(r.code, 0) << r.err;
    for (const char* s : {"resident by layer kind", "MLA layers KiB", "KDA state KiB"}) {
      EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
    }
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    const int64_t per_seq = j["model"]["recurrent_state_bytes_per_sequence"].get<int64_t>();
    // 2 KDA layers x 4 heads x (32 x 32 state + 3 x 32 x 3 conv tail) f32.
    EXPECT_EQ(per_seq, 2 * 4 * (32 * 32 + 3 * 32 * 3) * 4);
    ASSERT_EQ(j["needle"]["cells"].size(), 2u);
    for (const auto& c : j["needle"]["cells"]) check(c["achieved"], per_seq, 2, "needle");
  }
  {
    const std::string json = Path("ppl-kimi.json");
    Result r = Strata({"eval", "ppl", "-m", kimi, "--len", "128", "--windows", "2", "--policy",
                       "full,streaming", "--ratio", "4", "--threads", "1", "--json", json});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("resident by layer kind (mean per window"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("KDA state KiB"), std::string::npos) << r.out;
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    const int64_t per_seq = j["model"]["recurrent_state_bytes_per_sequence"].get<int64_t>();
    ASSERT_EQ(j["ppl"]["configs"].size(), 2u);
    for (const auto& c : j["ppl"]["configs"]) check(c["achieved"], per_seq, 2, "ppl");
  }
  {
    const std::string json = Path("demo-kimi.json");
    Result r = Strata({"demo", "-m", kimi, "--len", "512", "--policy", "full,streaming", "--gen",
                       "0", "--json", json});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("resident by layer kind (after the answer"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("KDA state KiB"), std::string::npos) << r.out;
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    ASSERT_EQ(j["results"].size(), 2u);
    for (const auto& row : j["results"]) {
      check(row["achieved"], 2 * 4 * (32 * 32 + 3 * 32 * 3) * 4, 1, "demo");
    }
  }
  // One kind (MLA only): no table; the JSON holds the one kind.
  if (fs::exists(nope)) {
    const std::string json = Path("needle-nope.json");
    Result r = Strata({"eval", "needle", "-m", nope, "--needle-format", "kv-tokens", "--len", "256",
                       "--trials", "1", "--policy", "full", "--ratio", "none", "--threads", "1",
                       "--json", json});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("resident by layer kind"), std::string::npos) << r.out;
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    const nlohmann::json& a = j["needle"]["cells"][0]["achieved"];
    EXPECT_EQ(a["resident_by_layer_kind"].size(), 1u) << a;
    EXPECT_EQ(a["resident_by_layer_kind"]["mla"], a["resident_bytes"]) << a;
  }
}

}  // namespace
}  // namespace strata::cli
