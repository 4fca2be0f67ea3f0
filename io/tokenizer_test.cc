// Tests for the SentencePiece ("llama") and GPT-2 byte-level BPE ("gpt2") tokenizers: hand-worked
// token sequences, randomized round trips and comparisons against naive O(n^2) reference
// mergers, validation errors, and loading from GGUF metadata.
#include "io/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/gguf.h"
#include "io/tokenizer_json.h"

namespace strata {
namespace {

const std::string kSp = "\xE2\x96\x81";  // U+2581

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Splits into UTF-8 characters the way the tokenizer does (lead-byte length, no validation).
std::vector<std::string> Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    size_t len = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    len = std::min(len, s.size() - i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// Printable ASCII plus space, tab and newline.
std::string RandomAscii(Rng& rng, size_t max_len) {
  static const std::string extra = " \n\t  ";
  std::string s;
  const size_t n = rng.Below(max_len + 1);
  for (size_t i = 0; i < n; ++i) {
    if (rng.Below(5) == 0) {
      s.push_back(extra[rng.Below(extra.size())]);
    } else {
      s.push_back(static_cast<char>(0x21 + rng.Below(0x7F - 0x21)));
    }
  }
  return s;
}

// Valid UTF-8 with 1-, 2-, 3- and 4-byte characters (accents, CJK, emoji), never U+2581 (which
// SentencePiece decodes as a space).
std::string RandomUtf8(Rng& rng, size_t max_len) {
  static const uint32_t picks[] = {0xE9,   0xFC,   0x3B1,   0x416,   0x5D0,  0x4E2D,     0x65E5,
                                   0x3042, 0xAC00, 0x1F600, 0x1F680, 0x20AC, 0x2581 + 1, 0x10348};
  std::string s;
  const size_t n = rng.Below(max_len + 1);
  for (size_t i = 0; i < n; ++i) {
    uint32_t cp;
    switch (rng.Below(6)) {
      case 0:
        cp = 0x20;
        break;
      case 1:
        cp = 0x21 + static_cast<uint32_t>(rng.Below(0x5E));
        break;
      case 2:
        cp = 0x80 + static_cast<uint32_t>(rng.Below(0x780));
        break;
      case 3:
        do {
          cp = 0x800 + static_cast<uint32_t>(rng.Below(0x10000 - 0x800));
        } while ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x2581);
        break;
      case 4:
        cp = 0x10000 + static_cast<uint32_t>(rng.Below(0x100000));
        break;
      default:
        cp = picks[rng.Below(sizeof(picks) / sizeof(picks[0]))];
        break;
    }
    s += Utf8(cp);
  }
  return s;
}

std::string RandomBytes(Rng& rng, size_t max_len) {
  std::string s;
  const size_t n = rng.Below(max_len + 1);
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(rng.Below(256)));
  return s;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  s += ']';
  return s;
}

// ---------------------------------------------------------------------------------------------
// SentencePiece ("llama")

// Ids 0..2: <unk> <s> </s>; 3..258: <0x00>..<0xFF>; then the pieces below.
constexpr int32_t kByte0 = 3;
TokenizerData SpmData() {
  TokenizerData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.scores = {0, 0, 0};
  d.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    d.tokens.push_back(buf);
    d.scores.push_back(0);
    d.token_types.push_back(6);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {kSp, -10},         // 259
      {"t", -10},         // 260
      {"h", -10},         // 261
      {"e", -10},         // 262
      {"he", -3},         // 263
      {kSp + "t", -4},    // 264
      {kSp + "the", -1},  // 265
      {"th", -5},         // 266
      {"l", -10},         // 267
      {"o", -10},         // 268
      {"ll", -6},         // 269
      {"lo", -6},         // 270 (ties with "ll": the leftmost pair must win)
  };
  for (const auto& [t, s] : pieces) {
    d.tokens.push_back(t);
    d.scores.push_back(s);
    d.token_types.push_back(1);
  }
  d.unk = 0;
  d.bos = 1;
  d.eos = 2;
  d.add_bos = true;
  d.add_space_prefix = true;
  return d;
}

std::unique_ptr<Tokenizer> MustBuild(TokenizerData d) {
  auto t = Tokenizer::FromData(std::move(d));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  return std::move(t).value();
}

TEST(TokenizerSpm, HandWorkedSequences) {
  auto tok = MustBuild(SpmData());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), Tokenizer::Kind::kSentencePiece);
  // "▁the": he(-3) merges first, then ▁t(-4), then ▁t+he = ▁the(-1).
  EXPECT_EQ(tok->Encode("the", false), (std::vector<int32_t>{265}));
  EXPECT_EQ(tok->Encode("the", true), (std::vector<int32_t>{1, 265}));
  EXPECT_EQ(tok->Encode("the the", false), (std::vector<int32_t>{265, 265}));
  // "▁hello": he(-3), then ll(-6) and lo(-6) tie; the leftmost (ll) wins, which blocks lo.
  EXPECT_EQ(tok->Encode("hello", false), (std::vector<int32_t>{259, 263, 269, 268}));
  // Unknown characters fall back to byte tokens.
  EXPECT_EQ(tok->Encode("hi!", false),
            (std::vector<int32_t>{259, 261, kByte0 + 'i', kByte0 + '!'}));
  EXPECT_EQ(tok->Encode("\xC3\xA9", false),
            (std::vector<int32_t>{259, kByte0 + 0xC3, kByte0 + 0xA9}));
  // Two spaces: the prefix and the text's own space stay separate ▁ tokens.
  EXPECT_EQ(tok->Encode(" the", false), (std::vector<int32_t>{259, 265}));
  EXPECT_EQ(tok->Encode("", false), (std::vector<int32_t>{}));
  EXPECT_EQ(tok->Encode("", true), (std::vector<int32_t>{1}));

  EXPECT_EQ(tok->Decode({1, 265, 265, 2}), "the the");
  EXPECT_EQ(tok->Decode({259, kByte0 + 0xC3, kByte0 + 0xA9}), "\xC3\xA9");
  EXPECT_EQ(tok->Decode({259, 265}), " the");
  EXPECT_EQ(tok->DecodeToken(265), " the");
  EXPECT_EQ(tok->DecodeToken(kByte0 + 0xC3), "\xC3");
  EXPECT_EQ(tok->DecodeToken(1), "");
  EXPECT_EQ(tok->DecodeToken(0), "");  // <unk> is not printed
  // Unknown ids are skipped, never fatal.
  EXPECT_EQ(tok->Decode({265, -5, 100000, 265}), "the the");
  EXPECT_EQ(tok->DecodeToken(-1), "");
  EXPECT_EQ(tok->token_type(kByte0), TokenType::kByte);
  EXPECT_EQ(tok->TokenId(kSp + "the"), 265);
  EXPECT_EQ(tok->TokenId("nope"), -1);
}

