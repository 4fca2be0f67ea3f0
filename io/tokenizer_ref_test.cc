// Identity tests against the reference tokenizer (tools/ref/make_refs.py: HF tokenizers and
// transformers from PyPI): for every tokenizer and every corpus string, Strata's ids must be the
// reference's, with and without the special tokens, and Decode(Encode(s)) == s wherever the
// reference itself gives the text back.
//
// The real tokenizer.json files (Llama 3, Qwen3, DeepSeek V3) are the shared test fixtures
// ($STRATA_FIXTURES, default ../shared/fixtures); without them those cases skip (fail under CI).
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/test_refs.h"
#include "io/gguf.h"
#include "io/pretokenizer_types.h"
#include "io/tokenizer.h"
#include "io/tokenizer_json.h"

namespace strata {
namespace {

const std::string kRoot = STRATA_SOURCE_DIR;

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::string DecodeBase64(const std::string& in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+') {
      v = 62;
    } else if (c == '/') {
      v = 63;
    } else {
      continue;  // '=' padding
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

struct RefCase {
  std::string name;
  std::string text;  // the bytes Strata is given (invalid UTF-8 included)
  bool lossy = false;
  std::vector<int32_t> ids, ids_special;
  std::string decoded;
};

std::vector<RefCase> LoadCases(const nlohmann::json& ref) {
  const nlohmann::json corpus = ReadJson(kRoot + "/testdata/tokenizer/corpus.json");
  const auto& strings = corpus["strings"];
  EXPECT_EQ(strings.size(), ref["cases"].size()) << "regenerate: .venv/bin/python tools/ref/make_refs.py";
  std::vector<RefCase> cases;
  for (size_t i = 0; i < strings.size() && i < ref["cases"].size(); ++i) {
    const auto& s = strings[i];
    const auto& r = ref["cases"][i];
    EXPECT_EQ(s["name"], r["name"]);
    RefCase c;
    c.name = s["name"].get<std::string>();
    c.lossy = s.contains("base64");
    c.text = c.lossy ? DecodeBase64(s["base64"].get<std::string>()) : s["text"].get<std::string>();
    c.ids = r["ids"].get<std::vector<int32_t>>();
    c.ids_special = r["ids_special"].get<std::vector<int32_t>>();
    c.decoded = r["decoded"].get<std::string>();
    cases.push_back(std::move(c));
  }
  return cases;
}

std::string Quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// Runs the corpus strings of ref_<name>.json (`lossy`: only the invalid-UTF-8 ones, else only
// the others) through `tok`; reports each mismatch with the string and both id lists, and the
// counts.
void ExpectIdentical(const std::string& name, const Tokenizer& tok,
                     const std::vector<RefCase>& all, bool lossy) {
  std::vector<RefCase> cases;
  for (const RefCase& c : all) {
    if (c.lossy == lossy) cases.push_back(c);
  }
  int ids_ok = 0, special_ok = 0, trips = 0, trips_ok = 0, decodes = 0, decodes_ok = 0;
  for (const RefCase& c : cases) {
    const std::vector<int32_t> ids = tok.Encode(c.text, /*with_bos=*/false, /*parse_special=*/true);
    const std::vector<int32_t> with = tok.Encode(c.text, /*with_bos=*/true, /*parse_special=*/true);
    ids_ok += ids == c.ids;
    special_ok += with == c.ids_special;
    EXPECT_EQ(Ids(ids), Ids(c.ids)) << name << " / " << c.name << ": " << Quoted(c.text);
    EXPECT_EQ(Ids(with), Ids(c.ids_special)) << name << " / " << c.name << " (add_special_tokens)";
    // Lossless where the reference gives the text back; control tokens print nothing in Strata's
    // Decode (they are rendered on request elsewhere), so texts holding them are left out.
    bool has_control = false;
    for (const int32_t id : c.ids) has_control |= tok.token_type(id) == TokenType::kControl;
    if (!c.lossy && !has_control) {
      // The decoder itself: the reference ids decode to the reference text.
      ++decodes;
      const std::string text = tok.Decode(c.ids);
      decodes_ok += text == c.decoded;
      EXPECT_EQ(text, c.decoded) << name << " / " << c.name << ": Decode(reference ids)";
    }
    if (!c.lossy && c.decoded == c.text && !has_control) {
      ++trips;
      const std::string back = tok.Decode(ids);
      trips_ok += back == c.text;
      EXPECT_EQ(back, c.text) << name << " / " << c.name << ": Decode(Encode(s)) != s";
    }
  }
  std::printf("[ref] %s%s: ids %d/%zu, with special tokens %d/%zu, Decode(reference ids) %d/%d, "
              "Decode(Encode(s)) == s %d/%d\n",
              name.c_str(), lossy ? " (invalid UTF-8)" : "", ids_ok, cases.size(), special_ok,
              cases.size(), decodes_ok, decodes, trips_ok, trips);
}

class TokenizerRefTest : public ::testing::TestWithParam<std::string> {};

// The tokenizer.json of ref_<name>.json, or "" when it is absent ("$STRATA_FIXTURES/..." names
// the shared fixtures, anything else a path in the repository).
std::string TokenizerJsonOf(const nlohmann::json& ref) {
  std::string dir = ref["tokenizer_dir"].get<std::string>();
  const std::string kFixtures = "$STRATA_FIXTURES/";
  dir = dir.rfind(kFixtures, 0) == 0 ? testing_refs::FixturesDir() + "/" + dir.substr(kFixtures.size())
                                     : kRoot + "/" + dir;
  const std::string path = dir + "/tokenizer.json";
  return std::filesystem::exists(path) ? path : "";
}

// Skipped on a developer machine without the shared fixtures; under CI an absent file is a
// failure, so the reference comparison can never silently not run there.
#define STRATA_SKIP_WITHOUT(path) STRATA_NEED_REF((path).empty(), "the real tokenizer.json")

TEST_P(TokenizerRefTest, IdsMatchTheReference) {
  const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + GetParam() + ".json");
  const std::string path = TokenizerJsonOf(ref);
  STRATA_SKIP_WITHOUT(path);
  auto tok = Tokenizer::FromHfJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ExpectIdentical(GetParam(), **tok, LoadCases(ref), /*lossy=*/false);
}

// Bytes that are not UTF-8: HF only ever sees text (Python's errors="replace" or the JS
// TextDecoder turn each bad sequence into U+FFFD) and llama.cpp replaces each bad byte by U+FFFD
// too; the corpus keeps to cases where both rules agree, and the reference is the U+FFFD text.
TEST_P(TokenizerRefTest, InvalidUtf8IsTokenizedAsReplacementCharacters) {
  const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + GetParam() + ".json");
  const std::string path = TokenizerJsonOf(ref);
  STRATA_SKIP_WITHOUT(path);
  auto tok = Tokenizer::FromHfJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ExpectIdentical(GetParam(), **tok, LoadCases(ref), /*lossy=*/true);
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerRefTest,
                         ::testing::Values("llama3", "qwen3", "deepseek_v3", "unigram_bf",
                                           "spm_bpe_bf", "kimi_style"));

// The pre-tokenizer type each real tokenizer.json is recognised as (convert_hf_to_gguf.py's
// names for these models).
TEST(TokenizerRefCorpusTest, RealTokenizersHaveTheirPreTypes) {
  const std::pair<const char*, const char*> expected[] = {
      {"llama3", "llama-bpe"}, {"qwen3", "qwen2"}, {"deepseek_v3", "deepseek-v3"},
      {"kimi_style", "kimi-k2"}};
  for (const auto& [name, pre] : expected) {
    const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + name + ".json");
    const std::string path = TokenizerJsonOf(ref);
    if (path.empty()) continue;  // shared fixture absent
    auto type = PreTypeOfTokenizerJson(ReadJson(path));
    ASSERT_TRUE(type.ok()) << name << ": " << type.status().ToString();
    EXPECT_EQ(*type, pre) << name;
  }
}

