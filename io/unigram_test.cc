// Unigram model: hand-worked lattices (best path, ties, unknown fusion, byte fallback) and the
// Build errors.
#include "io/unigram.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

UnigramModel Make(std::vector<UnigramModel::Piece> vocab, int32_t unk, bool byte_fallback) {
  auto m = UnigramModel::Build(std::move(vocab), unk, byte_fallback);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

TEST(UnigramTest, BestPathByTotalScore) {
  // "abc": a+b+c = -1-2-3 = -6; ab+c = -2.5-3 = -5.5 (best); abc = -7; a+bc = -1-4.6 = -5.6.
  const UnigramModel m = Make(
      {{"<unk>", 0}, {"a", -1}, {"b", -2}, {"ab", -2.5}, {"c", -3}, {"abc", -7}, {"bc", -4.6}},
      0, false);
  EXPECT_EQ(m.Encode("abc"), (Ids{3, 4}));
  // "bcab": bc+ab = -7.1 beats b+c+ab = -7.5 and bc+a+b = -7.6.
  EXPECT_EQ(m.Encode("bcab"), (Ids{6, 3}));
  EXPECT_EQ(m.Encode(""), Ids{});
  EXPECT_DOUBLE_EQ(m.unk_score(), -17.0);  // min score -7, minus HF's penalty 10
}

TEST(UnigramTest, TieKeepsTheEarliestStart) {
  // "ab": ab = -2 and a+b = -1-1 = -2 tie; the path whose last piece starts earliest (ab, at
  // 0) is found first and kept.
  const UnigramModel m = Make({{"<unk>", 0}, {"a", -1}, {"b", -1}, {"ab", -2}}, 0, false);
  EXPECT_EQ(m.Encode("ab"), (Ids{3}));
  // "aab": a+ab = -3 ties a+a+b = -3; best[3] is offered from start 1 (ab) before start 2 (b).
  EXPECT_EQ(m.Encode("aab"), (Ids{1, 3}));
}

TEST(UnigramTest, UnknownCharactersAreFused) {
  // x, y, z are not pieces: each gets an unknown edge (-2 - 10 = -12); runs fuse into one unk.
  const UnigramModel m = Make({{"<unk>", 0}, {"a", -1}, {"b", -2}}, 0, false);
  EXPECT_EQ(m.Encode("axyb"), (Ids{1, 0, 2}));
  EXPECT_EQ(m.Encode("xyz"), (Ids{0}));
  EXPECT_EQ(m.Encode("xaz"), (Ids{0, 1, 0}));
  // Multi-byte characters: one edge per code point, fused the same way.
  EXPECT_EQ(m.Encode("\xE6\x97\xA5\xE6\x9C\xAC" "a"), (Ids{0, 1}));  // "日本a"
}

TEST(UnigramTest, UnknownEdgeOnlyWhereNoSingleCharacterPiece) {
  // "ab" is a piece but neither "a" nor "b" is: position 0 gets an unknown edge as well, and the
  // piece (-1) beats two unknown edges (-2 * 11).
  const UnigramModel m = Make({{"<unk>", -1}, {"ab", -1}}, 0, false);
  EXPECT_EQ(m.Encode("ab"), (Ids{1}));
  EXPECT_EQ(m.Encode("abb"), (Ids{1, 0}));
  EXPECT_EQ(m.Encode("bab"), (Ids{0, 1}));
}

TEST(UnigramTest, ByteFallbackSpellsUnknownRuns) {
  std::vector<UnigramModel::Piece> v = {{"<unk>", 0}, {"a", -1}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.push_back({buf, -20});
  }
  const UnigramModel m = Make(v, 0, true);
  auto byte = [](int b) { return 2 + b; };
  EXPECT_EQ(m.Encode("axy"), (Ids{1, byte('x'), byte('y')}));
  EXPECT_EQ(m.Encode("\xC3\xA9"), (Ids{byte(0xC3), byte(0xA9)}));  // "é"
  // Invalid UTF-8: each stray byte is a character of its own, spelled as its byte piece.
  EXPECT_EQ(m.Encode("a\xFF"), (Ids{1, byte(0xFF)}));
  // Without byte_fallback the same model gives unk.
  const UnigramModel no_fb = Make(v, 0, false);
  EXPECT_EQ(no_fb.Encode("axy"), (Ids{1, 0}));
}

TEST(UnigramTest, ByteFallbackNeedsEveryBytePiece) {
  // Only <0xC3> exists: "é" (C3 A9) cannot be spelled in bytes, so the run is unk.
  const UnigramModel m = Make({{"<unk>", 0}, {"a", -1}, {"<0xC3>", -5}, {"<0x78>", -5}}, 0, true);
  EXPECT_EQ(m.Encode("\xC3\xA9"), (Ids{0}));
  EXPECT_EQ(m.Encode("xa"), (Ids{3, 1}));
}

TEST(UnigramTest, NoUnkIdDropsWhatBytesCannotSpell) {
  const UnigramModel m = Make({{"a", -1}, {"<0x78>", -5}}, -1, true);
  EXPECT_EQ(m.Encode("axzq"), (Ids{0}));  // "xzq" is one fused run; <0x7A>, <0x71> are missing
  EXPECT_EQ(m.Encode("ax"), (Ids{0, 1}));
}

TEST(UnigramTest, DuplicateTextLastIdWins) {
  const UnigramModel m = Make({{"<unk>", 0}, {"a", -1}, {"a", -3}}, 0, false);
  EXPECT_EQ(m.Encode("aa"), (Ids{2, 2}));
}

TEST(UnigramTest, BuildErrorsNameTheBadValue) {
  auto empty = UnigramModel::Build({}, -1, false);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);
  auto bad_unk = UnigramModel::Build({{"a", -1}}, 5, false);
  ASSERT_FALSE(bad_unk.ok());
  EXPECT_NE(bad_unk.status().message().find("unk_id 5"), std::string::npos);
  auto empty_text = UnigramModel::Build({{"a", -1}, {"", -2}}, 0, false);
  ASSERT_FALSE(empty_text.ok());
  EXPECT_NE(empty_text.status().message().find("piece 1"), std::string::npos);
  auto nan = UnigramModel::Build({{"a", std::numeric_limits<double>::quiet_NaN()}}, 0, false);
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find("not finite"), std::string::npos);
}