TEST(TokenizerSpm, NoSpacePrefix) {
  TokenizerData d = SpmData();
  d.add_space_prefix = false;
  auto tok = MustBuild(std::move(d));
  ASSERT_NE(tok, nullptr);
  // "the" without the marker: he merges, t+he is not a piece.
  EXPECT_EQ(tok->Encode("the", false), (std::vector<int32_t>{260, 263}));
  EXPECT_EQ(tok->Encode(" the", false), (std::vector<int32_t>{265}));
  EXPECT_EQ(tok->Decode({265}), " the");  // nothing to strip
}

TEST(TokenizerSpm, AddBosFalse) {
  TokenizerData d = SpmData();
  d.add_bos = false;
  auto tok = MustBuild(std::move(d));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("the", true), (std::vector<int32_t>{265}));
}

TEST(TokenizerSpm, SpecialTokensParsedOnlyWhenAsked) {
  auto tok = MustBuild(SpmData());
  ASSERT_NE(tok, nullptr);
  // Without parse_special "</s>" is plain text (bytes); with it, the control token, and the text
  // after a special token gets the space prefix again (llama.cpp's is_prev_special).
  const std::vector<int32_t> plain = tok->Encode("the</s>the", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0) << Show(plain);
  EXPECT_EQ(tok->Decode(plain), "the</s>the");
  EXPECT_EQ(tok->Encode("the</s>the", false, true), (std::vector<int32_t>{265, 2, 265}));
}

// Naive reference: repeatedly merge the best-scoring adjacent pair (leftmost on ties).
std::vector<int32_t> NaiveSpm(const TokenizerData& d, const std::string& text) {
  std::map<std::string, int32_t> vocab;
  for (size_t i = 0; i < d.tokens.size(); ++i) vocab[d.tokens[i]] = static_cast<int32_t>(i);
  std::string esc = d.add_space_prefix ? kSp : "";
  for (char c : text) esc += c == ' ' ? kSp : std::string(1, c);
  std::vector<int32_t> out;
  if (text.empty()) return out;
  std::vector<std::string> sym = Chars(esc);
  while (true) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = vocab.find(sym[i] + sym[i + 1]);
      if (it == vocab.end()) continue;
      const float s = d.scores[it->second];
      if (best < 0 || s > best_score) best = static_cast<int>(i), best_score = s;
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  for (const std::string& s : sym) {
    auto it = vocab.find(s);
    if (it != vocab.end()) {
      out.push_back(it->second);
    } else {
      for (char c : s) out.push_back(kByte0 + static_cast<uint8_t>(c));
    }
  }
  return out;
}

// Adds random pieces (substrings of random words, with and without the marker) and random scores.
TokenizerData RandomSpmData(Rng& rng) {
  TokenizerData d = SpmData();
  std::set<std::string> have(d.tokens.begin(), d.tokens.end());
  const std::string alphabet = "abcdehilmnorst";
  for (int i = 0; i < 300; ++i) {
    std::string p = rng.Below(3) == 0 ? kSp : "";
    const size_t len = 1 + rng.Below(5);
    for (size_t k = 0; k < len; ++k) p += alphabet[rng.Below(alphabet.size())];
    if (rng.Below(8) == 0) p += "\xC3\xA9";
    if (!have.insert(p).second) continue;
    d.tokens.push_back(p);
    // Coarse scores so that ties happen.
    d.scores.push_back(-static_cast<float>(rng.Below(20)));
    d.token_types.push_back(1);
  }
  return d;
}

TEST(TokenizerSpm, MatchesNaiveMergerOnRandomVocab) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (int v = 0; v < 5; ++v) {
    TokenizerData d = RandomSpmData(rng);
    auto tok = MustBuild(d);
    ASSERT_NE(tok, nullptr) << "seed " << seed;
    for (int i = 0; i < 200; ++i) {
      std::string text;
      const size_t words = rng.Below(8);
      for (size_t w = 0; w < words; ++w) {
        if (w) text += ' ';
        const size_t len = 1 + rng.Below(8);
        for (size_t k = 0; k < len; ++k) text += "abcdehilmnorstxyz"[rng.Below(17)];
        if (rng.Below(6) == 0) text += "\xC3\xA9";
      }
      const std::vector<int32_t> got = tok->Encode(text, false);
      ASSERT_EQ(got, NaiveSpm(d, text)) << "seed " << seed << " text \"" << text << "\"";
      ASSERT_EQ(tok->Decode(got), text) << "seed " << seed;
    }
  }
}