// `strata convert`'s tokenizer: the tokenizer.json (with its tokenizer_config.json and a
// config.json giving the model's vocab_size) written as tokenizer.ggml.* keys, read back with
// FromGguf, tokenizes the corpus as the tokenizer.json does.
class GgufFromTokenizerJsonTest : public ::testing::TestWithParam<std::pair<std::string, int>> {};

// Converts the tokenizer of ref_<name>.json as `strata convert` does (a copy of its
// tokenizer.json + tokenizer_config.json and a config.json with `vocab_size`) and loads the GGUF
// keys back with FromGguf.
std::unique_ptr<Tokenizer> ConvertedGguf(const std::string& name, const std::string& path,
                                         int vocab_size, std::string* pre) {
  const std::string src = std::filesystem::path(path).parent_path().string();
  const std::string dir = ::testing::TempDir() + "/strata_hf_tok_" + name;
  std::filesystem::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(src + "/" + f, dir + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::ofstream(dir + "/config.json") << "{\"vocab_size\": " << vocab_size << "}";
  GgufWriter w;
  auto conv = AddHfTokenizerJson(dir, &w);
  EXPECT_TRUE(conv.ok()) << conv.status().ToString();
  if (!conv.ok()) return nullptr;
  EXPECT_EQ(conv->model, "gpt2");
  EXPECT_EQ(conv->n_tokens, vocab_size);
  *pre = conv->pre;
  auto file = GgufFile::FromBuffer(w.ToBytes(), name);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!tok.ok()) return nullptr;
  EXPECT_EQ((*tok)->vocab_size(), vocab_size);
  return std::move(tok).value();
}

