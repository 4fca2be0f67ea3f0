// Tokenizer: SentencePiece-style BPE over scores ("llama") and GPT-2 byte-level BPE over merge
// ranks ("gpt2"), following llama.cpp's llm_tokenizer_spm / llm_tokenizer_bpe.
#include "io/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <list>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/check.h"
#include "io/gguf.h"

namespace strata {
namespace {

constexpr const char kSpmSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's word marker

// Length of the UTF-8 sequence led by `c` without validation (llama.cpp's unicode_len_utf8):
// continuation bytes count as 1 so that stray bytes still advance.
size_t Utf8SeqLen(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// One code point of the input with its byte span. Invalid UTF-8 yields one-byte units with
// cp = kInvalidCp so the bytes survive pre-tokenization unchanged.
struct CodeUnit {
  uint32_t cp;
  size_t begin, len;
};
constexpr uint32_t kInvalidCp = 0xFFFFFFFFu;

std::vector<CodeUnit> DecodeUtf8(const std::string& s) {
  std::vector<CodeUnit> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    size_t len = 0;
    uint32_t cp = 0, min_cp = 0;
    if (c < 0x80) {
      len = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back({kInvalidCp, i, 1});
      ++i;
    } else {
      out.push_back({cp, i, len});
      i += len;
    }
  }
  return out;
}

// ---- Unicode classes (approximation, see the header comment) ----

struct CpRange {
  uint32_t lo, hi;  // inclusive
};

// Sorted, non-overlapping.
constexpr CpRange kNumberRanges[] = {
    {0x30, 0x39},       {0xB2, 0xB3},       {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
    {0x6F0, 0x6F9},     {0x7C0, 0x7C9},     {0x966, 0x96F},   {0x9E6, 0x9EF},   {0xA66, 0xA6F},
    {0xAE6, 0xAEF},     {0xB66, 0xB6F},     {0xBE6, 0xBF2},   {0xC66, 0xC6F},   {0xCE6, 0xCEF},
    {0xD66, 0xD78},     {0xE50, 0xE59},     {0xED0, 0xED9},   {0xF20, 0xF33},   {0x1040, 0x1049},
    {0x17E0, 0x17E9},   {0x1810, 0x1819},   {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
    {0x2150, 0x2182},   {0x2185, 0x2189},   {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793},
    {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229},
    {0x3248, 0x324F},   {0x3251, 0x325F},   {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xFF10, 0xFF19},
    {0x1D7CE, 0x1D7FF}, {0x1F100, 0x1F10C},
};

constexpr CpRange kLetterRanges[] = {
    {0x41, 0x5A},     {0x61, 0x7A},       {0xAA, 0xAA},     {0xB5, 0xB5},     {0xBA, 0xBA},
    {0xC0, 0xD6},     {0xD8, 0xF6},       {0xF8, 0x2C1},    {0x2C6, 0x2D1},   {0x2E0, 0x2E4},
    {0x2EC, 0x2EC},   {0x2EE, 0x2EE},     {0x370, 0x374},   {0x376, 0x377},   {0x37A, 0x37D},
    {0x37F, 0x37F},   {0x386, 0x386},     {0x388, 0x3F5},   {0x3F7, 0x481},   {0x48A, 0x52F},
    {0x531, 0x556},   {0x559, 0x559},     {0x560, 0x588},   {0x5D0, 0x5EA},   {0x5EF, 0x5F2},
    {0x620, 0x64A},   {0x66E, 0x66F},     {0x671, 0x6D3},   {0x6D5, 0x6D5},   {0x6E5, 0x6E6},
    {0x6EE, 0x6EF},   {0x6FA, 0x6FC},     {0x6FF, 0x6FF},   {0x710, 0x710},   {0x712, 0x72F},
    {0x74D, 0x7A5},   {0x904, 0x939},     {0x93D, 0x93D},   {0x950, 0x950},   {0x958, 0x961},
    {0x971, 0x980},   {0x985, 0x9B9},     {0xA05, 0xA39},   {0xA85, 0xAB9},   {0xB05, 0xB39},
    {0xB85, 0xBB9},   {0xC05, 0xC39},     {0xC85, 0xCB9},   {0xD05, 0xD3A},   {0xE01, 0xE30},
    {0xE32, 0xE33},   {0xE40, 0xE46},     {0x10A0, 0x10C5}, {0x10D0, 0x10FA}, {0x10FC, 0x10FF},
    {0x1100, 0x11FF}, {0x1E00, 0x1F15},   {0x1F18, 0x1FBC}, {0x1FC2, 0x1FCC}, {0x1FD0, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FFC},   {0x2C00, 0x2CE4}, {0x3005, 0x3006}, {0x3031, 0x3035},
    {0x3041, 0x3096}, {0x309D, 0x309F},   {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F},
    {0x3131, 0x318E}, {0x31A0, 0x31BF},   {0x31F0, 0x31FF}, {0x3400, 0x4DBF}, {0x4E00, 0x9FFF},
    {0xA000, 0xA48C}, {0xAC00, 0xD7A3},   {0xF900, 0xFAFF}, {0xFB00, 0xFB06}, {0xFB1D, 0xFB28},
    {0xFB2A, 0xFBB1}, {0xFBD3, 0xFD3D},   {0xFE70, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A},
    {0xFF66, 0xFFDC}, {0x20000, 0x323AF},
};

constexpr CpRange kSpaceRanges[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

template <size_t N>
bool InRanges(const CpRange (&ranges)[N], uint32_t cp) {
  const CpRange* it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                                       [](uint32_t v, const CpRange& r) { return v < r.lo; });
  if (it == std::begin(ranges)) return false;
  --it;
  return cp <= it->hi;
}

enum class CpClass : uint8_t { kOther, kLetter, kNumber, kSpace, kNone };

CpClass Classify(uint32_t cp) {
  if (cp == kInvalidCp) return CpClass::kOther;
  if (InRanges(kSpaceRanges, cp)) return CpClass::kSpace;
  if (InRanges(kNumberRanges, cp)) return CpClass::kNumber;
  if (InRanges(kLetterRanges, cp)) return CpClass::kLetter;
  return CpClass::kOther;
}

// GPT-2 pre-tokenizer, transcribed from llama.cpp's unicode_regex_split_custom_gpt2. Returns the
// end index (in units) of every piece.
std::vector<size_t> SplitGpt2(const std::vector<CodeUnit>& units) {
  const size_t n = units.size();
  std::vector<CpClass> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = Classify(units[i].cp);
  auto cpt = [&](size_t pos) -> uint32_t { return pos < n ? units[pos].cp : kInvalidCp - 1; };
  auto flags = [&](size_t pos) -> CpClass { return pos < n ? cls[pos] : CpClass::kNone; };
  std::vector<size_t> ends;
  auto add = [&](size_t end) {
    if (ends.empty() ? end > 0 : end > ends.back()) ends.push_back(end);
  };
  size_t pos = 0;
  while (pos < n) {
    const uint32_t c = cpt(pos);
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'' && pos + 1 < n) {
      const uint32_t c1 = cpt(pos + 1);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        add(pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < n) {
        const uint32_t c2 = cpt(pos + 2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          add(pos + 3);
          pos += 3;
          continue;
        }
      }
    }
    const CpClass f2 = c == ' ' ? flags(pos + 1) : flags(pos);
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    if (f2 == CpClass::kLetter || f2 == CpClass::kNumber || f2 == CpClass::kOther) {
      pos += (c == ' ');
      while (flags(pos) == f2) ++pos;
      add(pos);
      continue;
    }
    size_t n_ws = 0;
    while (flags(pos + n_ws) == CpClass::kSpace) ++n_ws;
    // \s+(?!\S): leave the last whitespace to prefix the next piece
    if (n_ws > 1 && pos + n_ws < n) {
      pos += n_ws - 1;
      add(pos);
      continue;
    }
    if (n_ws > 0) {  // \s+
      pos += n_ws;
      add(pos);
      continue;
    }
    add(++pos);  // no match
  }
  return ends;
}

// A symbol of the merge loop: a byte span [begin, begin+n) of the working string, linked to its
// live neighbours. n == 0 once merged into its left neighbour.
struct Symbol {
  int prev, next;
  size_t begin, n;
};

void LinkSymbols(std::vector<Symbol>* symbols) {
  const int count = static_cast<int>(symbols->size());
  for (int i = 0; i < count; ++i) {
    (*symbols)[i].prev = i - 1;
    (*symbols)[i].next = i + 1 < count ? i + 1 : -1;
  }
}

void MergeInto(std::vector<Symbol>* symbols, int left, int right) {
  Symbol& l = (*symbols)[left];
  Symbol& r = (*symbols)[right];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) (*symbols)[r.next].prev = left;
}

// Transparent hash so that lookups by string_view do not allocate.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

struct PairHash {
  size_t operator()(const std::pair<std::string, std::string>& p) const {
    const size_t a = std::hash<std::string>()(p.first);
    const size_t b = std::hash<std::string>()(p.second);
    return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  }
};

// Parses "<0xNN>" into NN, or -1.
int ParseByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const uint8_t c = static_cast<uint8_t>(ch);
    if (c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

}  // namespace

struct Tokenizer::Impl {
  Kind kind = Kind::kSentencePiece;
  std::vector<std::string> tokens;
  std::vector<float> scores;     // [n_vocab]
  std::vector<TokenType> types;  // [n_vocab]
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id;
  std::unordered_map<std::pair<std::string, std::string>, int32_t, PairHash> merge_rank;
  std::array<int32_t, 256> byte_token{};  // SPM: id of <0xNN> (or of the raw byte), -1 if none
  std::array<std::string, 256> byte_to_unicode;  // GPT-2 map: byte -> UTF-8 of its code point
  std::vector<int16_t> unicode_to_byte;          // code point -> byte, -1 if none
  std::vector<int32_t> special_ids;              // control/unknown/user-defined, longest text first
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_space_prefix = false;
  std::string pre;