TEST(TokenizerSpm, RoundTripRandomText) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  Rng vocab_rng(seed ^ 0x1234);
  auto tok = MustBuild(RandomSpmData(vocab_rng));
  ASSERT_NE(tok, nullptr) << "seed " << seed;
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    switch (i % 3) {
      case 0:
        text = RandomAscii(rng, 60);
        break;
      case 1:
        text = RandomUtf8(rng, 40);
        break;
      default:
        text = RandomBytes(rng, 40);
        break;  // invalid UTF-8 survives via byte tokens
    }
    if (text.find(kSp) != std::string::npos) continue;  // U+2581 decodes as a space by design
    const std::vector<int32_t> ids = tok->Encode(text, true);
    ASSERT_EQ(tok->Decode(ids), text) << "seed " << seed << " case " << i << " ids " << Show(ids);
    // Streaming pieces concatenate to the same bytes, up to the stripped prefix space.
    std::string streamed;
    for (int32_t id : ids) streamed += tok->DecodeToken(id);
    ASSERT_EQ(streamed, text.empty() ? "" : " " + text) << "seed " << seed;
  }
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level BPE ("gpt2")

std::string ByteChar(uint8_t b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (printable) return Utf8(b);
  int k = 0;
  for (int c = 0; c < b; ++c) {
    if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++k;
  }
  return Utf8(256 + k);
}

std::string ToByteChars(const std::string& s) {
  std::string out;
  for (char c : s) out += ByteChar(static_cast<uint8_t>(c));
  return out;
}

// Ids 0..255: byte characters in byte order; 256: <|endoftext|> (control); then merges.
TokenizerData Gpt2Base() {
  TokenizerData d;
  d.model = "gpt2";
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(ByteChar(static_cast<uint8_t>(b)));
    d.token_types.push_back(1);
  }
  d.tokens.push_back("<|endoftext|>");
  d.token_types.push_back(3);
  d.bos = d.eos = 256;
  d.add_bos = false;
  d.add_space_prefix = false;
  d.pre = "gpt-2";  // the tests below are about the GPT-2 regex ("" would be llama.cpp's default)
  return d;
}

void AddMerge(TokenizerData* d, const std::string& a, const std::string& b) {
  d->merges.push_back(a + " " + b);
  if (std::find(d->tokens.begin(), d->tokens.end(), a + b) == d->tokens.end()) {
    d->tokens.push_back(a + b);
    d->token_types.push_back(1);
  }
}

