// Tests for HfTokenizer (the tokenizer.json pipeline) and Tokenizer::FromHfJson: each normalizer,
// pre-tokenizer, model option, added-token flag, decoder and post-processor on small hand-built
// tokenizer.json objects, with expectations worked out by hand (the non-obvious ones checked
// against @lenml/tokenizers, the Node port of the HF pipeline); errors name the JSON path.
#include "io/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/tokenizer.h"

namespace strata {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using Strs = std::vector<std::string>;

const std::string kSp = "\xE2\x96\x81";  // U+2581

// A tokenizer.json with a tiny BPE model {a, b, ab} and the given components.
json Base() {
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                {"merges", json::array({"a b"})}}}};
}

std::shared_ptr<HfTokenizer> Must(const json& j) {
  auto t = HfTokenizer::FromJson(j, "test.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  return *t;
}

std::string Norm(const json& normalizer, const std::string& text) {
  json j = Base();
  j["normalizer"] = normalizer;
  auto t = Must(j);
  return t ? t->Normalize(text) : "<build failed>";
}

Strs Pre(const json& pre, const std::string& text, bool at_start = true) {
  json j = Base();
  j["pre_tokenizer"] = pre;
  auto t = Must(j);
  return t ? t->PreTokenize(text, at_start) : Strs{"<build failed>"};
}

json Pattern(const char* kind, const std::string& p) { return json{{kind, p}}; }

// ---------------------------------------------------------------------------------------------
// Normalizers

TEST(HfNormalizer, UnicodeForms) {
  EXPECT_EQ(Norm({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");               // e + U+0301 -> é
  EXPECT_EQ(Norm({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");               // é -> e + U+0301
  EXPECT_EQ(Norm({{"type", "NFKC"}}, "\xEF\xAC\x81 \xE2\x91\xA0"), "fi 1");  // ﬁ ① -> fi 1
  EXPECT_EQ(Norm({{"type", "NFKD"}}, "\xEF\xAC\x81\xC3\xA9"), "fie\xCC\x81");
  EXPECT_EQ(Norm({{"type", "NFC"}}, "plain ascii"), "plain ascii");
  // Invalid bytes pass untouched; the valid runs around them are still normalized.
  EXPECT_EQ(Norm({{"type", "NFC"}},
                 "e\xCC\x81\xFF"
                 "e\xCC\x81"),
            "\xC3\xA9\xFF\xC3\xA9");
  EXPECT_EQ(Norm(nullptr, "AbC"), "AbC");
}

TEST(HfNormalizer, LowercaseStripAccentsStripPrepend) {
  // İ lowercases to i + combining dot (the full mapping), Σ to σ, ASCII as usual.
  EXPECT_EQ(Norm({{"type", "Lowercase"}}, "HeLLo \xC4\xB0 \xCE\xA3"), "hello i\xCC\x87 \xCF\x83");
  EXPECT_EQ(
      Norm({{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}}}},
           "caf\xC3\xA9 na\xC3\xAFve"),
      "cafe naive");
  EXPECT_EQ(Norm({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                 " \t hi there \xE3\x80\x80\n"),
            "hi there");
  EXPECT_EQ(Norm({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, "  hi  "),
            "  hi");
  EXPECT_EQ(Norm({{"type", "Prepend"}, {"prepend", kSp}}, "hi"), kSp + "hi");
  EXPECT_EQ(Norm({{"type", "Prepend"}, {"prepend", kSp}}, ""), "");  // only non-empty text
}

TEST(HfNormalizer, ReplaceStringRegexAndSequence) {
  EXPECT_EQ(
      Norm({{"type", "Replace"}, {"pattern", Pattern("String", " ")}, {"content", kSp}}, "a b  c"),
      "a" + kSp + "b" + kSp + kSp + "c");
  // A String pattern is literal: "." is not a wildcard.
  EXPECT_EQ(
      Norm({{"type", "Replace"}, {"pattern", Pattern("String", ".")}, {"content", "!"}}, "a.b"),
      "a!b");
  EXPECT_EQ(Norm({{"type", "Replace"}, {"pattern", Pattern("Regex", " {2,}")}, {"content", " "}},
                 "a    b c"),
            "a b c");
  // Llama 2 / Mistral tokenizer.json: Prepend ▁ then spaces -> ▁.
  const json llama2 = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kSp}},
        {{"type", "Replace"}, {"pattern", Pattern("String", " ")}, {"content", kSp}}}}};
  EXPECT_EQ(Norm(llama2, "Hey friend"), kSp + "Hey" + kSp + "friend");
  EXPECT_EQ(Norm({{"type", "Sequence"}, {"normalizers", json::array()}}, "x y"), "x y");
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

TEST(HfPreTokenizer, ByteLevel) {
  const std::string G = "\xC4\xA0";  // Ġ, the byte-level character of ' '
  EXPECT_EQ(Pre({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
                "Hello world's"),
            (Strs{G + "Hello", G + "world", "'s"}));
  EXPECT_EQ(Pre({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}},
                "Hello  world"),
            (Strs{"Hello", G, G + "world"}));
  // No regex, no prefix: one piece, bytes mapped (é = C3 A9 -> "Ã©", newline -> Ċ).
  EXPECT_EQ(Pre({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                "a \xC3\xA9\n"),
            (Strs{"a" + G + "\xC3\x83\xC2\xA9\xC4\x8A"}));
}

TEST(HfPreTokenizer, SplitBehaviorsAndInvert) {
  auto split = [](const json& pattern, const char* behavior, bool invert) {
    return json{
        {"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
  };
  EXPECT_EQ(Pre(split(Pattern("String", "-"), "Removed", false), "the-final--countdown"),
            (Strs{"the", "final", "countdown"}));
  EXPECT_EQ(Pre(split(Pattern("String", "-"), "MergedWithNext", false), "the-final--countdown"),
            (Strs{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Pre(split(Pattern("Regex", "\\p{N}{1,3}"), "Isolated", false), "x12345y"),
            (Strs{"x", "123", "45", "y"}));
  // invert + Removed keeps the matches only.
  EXPECT_EQ(Pre(split(Pattern("Regex", "\\w+"), "Removed", true), "hi, you!"), (Strs{"hi", "you"}));
}

TEST(HfPreTokenizer, Metaspace) {
  auto meta = [](const char* scheme, bool split) {
    return json{{"type", "Metaspace"},
                {"replacement", "\xE2\x96\x81"},
                {"prepend_scheme", scheme},
                {"split", split}};
  };
  EXPECT_EQ(Pre(meta("always", true), "Hey friend"), (Strs{kSp + "Hey", kSp + "friend"}));
  EXPECT_EQ(Pre(meta("always", false), "Hey friend"), (Strs{kSp + "Hey" + kSp + "friend"}));
  // "first": only a piece that starts the input gets the prefix.
  EXPECT_EQ(Pre(meta("first", true), "Hey friend", true), (Strs{kSp + "Hey", kSp + "friend"}));
  EXPECT_EQ(Pre(meta("first", true), "Hey friend", false), (Strs{"Hey", kSp + "friend"}));
  EXPECT_EQ(Pre(meta("never", true), "Hey friend"), (Strs{"Hey", kSp + "friend"}));
  // Already starting with the marker: no second one.
  EXPECT_EQ(Pre(meta("always", true), " x"), (Strs{kSp + "x"}));
  // Older files: add_prefix_space instead of prepend_scheme.
  EXPECT_EQ(Pre({{"type", "Metaspace"}, {"replacement", kSp}, {"add_prefix_space", false}}, "a b"),
            (Strs{"a", kSp + "b"}));
}

TEST(HfPreTokenizer, DigitsWhitespacePunctuation) {
  EXPECT_EQ(Pre({{"type", "Digits"}, {"individual_digits", true}}, "a123b"),
            (Strs{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(Pre({{"type", "Digits"}, {"individual_digits", false}}, "a123b45"),
            (Strs{"a", "123", "b", "45"}));
  EXPECT_EQ(Pre({{"type", "Whitespace"}}, "Hey friend!  How are you?!?"),
            (Strs{"Hey", "friend", "!", "How", "are", "you", "?!?"}));
  EXPECT_EQ(Pre({{"type", "WhitespaceSplit"}}, "Hey friend!  How\tare\nyou?"),
            (Strs{"Hey", "friend!", "How", "are", "you?"}));
  EXPECT_EQ(Pre({{"type", "Punctuation"}}, "Hey, friend!?"),
            (Strs{"Hey", ",", " friend", "!", "?"}));
  EXPECT_EQ(Pre({{"type", "Punctuation"}, {"behavior", "Contiguous"}}, "Hey, friend!?"),
            (Strs{"Hey", ",", " friend", "!?"}));
}

TEST(HfPreTokenizer, SequenceLikeLlama3) {
  const json seq = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"},
                       {"pattern", Pattern("Regex", "\\p{N}{1,3}| ?\\p{L}+|\\s+")},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(Pre(seq, "ab 1234"), (Strs{"ab", "\xC4\xA0", "123", "4"}));
}

// ---------------------------------------------------------------------------------------------
// Models

// Byte-level BPE: ids 0..255 are the byte characters in byte order, then merged tokens.
json ByteLevelJson(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[Gpt2ByteChar(static_cast<uint8_t>(b))] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(json::array({a, b}));  // pair form
  }
  json j = Base();
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  return j;
}

TEST(HfBpe, ByteLevelMergesByRank) {
  const std::string G = "\xC4\xA0";
  // Ranks: H e, l l, He ll, Hell o, Ġ w, o r, Ġw or, l d, Ġwor ld.
  auto t = Must(ByteLevelJson({{"H", "e"},
                               {"l", "l"},
                               {"He", "ll"},
                               {"Hell", "o"},
                               {G, "w"},
                               {"o", "r"},
                               {G + "w", "or"},
                               {"l", "d"},
                               {G + "wor", "ld"}}));
  ASSERT_NE(t, nullptr);
  const int32_t hello = t->TokenId("Hello"), world = t->TokenId(G + "world");
  ASSERT_GE(hello, 256);
  ASSERT_GE(world, 256);
  EXPECT_EQ(t->Encode("Hello world", false), (Ids{hello, world}));
  EXPECT_EQ(t->Encode("Hellx", false), (Ids{t->TokenId("Hell"), 'x'}));
  EXPECT_EQ(t->Encode("\xC3\xA9", false), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(t->Decode({hello, world}, true), "Hello world");
  EXPECT_EQ(t->DecodeToken(world), " world");
  // Invalid UTF-8 is read as HF would be given it: each bad sequence one U+FFFD (EF BF BD).
  EXPECT_EQ(t->Encode("a\xFF\xE6\x97(", false),
            (Ids{'a', 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, '('}));
  // Repeated words hit the word cache and give the same ids.
  EXPECT_EQ(t->Encode("Hello Hello Hello", false), t->Encode("Hello Hello Hello", false));
}

TEST(HfBpe, IgnoreMergesTakesWholeVocabWords) {
  json j = ByteLevelJson({{"a", "b"}, {"ab", "c"}});
  j["model"]["vocab"]["bc"] = 300;  // reachable only as a whole word: no merge builds it
  auto plain = Must(j);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->Encode("bc", false), (Ids{'b', 'c'}));
  j["model"]["ignore_merges"] = true;
  auto ignore = Must(j);
  ASSERT_NE(ignore, nullptr);
  EXPECT_EQ(ignore->Encode("bc", false), (Ids{300}));
  EXPECT_EQ(ignore->Encode("abc", false), (Ids{ignore->TokenId("abc")}));
}

// SentencePiece-style BPE (Llama 2 / Mistral tokenizer.json): ▁ words, <0xNN> byte fallback.
json SpmBpeJson(bool byte_fallback, bool fuse_unk) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab[buf] = 3 + b;
  }
  int id = 259;
  for (const std::string& t : {kSp, std::string("h"), std::string("i"), kSp + "h", kSp + "hi"}) {
    vocab[t] = id++;
  }
  json j = Base();
  j["model"] = {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", {kSp + " h", kSp + "h i"}},
                {"unk_token", "<unk>"},
                {"byte_fallback", byte_fallback},
                {"fuse_unk", fuse_unk}};
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kSp}},
        {{"type", "Replace"}, {"pattern", Pattern("String", " ")}, {"content", kSp}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", Pattern("String", kSp)}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["added_tokens"] = {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                       {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                       {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  return j;
}

TEST(HfBpe, SentencePieceStyleByteFallback) {
  auto t = Must(SpmBpeJson(true, false));
  ASSERT_NE(t, nullptr);
  // "hi hi!" -> ▁hi▁hi! ; '!' is no piece: its byte <0x21>.
  EXPECT_EQ(t->Encode("hi hi!", false), (Ids{263, 263, 3 + '!'}));
  EXPECT_EQ(t->Encode("hi", true), (Ids{1, 263}));
  EXPECT_EQ(t->Encode("\xC3\xA9", false), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  // Decoding: ▁ -> space, byte runs -> bytes, the leading space stripped.
  EXPECT_EQ(t->Decode({1, 263, 263, 3 + '!'}, true), "hi hi!");
  EXPECT_EQ(t->Decode({1, 263}, false), "<s> hi");  // Strip only removes one leading space
  EXPECT_EQ(t->Decode({259, 3 + 0xC3, 3 + 0xA9}, true), "\xC3\xA9");
  EXPECT_EQ(t->DecodeToken(263), " hi");  // streaming keeps the space
  EXPECT_EQ(t->DecodeToken(3 + 0xC3), "\xC3");
  EXPECT_TRUE(t->IsByteToken(3 + 0x41));
  EXPECT_FALSE(t->IsByteToken(263));
  EXPECT_EQ(t->prefix_special_ids(), (Ids{1}));
}

TEST(HfBpe, UnknownTokensFuseOrNot) {
  auto plain = Must(SpmBpeJson(false, false));
  auto fused = Must(SpmBpeJson(false, true));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(fused, nullptr);
  // "hi!?" -> ▁hi then two characters with no piece: unk each, or one fused unk.
  EXPECT_EQ(plain->Encode("hi!?", false), (Ids{263, 0, 0}));
  EXPECT_EQ(fused->Encode("hi!?", false), (Ids{263, 0}));
}

TEST(HfBpe, SubwordPrefixAndSuffix) {
  // WordPiece-like BPE: continuing_subword_prefix "##" (merged tokens drop the inner prefix).
  json j = Base();
  j["model"] = {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}, {"ab##c", 4}, {"abc", 5}}},
                {"merges", {"a ##b", "ab ##c"}},
                {"continuing_subword_prefix", "##"}};
  auto t = Must(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("ab", false), (Ids{3}));
  EXPECT_EQ(t->Encode("abc", false), (Ids{5}));  // "ab" + "##c" -> "abc"
  EXPECT_EQ(t->Encode("ac", false), (Ids{0, 2}));
  // end_of_word_suffix "</w>" goes on the last character.
  json k = Base();
  k["model"] = {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"a</w>", 3}}},
                {"merges", {"a b</w>"}},
                {"end_of_word_suffix", "</w>"}};
  k["decoder"] = {{"type", "BPEDecoder"}, {"suffix", "</w>"}};
  k["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  auto s = Must(k);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->Encode("ab a", false), (Ids{2, 3}));
  EXPECT_EQ(s->Decode({2, 3}, true), "ab a");
}

TEST(HfUnigram, WiredToTheModel) {
  json j = Base();
  json vocab = json::array();
  for (const auto& [piece, score] :
       std::vector<std::pair<std::string, double>>{{"<unk>", 0.0},
                                                   {kSp + "ab", -1.0},
                                                   {kSp, -2.0},
                                                   {"a", -2.5},
                                                   {"b", -2.5},
                                                   {kSp + "a", -3.0}}) {
    vocab.push_back(json::array({piece, score}));
  }
  j["model"] = {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}};
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}};
  auto t = Must(j);
  ASSERT_NE(t, nullptr);
  // ▁ab: the whole piece (-1) beats ▁ a b (-7) and ▁a b (-5.5).
  EXPECT_EQ(t->Encode("ab", false), (Ids{1}));
  // ▁ba: ▁ b a (-7) is the only full path; "z" has no piece: one unknown.
  EXPECT_EQ(t->Encode("ba", false), (Ids{2, 4, 3}));
  EXPECT_EQ(t->Encode("z", false), (Ids{2, 0}));
  EXPECT_EQ(t->Decode({1, 1}, true), "ab ab");
  EXPECT_EQ(t->TokenId(kSp + "ab"), 1);
}

