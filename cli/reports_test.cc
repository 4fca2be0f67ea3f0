// CLI tests of what the reports say (issue 19, defects 8, 9, 11, 12, 13): table legends, bench
// caveats, inspect's metadata listing, replayable needle trials and the KV storage type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "cli/common.h"
#include "io/gguf.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

class ReportsTest : public TinyModelSuite<ReportsTest> {
 public:
  static constexpr const char* kDirPrefix = "strata_reports_test_";

 protected:
  static std::string Shipped(const std::string& name) {
    return std::string(STRATA_SOURCE_DIR) + "/models/" + name;
  }
};

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
  CliResult g = Strata({"bench", "attention", "--kind", "gqa", "--rows", "random", "--ctx",
                        "256,320", "--q-heads",
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

// A copy of the GGUF file `src` with `extra` metadata added (its tensors copied byte for byte).
void CopyGgufWith(const std::string& src, const std::string& dst,
                  const std::vector<std::pair<std::string, GgufValue>>& extra) {
  auto f = GgufFile::Open(src, GgufFile::Load::kMemory);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  GgufWriter w;
  for (const auto& [k, v] : (*f)->metadata()) {
    if (k != "general.alignment") w.Set(k, v);
  }
  for (const auto& [k, v] : extra) w.Set(k, v);
  for (const auto& t : (*f)->tensors()) {
    const uint8_t* data = (*f)->data() + (*f)->data_offset() + t.offset;
    ASSERT_TRUE(w.AddTensor(t.name, t.dtype, t.shape, data, t.n_bytes).ok());
  }
  ASSERT_TRUE(w.WriteFile(dst).ok());
}

// Defect 11: inspect lists every metadata key with its value (arrays summarised), BOS/EOS with
// their text, the file type and bits per weight, and whether there is a chat template.
TEST_F(ReportsTest, InspectListsMetadataTokensFileTypeAndTemplate) {
  const std::string json = Path("inspect.json");
  CliResult r = Strata({"inspect", Shipped("nope-mla.gguf"), "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("format: GGUF v3 file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ngeneral.architecture "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"deepseek2\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("deepseek2.attention.kv_lora_rank "), std::string::npos) << r.out;
  // An array: its element type and count and the first elements, not 128 tokens.
  EXPECT_NE(r.out.find("[string x 128] \"<s>\", \"<KEY>\","), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"<v100>\""), std::string::npos) << "arrays are summarised";
  EXPECT_NE(r.out.find("bos 0 \"<s>\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("file type: ALL_F32 (general.file_type 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bits per weight: 32.00"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chat template: none"), std::string::npos) << r.out;
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["metadata"].size(), j["metadata_count"].get<size_t>());
  EXPECT_EQ(j["tokenizer"]["bos_text"], "<s>");
  EXPECT_DOUBLE_EQ(j["bits_per_weight"].get<double>(), 32.0);
  EXPECT_EQ(j["chat_template"], false);

  // An F16 model with a chat template (a multi-line string: shown escaped and cut).
  const std::string f16 = Path("f16.gguf");
  ASSERT_EQ(Strata({"synth", "--arch", "llama", "--dtype", "f16", "-o", f16}).code, 0);
  const std::string tmpl = Path("tmpl.gguf");
  std::string text = "{% for m in messages %}\n{{ m['content'] }}";
  while (text.size() < 200) text += " {{ eos_token }}";
  CopyGgufWith(f16, tmpl, {{"tokenizer.chat_template", GgufValue::String(text)}});
  CliResult t = Strata({"inspect", tmpl});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("chat template: yes (tokenizer.chat_template, " +
                       std::to_string(text.size()) + " chars"),
            std::string::npos)
      << t.out;
  EXPECT_NE(t.out.find("\"{% for m in messages %}\\n{{"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("(" + std::to_string(text.size()) + " chars)"), std::string::npos);
  EXPECT_NE(t.out.find("F16"), std::string::npos) << t.out;
  // Norm vectors stay F32: a little over 16 bits per weight.
  const size_t bpw = t.out.find("bits per weight: 16.");
  EXPECT_NE(bpw, std::string::npos) << t.out;
}

// Defect 11: on an HF directory inspect says what it is before describing the converted model.
TEST_F(ReportsTest, InspectSaysWhatAnHfDirectoryIs) {
  const std::string json = Path("inspect_hf.json");
  CliResult r = Strata({"inspect", Shipped("hf/gqa"), "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("format: Hugging Face directory: config.json (LlamaForCausalLM, "
                       "model_type llama, torch_dtype float32), 1 safetensors file"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizer files: strata_tokenizer.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("converted in memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("converted GGUF image v3"), std::string::npos) << r.out;
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["format"], "hf_directory");
  EXPECT_EQ(j["hf_directory"]["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(j["hf_directory"]["safetensors_files"].size(), 1u);
}

// Defect 12: `eval needle --dump-trials FILE` writes the filler and one line per trial.
TEST_F(ReportsTest, EvalNeedleDumpsTrials) {
  const std::string dump = Path("trials.jsonl"), json = Path("needle.json");
  CliResult r = Strata({"eval", "needle", "-m", Shipped("nope-mla.gguf"), "--needle-format",
                        "kv-tokens", "--policy", "full", "--len", "128", "--trials", "3",
                        "--dump-trials", dump, "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(dump);
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_FALSE(lines[0]["filler"].empty());
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i]["prefix"].size(), 128u);
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["needle"]["trial_recipe"]["filler_hash"], lines[0]["filler_hash"]);
  EXPECT_EQ(j["needle"]["trials"][1]["filler_offset"], lines[2]["filler_offset"]);
  CliResult bad = Strata({"eval", "needle", "-m", Shipped("nope-mla.gguf"), "--needle-format",
                          "kv-tokens", "--policy", "full", "--len", "128", "--trials", "1",
                          "--dump-trials", "/nonexistent-dir/t.jsonl"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("/nonexistent-dir/t.jsonl"), std::string::npos) << bad.err;
}

// Defect 13: --kv-type in generate, logits and inspect; the output says which is used; the full
// policy runs every type, the others refuse f32/f16 naming the policy; bf16 is the default and
// gives the same logits as before (bit for bit: the same run without the flag).
TEST_F(ReportsTest, KvTypeIsAFlagAndTheOutputSaysWhichIsUsed) {
  const std::string model = Shipped("gqa.gguf");
  const std::string json = Path("gen.json");
  CliResult g = Strata({"generate", "-m", model, "-p", "abc", "-n", "3", "--kv-type", "f32",
                        "--threads", "1", "--json", json});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.err.find("KV cache: f32 rows"), std::string::npos) << g.err;
  EXPECT_TRUE(std::regex_search(g.err, std::regex("KV cache type +f32"))) << g.err;
  std::ifstream jf(json);
  EXPECT_EQ(nlohmann::json::parse(jf)["kv_type"], "f32");
  CliResult d = Strata({"generate", "-m", model, "-p", "abc", "-n", "3", "--threads", "1"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("KV cache: bf16 rows"), std::string::npos) << d.err;
  CliResult refused = Strata({"generate", "-m", model, "-n", "2", "--kv-type", "f16",
                              "--policy", "kivi2"});
  EXPECT_EQ(refused.code, kExitUsage);
  EXPECT_NE(refused.err.find("policy 'kivi2' reads bf16 KV rows only"), std::string::npos)
      << refused.err;
  CliResult bad = Strata({"generate", "-m", model, "-n", "2", "--kv-type", "int8"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_NE(bad.err.find("--kv-type 'int8' must be f32, f16 or bf16"), std::string::npos)
      << bad.err;

  // logits: the default and --kv-type bf16 are the same bytes; f32 differs (unrounded rows).
  const std::string toks = Path("toks.txt");
  {
    std::ofstream tf(toks);
    for (int i = 0; i < 80; ++i) tf << (i * 37 % 100) + 3 << "\n";
  }
  auto logits = [&](const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> args = {"logits", "-m", model, "--tokens", toks, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = Strata(args);
    EXPECT_EQ(r.code, 0) << r.err;
    std::ifstream f(out, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string def = logits({}, Path("l_def.f32"));
  const std::string bf16 = logits({"--kv-type", "bf16"}, Path("l_bf16.f32"));
  const std::string f32 = logits({"--kv-type", "f32"}, Path("l_f32.f32"));
  ASSERT_EQ(def.size(), 80u * 128 * 4);
  EXPECT_EQ(def, bf16);
  EXPECT_NE(def, f32);
  CliResult dump = Strata({"logits", "-m", model, "--tokens", toks, "--out", Path("x.f32"),
                           "--kv-type", "f32", "--dump-kv", Path("kv.bin")});
  EXPECT_EQ(dump.code, kExitUsage);
  EXPECT_NE(dump.err.find("--dump-kv writes bf16 rows"), std::string::npos) << dump.err;

  // inspect: the KV figures for the chosen type (f32: twice the bytes).
  CliResult i16 = Strata({"inspect", model});
  CliResult i32 = Strata({"inspect", model, "--kv-type", "f32"});
  ASSERT_EQ(i16.code, 0);
  ASSERT_EQ(i32.code, 0);
  EXPECT_NE(i16.out.find("KV cache (full, bf16 rows, the default"), std::string::npos) << i16.out;
  EXPECT_NE(i32.out.find("KV cache (full, f32 rows"), std::string::npos) << i32.out;
  // gqa testbed: 2 layers x 2 KV heads x (32 + 32) values.
  EXPECT_NE(i16.out.find("KV bytes per token (all layers): 512 "), std::string::npos) << i16.out;
  EXPECT_NE(i32.out.find("KV bytes per token (all layers): 1024 "), std::string::npos) << i32.out;
}

// Defect 8: --svg-dir writes the KL chart (it used to write nothing) and the needle run's
// comparison chart besides the per-policy heat maps, and says where.
TEST_F(ReportsTest, SvgDirWritesAChartPerCommand) {
  const std::string dir = Path("svg");
  CliResult kl = Strata({"eval", "kl", "-m", Shipped("nope-mla.gguf"), "--policy", "full,kivi2",
                         "--svg-dir", dir});
  ASSERT_EQ(kl.code, 0) << kl.err;
  EXPECT_TRUE(fs::exists(dir + "/kl.svg"));
  EXPECT_NE(kl.out.find("svg: " + dir + "/kl.svg"), std::string::npos) << kl.out;
  CliResult n = Strata({"eval", "needle", "-m", Shipped("nope-mla.gguf"), "--needle-format",
                        "kv-tokens", "--policy", "full,streaming", "--ratio", "8", "--len", "128",
                        "--trials", "2", "--svg-dir", dir});
  ASSERT_EQ(n.code, 0) << n.err;
  for (const char* f : {"needle_comparison.svg", "needle_full.svg", "needle_streaming.svg"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  }
  std::ifstream in(dir + "/needle_comparison.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(svg.find(">streaming@8<"), std::string::npos);
  EXPECT_NE(svg.find("answered"), std::string::npos);
}

// Defect 13: the eval commands take --kv-type too; with f32 the policies that read bf16 rows only
// are skipped under --policy all (and named), an explicit one is an error naming it.
TEST_F(ReportsTest, EvalTakesKvType) {
  const std::string json = Path("ppl.json");
  CliResult p = Strata({"eval", "ppl", "-m", Shipped("gqa.gguf"), "--policy", "all", "--kv-type",
                        "f32", "--windows", "2", "--json", json});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("KV cache: f32 rows (--kv-type)"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("skipped kivi2"), std::string::npos) << p.out;
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["ppl"]["kv_type"], "f32");
  ASSERT_EQ(j["ppl"]["configs"].size(), 1u);
  EXPECT_EQ(j["ppl"]["configs"][0]["policy"], "full");
  CliResult k = Strata({"eval", "kl", "-m", Shipped("gqa.gguf"), "--policy", "kivi2",
                        "--kv-type", "f16"});
  EXPECT_EQ(k.code, kExitUsage);
  EXPECT_NE(k.err.find("policy 'kivi2' reads bf16 KV rows only"), std::string::npos) << k.err;
  CliResult n = Strata({"eval", "needle", "-m", Shipped("nope-mla.gguf"), "--needle-format",
                        "kv-tokens", "--policy", "full", "--len", "128", "--trials", "2",
                        "--kv-type", "f32"});
  ASSERT_EQ(n.code, 0) << n.err;
  EXPECT_NE(n.out.find("KV cache: f32 rows"), std::string::npos) << n.out;
}

// A wrapped cell's lines are text, left-aligned under their column, even a line that starts
// with a digit (it used to be right-aligned like a number); a one-line number stays right-aligned.
TEST(TableTest, WrappedCellsAreLeftAligned) {
  Table t({"name", "value"});
  t.AddRow({"a", "12"});
  t.AddRow({"b", "words that wrap here 0)"});
  t.WrapColumn(1, 21);
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(),
            "name  value\n"
            "----  --------------------\n"
            "a                       12\n"
            "b     words that wrap here\n"
            "      0)\n");
}

// The same in `strata policies`: every line of a table starts its text where a column starts.
TEST_F(ReportsTest, PoliciesTablesAlignWrappedTextUnderItsColumn) {
  CliResult r = Strata({"policies"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  int continuation_lines = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].rfind("--", 0) != 0) continue;
    std::set<size_t> starts;  // the columns' starts, from the rule under the header
    for (size_t at = 0; at < lines[i].size(); ++at) {
      if (lines[i][at] == '-' && (at == 0 || lines[i][at - 1] == ' ')) starts.insert(at);
    }
    for (size_t k = i + 1; k < lines.size() && !lines[k].empty(); ++k) {
      if (lines[k][0] != ' ') continue;  // a row's first line
      ++continuation_lines;
      const size_t text = lines[k].find_first_not_of(' ');
      EXPECT_TRUE(starts.count(text)) << "line " << k << " starts at column " << text << ":\n"
                                      << lines[k];
    }
  }
  EXPECT_GT(continuation_lines, 0) << r.out;
}

// inspect says what strata does with a model's chat template: chat and serve apply it through
// the built-in renderer it is recognised as (it used to say strata never applies one).
TEST_F(ReportsTest, InspectSaysChatAndServeApplyTheChatTemplate) {
  const std::string chatml = Path("chatml.gguf");
  CopyGgufWith(Path("tiny.gguf"), chatml,
               {{"tokenizer.chat_template",
                 GgufValue::String("{% for message in messages %}{{'<|im_start|>' + "
                                   "message['role'] + '\\n' + message['content'] + "
                                   "'<|im_end|>' + '\\n'}}{% endfor %}")}});
  CliResult r = Strata({"inspect", chatml});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("not applied"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recognised as the built-in chatml template, which strata chat and serve "
                       "apply)"),
            std::string::npos)
      << r.out;
  const std::string odd = Path("odd_template.gguf");
  CopyGgufWith(Path("tiny.gguf"), odd,
               {{"tokenizer.chat_template", GgufValue::String("{{ messages }}")}});
  CliResult o = Strata({"inspect", odd});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("not recognised by a built-in renderer: strata chat and serve need "
                       "--chat-template NAME"),
            std::string::npos)
      << o.out;
}

// kimi-linear caches its MLA layers only (1 and 3 of the synthesized 4-layer model; 0 and 2 are
// KDA): inspect's KV table and JSON name those layers, not the cache's own 0 and 1, and so does
// a policy's error about a layer.
TEST_F(ReportsTest, KimiLinearKvLayersAreTheModelsLayerNumbers) {
  const std::string kimi = Path("kimi.gguf");
  ASSERT_EQ(Strata({"synth", "--arch", "kimi-linear", "-o", kimi}).code, 0);
  const std::string json = Path("inspect_kimi.json");
  CliResult r = Strata({"inspect", kimi, "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layer kinds (K = KDA, M = MLA)  KMKM"), std::string::npos) << r.out;
  const std::vector<std::string> lines = Lines(r.out);
  bool found = false;
  for (const std::string& l : lines) {
    if (l.find("MLA") != std::string::npos && l.find("global") != std::string::npos) {
      EXPECT_EQ(l.substr(0, l.find("MLA")), "   1,3  ") << l;
      found = true;
    }
  }
  EXPECT_TRUE(found) << r.out;
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  ASSERT_EQ(j["kv_layers"].size(), 2u);
  EXPECT_EQ(j["kv_layers"][0]["layer"], 1);
  EXPECT_EQ(j["kv_layers"][1]["layer"], 3);
  // geodesia needs GQA layers: the error names the first MLA layer, 1.
  CliResult g = Strata({"generate", "-m", kimi, "--policy", "geodesia", "-p", "hi", "-n", "1"});
  EXPECT_EQ(g.code, kExitUsage) << g.err;
  EXPECT_NE(g.err.find("layer 1 (MLA"), std::string::npos) << g.err;
  EXPECT_EQ(g.err.find("layer 0"), std::string::npos) << g.err;
}

}  // namespace
}  // namespace strata::cli