TEST(TokenizerGpt2, PreTokenizerSplits) {
  using V = std::vector<std::string>;
  auto split = &Tokenizer::SplitGpt2Words;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("I'm here  now!!"), (V{"I", "'m", " here", " ", " now", "!!"}));
  EXPECT_EQ(split("we'll they're don't"), (V{"we", "'ll", " they", "'re", " don", "'t"}));
  EXPECT_EQ(split("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split("abc 123 4.5"), (V{"abc", " 123", " 4", ".", "5"}));
  EXPECT_EQ(split("trailing   "), (V{"trailing", "   "}));
  EXPECT_EQ(split("a \tb"), (V{"a", " ", "\t", "b"}));
  EXPECT_EQ(split("\xC3\xBC"
                  "ber caf\xC3\xA9"),
            (V{"\xC3\xBC"
               "ber",
               " caf\xC3\xA9"}));
  EXPECT_EQ(split("\xE6\x97\xA5\xE6\x9C\xAC \xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88"),
            (V{"\xE6\x97\xA5\xE6\x9C\xAC", " \xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88"}));
  EXPECT_EQ(split("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"),
            (V{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"}));
  EXPECT_EQ(split("\xD9\xA3\xD9\xA4x"), (V{"\xD9\xA3\xD9\xA4", "x"}));  // Arabic-Indic digits
  EXPECT_EQ(split(""), V{});
  EXPECT_EQ(split(" "), V{" "});
}

TEST(TokenizerGpt2, HandWrittenMerges) {
  TokenizerData d = Gpt2Base();
  const std::string G = ByteChar(' ');  // "Ġ"
  ASSERT_EQ(G, "\xC4\xA0");
  AddMerge(&d, "H", "e");         // rank 0
  AddMerge(&d, "l", "l");         // 1
  AddMerge(&d, "He", "ll");       // 2
  AddMerge(&d, "Hell", "o");      // 3
  AddMerge(&d, G, "w");           // 4
  AddMerge(&d, "o", "r");         // 5
  AddMerge(&d, G + "w", "or");    // 6
  AddMerge(&d, "l", "d");         // 7
  AddMerge(&d, G + "wor", "ld");  // 8
  AddMerge(&d, "o", G);           // 9: must never apply across the pre-tokenizer's split
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), Tokenizer::Kind::kBytePairGpt2);
  const int32_t hello = tok->TokenId("Hello"), world = tok->TokenId(G + "world");
  ASSERT_GE(hello, 0);
  ASSERT_GE(world, 0);
  EXPECT_EQ(tok->Encode("Hello world", false), (std::vector<int32_t>{hello, world}));
  EXPECT_EQ(tok->Encode("Hello world", true), (std::vector<int32_t>{hello, world}));  // add_bos off
  EXPECT_EQ(tok->Decode({hello, world}), "Hello world");
  EXPECT_EQ(tok->DecodeToken(world), " world");
  // Merges stop where no pair has a rank; the rest stay single byte tokens.
  EXPECT_EQ(tok->Encode("Hellx", false),
            (std::vector<int32_t>{tok->TokenId("Hell"), static_cast<int32_t>('x')}));
  // Non-ASCII: bytes map to byte characters.
  EXPECT_EQ(tok->Encode("\xC3\xA9", false), (std::vector<int32_t>{0xC3, 0xA9}));
  // Control tokens: parsed only when asked, and dropped by Decode.
  EXPECT_EQ(tok->Encode("<|endoftext|>", false, true), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->Decode({hello, 256, world}), "Hello world");
  const std::vector<int32_t> plain = tok->Encode("<|endoftext|>", false);
  EXPECT_EQ(tok->Decode(plain), "<|endoftext|>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 256), 0);
}

// The pre-tokenizer follows tokenizer.ggml.pre: Llama 3's regex ("llama-bpe") splits digit runs in
// threes and keeps a non-letter before a word; GPT-2's keeps digit runs whole.
TEST(TokenizerGpt2, PreTypeSelectsTheRegexes) {
  TokenizerData gpt2 = Gpt2Base();
  TokenizerData llama3 = Gpt2Base();
  llama3.pre = "llama-bpe";
  auto a = MustBuild(gpt2);
  auto b = MustBuild(llama3);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Bytes only (no merges): the ids are the bytes either way; the pieces differ, which shows in
  // a merge that may only apply within a piece.
  TokenizerData g2 = gpt2, l3 = llama3;
  AddMerge(&g2, "3", "4");
  AddMerge(&l3, "3", "4");
  auto a34 = MustBuild(g2);
  auto b34 = MustBuild(l3);
  ASSERT_NE(a34, nullptr);
  ASSERT_NE(b34, nullptr);
  const int32_t t34 = a34->TokenId("34");
  // "1234": GPT-2 keeps one piece (1 2 34); Llama 3 cuts "123" | "4", so 3 and 4 never meet.
  EXPECT_EQ(a34->Encode("1234", false), (std::vector<int32_t>{'1', '2', t34}));
  EXPECT_EQ(b34->Encode("1234", false), (std::vector<int32_t>{'1', '2', '3', '4'}));
  EXPECT_EQ(a->Encode("x 1", false), b->Encode("x 1", false));
}

TEST(TokenizerGpt2, UnknownPreTypeIsAnError) {
  TokenizerData d = Gpt2Base();
  d.pre = "no-such-pre";
  auto t = Tokenizer::FromData(d);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.ggml.pre"), std::string::npos)
      << t.status().ToString();
  EXPECT_NE(t.status().message().find("no-such-pre"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("llama-bpe"), std::string::npos)  // lists the names
      << t.status().ToString();
}

TEST(TokenizerGpt2, AddBosWhenConfigured) {
  TokenizerData d = Gpt2Base();
  d.add_bos = true;
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("a", true), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tok->Encode("a", false), (std::vector<int32_t>{'a'}));
}

// Tiny BPE trainer: words are the GPT-2 pre-tokenizer's pieces in byte-character form; each step
// merges the most frequent adjacent pair (ties: smallest pair).
TokenizerData TrainGpt2(const std::string& corpus, int n_merges) {
  TokenizerData d = Gpt2Base();
  std::map<std::vector<std::string>, int> words;
  for (const std::string& w : Tokenizer::SplitGpt2Words(corpus)) ++words[Chars(ToByteChars(w))];
  for (int m = 0; m < n_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& [w, c] : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += c;
    }
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    AddMerge(&d, a, b);
    std::map<std::vector<std::string>, int> next;
    for (const auto& [w, c] : words) {
      std::vector<std::string> nw;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          nw.push_back(a + b);
          ++i;
        } else {
          nw.push_back(w[i]);
        }
      }
      next[nw] += c;
    }
    words = std::move(next);
  }
  return d;
}

const char kCorpus[] =
    "Hello world.\nHello world!\nHello world, again.\nThe world is wide, and the weather is warm. "
    "Hello again, world! "
    "There are 123 things in the world and 45 of them are here. We'll see, they're "
    "sure it's fine. \xC3\x9C"
    "ber caf\xC3\xA9s und Gr\xC3\xBC\xC3\x9F"
    "e. "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE3\x83\x86\xE3\x82\xB9\xE3\x83\x88. Hello there.";

// Naive reference: per pre-tokenized word, repeatedly merge the lowest-rank pair (leftmost).
std::vector<int32_t> NaiveGpt2(const TokenizerData& d, const std::string& text) {
  std::map<std::string, int32_t> vocab;
  for (size_t i = 0; i < d.tokens.size(); ++i) vocab[d.tokens[i]] = static_cast<int32_t>(i);
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t r = 0; r < d.merges.size(); ++r) {
    const size_t sp = d.merges[r].find(' ');
    rank.emplace(std::make_pair(d.merges[r].substr(0, sp), d.merges[r].substr(sp + 1)),
                 static_cast<int>(r));
  }
  std::vector<int32_t> out;
  for (const std::string& w : Tokenizer::SplitGpt2Words(text)) {
    std::vector<std::string> sym = Chars(ToByteChars(w));
    while (true) {
      int best = -1, best_rank = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = rank.find({sym[i], sym[i + 1]});
        if (it == rank.end()) continue;
        if (best < 0 || it->second < best_rank) best = static_cast<int>(i), best_rank = it->second;
      }
      if (best < 0) break;
      sym[best] += sym[best + 1];
      sym.erase(sym.begin() + best + 1);
    }
    for (const std::string& s : sym) out.push_back(vocab.at(s));
  }
  return out;
}