// ---------------------------------------------------------------------------------------------
// Added tokens

json WithAdded(json j, const std::vector<json>& added) {
  for (const json& a : added) j["added_tokens"].push_back(a);
  return j;
}

json Added(int id, const std::string& content, bool special, bool normalized = false) {
  return {
      {"id", id},        {"content", content}, {"special", special},  {"normalized", normalized},
      {"lstrip", false}, {"rstrip", false},    {"single_word", false}};
}

TEST(HfAddedTokens, SpecialAndPlainLongestFirst) {
  json j = ByteLevelJson({});
  j = WithAdded(
      j, {Added(256, "<|a|>", true), Added(257, "<|a|><|b|>", true), Added(258, "<think>", false)});
  auto t = Must(j);
  ASSERT_NE(t, nullptr);
  // Longest match first at a position; text around becomes ordinary pieces.
  EXPECT_EQ(t->Encode("x<|a|><|b|>y<|a|>", false), (Ids{'x', 257, 'y', 256}));
  // split_special_tokens = false: special tokens are text, non-special added ones still match.
  const Ids plain = t->Encode("<|a|><think>", false, false);
  EXPECT_EQ(plain.back(), 258);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 256), 0);
  EXPECT_EQ(t->Decode(plain, true), "<|a|><think>");
  // Decoding: special tokens skipped or rendered, added tokens printed as they are.
  EXPECT_EQ(t->Decode({'x', 256, 258}, true), "x<think>");
  EXPECT_EQ(t->Decode({'x', 256, 258}, false), "x<|a|><think>");
  EXPECT_TRUE(t->IsSpecial(256));
  EXPECT_FALSE(t->IsSpecial(258));
  EXPECT_TRUE(t->IsAdded(258));
  EXPECT_EQ(t->vocab_size(), 259);
  EXPECT_EQ(t->token_text(257), "<|a|><|b|>");
}