  int32_t Find(std::string_view s) const {
    const auto it = token_to_id.find(s);
    return it == token_to_id.end() ? -1 : it->second;
  }

  void EncodeSpm(const std::string& raw, bool prefix_space, std::vector<int32_t>* out) const;
  void EncodeGpt2(const std::string& raw, std::vector<int32_t>* out) const;
  void BpeWord(const std::string& word, std::vector<int32_t>* out) const;
  // Appends the printed text of `id`; false when it prints nothing.
  void AppendPiece(int32_t id, std::string* out) const;
};

// ---- SentencePiece (llm_tokenizer_spm) ----

void Tokenizer::Impl::EncodeSpm(const std::string& raw, bool prefix_space,
                                std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() * 2 + 3);
  if (prefix_space) text += kSpmSpace;
  for (const char c : raw) {
    if (c == ' ') {
      text += kSpmSpace;
    } else {
      text.push_back(c);
    }
  }
  if (text.empty()) return;

  // One symbol per UTF-8 character. llama.cpp splits by the lead byte's length alone; splitting
  // on validated characters is the same for valid UTF-8 and keeps a stray byte from swallowing
  // the following U+2581 (which would then decode as the marker instead of a space).
  std::vector<Symbol> symbols;
  for (const CodeUnit& u : DecodeUtf8(text)) symbols.push_back({0, 0, u.begin, u.len});
  LinkSymbols(&symbols);

  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  // Highest score first; ties: leftmost first.
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = Find(std::string_view(text).substr(symbols[left].begin, size));
    if (id < 0) return;
    queue.push({left, right, scores[id], size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    MergeInto(&symbols, b.left, b.right);
    try_add(symbols[b.left].prev, b.left);
    try_add(b.left, symbols[b.left].next);
  }

  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string piece = text.substr(s.begin, s.n);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Not in the vocabulary (only unmerged characters reach here): byte fallback, else unk.
    for (const char c : piece) {
      const int32_t b = byte_token[static_cast<uint8_t>(c)];
      if (b >= 0) {
        out->push_back(b);
      } else if (unk >= 0) {
        out->push_back(unk);
      }
    }
  }
}

// ---- GPT-2 byte-level BPE (llm_tokenizer_bpe) ----

void Tokenizer::Impl::BpeWord(const std::string& word, std::vector<int32_t>* out) const {
  // `word` is already in byte-unicode form: every UTF-8 character stands for one input byte.
  std::vector<Symbol> symbols;
  for (size_t offs = 0; offs < word.size();) {
    const size_t len = std::min(Utf8SeqLen(static_cast<uint8_t>(word[offs])), word.size() - offs);
    symbols.push_back({0, 0, offs, len});
    offs += len;
  }
  LinkSymbols(&symbols);

  struct Bigram {
    int left, right;
    int32_t rank;
    std::string text;
  };
  // Lowest rank first; ties: leftmost first.
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::pair<std::string, std::string> key(word.substr(symbols[left].begin, symbols[left].n),
                                            word.substr(symbols[right].begin, symbols[right].n));
    const auto it = merge_rank.find(key);
    if (it == merge_rank.end()) return;
    queue.push({left, right, it->second, key.first + key.second});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.text.size() ||
        word.compare(l.begin, b.text.size(), b.text) != 0) {
      continue;  // stale
    }
    MergeInto(&symbols, b.left, b.right);
    try_add(symbols[b.left].prev, b.left);
    try_add(b.left, symbols[b.left].next);
  }

  for (int i = 0; i != -1 && !symbols.empty(); i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string piece = word.substr(s.begin, s.n);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Fall back to one token per byte-character (llama.cpp looks up single bytes of the UTF-8,
    // which loses non-ASCII bytes; looking up whole characters keeps them).
    for (size_t offs = 0; offs < piece.size();) {
      const size_t len =
          std::min(Utf8SeqLen(static_cast<uint8_t>(piece[offs])), piece.size() - offs);
      const int32_t cid = Find(std::string_view(piece).substr(offs, len));
      if (cid >= 0) {
        out->push_back(cid);
      } else if (unk >= 0) {
        out->push_back(unk);
      }
      offs += len;
    }
  }
}