TEST(TokenizerGpt2, TrainedMergesSplitHelloWorld) {
  TokenizerData d = TrainGpt2(kCorpus, 120);
  ASSERT_GE(d.merges.size(), 50u);
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  // "Hello" (after a newline) and " world" are frequent in the corpus: 120 merges learn both.
  const std::vector<int32_t> ids = tok->Encode("Hello world", false);
  ASSERT_EQ(ids.size(), 2u) << Show(ids);
  EXPECT_EQ(tok->token_text(ids[0]), "Hello");
  EXPECT_EQ(tok->token_text(ids[1]), ByteChar(' ') + "world");
  EXPECT_EQ(ids, NaiveGpt2(d, "Hello world"));
}

TEST(TokenizerGpt2, MatchesNaiveMergerAndRoundTrips) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  TokenizerData d = TrainGpt2(kCorpus, 200);
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  const std::string corpus = kCorpus;
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    switch (i % 4) {
      case 0:
        text = RandomAscii(rng, 60);
        break;
      case 1:
        text = RandomUtf8(rng, 40);
        break;
      case 2:
        text = RandomBytes(rng, 40);
        break;
      default: {  // slices of the training text, where many merges apply
        const size_t a = rng.Below(corpus.size()), len = rng.Below(80);
        text = corpus.substr(a, len);
        break;
      }
    }
    const std::vector<int32_t> ids = tok->Encode(text, false);
    ASSERT_EQ(ids, NaiveGpt2(d, text)) << "seed " << seed << " case " << i;
    ASSERT_EQ(tok->Decode(ids), text) << "seed " << seed << " case " << i << " ids " << Show(ids);
    std::string streamed;
    for (int32_t id : ids) streamed += tok->DecodeToken(id);
    ASSERT_EQ(streamed, text) << "seed " << seed;
    // Pre-tokenizer pieces always cover the text exactly.
    std::string joined;
    for (const std::string& w : Tokenizer::SplitGpt2Words(text)) {
      ASSERT_FALSE(w.empty()) << "seed " << seed;
      joined += w;
    }
    ASSERT_EQ(joined, text) << "seed " << seed;
  }
}

TEST(TokenizerGpt2, BytesOnlyVocabWithoutMerges) {
  auto tok = MustBuild(Gpt2Base());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab c", false), (std::vector<int32_t>{'a', 'b', ' ', 'c'}));
  EXPECT_EQ(tok->Decode({'a', 'b', ' ', 'c', 0xC3, 0xA9}), "ab c\xC3\xA9");
}

// ---------------------------------------------------------------------------------------------
// Validation

void ExpectError(TokenizerData d, StatusCode code, const std::vector<std::string>& needles) {
  auto t = Tokenizer::FromData(std::move(d));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), code) << t.status().ToString();
  for (const std::string& n : needles) {
    EXPECT_NE(t.status().message().find(n), std::string::npos)
        << "'" << n << "' not in: " << t.status().message();
  }
}

TEST(TokenizerErrors, RejectsBadData) {
  {
    TokenizerData d = SpmData();
    d.model = "bert";
    ExpectError(d, StatusCode::kUnimplemented, {"tokenizer.ggml.model", "bert"});
  }
  {
    TokenizerData d = SpmData();
    d.tokens.clear();
    d.scores.clear();
    d.token_types.clear();
    d.bos = d.eos = d.unk = -1;
    ExpectError(d, StatusCode::kInvalidArgument, {"tokenizer.ggml.tokens"});
  }
  {
    TokenizerData d = SpmData();
    d.scores.pop_back();
    ExpectError(d, StatusCode::kInvalidArgument, {"tokenizer.ggml.scores", "270", "271"});
  }
  {
    TokenizerData d = SpmData();
    d.token_types.push_back(1);
    ExpectError(d, StatusCode::kInvalidArgument, {"tokenizer.ggml.token_type", "272"});
  }
  {
    TokenizerData d = SpmData();
    d.token_types[5] = 9;
    ExpectError(d, StatusCode::kInvalidArgument, {"token_type[5]", "9"});
  }
  {
    TokenizerData d = SpmData();
    d.bos = 271;
    ExpectError(d, StatusCode::kInvalidArgument, {"bos_token_id", "271"});
  }
  {
    TokenizerData d = SpmData();
    d.eos = -7;
    ExpectError(d, StatusCode::kInvalidArgument, {"eos_token_id", "-7"});
  }
  {
    TokenizerData d = Gpt2Base();
    d.merges = {"ab"};
    ExpectError(d, StatusCode::kInvalidArgument, {"merges[0]", "ab"});
  }
  {
    TokenizerData d = Gpt2Base();
    AddMerge(&d, "a", "b");
    d.merges.push_back("a zz");
    ExpectError(d, StatusCode::kInvalidArgument, {"merges[1]", "zz"});
  }
  {
    TokenizerData d = Gpt2Base();
    d.merges = {"a b"};  // "ab" itself is not in the vocabulary
    ExpectError(d, StatusCode::kInvalidArgument, {"merges[0]", "\"ab\""});
  }
  {
    TokenizerData d = Gpt2Base();
    d.tokens[0x41] = "zz";  // byte 'A' lost, and no merges
    ExpectError(d, StatusCode::kInvalidArgument, {"0x41"});
  }
}