TEST_P(GgufFromTokenizerJsonTest, TokenizesLikeTheTokenizerJson) {
  const auto& [name, vocab_size] = GetParam();
  const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + name + ".json");
  const std::string path = TokenizerJsonOf(ref);
  STRATA_SKIP_WITHOUT(path);
  std::string pre;
  std::unique_ptr<Tokenizer> gguf_tok = ConvertedGguf(name, path, vocab_size, &pre);
  ASSERT_NE(gguf_tok, nullptr);
  auto json = Tokenizer::FromHfJson(path);
  ASSERT_TRUE(json.ok()) << json.status().ToString();

  // GGUF has no normalizer key: llama.cpp (and so Strata's GGUF path) skips Qwen's NFC, so text
  // that is not already NFC tokenizes differently there; those strings are counted, not compared.
  const nlohmann::json norm = ReadJson(path).value("normalizer", nlohmann::json());
  const bool nfc = norm.is_object() && norm.value("type", "") == "NFC";
  auto is_nfc = [](const std::string& t) {
    utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(t.c_str()));
    if (out == nullptr) return true;  // not valid UTF-8: NFC leaves it alone in HfTokenizer
    const bool same = t == reinterpret_cast<const char*>(out);
    std::free(out);
    return same;
  };
  // What llama.cpp (v0.5.0's llama-tokenize on the converted file, see
  // scripts/check_llamacpp_tokenize.sh) gives for Qwen3's non-NFC strings: the GGUF path must
  // give the same.
  const std::map<std::string, std::vector<int32_t>> llama_cpp_not_nfc = {
      {"combining_nfd", {68, 53839, 264, 96549, 308, 136, 225}},
      {"combining_stack",
       {57, 137, 239, 137, 104, 137, 225, 137, 103, 136, 224, 137, 104, 136, 121, 137, 237}},
      {"precomposed_vs_decomposed", {924, 58858, 40930, 53839}}};
  int same = 0, same_bos = 0, n = 0, not_nfc = 0;
  for (const RefCase& c : LoadCases(ref)) {
    if (c.lossy) continue;  // invalid UTF-8: see InvalidUtf8AsLlamaCpp
    if (nfc && !is_nfc(c.text)) {
      ++not_nfc;
      const auto it = llama_cpp_not_nfc.find(c.name);
      if (name == "qwen3" && it != llama_cpp_not_nfc.end()) {
        EXPECT_EQ(Ids(gguf_tok->Encode(c.text, false, true)), Ids(it->second))
            << c.name << ": the GGUF path differs from llama.cpp";
      }
      continue;
    }
    ++n;
    const auto a = gguf_tok->Encode(c.text, /*with_bos=*/false, /*parse_special=*/true);
    const auto b = (*json)->Encode(c.text, /*with_bos=*/false, /*parse_special=*/true);
    same += a == b;
    EXPECT_EQ(Ids(a), Ids(b)) << name << " / " << c.name << ": " << Quoted(c.text);
    const auto a_bos = gguf_tok->Encode(c.text, /*with_bos=*/true, /*parse_special=*/true);
    auto b_bos = (*json)->Encode(c.text, /*with_bos=*/true, /*parse_special=*/true);
    // A GGUF without tokenizer.ggml.add_bos_token takes llama.cpp's default, which adds BOS for
    // llama-bpe (see BosAsLlamaCpp) where this tokenizer.json's post-processor adds none.
    if (gguf_tok->add_bos() && !(*json)->add_bos()) b_bos.insert(b_bos.begin(), gguf_tok->bos_id());
    same_bos += a_bos == b_bos;
    EXPECT_EQ(Ids(a_bos), Ids(b_bos)) << name << " / " << c.name << " (with BOS)";
    EXPECT_EQ(gguf_tok->Decode(a), (*json)->Decode(b)) << name << " / " << c.name;
  }
  std::printf("[gguf] %s (pre=%s): ids %d/%d, with BOS %d/%d identical to the tokenizer.json"
              " (%d strings not in NFC left out)\n",
              name.c_str(), pre.c_str(), same, n, same_bos, n, not_nfc);
  EXPECT_LE(not_nfc, 3);  // the corpus's three decomposed-accent strings
}