TEST(HfAddedTokens, NormalizedMatchAfterTheNormalizer) {
  json j = ByteLevelJson({});
  j["normalizer"] = {{"type", "Lowercase"}};
  // "hello" is normalized: it matches the lowercased text. "ABC" is not: raw text only.
  j = WithAdded(j, {Added(256, "hello", false, true), Added(257, "ABC", false, false)});
  auto t = Must(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("HeLLo", false), (Ids{256}));
  EXPECT_EQ(t->Encode("ABC", false), (Ids{257}));
  EXPECT_EQ(t->Encode("abc", false), (Ids{'a', 'b', 'c'}));
}

TEST(HfAddedTokens, LstripRstripSingleWord) {
  json j = ByteLevelJson({});
  json l = Added(256, "<L>", true);
  l["lstrip"] = true;
  json r = Added(257, "<R>", true);
  r["rstrip"] = true;
  json w = Added(258, "cat", false);
  w["single_word"] = true;
  auto t = Must(WithAdded(j, {l, r, w}));
  ASSERT_NE(t, nullptr);
  // lstrip swallows the spaces before, rstrip those after.
  EXPECT_EQ(t->Encode("a  <L>b", false), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(t->Encode("a<R>  b", false), (Ids{'a', 257, 'b'}));
  // single_word: "cat" only as a word of its own.
  EXPECT_EQ(t->Encode("a cat!", false), (Ids{'a', ' ', 258, '!'}));
  EXPECT_EQ(t->Encode("cats", false), (Ids{'c', 'a', 't', 's'}));
  EXPECT_EQ(t->Encode("concat", false).size(), 6u);
}

// ---------------------------------------------------------------------------------------------
// Decoders

std::string Dec(const json& decoder, const std::vector<std::string>& tokens,
                bool streaming = false) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int>(i);
  json j = Base();
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  j["decoder"] = decoder;
  auto t = Must(j);
  if (t == nullptr) return "<build failed>";
  if (streaming) {
    std::string s;
    for (size_t i = 0; i < tokens.size(); ++i) s += t->DecodeToken(static_cast<int32_t>(i));
    return s;
  }
  Ids ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.push_back(static_cast<int32_t>(i));
  return t->Decode(ids, true);
}