TEST(TokenizerErrors, CheckId) {
  auto tok = MustBuild(SpmData());
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->CheckId(0).ok());
  EXPECT_TRUE(tok->CheckId(270).ok());
  const Status s = tok->CheckId(271);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("271"), std::string::npos) << s.message();
  EXPECT_NE(tok->CheckId(-1).message().find("-1"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// GGUF metadata

void PutTokenizer(const TokenizerData& d, GgufWriter* w) {
  w->Set("tokenizer.ggml.model", GgufValue::String(d.model));
  w->Set("tokenizer.ggml.tokens", GgufValue::StringArray(d.tokens));
  if (!d.scores.empty()) w->Set("tokenizer.ggml.scores", GgufValue::F32Array(d.scores));
  if (!d.token_types.empty()) {
    w->Set("tokenizer.ggml.token_type", GgufValue::I32Array(d.token_types));
  }
  if (!d.merges.empty()) w->Set("tokenizer.ggml.merges", GgufValue::StringArray(d.merges));
  if (d.bos >= 0) w->Set("tokenizer.ggml.bos_token_id", GgufValue::U32(d.bos));
  if (d.eos >= 0) w->Set("tokenizer.ggml.eos_token_id", GgufValue::U32(d.eos));
  if (d.unk >= 0) w->Set("tokenizer.ggml.unknown_token_id", GgufValue::U32(d.unk));
  w->Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(d.add_bos));
  w->Set("tokenizer.ggml.add_space_prefix", GgufValue::Bool(d.add_space_prefix));
  w->Set("tokenizer.ggml.pre", GgufValue::String(d.pre.empty() ? "default" : d.pre));
}

// Parses a GGUF image; skips the test while the GGUF reader is still a stub (Unimplemented).
#define LOAD_GGUF_OR_SKIP(var, writer)                                                   \
  auto var##_or = GgufFile::FromBuffer((writer).ToBytes());                              \
  if (!var##_or.ok() && var##_or.status().code() == StatusCode::kUnimplemented) {        \
    GTEST_SKIP() << "GGUF reader not implemented yet: " << var##_or.status().ToString(); \
  }                                                                                      \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status().ToString();                            \
  const GgufFile& var = *var##_or.value()

TEST(TokenizerGguf, FromGgufMatchesFromData) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (const TokenizerData& d : {SpmData(), TrainGpt2(kCorpus, 80)}) {
    GgufWriter w;
    w.Set("general.architecture", GgufValue::String("llama"));
    PutTokenizer(d, &w);
    LOAD_GGUF_OR_SKIP(f, w);
    auto from_gguf = Tokenizer::FromGguf(f);
    ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().ToString();
    auto direct = MustBuild(d);
    ASSERT_NE(direct, nullptr);
    const Tokenizer& t = **from_gguf;
    EXPECT_EQ(t.kind(), direct->kind());
    EXPECT_EQ(t.vocab_size(), direct->vocab_size());
    EXPECT_EQ(t.bos_id(), d.bos);
    EXPECT_EQ(t.eos_id(), d.eos);
    EXPECT_EQ(t.add_bos(), d.add_bos);
    for (int i = 0; i < 200; ++i) {
      const std::string text = i % 2 ? RandomUtf8(rng, 30) : RandomAscii(rng, 40);
      ASSERT_EQ(t.Encode(text, true), direct->Encode(text, true)) << "seed " << seed;
    }
  }
}

TEST(TokenizerGguf, ErrorsNameTheKey) {
  {
    GgufWriter w;
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray({"a"}));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("tokenizer.ggml.model"), std::string::npos)
        << t.status().ToString();
  }
  {
    GgufWriter w;
    TokenizerData d = SpmData();
    PutTokenizer(d, &w);
    w.Set("tokenizer.ggml.bos_token_id", GgufValue::U32(5000));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("bos_token_id"), std::string::npos)
        << t.status().ToString();
    EXPECT_NE(t.status().message().find("5000"), std::string::npos);
  }
  {
    // Absent optional keys take llama.cpp's "llama" defaults: bos 1, eos 2, unk 0.
    GgufWriter w;
    TokenizerData d = SpmData();
    w.Set("tokenizer.ggml.model", GgufValue::String("llama"));
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(d.tokens));
    w.Set("tokenizer.ggml.scores", GgufValue::F32Array(d.scores));
    w.Set("tokenizer.ggml.token_type", GgufValue::I32Array(d.token_types));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->bos_id(), 1);
    EXPECT_EQ((*t)->eos_id(), 2);
    EXPECT_EQ((*t)->unk_id(), 0);
    EXPECT_TRUE((*t)->add_bos());
    EXPECT_EQ((*t)->Encode("the", true), (std::vector<int32_t>{1, 265}));
  }
}

