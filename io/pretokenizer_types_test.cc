// Pre-tokenizer types: every regex compiles with PCRE2 (RegexSplitter), hand-worked splits per
// type, the unknown-name error, and the tokenizer.json fingerprints.
#include "io/pretokenizer_types.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/regex_split.h"

namespace strata {
namespace {

using Pieces = std::vector<std::string>;

// Applies the type's regexes in order, each splitting every piece of the previous (Isolated).
Pieces SplitAs(std::string_view pre, const std::string& text) {
  auto regexes = PreTokenizerRegexes(pre);
  EXPECT_TRUE(regexes.ok()) << regexes.status().ToString();
  Pieces pieces = {text};
  for (const std::string& re : *regexes) {
    auto splitter = RegexSplitter::Compile(re);
    EXPECT_TRUE(splitter.ok()) << splitter.status().ToString();
    Pieces next;
    for (const std::string& p : pieces) splitter->Split(p, SplitBehavior::kIsolated, false, &next);
    pieces = std::move(next);
  }
  return pieces;
}

TEST(PreTokenizerTypesTest, EveryRegexCompiles) {
  const std::vector<std::string> names = SupportedPreTokenizers();
  ASSERT_GE(names.size(), 60u);
  for (const std::string& name : names) {
    auto regexes = PreTokenizerRegexes(name);
    ASSERT_TRUE(regexes.ok()) << name;
    ASSERT_FALSE(regexes->empty()) << name;
    for (const std::string& re : *regexes) {
      auto splitter = RegexSplitter::Compile(re);
      EXPECT_TRUE(splitter.ok()) << name << ": " << splitter.status().ToString();
    }
  }
}

TEST(PreTokenizerTypesTest, EmptyIsDefault) {
  auto empty = PreTokenizerRegexes("");
  auto def = PreTokenizerRegexes("default");
  ASSERT_TRUE(empty.ok() && def.ok());
  EXPECT_EQ(*empty, *def);
  EXPECT_EQ(def->size(), 4u);
}

TEST(PreTokenizerTypesTest, UnknownNameListsTheSupportedOnes) {
  auto r = PreTokenizerRegexes("gpt-5-turbo");
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();  // a copy: message() of a temporary status
  EXPECT_NE(msg.find("\"gpt-5-turbo\""), std::string::npos) << msg;
  for (const char* n : {"default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-v3",
                        "kimi-k2", "tekken"}) {
    EXPECT_NE(msg.find(n), std::string::npos) << n << " missing from: " << msg;
  }
}

TEST(PreTokenizerTypesTest, Gpt2) {
  // "  x": \s+(?!\S) takes the first space only, the second prefixes the word.
  EXPECT_EQ(SplitAs("gpt-2", "Hello world's 123  x"),
            (Pieces{"Hello", " world", "'s", " 123", " ", " x"}));
  EXPECT_EQ(SplitAs("gpt-2", "a\tb"), (Pieces{"a", "\t", "b"}));
}

TEST(PreTokenizerTypesTest, Llama3) {
  // Upper-case contraction, digits in threes with the space on its own, newline run.
  EXPECT_EQ(SplitAs("llama-bpe", "I'M 12345 ok\n\nyes"),
            (Pieces{"I", "'M", " ", "123", "45", " ok", "\n\n", "yes"}));
  // One non-letter may lead a word; punctuation takes trailing newlines.
  EXPECT_EQ(SplitAs("llama3", "(hi)...\n x"), (Pieces{"(hi", ")...\n", " x"}));
  EXPECT_TRUE(PreTokenizerIgnoresMerges("llama-bpe"));
  EXPECT_FALSE(PreTokenizerIgnoresMerges("qwen2"));
  EXPECT_FALSE(PreTokenizerIgnoresMerges("no-such-type"));
}

TEST(PreTokenizerTypesTest, Qwen2) {
  EXPECT_EQ(SplitAs("qwen2", "x 2024"), (Pieces{"x", " ", "2", "0", "2", "4"}));
  // A combining mark is not \p{L}: it ends the word and leads the next one as its optional
  // non-letter (qwen35 keeps it in the word: \p{M} is in its class).
  EXPECT_EQ(SplitAs("qwen2", "cafe\xCC\x81s"), (Pieces{"cafe", "\xCC\x81s"}));
  EXPECT_EQ(SplitAs("qwen35", "cafe\xCC\x81s"), (Pieces{"cafe\xCC\x81s"}));
}

TEST(PreTokenizerTypesTest, DeepseekV3) {
  // Digits first (in threes), then runs of CJK/kana, then the word pattern on what is left.
  EXPECT_EQ(SplitAs("deepseek-v3", "abc 12345 日本語テスト"),
            (Pieces{"abc", " ", "123", "45", " ", "日本語テスト"}));
  // ASCII punctuation glued to the following ASCII word.
  EXPECT_EQ(SplitAs("deepseek-v3", "a.b"), (Pieces{"a", ".b"}));
}

TEST(PreTokenizerTypesTest, DeepseekLlm) {
  EXPECT_EQ(SplitAs("deepseek-llm", "Hi\nthere 42"), (Pieces{"Hi", "\n", "there", " ", "42"}));
  // U+1FD3 (a compatibility character that an NFC pass over the source would turn into U+0390
  // and make the class's range out of order) is a letter: " \u1FD3\u1FD3" is one piece of the
  // letter split, whose space the later "CJK" split (its U+0800..U+4E00 covers U+1FD3) cuts off.
  EXPECT_EQ(SplitAs("deepseek-llm", " \xE1\xBF\x93\xE1\xBF\x93!"),
            (Pieces{" ", "\xE1\xBF\x93\xE1\xBF\x93", "!"}));
  EXPECT_EQ(SplitAs("deepseek-llm", "a\xE4\xB8\xAD"), (Pieces{"a", "\xE4\xB8\xAD"}));
}

TEST(PreTokenizerTypesTest, KimiK2) {
  // Han is split off from other letters (\p{Lo} minus \p{Han}); contraction kept on the word.
  EXPECT_EQ(SplitAs("kimi-k2", "Hello世界 I'm"), (Pieces{"Hello", "世界", " I'm"}));
  EXPECT_EQ(SplitAs("kimi-k2", "abc中文def"), (Pieces{"abc", "中文", "def"}));
  EXPECT_EQ(SplitAs("kimi-k2", "12345"), (Pieces{"123", "45"}));
  // Kana is not Han: it stays with the letters around it.
  EXPECT_EQ(SplitAs("kimi-k2", "abcテスト"), (Pieces{"abcテスト"}));
}

TEST(PreTokenizerTypesTest, Default) {
  EXPECT_EQ(SplitAs("default", "a+b=3.14"), (Pieces{"a", "+", "b", "=", "3", ".", "14"}));
  EXPECT_EQ(SplitAs("", "x 1234"), (Pieces{"x", " ", "123", "4"}));
}

TEST(PreTokenizerTypesTest, StarcoderSplitsDigits) {
  EXPECT_EQ(SplitAs("starcoder", "v 12"), (Pieces{"v", " ", "1", "2"}));
}

nlohmann::json SplitJson(const std::string& regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}
nlohmann::json ByteLevelJson(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}
nlohmann::json TokJson(nlohmann::json normalizer, std::vector<nlohmann::json> steps) {
  return {{"normalizer", std::move(normalizer)},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}}};
}