TEST(HfDecoder, EachType) {
  EXPECT_EQ(Dec({{"type", "ByteLevel"}}, {"Hello", "\xC4\xA0world", "\xC4\x8A"}), "Hello world\n");
  EXPECT_EQ(Dec({{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}},
                {kSp + "Hey", kSp + "friend"}),
            "Hey friend");
  EXPECT_EQ(Dec({{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "never"}},
                {kSp + "Hey", kSp + "friend"}),
            " Hey friend");
  EXPECT_EQ(Dec({{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}},
                {kSp + "Hey", kSp + "friend"}, true),
            " Hey friend");  // streaming keeps the first space
  // HF drops every marker of the first token, not only the leading one.
  EXPECT_EQ(Dec({{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "first"}},
                {kSp + kSp + "a" + kSp, kSp + "b"}),
            "a b");
  EXPECT_EQ(Dec({{"type", "ByteFallback"}}, {"a", "<0xC3>", "<0xA9>", "b"}),
            "a\xC3\xA9"
            "b");
  EXPECT_EQ(Dec({{"type", "Fuse"}}, {"a", "b"}), "ab");
  EXPECT_EQ(Dec({{"type", "Strip"}, {"content", "x"}, {"start", 1}, {"stop", 2}}, {"xxaxx", "xb"}),
            "xab");  // each token: one leading x, up to two trailing
  EXPECT_EQ(Dec({{"type", "Replace"}, {"pattern", Pattern("String", "_")}, {"content", " "}},
                {"a_b", "_c"}),
            "a b c");
  EXPECT_EQ(Dec({{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}},
                {"hel", "##lo", "world", "."}),
            "hello world.");
  EXPECT_EQ(Dec({{"type", "Sequence"},
                 {"decoders",
                  {{{"type", "Replace"}, {"pattern", Pattern("String", kSp)}, {"content", " "}},
                   {{"type", "Fuse"}},
                   {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}},
                {kSp + "a", kSp + "b"}),
            "a b");
  EXPECT_EQ(Dec(nullptr, {"a", "b"}), "a b");  // no decoder: HF joins with spaces
}

// ---------------------------------------------------------------------------------------------
// Post-processors

Ids EncodeWith(const json& post, const std::string& text, bool add_special) {
  json j = WithAdded(ByteLevelJson({}), {Added(256, "<s>", true), Added(257, "</s>", true)});
  j["post_processor"] = post;
  auto t = Must(j);
  return t ? t->Encode(text, add_special) : Ids{-1};
}

TEST(HfPostProcessor, TemplatesRobertaBertSequence) {
  const json tmpl = {{"type", "TemplateProcessing"},
                     {"single",
                      {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                       {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                     {"pair", json::array()},
                     {"special_tokens",
                      {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}},
                       {"</s>", {{"id", "</s>"}, {"ids", {257}}, {"tokens", {"</s>"}}}}}}};
  EXPECT_EQ(EncodeWith(tmpl, "a", true), (Ids{256, 'a', 257}));
  EXPECT_EQ(EncodeWith(tmpl, "a", false), (Ids{'a'}));
  const json roberta = {
      {"type", "RobertaProcessing"}, {"cls", {"<s>", 256}}, {"sep", {"</s>", 257}}};
  EXPECT_EQ(EncodeWith(roberta, "a", true), (Ids{256, 'a', 257}));
  const json bert = {{"type", "BertProcessing"}, {"cls", {"<s>", 256}}, {"sep", {"</s>", 257}}};
  EXPECT_EQ(EncodeWith(bert, "", true), (Ids{256, 257}));
  const json bytelevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  EXPECT_EQ(EncodeWith(bytelevel, "a", true), (Ids{'a'}));
  // Llama 3's form: Sequence[ByteLevel, TemplateProcessing "<s> $A"] (the template names the
  // token, no special_tokens entry needed when it is in the vocabulary).
  json bos_a = json::object();
  bos_a["type"] = "TemplateProcessing";
  bos_a["single"] = json::array({json{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                 json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
  json seq = json::object();
  seq["type"] = "Sequence";
  seq["processors"] = json::array({bytelevel, bos_a});
  EXPECT_EQ(EncodeWith(seq, "a", true), (Ids{256, 'a'}));
}

// ---------------------------------------------------------------------------------------------
// Errors

void ExpectError(const json& j, StatusCode code, const std::vector<std::string>& needles) {
  auto t = HfTokenizer::FromJson(j, "tok.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), code) << t.status().ToString();
  for (const std::string& n : needles) {
    EXPECT_NE(t.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << t.status().message();
  }
}

TEST(HfErrors, NameTheFieldPath) {
  {
    json j = Base();
    j.erase("model");
    ExpectError(j, StatusCode::kInvalidArgument, {"tok.json", "model", "missing"});
  }
  {
    json j = Base();
    j["model"] = {{"type", "WordPiece"}, {"vocab", json::object()}};
    ExpectError(j, StatusCode::kUnimplemented, {"unsupported model type", "WordPiece"});
  }
  {
    json j = Base();
    const json split = {{"type", "Split"}, {"pattern", {{"Regex", 5}}}, {"behavior", "Isolated"}};
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split})}};
    ExpectError(j, StatusCode::kInvalidArgument,
                {"pre_tokenizer.pretokenizers[0].pattern.Regex", "expected a string"});
  }
  {
    json j = Base();
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"Regex", "a(b"}}}, {"behavior", "Isolated"}};
    ExpectError(j, StatusCode::kInvalidArgument, {"pre_tokenizer.pattern.Regex", "a(b", "offset"});
  }
  {
    json j = Base();
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
    ExpectError(j, StatusCode::kInvalidArgument, {"pre_tokenizer.behavior", "Sideways"});
  }
  {
    json j = Base();
    j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
    ExpectError(j, StatusCode::kUnimplemented, {"normalizer", "Precompiled"});
  }
  {
    json j = Base();
    j["decoder"] = {{"type", "CTC"}};
    ExpectError(j, StatusCode::kUnimplemented, {"decoder", "CTC"});
  }
  {
    json j = Base();
    j["model"]["merges"] = {"a b", "ab"};
    ExpectError(j, StatusCode::kInvalidArgument, {"model.merges[1]", "left right"});
  }
  {
    json j = Base();
    j["model"]["merges"] = {"a zz"};
    ExpectError(j, StatusCode::kInvalidArgument, {"model.merges[0]", "\"zz\"", "vocabulary"});
  }
  {
    json j = Base();
    j["model"]["vocab"]["c"] = "three";
    ExpectError(j, StatusCode::kInvalidArgument, {"model.vocab", "\"c\"", "integer"});
  }
  {
    json j = Base();
    j["model"]["dropout"] = 0.1;
    ExpectError(j, StatusCode::kUnimplemented, {"model.dropout", "dropout"});
  }
  {
    json j = Base();
    j["added_tokens"] = {{{"id", 2000000000}, {"content", "<x>"}}};
    ExpectError(j, StatusCode::kInvalidArgument, {"added_tokens[0].id", "2000000000"});
  }
  {
    json j = Base();
    j["model"]["vocab"]["c"] = 1500000000;
    ExpectError(j, StatusCode::kInvalidArgument, {"model.vocab", "1500000000"});
  }
  {
    json j = Base();
    j["added_tokens"] = {{{"id", 9}, {"content", ""}}};
    ExpectError(j, StatusCode::kInvalidArgument, {"added_tokens[0].content", "empty"});
  }
  {
    json j = Base();
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<nope>"}, {"type_id", 0}}}}}}};
    ExpectError(j, StatusCode::kInvalidArgument, {"post_processor.single[0]", "<nope>"});
  }
  {
    auto t = HfTokenizer::FromJsonText("{\"model\": ", "broken.json");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("broken.json"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Round trips and the GGUF "gpt2" path

std::string RandomText(Rng& rng, size_t max_len) {
  static const char* const kPieces[] = {
      " ",    "  ", "\n",       "\t",           "a",
      "b",    "ab", "Hello",    "'s",           "12",
      "3456", "!",  "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80",
      "<|a|>"};
  std::string s;
  const size_t n = rng.Below(max_len + 1);
  for (size_t i = 0; i < n; ++i) {
    if (rng.Below(6) == 0) {
      s.push_back(static_cast<char>(rng.Below(256)));  // stray bytes: invalid UTF-8
    } else {
      s += kPieces[rng.Below(sizeof(kPieces) / sizeof(kPieces[0]))];
    }
  }
  return s;
}

TEST(HfRoundTrip, ReplaceInvalidUtf8) {
  EXPECT_EQ(ReplaceInvalidUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  const std::string R = "\xEF\xBF\xBD";
  // A stray continuation byte, a truncated 3-byte sequence (one U+FFFD for the two bytes), an
  // overlong lead (C0: each byte), a surrogate (ED A0: the lead alone, then the stray byte).
  EXPECT_EQ(ReplaceInvalidUtf8("a\x80"
                               "b"),
            "a" + R + "b");
  EXPECT_EQ(ReplaceInvalidUtf8("\xE6\x97x"), R + "x");
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), R + R);
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98"), R);
}

// Byte-level BPE gives back exactly the text it was given (after the U+FFFD replacement).
TEST(HfRoundTrip, ByteLevelIsLosslessOnAnyBytes) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  const std::string G = "\xC4\xA0";
  auto t = Must(WithAdded(ByteLevelJson({{"a", "b"}, {G, "a"}, {"H", "e"}, {"1", "2"}}),
                          {Added(300, "<|a|>", true)}));
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 1000; ++i) {
    const std::string text = RandomText(rng, 20);
    for (const bool split_special : {false, true}) {
      const Ids ids = t->Encode(text, false, split_special);
      const std::string want = ReplaceInvalidUtf8(text);
      ASSERT_EQ(t->Decode(ids, false), want) << "seed " << seed << " case " << i;
      std::string streamed;
      for (const int32_t id : ids) streamed += t->DecodeToken(id);
      ASSERT_EQ(streamed, want) << "seed " << seed << " case " << i;
    }
  }
}