// "No EOS" must survive the trip tokenizer JSON -> GGUF -> Tokenizer: an eos_token_id of -1 that
// was dropped from the GGUF took llama.cpp's default eos 2, which on the testbeds is the needle
// value <v0> (generation stopped at the answer). It is written as u32 0xFFFFFFFF.
TEST(TokenizerGguf, JsonEosMinusOneMeansNone) {
  const TokenizerData d = SpmData();
  const std::string path = ::testing::TempDir() + "/strata_tokenizer_no_eos.json";
  auto write_json = [&](const std::string& eos) {
    std::string tokens;
    for (const std::string& t : d.tokens) {
      std::string q;
      for (char c : t) {
        if (c == '"' || c == '\\') q += '\\';
        q += c;
      }
      tokens += (tokens.empty() ? "\"" : ",\"") + q + "\"";
    }
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "{\"model\": \"llama\", \"tokens\": [%s], \"bos_token_id\": 0, "
                 "\"eos_token_id\": %s}", tokens.c_str(), eos.c_str());
    std::fclose(f);
  };
  {
    write_json("-1");
    GgufWriter w;
    ASSERT_TRUE(AddTokenizerJson(path, &w).ok());
    LOAD_GGUF_OR_SKIP(f, w);
    // As u32 0xFFFFFFFF (LLAMA_TOKEN_NULL's bits): llama.cpp refuses a special-token id that is
    // not u32 (issue 17 part 5).
    const GgufValue* eos = f.Find("tokenizer.ggml.eos_token_id");
    ASSERT_NE(eos, nullptr);
    EXPECT_EQ(eos->type, GgufType::kU32);
    EXPECT_EQ(f.GetInt("tokenizer.ggml.eos_token_id").value(), 0xFFFFFFFFll);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eos_id(), -1);
    EXPECT_EQ((*t)->bos_id(), 0);
  }
  {
    // Files Strata wrote before that carry a signed -1; both mean none.
    GgufWriter w;
    w.Set("tokenizer.ggml.model", GgufValue::String("llama"));
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(d.tokens));
    w.Set("tokenizer.ggml.eos_token_id", GgufValue::I32(-1));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eos_id(), -1);
  }
  {
    // Only the u32 image of -1 means none: a large u32 id past the vocabulary is still refused.
    GgufWriter w;
    w.Set("tokenizer.ggml.model", GgufValue::String("llama"));
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(d.tokens));
    w.Set("tokenizer.ggml.eos_token_id", GgufValue::U32(0xFFFFFFFEu));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("4294967294"), std::string::npos) << t.status().ToString();
  }
  {
    write_json("3");
    GgufWriter w;
    ASSERT_TRUE(AddTokenizerJson(path, &w).ok());
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eos_id(), 3);
  }
  {
    write_json("-7");
    GgufWriter w;
    const Status st = AddTokenizerJson(path, &w);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("eos_token_id"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("-7"), std::string::npos) << st.ToString();
  }
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// Special tokens: end-of-generation set, rendering in Decode, chat template metadata

// Gpt2Base plus control tokens (ids 257...), each typed control.
TokenizerData Gpt2WithControls(const std::vector<std::string>& controls) {
  TokenizerData d = Gpt2Base();
  for (const std::string& c : controls) {
    d.tokens.push_back(c);
    d.token_types.push_back(3);
  }
  return d;
}

TEST(TokenizerSpecial, EogSetFromIdsAndKnownTexts) {
  // 257 <|im_start|>, 258 <|im_end|>, 259 <|fim_pad|>, 260 <|repo_name|>, 261 <|file_sep|>,
  // 262 <|eot_id|>, 263 <custom_eot>, 264 <custom_eom>, 265 <｜end▁of▁sentence｜>, 266 [EOS].
  TokenizerData d = Gpt2WithControls({"<|im_start|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>",
                                      "<|file_sep|>", "<|eot_id|>", "<custom_eot>", "<custom_eom>",
                                      "<｜end▁of▁sentence｜>", "[EOS]"});
  d.eos = 256;  // <|endoftext|>, also a known text
  d.eot = 263;
  d.eom = 264;
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->eog_ids(),
            (std::vector<int32_t>{256, 258, 259, 260, 261, 262, 263, 264, 265, 266}));
  for (const int32_t id : tok->eog_ids()) EXPECT_TRUE(tok->IsEog(id)) << id;
  EXPECT_FALSE(tok->IsEog(257));  // <|im_start|> opens a turn
  EXPECT_FALSE(tok->IsEog('a'));
  EXPECT_FALSE(tok->IsEog(-1));
  EXPECT_FALSE(tok->IsEog(100000));

  // Without EOS and any known text, only the given ids end generation; a FIM id given by its key
  // replaces the one found by text.
  TokenizerData e = Gpt2WithControls({"<a>", "<b>", "<|fim_pad|>"});
  e.bos = e.eos = -1;
  e.tokens[256] = "<|begin|>";
  e.eot = 258;
  e.fim_pad = 257;
  auto tok2 = MustBuild(e);
  ASSERT_NE(tok2, nullptr);
  EXPECT_EQ(tok2->eog_ids(), (std::vector<int32_t>{257, 258}));
}

TEST(TokenizerSpecial, EogExceptionsFollowLlamaCpp) {
  // gpt-oss: with <|return|> and <|call|>, <|end|> ends a message, not the generation.
  auto harmony = MustBuild(Gpt2WithControls({"<|end|>", "<|return|>", "<|call|>"}));
  ASSERT_NE(harmony, nullptr);
  EXPECT_FALSE(harmony->IsEog(257));
  EXPECT_TRUE(harmony->IsEog(258));
  EXPECT_TRUE(harmony->IsEog(259));
  auto phi = MustBuild(Gpt2WithControls({"<|end|>"}));
  ASSERT_NE(phi, nullptr);
  EXPECT_TRUE(phi->IsEog(257));
  // Gemma 4: with <|tool_response>, </s> is not an end of generation.
  auto gemma = MustBuild(Gpt2WithControls({"</s>", "<|tool_response>"}));
  ASSERT_NE(gemma, nullptr);
  EXPECT_FALSE(gemma->IsEog(257));
  EXPECT_TRUE(gemma->IsEog(258));
  auto plain = MustBuild(Gpt2WithControls({"</s>"}));
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE(plain->IsEog(257));
}

