// In-process tests of the strata commands (through RunStrata, so flag parsing is covered), plus
// a smoke test of the built binary's exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

Result Strata(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  Result r;
  r.code = RunStrata(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_cli_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    Result r = Strata({"synth", "--arch", "llama", "--seed", "7", "-o", Path("tiny.gguf")});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  static std::string* dir_;
};
std::string* CliTest::dir_ = nullptr;

TEST_F(CliTest, HelpListsCommandsAndUnknownCommandIsAnError) {
  Result h = Strata({"--help"});
  EXPECT_EQ(h.code, 0);
  for (const char* c : {"inspect", "generate", "synth", "bench"}) {
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
  EXPECT_NE(u.err.find("inspect, generate, synth, convert, logits, bench"), std::string::npos) << u.err;
  Result ub = Strata({"bench", "prefill"});
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
                        "KV bytes resident", "KV bytes read, last step"}) {
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
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
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
  };
  for (const Case& c : cases) {
    Result r = Strata(c.args);
    std::string cmd;
    for (const auto& a : c.args) cmd += a + " ";
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << cmd << "\nstderr: " << r.err;
  }
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

  // A models/ folder with a GGUF wins.
  fs::create_directories(Path("models"));
  fs::copy_file(Path("tiny.gguf"), Path("models/trained.gguf"));
  std::ostringstream e3;
  auto p3 = ResolveDefaultModel(Path("models"), cache, e3);
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(*p3, Path("models/trained.gguf"));

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

TEST_F(CliTest, BinaryExitCodes) {
  const std::string bin = STRATA_BIN;
  EXPECT_EQ(System(bin + " --help > /dev/null"), 0);
  EXPECT_EQ(System(bin + " nonsense 2> /dev/null"), 2);
  EXPECT_EQ(System(bin + " generate -m " + Path("tiny.gguf") + " -n -1 2> /dev/null"), 2);
  EXPECT_EQ(System(bin + " inspect " + Path("tiny.gguf") + " > /dev/null"), 0);
}
#endif

}  // namespace
}  // namespace strata::cli