// A GGUF "gpt2" tokenizer (TokenizerData, pre "gpt-2") and the tokenizer.json with the same
// vocabulary, Split(GPT-2 regex) + ByteLevel: one pipeline, the same ids.
TEST(HfRoundTrip, GgufGpt2MatchesTokenizerJson) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  const std::string G = "\xC4\xA0";
  json j = WithAdded(ByteLevelJson({{"a", "b"}, {G, "a"}, {"H", "e"}, {"He", "l"}, {"1", "2"}}),
                     {Added(300, "<|a|>", true)});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {json{{"type", "Split"},
                 {"pattern",
                  Pattern("Regex",
                          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                          "\\s+(?!\\S)|\\s+")},
                 {"behavior", "Isolated"},
                 {"invert", false}},
            json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  auto hf = Must(j);
  ASSERT_NE(hf, nullptr);
  TokenizerData d;
  d.model = "gpt2";
  d.pre = "gpt-2";
  d.add_bos = false;
  d.tokens.assign(hf->vocab_size(), "");
  d.token_types.assign(hf->vocab_size(), 1);
  for (int32_t i = 0; i < hf->vocab_size(); ++i) {
    d.tokens[i] = hf->token_text(i);
    if (d.tokens[i].empty()) {  // ids between the merged tokens and the added one
      d.tokens[i] = "<unused" + std::to_string(i) + ">";
      d.token_types[i] = 5;
    }
  }
  d.token_types[300] = 3;  // control
  for (const auto& m : j["model"]["merges"]) {
    d.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  auto gguf = Tokenizer::FromData(d);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  for (int i = 0; i < 500; ++i) {
    // Valid UTF-8 only: there the two agree; on invalid bytes the GGUF path keeps the raw bytes.
    const std::string text = ReplaceInvalidUtf8(RandomText(rng, 20));
    for (const bool special : {false, true}) {
      ASSERT_EQ((*gguf)->Encode(text, false, special), hf->Encode(text, false, special))
          << "seed " << seed << " case " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer::FromHfJson with tokenizer_config.json

class FromHfJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("strata_hf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(FromHfJsonTest, ConfigSuppliesSpecialsAndTemplate) {
  json j = WithAdded(
      ByteLevelJson({{"a", "b"}}),
      {Added(257, "<|bos|>", true), Added(258, "<|eos|>", true), Added(259, "<|im_start|>", true)});
  const std::string path = Write("tokenizer.json", j.dump());
  Write(
      "tokenizer_config.json",
      json{{"bos_token", {{"__type", "AddedToken"}, {"content", "<|bos|>"}}},
           {"eos_token", "<|eos|>"},
           {"add_bos_token", true},
           {"chat_template",
            {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}}
          .dump());
  auto tok = Tokenizer::FromHfJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.kind(), Tokenizer::Kind::kTokenizerJson);
  EXPECT_EQ(t.bos_id(), 257);
  EXPECT_EQ(t.eos_id(), 258);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.chat_template(), "D");
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.token_type(259), TokenType::kControl);
  EXPECT_EQ(t.token_type('a'), TokenType::kNormal);
  EXPECT_EQ(t.TokenId("ab"), 256);
  EXPECT_EQ(t.token_text(256), "ab");
  // with_bos applies the post-processor (here from add_bos_token); parse_special as asked.
  EXPECT_EQ(t.Encode("ab<|im_start|>", true, true), (Ids{257, 256, 259}));
  const Ids plain = t.Encode("ab<|im_start|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 259), 0);
  EXPECT_EQ(t.Decode({257, 256, 259, 'c'}), "abc");
  EXPECT_EQ(t.DecodeToken(256), "ab");
  EXPECT_EQ(t.DecodeToken(259), "");
  // Special tokens rendered on request; the config's eos ends generation.
  EXPECT_EQ(t.Decode({257, 256, 259, 'c'}, /*render_special=*/true), "<|bos|>ab<|im_start|>c");
  EXPECT_EQ(t.DecodeToken(259, /*render_special=*/true), "<|im_start|>");
  EXPECT_TRUE(t.IsEog(258));
  EXPECT_FALSE(t.IsEog(259));
}

TEST_F(FromHfJsonTest, WithoutConfigAndErrors) {
  const std::string path = Write("tokenizer.json", ByteLevelJson({}).dump());
  auto tok = Tokenizer::FromHfJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_EQ((*tok)->chat_template(), "");
  EXPECT_EQ((*tok)->Encode("hi", true), (Ids{'h', 'i'}));

  Write("tokenizer_config.json", json{{"bos_token", "<missing>"}}.dump());
  auto bad = Tokenizer::FromHfJson(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bos_token"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("<missing>"), std::string::npos);

  Write("tokenizer_config.json", json{{"chat_template", 7}}.dump());
  auto bad2 = Tokenizer::FromHfJson(path);
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("chat_template"), std::string::npos);

  auto missing = Tokenizer::FromHfJson((dir_ / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata
