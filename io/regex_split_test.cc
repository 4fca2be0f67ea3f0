// Tests for RegexSplitter: HF's split behaviors (the examples of the tokenizers documentation),
// invert, Unicode classes and lookahead of the real pre-tokenizer regexes, invalid UTF-8, errors.
#include "io/regex_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"

namespace strata {
namespace {

using V = std::vector<std::string>;

V SplitAll(const RegexSplitter& r, std::string_view text, SplitBehavior b, bool invert = false) {
  V out;
  r.Split(text, b, invert, &out);
  return out;
}

RegexSplitter Must(std::string_view pattern) {
  auto r = RegexSplitter::Compile(pattern);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

// The tokenizers documentation's SplitDelimiterBehavior examples ("the-final--countdown").
TEST(RegexSplit, BehaviorsOnDocExample) {
  const RegexSplitter r = Must("-");
  const std::string t = "the-final--countdown";
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kIsolated),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kMergedWithPrevious),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kMergedWithNext),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kContiguous),
            (V{"the", "-", "final", "--", "countdown"}));
}

TEST(RegexSplit, EdgesAndInvert) {
  const RegexSplitter r = Must("-");
  EXPECT_EQ(SplitAll(r, "-a-", SplitBehavior::kMergedWithPrevious), (V{"-", "a-"}));
  EXPECT_EQ(SplitAll(r, "-a-", SplitBehavior::kMergedWithNext), (V{"-a", "-"}));
  EXPECT_EQ(SplitAll(r, "--", SplitBehavior::kRemoved), V{});
  EXPECT_EQ(SplitAll(r, "", SplitBehavior::kIsolated), V{});
  EXPECT_EQ(SplitAll(r, "abc", SplitBehavior::kRemoved), V{"abc"});
  // invert: the gaps count as matches. Removed then drops the words and keeps the dashes.
  EXPECT_EQ(SplitAll(r, "a-b--c", SplitBehavior::kRemoved, true), (V{"-", "-", "-"}));
  // Keep-the-matches splitting (as the Whitespace pre-tokenizer uses \w+|[^\w\s]+).
  const RegexSplitter w = Must("\\w+|[^\\w\\s]+");
  EXPECT_EQ(SplitAll(w, "Hey friend!  How?", SplitBehavior::kRemoved, true),
            (V{"Hey", "friend", "!", "How", "?"}));
}

TEST(RegexSplit, Gpt2AndLlama3Regexes) {
  const RegexSplitter gpt2 =
      Must("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(SplitAll(gpt2, "I'm here  now!!\n\nok", SplitBehavior::kIsolated),
            (V{"I", "'m", " here", " ", " now", "!!", "\n", "\n", "ok"}));
  // Non-ASCII letters and digits by their Unicode properties: Greek, CJK, Arabic-Indic digits;
  // U+00A0 and U+3000 are whitespace.
  EXPECT_EQ(SplitAll(gpt2, "\xCE\xB1\xCE\xB2 \xE6\x97\xA5\xD9\xA3\xD9\xA4\xC2\xA0x\xE3\x80\x80y",
                     SplitBehavior::kIsolated),
            (V{"\xCE\xB1\xCE\xB2", " \xE6\x97\xA5", "\xD9\xA3\xD9\xA4", "\xC2\xA0", "x",
               "\xE3\x80\x80", "y"}));
  // Llama 3: case-insensitive contractions, possessive quantifiers, digits in threes.
  const RegexSplitter l3 = Must(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(SplitAll(l3, "I'M 12345 $x\r\n\n  y", SplitBehavior::kIsolated),
            (V{"I", "'M", " ", "123", "45", " $", "x", "\r\n\n", " ", " y"}));
}

TEST(RegexSplit, InvalidUtf8NeverFails) {
  const RegexSplitter r = Must("\\p{L}+");
  // The stray bytes cannot match; they stay in gaps and every byte is kept.
  const std::string t = "ab\xFF\xC3(cd\xE6\x97";
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kIsolated), (V{"ab", "\xFF\xC3(", "cd", "\xE6\x97"}));
  Rng rng(TestSeed());
  for (int i = 0; i < 500; ++i) {
    std::string s;
    const size_t n = rng.Below(40);
    for (size_t k = 0; k < n; ++k) s.push_back(static_cast<char>(rng.Below(256)));
    V pieces = SplitAll(r, s, SplitBehavior::kIsolated);
    std::string joined;
    for (const std::string& p : pieces) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(RegexSplit, EmptyMatchesSplitGaps) {
  const RegexSplitter r = Must("x*");
  EXPECT_EQ(SplitAll(r, "abxxc", SplitBehavior::kIsolated), (V{"a", "b", "xx", "c"}));
  std::vector<std::pair<size_t, size_t>> m;
  r.FindMatches("abxxc", &m);
  // (4,4) touches the end of (2,4) and is skipped, as Rust's find_iter does.
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 1}, {2, 4}, {5, 5}}));
}

TEST(RegexSplit, LiteralAndCopies) {
  auto lit = RegexSplitter::CompileLiteral("a.b");
  ASSERT_TRUE(lit.ok()) << lit.status().ToString();
  EXPECT_EQ(SplitAll(*lit, "a.bxaxb", SplitBehavior::kIsolated), (V{"a.b", "xaxb"}));
  const RegexSplitter copy = *lit;  // copies share the compiled code
  EXPECT_EQ(SplitAll(copy, "a.b", SplitBehavior::kRemoved), V{});
  EXPECT_EQ(copy.pattern(), "a.b");
}

TEST(RegexSplit, OnigurumaTranslation) {
  EXPECT_EQ(TranslateOnigurumaPattern("\\h+[\\h_]"), "[0-9a-fA-F]+[0-9a-fA-F_]");
  EXPECT_EQ(TranslateOnigurumaPattern("\\u00e9\\\\u"), "\\x{00e9}\\\\u");
  EXPECT_EQ(TranslateOnigurumaPattern("[]\\h]"), "[]0-9a-fA-F]");
  const RegexSplitter r = Must("\\h+");
  EXPECT_EQ(SplitAll(r, "zz0fA g", SplitBehavior::kIsolated), (V{"zz", "0fA", " g"}));
  const RegexSplitter u = Must("\\u00E9");
  EXPECT_EQ(SplitAll(u, "caf\xC3\xA9!", SplitBehavior::kRemoved), (V{"caf", "!"}));
}

TEST(RegexSplit, ErrorsNamePatternAndOffset) {
  auto r = RegexSplitter::Compile("ab(c");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("\"ab(c\""), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("offset 4"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("parenthes"), std::string::npos) << r.status().message();
  auto b = ParseSplitBehavior("Merged");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("Merged"), std::string::npos);
  EXPECT_EQ(ParseSplitBehavior("Contiguous").value(), SplitBehavior::kContiguous);
}

TEST(RegexSplit, LongWhitespaceRunDoesNotOverflow) {
  // \s+(?!\S) backtracks over the whole run: a 1 MB run must still split (JIT stack fallback).
  const RegexSplitter r = Must("\\s+(?!\\S)|\\s+");
  const std::string t = std::string(1 << 20, ' ') + "x";
  EXPECT_EQ(SplitAll(r, t, SplitBehavior::kIsolated),
            (V{std::string((1 << 20) - 1, ' '), " ", "x"}));
}

}  // namespace
}  // namespace strata