void Tokenizer::Impl::EncodeGpt2(const std::string& raw, std::vector<int32_t>* out) const {
  const std::vector<CodeUnit> units = DecodeUtf8(raw);
  const std::vector<size_t> ends = SplitGpt2(units);
  size_t start = 0;
  std::string word;
  for (const size_t end : ends) {
    word.clear();
    for (size_t u = start; u < end; ++u) {
      for (size_t k = 0; k < units[u].len; ++k) {
        word += byte_to_unicode[static_cast<uint8_t>(raw[units[u].begin + k])];
      }
    }
    BpeWord(word, out);
    start = end;
  }
}

void Tokenizer::Impl::AppendPiece(int32_t id, std::string* out) const {
  if (id < 0 || id >= static_cast<int32_t>(tokens.size())) return;
  const std::string& text = tokens[id];
  switch (types[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUnused:
      return;
    case TokenType::kUserDefined:
      *out += text;
      return;
    case TokenType::kByte:
      if (kind == Kind::kSentencePiece) {
        const int b = ParseByteToken(text);
        if (b >= 0) {
          out->push_back(static_cast<char>(b));
        } else {
          *out += text;
        }
        return;
      }
      break;  // gpt2: decode like a normal token
    default:
      break;
  }
  if (kind == Kind::kSentencePiece) {
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, kSpmSpace) == 0) {
        out->push_back(' ');
        i += 3;
      } else {
        out->push_back(text[i++]);
      }
    }
    return;
  }
  for (const CodeUnit& u : DecodeUtf8(text)) {
    const int b = u.cp < unicode_to_byte.size() ? unicode_to_byte[u.cp] : -1;
    if (b >= 0) {
      out->push_back(static_cast<char>(b));
    } else {
      out->append(text, u.begin, u.len);  // not a byte-level character: print as is
    }
  }
}