// Invalid UTF-8 through the converted GGUF: llama.cpp replaces each bad byte by U+FFFD (its
// unicode_cpts_from_utf8), which on the corpus's cases gives the reference ids (HF's
// maximal-subsequence rule agrees there): scripts/check_llamacpp_tokenize.sh measured 4/4 for
// each of these tokenizers. The GGUF path must give the same.
TEST_P(GgufFromTokenizerJsonTest, InvalidUtf8AsLlamaCpp) {
  const auto& [name, vocab_size] = GetParam();
  const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + name + ".json");
  const std::string path = TokenizerJsonOf(ref);
  STRATA_SKIP_WITHOUT(path);
  std::string pre;
  std::unique_ptr<Tokenizer> gguf = ConvertedGguf(name, path, vocab_size, &pre);
  ASSERT_NE(gguf, nullptr);
  int same = 0, n = 0;
  for (const RefCase& c : LoadCases(ref)) {
    if (!c.lossy) continue;
    ++n;
    const auto ids = gguf->Encode(c.text, /*with_bos=*/false, /*parse_special=*/true);
    same += ids == c.ids;
    EXPECT_EQ(Ids(ids), Ids(c.ids)) << name << " / " << c.name << ": " << Quoted(c.text);
  }
  std::printf("[gguf] %s (pre=%s, invalid UTF-8): ids %d/%d as llama.cpp\n", name.c_str(),
              pre.c_str(), same, n);
}

// BOS from the converted GGUF as llama.cpp adds it by default (llama-tokenize without --no-bos
// on "Hello world", v0.5.0): these tokenizer files carry no add_bos_token, and llama.cpp's
// default for pre "llama-bpe" (also tekken, chameleon) is true; for the others false, unless the
// post-processor or tokenizer_config.json says so (DeepSeek V3's add_bos_token: true).
TEST_P(GgufFromTokenizerJsonTest, BosAsLlamaCpp) {
  const auto& [name, vocab_size] = GetParam();
  const std::map<std::string, std::vector<int32_t>> llama_cpp = {
      {"llama3", {128000, 9906, 1917}},
      {"qwen3", {9707, 1879}},
      {"deepseek_v3", {0, 19923, 2058}}};
  const auto it = llama_cpp.find(name);
  const nlohmann::json ref = ReadJson(kRoot + "/testdata/tokenizer/ref_" + name + ".json");
  const std::string path = TokenizerJsonOf(ref);
  STRATA_SKIP_WITHOUT(path);
  std::string pre;
  std::unique_ptr<Tokenizer> gguf = ConvertedGguf(name, path, vocab_size, &pre);
  ASSERT_NE(gguf, nullptr);
  if (it == llama_cpp.end()) {
    // Not run in llama.cpp (a fixture vocabulary): its tokenizer_config.json says
    // add_bos_token: true, which the converter writes as tokenizer.ggml.add_bos_token (llama.cpp's
    // default for kimi-k2 would be no BOS), so the GGUF adds the fixture's [BOS].
    EXPECT_TRUE(gguf->add_bos()) << name << " (pre=" << pre << ")";
    const std::vector<int32_t> ids = gguf->Encode("ab", /*with_bos=*/true, /*parse_special=*/true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], gguf->bos_id());
    return;
  }
  EXPECT_EQ(Ids(gguf->Encode("Hello world", /*with_bos=*/true, /*parse_special=*/true)),
            Ids(it->second))
      << name << " (pre=" << pre << ")";
}

// vocab_size as each model's config.json has it (Llama 3: 128256 = the tokens; Qwen3: 151936
// and DeepSeek V3: 129280, both padded beyond the last token).
INSTANTIATE_TEST_SUITE_P(All, GgufFromTokenizerJsonTest,
                         ::testing::Values(std::pair<std::string, int>("llama3", 128256),
                                           std::pair<std::string, int>("qwen3", 151936),
                                           std::pair<std::string, int>("deepseek_v3", 129280),
                                           std::pair<std::string, int>("kimi_style", 700)));

TEST(TokenizerRefCorpusTest, CorpusCoversTheHardCases) {
  const nlohmann::json corpus = ReadJson(kRoot + "/testdata/tokenizer/corpus.json");
  EXPECT_GE(corpus["strings"].size(), 60u);
  int invalid = 0;
  for (const auto& s : corpus["strings"]) invalid += s.contains("base64");
  EXPECT_GE(invalid, 3);
}

}  // namespace
}  // namespace strata