TEST(TokenizerSpecial, EogIdsAreValidated) {
  TokenizerData d = Gpt2Base();
  d.eot = 257;  // one past the vocabulary
  auto t = Tokenizer::FromData(d);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.ggml.eot_token_id = 257"), std::string::npos)
      << t.status().ToString();
  d.eot = -1;
  d.fim_sep = -2;
  t = Tokenizer::FromData(d);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("fim_sep_token_id = -2"), std::string::npos)
      << t.status().ToString();
}

TEST(TokenizerSpecial, DecodeRendersOrHidesControlTokens) {
  TokenizerData d = Gpt2WithControls({"<|im_start|>", "<|im_end|>"});
  auto tok = MustBuild(d);
  ASSERT_NE(tok, nullptr);
  const std::string text = "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>";
  const std::vector<int32_t> ids = tok->Encode(text, false, true);
  ASSERT_EQ(ids.front(), 257);
  EXPECT_EQ(tok->Decode(ids, /*render_special=*/true), text);
  EXPECT_EQ(tok->Decode(ids, /*render_special=*/false), "user\nHi there\n");
  EXPECT_EQ(tok->Decode(ids), "user\nHi there\n");
  EXPECT_EQ(tok->DecodeToken(258, true), "<|im_end|>");
  EXPECT_EQ(tok->DecodeToken(258, false), "");
  EXPECT_EQ(tok->DecodeToken('a', true), "a");
  EXPECT_EQ(tok->DecodeToken(-3, true), "");
  EXPECT_EQ(tok->Decode({-3, 257, 99999}, true), "<|im_start|>");

  // SentencePiece: BOS, EOS and <unk> print their text; the space prefix Encode adds after a
  // special token is taken out again, so rendering round-trips.
  auto spm = MustBuild(SpmData());
  ASSERT_NE(spm, nullptr);
  EXPECT_EQ(spm->Decode(spm->Encode("the</s>the", true, true), true), "<s>the</s>the");
  EXPECT_EQ(spm->Decode(spm->Encode("the</s> the", false, true), true), "the</s> the");
  EXPECT_EQ(spm->Decode({1, 265, 2}, false), "the");
  EXPECT_EQ(spm->DecodeToken(0, true), "<unk>");
  EXPECT_EQ(spm->DecodeToken(0, false), "");
  EXPECT_EQ(spm->DecodeToken(1, true), "<s>");
}

TEST(TokenizerSpecial, RenderedDecodeRoundTripsTextWithSpecials) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  TokenizerData gd = TrainGpt2(kCorpus, 60);
  for (const std::string c : {"<|im_start|>", "<|im_end|>"}) {
    gd.tokens.push_back(c);
    gd.token_types.push_back(3);
  }
  auto gpt2 = MustBuild(gd);
  auto spm = MustBuild(SpmData());
  ASSERT_NE(gpt2, nullptr);
  ASSERT_NE(spm, nullptr);
  const std::vector<std::string> gpt2_specials = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  const std::vector<std::string> spm_specials = {"<s>", "</s>", "<unk>"};
  for (int i = 0; i < 300; ++i) {
    const bool use_spm = i % 2;
    const Tokenizer& tok = use_spm ? *spm : *gpt2;
    const auto& specials = use_spm ? spm_specials : gpt2_specials;
    std::string text;
    const int parts = 1 + static_cast<int>(rng.Below(4));
    for (int p = 0; p < parts; ++p) {
      if (rng.Below(2)) text += specials[rng.Below(specials.size())];
      text += use_spm ? RandomAscii(rng, 12) : RandomUtf8(rng, 12);
    }
    const std::vector<int32_t> ids = tok.Encode(text, false, true);
    ASSERT_EQ(tok.Decode(ids, true), text) << "seed " << seed << " case " << i << Show(ids);
  }
}

TEST(TokenizerSpecial, GgufKeysForEogAndChatTemplate) {
  TokenizerData d = Gpt2WithControls({"<my_eot>", "<my_eom>", "<my_pad>"});
  const std::string tmpl = "{% for message in messages %}{{ message['content'] }}{% endfor %}";
  {
    GgufWriter w;
    PutTokenizer(d, &w);
    w.Set("tokenizer.ggml.eot_token_id", GgufValue::U32(257));
    w.Set("tokenizer.ggml.eom_token_id", GgufValue::U32(258));
    w.Set("tokenizer.ggml.fim_pad_token_id", GgufValue::U32(259));
    w.Set("tokenizer.ggml.fim_rep_token_id", GgufValue::U32(0xFFFFFFFFu));  // none
    w.Set("tokenizer.chat_template", GgufValue::String(tmpl));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eog_ids(), (std::vector<int32_t>{256, 257, 258, 259}));
    EXPECT_EQ((*t)->chat_template(), tmpl);
  }
  {
    GgufWriter w;
    PutTokenizer(d, &w);
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eog_ids(), (std::vector<int32_t>{256}));
    EXPECT_EQ((*t)->chat_template(), "");
  }
  {
    GgufWriter w;
    PutTokenizer(d, &w);
    w.Set("tokenizer.ggml.eom_token_id", GgufValue::U32(9000));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("tokenizer.ggml.eom_token_id = 9000"), std::string::npos)
        << t.status().ToString();
  }
  {
    GgufWriter w;
    PutTokenizer(d, &w);
    w.Set("tokenizer.chat_template", GgufValue::U32(3));
    LOAD_GGUF_OR_SKIP(f, w);
    auto t = Tokenizer::FromGguf(f);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("tokenizer.chat_template"), std::string::npos)
        << t.status().ToString();
  }
}

}  // namespace
}  // namespace strata