// ---- Construction ----

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromData(TokenizerData data) {
  auto impl = std::make_shared<Impl>();
  if (data.model == "llama") {
    impl->kind = Kind::kSentencePiece;
  } else if (data.model == "gpt2") {
    impl->kind = Kind::kBytePairGpt2;
  } else {
    return Unimplemented("tokenizer.ggml.model = " + Quote(data.model) +
                         " is not supported (expected \"llama\" or \"gpt2\")");
  }
  const size_t n = data.tokens.size();
  if (n == 0) return InvalidArgument("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgument("tokenizer.ggml.tokens has " + std::to_string(n) +
                           " entries, more than int32 ids can address");
  }
  const int32_t n_vocab = static_cast<int32_t>(n);
  if (!data.scores.empty() && data.scores.size() != n) {
    return InvalidArgument("tokenizer.ggml.scores has " + std::to_string(data.scores.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!data.token_types.empty() && data.token_types.size() != n) {
    return InvalidArgument("tokenizer.ggml.token_type has " +
                           std::to_string(data.token_types.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  const std::pair<const char*, int32_t> specials[] = {
      {"tokenizer.ggml.bos_token_id", data.bos},
      {"tokenizer.ggml.eos_token_id", data.eos},
      {"tokenizer.ggml.unknown_token_id", data.unk},
      {"tokenizer.ggml.padding_token_id", data.pad},
      {"tokenizer.ggml.eot_token_id", data.eot},
      {"tokenizer.ggml.eom_token_id", data.eom},
      {"tokenizer.ggml.fim_pad_token_id", data.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", data.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", data.fim_sep},
  };
  for (const auto& [key, id] : specials) {
    if (id < -1 || id >= n_vocab) {
      return InvalidArgument(std::string(key) + " = " + std::to_string(id) +
                             " is out of range for a vocabulary of " + std::to_string(n) +
                             " tokens");
    }
  }

  impl->scores = data.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(data.scores);
  impl->types.resize(n, TokenType::kNormal);
  if (!data.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = data.token_types[i];
      if (t < 0 || t > 6) {
        return InvalidArgument("tokenizer.ggml.token_type[" + std::to_string(i) +
                               "] = " + std::to_string(t) + " is not a token type (0..6)");
      }
      impl->types[i] = static_cast<TokenType>(t);
    }
  } else {
    // No types stored: infer what decoding needs.
    for (size_t i = 0; i < n; ++i) {
      if (impl->kind == Kind::kSentencePiece && ParseByteToken(data.tokens[i]) >= 0) {
        impl->types[i] = TokenType::kByte;
      }
    }
    for (const int32_t id : {data.bos, data.eos, data.pad, data.eot, data.eom}) {
      if (id >= 0) impl->types[id] = TokenType::kControl;
    }
    if (data.unk >= 0) impl->types[data.unk] = TokenType::kUnknown;
  }

  impl->token_to_id.reserve(n * 2);
  for (int32_t i = 0; i < n_vocab; ++i) impl->token_to_id[data.tokens[i]] = i;  // last wins

  impl->byte_token.fill(-1);
  if (impl->kind == Kind::kSentencePiece) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      int32_t id = impl->Find(buf);
      if (id < 0) id = impl->Find(std::string(1, static_cast<char>(b)));
      impl->byte_token[b] = id;
    }
  }

  // GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256 + k.
  impl->unicode_to_byte.assign(256 + 68, -1);
  {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 256 + next++;
      AppendUtf8(cp, &impl->byte_to_unicode[b]);
      impl->unicode_to_byte[cp] = static_cast<int16_t>(b);
    }
  }

  if (impl->kind == Kind::kBytePairGpt2) {
    for (size_t r = 0; r < data.merges.size(); ++r) {
      const std::string& m = data.merges[r];
      const size_t sp = m.find(' ', 1);
      const std::string where = "tokenizer.ggml.merges[" + std::to_string(r) + "] = " + Quote(m);
      if (m.empty() || sp == std::string::npos || sp + 1 >= m.size() ||
          m.find(' ', sp + 1) != std::string::npos) {
        return InvalidArgument(where + " is not of the form \"left right\"");
      }
      std::string left = m.substr(0, sp), right = m.substr(sp + 1);
      for (const std::string* part : {&left, &right}) {
        if (impl->Find(*part) < 0) {
          return InvalidArgument(where + ": " + Quote(*part) + " is not in the vocabulary");
        }
      }
      if (impl->Find(left + right) < 0) {
        return InvalidArgument(where + ": merged token " + Quote(left + right) +
                               " is not in the vocabulary");
      }
      impl->merge_rank.emplace(std::make_pair(std::move(left), std::move(right)),
                               static_cast<int32_t>(r));  // first (lowest) rank wins
    }
    if (data.merges.empty()) {
      for (int b = 0; b < 256; ++b) {
        if (impl->Find(impl->byte_to_unicode[b]) < 0) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "0x%02X", b);
          return InvalidArgument(
              std::string("gpt2 tokenizer has no tokenizer.ggml.merges and lacks the token for "
                          "byte ") +
              buf + " (" + Quote(impl->byte_to_unicode[b]) + ")");
        }
      }
    }
  }

  for (int32_t i = 0; i < n_vocab; ++i) {
    const TokenType t = impl->types[i];
    if ((t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) &&
        !data.tokens[i].empty()) {
      impl->special_ids.push_back(i);
    }
  }
  std::stable_sort(impl->special_ids.begin(), impl->special_ids.end(), [&](int32_t a, int32_t b) {
    return data.tokens[a].size() > data.tokens[b].size();
  });

  impl->bos = data.bos;
  impl->eos = data.eos;
  impl->unk = data.unk;
  impl->pad = data.pad;
  impl->add_bos = data.add_bos;
  impl->add_space_prefix = impl->kind == Kind::kSentencePiece && data.add_space_prefix;
  impl->pre = std::move(data.pre);
  impl->tokens = std::move(data.tokens);

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->kind_ = impl->kind;
  tok->vocab_size_ = n_vocab;
  tok->bos_ = impl->bos;
  tok->eos_ = impl->eos;
  tok->add_bos_ = impl->add_bos;
  tok->impl_ = std::move(impl);
  tok->InitSpecialTokens(data);
  return tok;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  TokenizerData d;
  ASSIGN_OR_RETURN(d.model, f.GetString("tokenizer.ggml.model"));
  ASSIGN_OR_RETURN(d.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (f.Has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(d.scores, f.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray("tokenizer.ggml.token_type"));
    d.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < INT32_MIN || types[i] > INT32_MAX) {
        return InvalidArgument("tokenizer.ggml.token_type[" + std::to_string(i) +
                               "] = " + std::to_string(types[i]) + " is not a token type");
      }
      d.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (f.Has("tokenizer.ggml.merges")) {
    ASSIGN_OR_RETURN(d.merges, f.GetStringArray("tokenizer.ggml.merges"));
  }
  const bool spm = d.model == "llama";
  const int64_t n = static_cast<int64_t>(d.tokens.size());
  struct IdKey {
    const char* key;
    int32_t* dst;
    int64_t def;
  };
  // llama.cpp's defaults for "llama" when the keys are absent (and the ids exist).
  const IdKey ids[] = {
      {"tokenizer.ggml.bos_token_id", &d.bos, spm && n > 1 ? 1 : -1},
      {"tokenizer.ggml.eos_token_id", &d.eos, spm && n > 2 ? 2 : -1},
      {"tokenizer.ggml.unknown_token_id", &d.unk, spm && n > 0 ? 0 : -1},
      {"tokenizer.ggml.padding_token_id", &d.pad, -1},
      {"tokenizer.ggml.eot_token_id", &d.eot, -1},
      {"tokenizer.ggml.eom_token_id", &d.eom, -1},
      {"tokenizer.ggml.fim_pad_token_id", &d.fim_pad, -1},
      {"tokenizer.ggml.fim_rep_token_id", &d.fim_rep, -1},
      {"tokenizer.ggml.fim_sep_token_id", &d.fim_sep, -1},
  };
  for (const IdKey& k : ids) {
    int64_t v = k.def;
    if (f.Has(k.key)) {
      ASSIGN_OR_RETURN(v, f.GetInt(k.key));
      // "No such token": a signed -1 (older Strata files) or u32 0xFFFFFFFF, the bits of
      // llama.cpp's LLAMA_TOKEN_NULL, which Strata writes now because llama.cpp reads ids as u32
      // only (it refuses an i32 key; an out-of-range u32 makes it warn and use its default).
      if (v == 0xFFFFFFFFll && f.Find(k.key)->type == GgufType::kU32) v = -1;
    }
    if (v < -1 || v >= n) {
      return InvalidArgument(std::string(k.key) + " = " + std::to_string(v) +
                             " is out of range for a vocabulary of " + std::to_string(n) +
                             " tokens");
    }
    *k.dst = static_cast<int32_t>(v);
  }
  if (f.Has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(d.add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  } else {
    d.add_bos = spm;
  }
  if (f.Has("tokenizer.ggml.add_space_prefix")) {
    ASSIGN_OR_RETURN(d.add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  } else {
    d.add_space_prefix = spm;
  }
  if (f.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(d.pre, f.GetString("tokenizer.ggml.pre"));
  }
  if (f.Has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(d.chat_template, f.GetString("tokenizer.chat_template"));
  }
  return FromData(std::move(d));
}

// ---- Queries ----

int32_t Tokenizer::unk_id() const { return impl_->unk; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return impl_->types[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  STRATA_CHECK_MSG(id >= 0 && id < vocab_size_, "token id %d out of range [0, %d)", id,
                   vocab_size_);
  return impl_->tokens[id];
}

int32_t Tokenizer::TokenId(const std::string& text) const { return impl_->Find(text); }

Status Tokenizer::CheckId(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return InvalidArgument("token id " + std::to_string(id) + " is out of range [0, " +
                           std::to_string(vocab_size()) + ")");
  }
  return OkStatus();
}

// ---- Encode / Decode ----

std::vector<int32_t> Tokenizer::Encode(const std::string& text, bool with_bos) const {
  return Encode(text, with_bos, /*parse_special=*/false);
}

std::vector<int32_t> Tokenizer::Encode(const std::string& text, bool with_bos,
                                       bool parse_special) const {
  const Impl& im = *impl_;
  // Fragments: raw text spans, or a matched special token (llama.cpp's tokenizer_st_partition:
  // special tokens are tried longest first, each splitting every remaining raw fragment).
  struct Fragment {
    int32_t token;  // -1: raw text [begin, begin+len)
    size_t begin, len;
  };
  std::list<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (const int32_t sid : im.special_ids) {
    const TokenType t = im.types[sid];
    if (!parse_special && t != TokenType::kUserDefined) continue;
    const std::string& st = im.tokens[sid];
    for (auto it = frags.begin(); it != frags.end(); ++it) {
      if (it->token >= 0) continue;
      size_t pos = it->begin;
      const size_t end = it->begin + it->len;
      const std::string_view upto_end(text.data(), end);  // search this fragment only
      while (true) {
        const size_t hit = upto_end.find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) frags.insert(it, Fragment{-1, pos, hit - pos});
        frags.insert(it, Fragment{sid, hit, st.size()});
        pos = hit + st.size();
      }
      if (pos == it->begin) continue;  // no match in this fragment
      if (pos < end) {
        it->begin = pos;
        it->len = end - pos;
      } else {
        it = std::prev(frags.erase(it));
      }
    }
  }

  std::vector<int32_t> out;
  if (with_bos && im.add_bos && im.bos >= 0) out.push_back(im.bos);
  bool prev_special = true;  // SPM: the space prefix goes before text that starts a segment
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string raw = text.substr(f.begin, f.len);
    if (im.kind == Kind::kSentencePiece) {
      im.EncodeSpm(raw, im.add_space_prefix && prev_special, &out);
    } else {
      im.EncodeGpt2(raw, &out);
    }
    prev_special = false;
  }
  return out;
}