nlohmann::json ReadJson(const std::string& rel) {
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(f.good()) << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// The model alone against the reference (tools/ref/make_refs.py) on the Unigram fixture:
// its pre-tokenizer (Metaspace: spaces -> U+2581, one prepended, split before each U+2581) is
// redone here, the ids without special tokens must match for every corpus string.
TEST(UnigramTest, MatchesTheReferenceOnTheFixture) {
  const nlohmann::json tok = ReadJson("testdata/tokenizer/fixtures/unigram_bf/tokenizer.json");
  const nlohmann::json ref = ReadJson("testdata/tokenizer/ref_unigram_bf.json");
  const nlohmann::json corpus = ReadJson("testdata/tokenizer/corpus.json");
  std::vector<UnigramModel::Piece> vocab;
  for (const auto& p : tok["model"]["vocab"]) {
    vocab.push_back({p[0].get<std::string>(), p[1].get<double>()});
  }
  const UnigramModel m = Make(vocab, tok["model"]["unk_id"].get<int32_t>(),
                              tok["model"]["byte_fallback"].get<bool>());
  const std::string sp = "\xE2\x96\x81";
  int checked = 0;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const auto& c = ref["cases"][i];
    const std::string text = c.contains("tokenized_text")
                                 ? c["tokenized_text"].get<std::string>()
                                 : corpus["strings"][i]["text"].get<std::string>();
    if (text.empty()) continue;  // Metaspace yields no piece at all for ""
    std::string norm;
    for (const char ch : text) norm += ch == ' ' ? sp : std::string(1, ch);
    if (norm.compare(0, sp.size(), sp) != 0) norm = sp + norm;
    std::vector<int32_t> ids;
    for (size_t b = 0; b < norm.size();) {
      size_t e = norm.find(sp, b + sp.size());
      if (e == std::string::npos) e = norm.size();
      for (const int32_t id : m.Encode(std::string_view(norm).substr(b, e - b))) ids.push_back(id);
      b = e;
    }
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << c["name"];
    ++checked;
  }
  EXPECT_GE(checked, 80);
}

}  // namespace
}  // namespace strata