TEST(PreTokenizerTypesTest, FingerprintsOfTokenizerJson) {
  // The Split regexes of Llama 3's and Qwen2's tokenizer.json, as the files spell them.
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
      R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
      R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto pre = [](const nlohmann::json& j) {
    auto r = PreTypeOfTokenizerJson(j);
    return r.ok() ? *r : "error: " + r.status().message();
  };
  EXPECT_EQ(pre(TokJson(nullptr, {SplitJson(llama3), ByteLevelJson(false)})), "llama-bpe");
  EXPECT_EQ(pre(TokJson({{"type", "NFC"}}, {SplitJson(qwen2), ByteLevelJson(false)})), "qwen2");
  // DeepSeek V3 writes \r\n as raw characters inside its third regex; both spellings match.
  auto v3 = PreTokenizerRegexes("deepseek-v3");
  ASSERT_TRUE(v3.ok());
  std::string third = (*v3)[2];
  for (size_t p; (p = third.find("\\r")) != std::string::npos;) third.replace(p, 2, "\r");
  for (size_t p; (p = third.find("\\n")) != std::string::npos;) third.replace(p, 2, "\n");
  EXPECT_EQ(pre(TokJson({{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}},
                        {SplitJson((*v3)[0]), SplitJson((*v3)[1]), SplitJson(third),
                         ByteLevelJson(false)})),
            "deepseek-v3");
  EXPECT_EQ(pre({{"normalizer", nullptr}, {"pre_tokenizer", ByteLevelJson(true)}}), "gpt-2");
  auto kimi = PreTokenizerRegexes("kimi-k2");
  ASSERT_TRUE(kimi.ok());
  EXPECT_EQ(pre(TokJson(nullptr, {SplitJson((*kimi)[0]), ByteLevelJson(false)})), "kimi-k2");
}

TEST(PreTokenizerTypesTest, UnknownTokenizerJsonNamesWhatWasFound) {
  auto r = PreTypeOfTokenizerJson(TokJson(nullptr, {SplitJson("[a-z]+"), ByteLevelJson(false)}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Split(Isolated, [a-z]+)"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("llama-bpe"), std::string::npos);
  // A Split that is inverted is a different pre-tokenizer.
  nlohmann::json inv = SplitJson(R"(\p{N}{1,3})");
  inv["invert"] = true;
  EXPECT_FALSE(PreTypeOfTokenizerJson(TokJson(nullptr, {inv, ByteLevelJson(false)})).ok());
  auto nfkc = PreTypeOfTokenizerJson(TokJson({{"type", "NFKC"}}, {ByteLevelJson(true)}));
  ASSERT_FALSE(nfkc.ok());
  EXPECT_NE(nfkc.status().message().find("NFKC"), std::string::npos);
}

}  // namespace
}  // namespace strata