std::vector<std::string> Tokenizer::SplitGpt2Words(const std::string& text) {
  const std::vector<CodeUnit> units = DecodeUtf8(text);
  std::vector<std::string> words;
  size_t start = 0;
  for (const size_t end : SplitGpt2(units)) {
    const size_t b = units[start].begin;
    const size_t e = units[end - 1].begin + units[end - 1].len;
    words.push_back(text.substr(b, e - b));
    start = end;
  }
  return words;
}

std::string Tokenizer::DecodeToken(int32_t id) const {
  std::string s;
  impl_->AppendPiece(id, &s);
  return s;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  return Decode(ids, /*render_special=*/false);
}

// ---- Special tokens: rendering and end of generation ----

namespace {

// Token texts llama.cpp treats as end of generation whatever the metadata says (llama-vocab.cpp,
// special_eog_ids), and the texts it takes as the FIM pad / repo / file-separator tokens when
// their keys are absent (those end generation too).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",  // DeepSeek
    "[e~[",
};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                        "<reponame>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>"};

}  // namespace

void Tokenizer::InitSpecialTokens(const TokenizerData& data) {
  chat_template_ = data.chat_template;
  const Impl& im = *impl_;
  std::vector<int32_t> eog;
  // A FIM id given by its key wins; otherwise the first listed text the vocabulary has.
  auto fim = [&](int32_t given, const auto& texts) -> int32_t {
    if (given >= 0) return given;
    for (const char* t : texts) {
      if (const int32_t id = im.Find(t); id >= 0) return id;
    }
    return -1;
  };
  for (const int32_t id : {fim(data.fim_pad, kFimPadTexts), fim(data.fim_rep, kFimRepTexts),
                           fim(data.fim_sep, kFimSepTexts), data.eos, data.eot, data.eom}) {
    if (id >= 0) eog.push_back(id);
  }
  for (const char* t : kEogTexts) {
    if (const int32_t id = im.Find(t); id >= 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  // llama.cpp's two exceptions: in the gpt-oss (harmony) and Solar Open vocabularies <|end|>
  // closes a message, not the generation; with Gemma 4's <|tool_response> present, </s> is
  // ordinary.
  auto has = [&](const char* t) {
    const int32_t id = im.Find(t);
    return id >= 0 && std::binary_search(eog.begin(), eog.end(), id);
  };
  auto drop = [&](const char* t) {
    const int32_t id = im.Find(t);
    eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
  };
  if (has("<|end|>") && ((has("<|return|>") && (has("<|call|>") || has("<|calls|>"))) ||
                         ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>")))) {
    drop("<|end|>");
  }
  if (has("<|tool_response>") && has("</s>")) drop("</s>");
  eog_ids_ = std::move(eog);
}

bool Tokenizer::IsEog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::string Tokenizer::DecodeToken(int32_t id, bool render_special) const {
  const TokenType t = token_type(id);
  if (render_special && (t == TokenType::kControl || t == TokenType::kUnknown)) {
    return impl_->tokens[id];
  }
  return DecodeToken(id);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  bool strip = impl_->add_space_prefix;
  for (const int32_t id : ids) {
    const TokenType t = token_type(id);
    if (render_special && (t == TokenType::kControl || t == TokenType::kUnknown)) {
      out += impl_->tokens[id];
      // Encode gave the text after a special token the space prefix again.
      strip = impl_->add_space_prefix;
      continue;
    }
    const size_t before = out.size();
    impl_->AppendPiece(id, &out);
    if (strip && out.size() > before) {
      if (out[before] == ' ') out.erase(before, 1);
      strip = false;
    }
  }
  return out;
}

}  // namespace strata
