// HfTokenizer: tokenizer.json parsing (every field type-checked, errors name the JSON path) and
// the pipeline stages. See hf_tokenizer.h for the behaviour and the deliberate differences.
#include "io/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/check.h"
#include "core/utf8.h"
#include "io/json_input.h"
#include "io/regex_split.h"
#include "io/unigram.h"

namespace strata {
namespace {

using json = nlohmann::json;

// ---- UTF-8 ----

constexpr uint32_t kBadCp = kInvalidCodePoint;

// The character at s[i] as (code point, length); core/utf8.h.
inline std::pair<uint32_t, size_t> NextChar(std::string_view s, size_t i) {
  const Utf8Char c = DecodeUtf8At(s, i);
  return {c.cp, c.len};
}

// Length of the maximal valid prefix of a UTF-8 sequence at s[i] that is not a whole character
// (Unicode's "maximal subpart", what Python's errors="replace" and the WHATWG TextDecoder turn
// into one U+FFFD): at least 1.
size_t BadSequenceLength(std::string_view s, size_t i) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < len && i + k < s.size(); ++k) {
    const uint8_t cc = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (cc < lo || cc > hi) : (cc & 0xC0) != 0x80) break;
  }
  return k;
}

// Rust's char::is_whitespace (Unicode White_Space).
bool IsWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Rust's char::is_alphanumeric, approximated by the L and N general categories.
bool IsAlphanumeric(uint32_t cp) {
  if (cp == kBadCp) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
// U+0100 + k in byte order.
struct ByteMap {
  std::string byte_to_char[256];
  std::unordered_map<uint32_t, uint8_t> char_to_byte;
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 256 + next++;
      AppendUtf8(cp, &byte_to_char[b]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap m;
  return m;
}

int ParseByteToken(std::string_view t) {  // "<0xNN>" -> NN, else -1
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    v *= 16;
    if (c >= '0' && c <= '9') {
      v += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return v;
}

// ---- JSON field access with paths ----


std::string Join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

Status TypeError(const std::string& what, const std::string& path, const char* expected,
                 const json& got) {
  return InvalidArgument(what + ": " + path + ": expected " + expected + ", got " + JsonTypeName(got) +
                         " " + BriefJson(got));
}

// A JSON object with the file name and its path, for reading fields with clear errors.
struct Obj {
  const json& v;
  std::string path;
  const std::string& what;

  // The member, or nullptr when absent or null.
  const json* Find(std::string_view key) const {
    const auto it = v.find(key);
    if (it == v.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string At(std::string_view key) const { return Join(path, key); }
  Status Missing(std::string_view key) const {
    return InvalidArgument(what + ": " + At(key) + " is missing");
  }
  StatusOr<std::string> Str(std::string_view key, std::optional<std::string> def = {}) const {
    const json* f = Find(key);
    if (f == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!f->is_string()) return TypeError(what, At(key), "a string", *f);
    return f->get<std::string>();
  }
  StatusOr<bool> Bool(std::string_view key, std::optional<bool> def = {}) const {
    const json* f = Find(key);
    if (f == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!f->is_boolean()) return TypeError(what, At(key), "a boolean", *f);
    return f->get<bool>();
  }
  StatusOr<int64_t> Int(std::string_view key, std::optional<int64_t> def = {}) const {
    const json* f = Find(key);
    if (f == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!f->is_number_integer()) return TypeError(what, At(key), "an integer", *f);
    return f->get<int64_t>();
  }
  StatusOr<const json*> Array(std::string_view key) const {
    const json* f = Find(key);
    if (f == nullptr) return Missing(key);
    if (!f->is_array()) return TypeError(what, At(key), "an array", *f);
    return f;
  }
  StatusOr<Obj> Object(std::string_view key) const {
    const json* f = Find(key);
    if (f == nullptr) return Missing(key);
    if (!f->is_object()) return TypeError(what, At(key), "an object", *f);
    return Obj{*f, At(key), what};
  }
};

StatusOr<Obj> AsObj(const json& v, const std::string& path, const std::string& what) {
  if (!v.is_object()) return TypeError(what, path, "an object", v);
  return Obj{v, path, what};
}

Status UnsupportedType(const Obj& o, const char* component, const std::string& type) {
  return Unimplemented(o.what + ": " + o.At("type") + ": " + component + " type " + Quote(type) +
                       " is not supported");
}

// {"String": s} or {"Regex": r} (HF's SplitPattern / ReplacePattern).
StatusOr<RegexSplitter> ParsePattern(const Obj& o, std::string_view key) {
  ASSIGN_OR_RETURN(Obj p, o.Object(key));
  if (const json* s = p.Find("String")) {
    if (!s->is_string()) return TypeError(o.what, p.At("String"), "a string", *s);
    return RegexSplitter::CompileLiteral(s->get<std::string>());
  }
  if (const json* r = p.Find("Regex")) {
    if (!r->is_string()) return TypeError(o.what, p.At("Regex"), "a string", *r);
    auto re = RegexSplitter::Compile(r->get<std::string>());
    if (!re.ok()) return re.status().WithContext(o.what + ": " + p.At("Regex"));
    return re;
  }
  return InvalidArgument(o.what + ": " + p.path + ": expected {\"String\": ...} or " +
                         "{\"Regex\": ...}, got " + BriefJson(p.v));
}

// Every non-overlapping match of `re` in `s` replaced by `content`.
std::string ReplaceAll(const RegexSplitter& re, std::string_view s, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> m;
  re.FindMatches(s, &m);
  if (m.empty()) return std::string(s);
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string_view::npos);
  return out;
}

// ---- Normalizers ----

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Apply(std::string* s) const = 0;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(utf8proc_option_t opts) : opts_(opts) {}
  void Apply(std::string* s) const override {
    // utf8proc refuses invalid UTF-8 as a whole: normalize each valid run, keep stray bytes.
    std::string out;
    out.reserve(s->size());
    size_t i = 0;
    while (i < s->size()) {
      size_t j = i;
      while (j < s->size()) {
        const auto [cp, len] = NextChar(*s, j);
        if (cp == kBadCp) break;
        j += len;
      }
      if (j > i) Run(std::string_view(*s).substr(i, j - i), &out);
      if (j < s->size()) out.push_back((*s)[j++]);
      i = j;
    }
    *s = std::move(out);
  }

 private:
  void Run(std::string_view run, std::string* out) const {
    bool ascii = true;
    for (const char c : run) ascii &= static_cast<uint8_t>(c) < 0x80;
    if (ascii) {  // every form leaves ASCII alone
      out->append(run);
      return;
    }
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                            static_cast<utf8proc_ssize_t>(run.size()), &dst, opts_);
    if (n < 0) {
      out->append(run);  // cannot happen for valid UTF-8; keep the text rather than lose it
    } else {
      out->append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    }
    std::free(dst);
  }
  utf8proc_option_t opts_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Apply(std::string* s) const override {
    std::string out;
    out.reserve(s->size());
    for (size_t i = 0; i < s->size();) {
      const auto [cp, len] = NextChar(*s, i);
      if (cp == kBadCp) {
        out.push_back((*s)[i]);
      } else if (cp == 0x130) {
        out += "i\xCC\x87";  // İ -> i + combining dot above (Rust's full mapping)
      } else {
        AppendUtf8(static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))),
                   &out);
      }
      i += len;
    }
    *s = std::move(out);
  }
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(RegexSplitter re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void Apply(std::string* s) const override { *s = ReplaceAll(re_, *s, content_); }

 private:
  RegexSplitter re_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : p_(std::move(p)) {}
  void Apply(std::string* s) const override {
    if (!s->empty()) s->insert(0, p_);  // HF prepends to non-empty text only
  }

 private:
  std::string p_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Apply(std::string* s) const override {
    size_t b = 0, e = s->size();
    if (left_) {
      while (b < e) {
        const auto [cp, len] = NextChar(*s, b);
        if (!IsWhitespace(cp)) break;
        b += len;
      }
    }
    if (right_) {
      // Walk forward remembering where the trailing whitespace run starts.
      size_t run = e;
      for (size_t i = b; i < e;) {
        const auto [cp, len] = NextChar(*s, i);
        if (IsWhitespace(cp)) {
          if (run == e) run = i;
        } else {
          run = e;
        }
        i += len;
      }
      e = run;
    }
    *s = s->substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void Apply(std::string* s) const override {
    std::string out;
    out.reserve(s->size());
    for (size_t i = 0; i < s->size();) {
      const auto [cp, len] = NextChar(*s, i);
      if (cp == kBadCp ||
          utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_MN) {
        out.append(*s, i, len);
      }
      i += len;
    }
    *s = std::move(out);
  }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Apply(std::string* s) const override {
    for (const auto& n : steps_) n->Apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// The steps of a "Sequence" component: each element of the array `key`, parsed by `parse`
// (which reports the element's path in its errors); a step that parses to nothing (e.g. an empty
// normalizer) is dropped.
template <typename T, typename Parse>
StatusOr<std::vector<std::unique_ptr<T>>> ParseSteps(const Obj& o, std::string_view key,
                                                     const std::string& what, Parse parse) {
  ASSIGN_OR_RETURN(const json* arr, o.Array(key));
  std::vector<std::unique_ptr<T>> steps;
  for (size_t i = 0; i < arr->size(); ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<T> step,
                     parse((*arr)[i], o.At(key) + "[" + std::to_string(i) + "]", what));
    if (step) steps.push_back(std::move(step));
  }
  return steps;
}

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& v, const std::string& path,
                                                      const std::string& what) {
  if (v.is_null()) return std::unique_ptr<Normalizer>();
  ASSIGN_OR_RETURN(Obj o, AsObj(v, path, what));
  ASSIGN_OR_RETURN(std::string type, o.Str("type"));
  const utf8proc_option_t base = static_cast<utf8proc_option_t>(UTF8PROC_STABLE);
  if (type == "NFC") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(static_cast<utf8proc_option_t>(base | UTF8PROC_COMPOSE)));
  }
  if (type == "NFD") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(static_cast<utf8proc_option_t>(base | UTF8PROC_DECOMPOSE)));
  }
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
        static_cast<utf8proc_option_t>(base | UTF8PROC_COMPOSE | UTF8PROC_COMPAT)));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
        static_cast<utf8proc_option_t>(base | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  if (type == "Replace") {
    ASSIGN_OR_RETURN(RegexSplitter re, ParsePattern(o, "pattern"));
    ASSIGN_OR_RETURN(std::string content, o.Str("content"));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), std::move(content)));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string p, o.Str("prepend"));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(bool left, o.Bool("strip_left", true));
    ASSIGN_OR_RETURN(bool right, o.Bool("strip_right", true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Normalizer>> steps,
                     ParseSteps<Normalizer>(o, "normalizers", what, ParseNormalizer));
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return UnsupportedType(o, "normalizer", type);
}

// ---- Pre-tokenizers ----

// A piece of pre-tokenized text; `at_start`: it begins at offset 0 of the whole input.
struct Piece {
  std::string text;
  bool at_start;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces.
  virtual void Apply(std::vector<Piece>* pieces) const = 0;
};

// Helper: splits every piece by `re` with `behavior`.
void SplitPieces(const RegexSplitter& re, SplitBehavior behavior, bool invert,
                 std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size() * 2);
  std::vector<std::pair<size_t, size_t>> spans;
  for (Piece& p : *pieces) {
    spans.clear();
    re.SplitSpans(p.text, behavior, invert, &spans);
    for (const auto& [b, e] : spans) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }
  *pieces = std::move(out);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(RegexSplitter re, SplitBehavior b, bool invert)
      : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void Apply(std::vector<Piece>* pieces) const override {
    SplitPieces(re_, behavior_, invert_, pieces);
  }

 private:
  RegexSplitter re_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr const char kGpt2Regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<RegexSplitter> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void Apply(std::vector<Piece>* pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    if (re_) SplitPieces(*re_, SplitBehavior::kIsolated, false, pieces);
    const ByteMap& bm = Bytes();
    for (Piece& p : *pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) mapped += bm.byte_to_char[static_cast<uint8_t>(c)];
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<RegexSplitter> re_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : rep_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        rep_re_(RegexSplitter::CompileLiteral(rep_).value()) {}
  void Apply(std::vector<Piece>* pieces) const override {
    for (Piece& p : *pieces) {
      std::string s;
      s.reserve(p.text.size() + rep_.size());
      for (const char c : p.text) {
        if (c == ' ') {
          s += rep_;
        } else {
          s.push_back(c);
        }
      }
      const bool starts = s.compare(0, rep_.size(), rep_) == 0;
      if (!starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start))) {
        s.insert(0, rep_);
      }
      p.text = std::move(s);
    }
    if (split_) SplitPieces(rep_re_, SplitBehavior::kMergedWithNext, false, pieces);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
  RegexSplitter rep_re_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void Apply(std::vector<Piece>* pieces) const override {
    for (const auto& s : steps_) s->Apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

StatusOr<RegexSplitter> MustCompile(const char* pattern) { return RegexSplitter::Compile(pattern); }

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& v, const std::string& path,
                                                          const std::string& what) {
  if (v.is_null()) return std::unique_ptr<PreTokenizer>();
  ASSIGN_OR_RETURN(Obj o, AsObj(v, path, what));
  ASSIGN_OR_RETURN(std::string type, o.Str("type"));
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space, o.Bool("add_prefix_space", true));
    ASSIGN_OR_RETURN(bool use_regex, o.Bool("use_regex", true));
    ASSIGN_OR_RETURN(bool trim_offsets, o.Bool("trim_offsets", true));
    (void)trim_offsets;  // offsets only
    std::optional<RegexSplitter> re;
    if (use_regex) {
      ASSIGN_OR_RETURN(re, MustCompile(kGpt2Regex));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, re));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(RegexSplitter re, ParsePattern(o, "pattern"));
    ASSIGN_OR_RETURN(std::string behavior_name, o.Str("behavior"));
    auto behavior = ParseSplitBehavior(behavior_name);
    if (!behavior.ok()) return behavior.status().WithContext(what + ": " + o.At("behavior"));
    ASSIGN_OR_RETURN(bool invert, o.Bool("invert", false));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), *behavior, invert));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string rep, o.Str("replacement", std::string("\xE2\x96\x81")));
    if (rep.empty()) return InvalidArgument(what + ": " + o.At("replacement") + " is empty");
    PrependScheme scheme;
    if (o.Find("prepend_scheme") != nullptr) {
      ASSIGN_OR_RETURN(std::string s, o.Str("prepend_scheme"));
      if (s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return InvalidArgument(what + ": " + o.At("prepend_scheme") + " = " + Quote(s) +
                               " is not one of always, first, never");
      }
    } else {  // older files: add_prefix_space
      ASSIGN_OR_RETURN(bool add, o.Bool("add_prefix_space", true));
      scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    ASSIGN_OR_RETURN(bool split, o.Bool("split", true));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(rep, scheme, split));
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(bool individual, o.Bool("individual_digits", false));
    // char::is_numeric is the N categories; runs fuse unless individual.
    ASSIGN_OR_RETURN(RegexSplitter re, MustCompile("\\p{N}"));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        std::move(re), individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false));
  }
  if (type == "Whitespace") {
    // HF: \w+|[^\w\s]+ kept, the rest dropped. Rust's \w is Alphabetic, M, Nd, Pc, Join_Control.
    ASSIGN_OR_RETURN(RegexSplitter re,
                     MustCompile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                                 "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\s]+"));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(re), SplitBehavior::kRemoved, true));
  }
  if (type == "WhitespaceSplit") {
    ASSIGN_OR_RETURN(RegexSplitter re, MustCompile("\\s"));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(re), SplitBehavior::kRemoved, false));
  }
  if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::kIsolated;
    if (o.Find("behavior") != nullptr) {
      ASSIGN_OR_RETURN(std::string name, o.Str("behavior"));
      auto b = ParseSplitBehavior(name);
      if (!b.ok()) return b.status().WithContext(what + ": " + o.At("behavior"));
      behavior = *b;
    }
    // HF: char::is_ascii_punctuation || Unicode punctuation (P categories), one char each.
    ASSIGN_OR_RETURN(RegexSplitter re, MustCompile("[\\p{P}!-/:-@\\[-`{-~]"));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), behavior, false));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<PreTokenizer>> steps,
                     ParseSteps<PreTokenizer>(o, "pretokenizers", what, ParsePreTokenizer));
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  return UnsupportedType(o, "pre-tokenizer", type);
}

// ---- Decoders ----

struct DecTok {
  std::string text;
  bool added;  // an added token: the ByteLevel decoder leaves it as is (as transformers does)
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // `at_start`: tokens[0] starts the text (strip the word-start marker / leading space).
  virtual void Apply(std::vector<DecTok>* toks, bool at_start) const = 0;
};

class ByteLevelDecoder : public Decoder {
 public:
  void Apply(std::vector<DecTok>* toks, bool) const override {
    const ByteMap& bm = Bytes();
    for (DecTok& t : *toks) {
      if (t.added) continue;
      std::string bytes;
      bool all = true;
      for (size_t i = 0; i < t.text.size() && all;) {
        const auto [cp, len] = NextChar(t.text, i);
        const auto it = bm.char_to_byte.find(cp);
        if (it == bm.char_to_byte.end()) {
          all = false;
        } else {
          bytes.push_back(static_cast<char>(it->second));
        }
        i += len;
      }
      if (all) t.text = std::move(bytes);  // otherwise HF keeps the token's own text
    }
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_(strip_first) {}
  void Apply(std::vector<DecTok>* toks, bool at_start) const override {
    for (size_t i = 0; i < toks->size(); ++i) {
      std::string& s = (*toks)[i].text;
      // As HF: in the first token of the text every marker is dropped (not only a leading one);
      // elsewhere (and when streaming) each becomes a space.
      const bool drop = i == 0 && at_start && strip_;
      std::string out;
      for (size_t k = 0; k < s.size();) {
        if (s.compare(k, rep_.size(), rep_) == 0) {
          if (!drop) out.push_back(' ');
          k += rep_.size();
        } else {
          out.push_back(s[k++]);
        }
      }
      s = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void Apply(std::vector<DecTok>* toks, bool) const override {
    // Runs of <0xNN> become their bytes (kept exact, never replaced by U+FFFD).
    std::vector<DecTok> out;
    std::string bytes;
    bool in_run = false;
    for (DecTok& t : *toks) {
      const int b = t.added ? -1 : ParseByteToken(t.text);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        in_run = true;
        continue;
      }
      if (in_run) {
        out.push_back({std::move(bytes), false});
        bytes.clear();
        in_run = false;
      }
      out.push_back(std::move(t));
    }
    if (in_run) out.push_back({std::move(bytes), false});
    *toks = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void Apply(std::vector<DecTok>* toks, bool) const override {
    std::string all;
    for (const DecTok& t : *toks) all += t.text;
    toks->assign(1, DecTok{std::move(all), false});
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void Apply(std::vector<DecTok>* toks, bool at_start) const override {
    // HF strips every token; when streaming (not at the start) the leading strip is skipped so
    // the token keeps its space.
    for (DecTok& t : *toks) {
      std::string& s = t.text;
      size_t b = 0, e = s.size();
      if (at_start) {
        for (size_t k = 0;
             k < start_ && s.compare(b, content_.size(), content_) == 0 && b + content_.size() <= e;
             ++k) {
          b += content_.size();
        }
      }
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         s.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k) {
        e -= content_.size();
      }
      s = s.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(RegexSplitter re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void Apply(std::vector<DecTok>* toks, bool) const override {
    for (DecTok& t : *toks) t.text = ReplaceAll(re_, t.text, content_);
  }

 private:
  RegexSplitter re_;
  std::string content_;
};

// transformers' clean_up_tokenization.
std::string CleanUp(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  for (const auto& [from, to] : kRules) {
    std::string out;
    const std::string_view f(from);
    size_t prev = 0;
    for (size_t hit = s.find(f); hit != std::string::npos; hit = s.find(f, prev)) {
      out.append(s, prev, hit - prev);
      out += to;
      prev = hit + f.size();
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }
  return s;
}

class WordPieceDecoder : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void Apply(std::vector<DecTok>* toks, bool at_start) const override {
    for (size_t i = 0; i < toks->size(); ++i) {
      std::string& s = (*toks)[i].text;
      if (i != 0 || !at_start) {
        if (s.compare(0, prefix_.size(), prefix_) == 0) {
          s.erase(0, prefix_.size());
        } else {
          s.insert(0, 1, ' ');
        }
      }
      if (cleanup_) s = CleanUp(std::move(s));
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeSuffixDecoder : public Decoder {  // HF's "BPEDecoder"
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void Apply(std::vector<DecTok>* toks, bool) const override {
    for (size_t i = 0; i < toks->size(); ++i) {
      std::string& s = (*toks)[i].text;
      const std::string rep = i + 1 == toks->size() ? "" : " ";
      std::string out;
      size_t prev = 0;
      for (size_t hit = s.find(suffix_); !suffix_.empty() && hit != std::string::npos;
           hit = s.find(suffix_, prev)) {
        out.append(s, prev, hit - prev);
        out += rep;
        prev = hit + suffix_.size();
      }
      out.append(s, prev, std::string::npos);
      s = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void Apply(std::vector<DecTok>* toks, bool at_start) const override {
    for (const auto& d : steps_) d->Apply(toks, at_start);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& v, const std::string& path,
                                                const std::string& what) {
  if (v.is_null()) return std::unique_ptr<Decoder>();
  ASSIGN_OR_RETURN(Obj o, AsObj(v, path, what));
  ASSIGN_OR_RETURN(std::string type, o.Str("type"));
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string rep, o.Str("replacement", std::string("\xE2\x96\x81")));
    bool strip = true;
    if (o.Find("prepend_scheme") != nullptr) {
      ASSIGN_OR_RETURN(std::string s, o.Str("prepend_scheme"));
      if (s != "always" && s != "first" && s != "never") {
        return InvalidArgument(what + ": " + o.At("prepend_scheme") + " = " + Quote(s) +
                               " is not one of always, first, never");
      }
      strip = s != "never";
    } else {
      ASSIGN_OR_RETURN(strip, o.Bool("add_prefix_space", true));
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(rep, strip));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string content, o.Str("content"));
    ASSIGN_OR_RETURN(int64_t start, o.Int("start"));
    ASSIGN_OR_RETURN(int64_t stop, o.Int("stop"));
    if (content.empty() || start < 0 || stop < 0) {
      return InvalidArgument(what + ": " + o.path + ": Strip needs a non-empty content and " +
                             "start, stop >= 0, got " + BriefJson(o.v));
    }
    return std::unique_ptr<Decoder>(new StripDecoder(content, start, stop));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(RegexSplitter re, ParsePattern(o, "pattern"));
    ASSIGN_OR_RETURN(std::string content, o.Str("content"));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(re), std::move(content)));
  }
  if (type == "WordPiece") {
    ASSIGN_OR_RETURN(std::string prefix, o.Str("prefix", std::string("##")));
    ASSIGN_OR_RETURN(bool cleanup, o.Bool("cleanup", true));
    return std::unique_ptr<Decoder>(new WordPieceDecoder(prefix, cleanup));
  }
  if (type == "BPEDecoder") {
    ASSIGN_OR_RETURN(std::string suffix, o.Str("suffix", std::string("</w>")));
    return std::unique_ptr<Decoder>(new BpeSuffixDecoder(suffix));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Decoder>> steps,
                     ParseSteps<Decoder>(o, "decoders", what, ParseDecoder));
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  return UnsupportedType(o, "decoder", type);
}

// ---- BPE model ----

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Text -> id for a large vocabulary: open addressing over one byte arena, so a lookup touches a
// slot array and one entry instead of chasing hash-map nodes (loading a 128K-150K vocabulary and
// its merges does ~3 lookups per merge; encoding one per character and merge step).
class FlatVocab {
 public:
  void Reserve(size_t n) {
    entries_.reserve(n);
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    Rehash(cap);
  }
  // Maps `text` to `id`; a text seen before takes the new id (last wins).
  void Set(std::string_view text, int32_t id) {
    if ((entries_.size() + 1) * 2 > slots_.size()) Rehash(std::max<size_t>(16, slots_.size() * 2));
    const uint64_t h = Hash(text);
    size_t i = h & mask_;
    for (; slots_[i] >= 0; i = (i + 1) & mask_) {
      Entry& e = entries_[slots_[i]];
      if (e.hash == h && Text(e) == text) {
        e.id = id;
        return;
      }
    }
    slots_[i] = static_cast<int32_t>(entries_.size());
    entries_.push_back(
        {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(text.size()), id});
    arena_.append(text);
  }
  int32_t Find(std::string_view text) const {
    if (slots_.empty()) return -1;
    const uint64_t h = Hash(text);
    for (size_t i = h & mask_; slots_[i] >= 0; i = (i + 1) & mask_) {
      const Entry& e = entries_[slots_[i]];
      if (e.hash == h && Text(e) == text) return e.id;
    }
    return -1;
  }

 private:
  struct Entry {
    uint64_t hash;
    uint32_t off, len;
    int32_t id;
  };
  static uint64_t Hash(std::string_view s) { return std::hash<std::string_view>()(s); }
  std::string_view Text(const Entry& e) const {
    return std::string_view(arena_).substr(e.off, e.len);
  }
  void Rehash(size_t cap) {
    slots_.assign(cap, -1);
    mask_ = cap - 1;
    for (size_t k = 0; k < entries_.size(); ++k) {
      size_t i = entries_[k].hash & mask_;
      while (slots_[i] >= 0) i = (i + 1) & mask_;
      slots_[i] = static_cast<int32_t>(k);
    }
  }
  std::vector<Entry> entries_;
  std::vector<int32_t> slots_;  // entry index or -1
  size_t mask_ = 0;
  std::string arena_;
};

// (left id, right id) -> merge, open addressing (see FlatVocab for why).
template <typename V>
class FlatPairMap {
 public:
  static constexpr uint64_t kEmpty = ~0ull;  // no key: ids are non-negative int32
  void Reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    Rehash(cap);
  }
  // Inserts unless the key is present (the first, lowest-rank merge wins).
  void Insert(uint64_t key, const V& v) {
    if ((size_ + 1) * 2 > keys_.size()) Rehash(std::max<size_t>(16, keys_.size() * 2));
    size_t i = Mix(key) & mask_;
    for (; keys_[i] != kEmpty; i = (i + 1) & mask_) {
      if (keys_[i] == key) return;
    }
    keys_[i] = key;
    vals_[i] = v;
    ++size_;
  }
  const V* Find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = Mix(key) & mask_; keys_[i] != kEmpty; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
    }
    return nullptr;
  }

 private:
  static uint64_t Mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return k;
  }
  void Rehash(size_t cap) {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<V> vals = std::move(vals_);
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, V{});
    mask_ = cap - 1;
    size_ = 0;
    for (size_t k = 0; k < keys.size(); ++k) {
      if (keys[k] != kEmpty) Insert(keys[k], vals[k]);
    }
  }
  std::vector<uint64_t> keys_;
  std::vector<V> vals_;
  size_t mask_ = 0, size_ = 0;
};

class BpeModel {
 public:
  FlatVocab vocab;
  std::vector<std::string> id_to_token;  // holes: ""
  struct Merge {
    int32_t rank, new_id;
  };
  FlatPairMap<Merge> merges;
  int32_t unk = -1;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  int32_t byte_ids[256];

  BpeModel() { std::fill(std::begin(byte_ids), std::end(byte_ids), -1); }

  int32_t Find(std::string_view s) const { return vocab.Find(s); }

  void InitByteIds() {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      byte_ids[b] = Find(buf);
    }
  }

  // HF's BPE::tokenize for one pre-tokenized piece (with a bounded word cache).
  void Encode(const std::string& word, std::vector<int32_t>* out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      const int32_t id = Find(word);
      if (id >= 0) {
        out->push_back(id);
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      const auto it = cache_.find(word);
      if (it != cache_.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    MergeWord(word, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCap) cache_.clear();
    cache_.emplace(word, std::move(ids));
  }

 private:
  static constexpr size_t kCacheCap = 1 << 16;

  struct Sym {
    int32_t id;
    int prev, next;
    bool live;
  };

  void MergeWord(const std::string& w, std::vector<int32_t>* out) const {
    std::vector<Sym> syms;
    syms.reserve(w.size());
    auto add = [&](int32_t id) {
      syms.push_back({id, static_cast<int>(syms.size()) - 1, -1, true});
    };
    int32_t pending_unk = -1;  // fused unknown run waiting to be added
    std::string s;
    for (size_t i = 0; i < w.size();) {
      const size_t len = NextChar(w, i).second;
      const bool first = i == 0, last = i + len == w.size();
      s.assign(w, i, len);
      if (!prefix.empty() && !first) s.insert(0, prefix);
      if (!suffix.empty() && last) s += suffix;
      i += len;
      const int32_t id = Find(s);
      if (id >= 0) {
        if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
        add(id);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (const char c : s) all &= byte_ids[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
          for (const char c : s) add(byte_ids[static_cast<uint8_t>(c)]);
          continue;
        }
      }
      if (unk >= 0) {
        if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
        pending_unk = unk;
      }
      // No unk token: HF drops the character.
    }
    if (pending_unk >= 0) add(pending_unk);
    for (size_t k = 0; k < syms.size(); ++k) {
      syms[k].next = k + 1 < syms.size() ? static_cast<int>(k + 1) : -1;
    }

    // Lowest rank first, then leftmost (HF's Word::merge_all).
    struct Cand {
      int32_t rank;
      int pos;
      int32_t new_id;
      bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand> queue;
    auto lookup = [&](int a, int b) -> const Merge* {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(syms[a].id)) << 32) |
                           static_cast<uint32_t>(syms[b].id);
      return merges.Find(key);
    };
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      if (const Merge* m = lookup(k, k + 1)) queue.push({m->rank, static_cast<int>(k), m->new_id});
    }
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      Sym& left = syms[c.pos];
      if (!left.live || left.next < 0) continue;
      const Merge* m = lookup(c.pos, left.next);
      if (m == nullptr || m->new_id != c.new_id) continue;  // stale
      Sym& right = syms[left.next];
      left.id = c.new_id;
      right.live = false;
      left.next = right.next;
      if (right.next >= 0) syms[right.next].prev = c.pos;
      if (left.prev >= 0) {
        if (const Merge* pm = lookup(left.prev, c.pos))
          queue.push({pm->rank, left.prev, pm->new_id});
      }
      if (left.next >= 0) {
        if (const Merge* nm = lookup(c.pos, left.next)) queue.push({nm->rank, c.pos, nm->new_id});
      }
    }
    for (int k = syms.empty() ? -1 : 0; k >= 0; k = syms[k].next) out->push_back(syms[k].id);
  }

  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Adds merge (a, b) at `rank`; `where` names it in errors.
Status AddMerge(BpeModel* m, std::string_view a, std::string_view b, int32_t rank,
                const std::string& where) {
  const int32_t ia = m->Find(a), ib = m->Find(b);
  if (ia < 0) return InvalidArgument(where + ": " + Quote(a) + " is not in the vocabulary");
  if (ib < 0) return InvalidArgument(where + ": " + Quote(b) + " is not in the vocabulary");
  thread_local std::string merged;  // reused: one merge per call, hundreds of thousands per file
  merged.assign(a);
  if (!m->prefix.empty() && b.substr(0, m->prefix.size()) == m->prefix) {
    merged += b.substr(m->prefix.size());
  } else {
    merged += b;
  }
  const int32_t id = m->Find(merged);
  if (id < 0) {
    return InvalidArgument(where + ": merged token " + Quote(merged) + " is not in the vocabulary");
  }
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) | static_cast<uint32_t>(ib);
  m->merges.Insert(key, BpeModel::Merge{rank, id});  // first (lowest) rank wins
  return OkStatus();
}

// "a b" -> (a, b); exactly one space (HF's merges format).
bool SplitMerge(std::string_view m, std::string_view* a, std::string_view* b) {
  const size_t sp = m.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= m.size() ||
      m.find(' ', sp + 1) != std::string_view::npos) {
    return false;
  }
  *a = m.substr(0, sp);
  *b = m.substr(sp + 1);
  return true;
}

// ---- Added tokens ----

// Leftmost-longest matching of a set of literal strings (what HF's AddedVocabulary does with
// aho-corasick): candidates indexed by first byte, longest first.
class LiteralMatcher {
 public:
  void Build(const std::vector<const HfAddedToken*>& toks) {
    for (auto& v : by_first_) v.clear();
    for (const HfAddedToken* t : toks) {
      if (!t->content.empty()) by_first_[static_cast<uint8_t>(t->content[0])].push_back(t);
    }
    for (auto& v : by_first_) {
      std::stable_sort(v.begin(), v.end(), [](const HfAddedToken* a, const HfAddedToken* b) {
        return a->content.size() > b->content.size();
      });
    }
    empty_ = toks.empty();
  }
  bool empty() const { return empty_; }
  // The longest token starting at s[i], or nullptr.
  const HfAddedToken* At(std::string_view s, size_t i) const {
    for (const HfAddedToken* t : by_first_[static_cast<uint8_t>(s[i])]) {
      if (s.compare(i, t->content.size(), t->content) == 0) return t;
    }
    return nullptr;
  }

 private:
  std::vector<const HfAddedToken*> by_first_[256];
  bool empty_ = true;
};

// A span of text or an added token's id.
struct Segment {
  std::string text;
  int32_t id;     // >= 0: an added token
  bool at_start;  // text begins at offset 0 of the input
};

bool EndsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return IsAlphanumeric(NextChar(s, i).first);
}
bool StartsWithWordChar(std::string_view s) {
  return !s.empty() && IsAlphanumeric(NextChar(s, 0).first);
}

// HF's AddedVocabulary::split_with_indices on one text segment.
void SplitAdded(const LiteralMatcher& m, bool split_special, const Segment& seg,
                std::vector<Segment>* out) {
  const std::string_view s = seg.text;
  size_t start_offset = 0;  // end of the previous token (with its stripped spaces)
  size_t i = 0;
  while (i < s.size()) {
    const HfAddedToken* t = m.At(s, i);
    if (t == nullptr) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + t->content.size();
    i = stop;  // like aho-corasick: a match consumes its span even when it is then refused
    if (t->special && !split_special) continue;
    if (t->single_word &&
        (EndsWithWordChar(s.substr(0, start)) || StartsWithWordChar(s.substr(stop)))) {
      continue;
    }
    if (t->lstrip) {
      size_t b = start;
      while (b > start_offset) {
        size_t p = b - 1;
        while (p > start_offset && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
        if (!IsWhitespace(NextChar(s, p).first)) break;
        b = p;
      }
      start = b;
    }
    if (t->rstrip) {
      while (stop < s.size()) {
        const auto [cp, len] = NextChar(s, stop);
        if (!IsWhitespace(cp)) break;
        stop += len;
      }
      i = std::max(i, stop);
    }
    if (start > start_offset) {
      out->push_back({std::string(s.substr(start_offset, start - start_offset)), -1,
                      seg.at_start && start_offset == 0});
    }
    out->push_back({std::string(), t->id, false});
    start_offset = stop;
  }
  if (start_offset < s.size()) {
    out->push_back({std::string(s.substr(start_offset)), -1, seg.at_start && start_offset == 0});
  }
}

}  // namespace

const std::string& Gpt2ByteChar(uint8_t b) { return Bytes().byte_to_char[b]; }

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = NextChar(text, i);
    if (cp != kBadCp) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += BadSequenceLength(text, i);
    }
  }
  return out;
}

namespace {
bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto [cp, len] = NextChar(text, i);
    if (cp == kBadCp) return false;
    i += len;
  }
  return true;
}
}  // namespace

// ---- The tokenizer ----

struct HfTokenizer::Impl {
  std::string what;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::optional<BpeModel> bpe;
  std::optional<UnigramModel> unigram;
  TokenMap token_to_id;                  // Unigram's vocabulary (BPE looks in its own)
  TokenMap added_ids;                    // added tokens, looked up first
  std::vector<std::string> id_to_token;  // holes: ""
  std::vector<HfAddedToken> added;
  std::vector<int8_t> added_kind;  // per id: 0 model, 1 added, 2 special added
  std::vector<bool> byte_token;
  LiteralMatcher raw_matcher, norm_matcher;  // non-normalized / normalized added tokens
  std::vector<int32_t> prefix, suffix;       // post-processor specials for a single sequence
  int32_t unk = -1;
  // tokenizer.json: the input is Unicode text, so invalid UTF-8 becomes U+FFFD first (as the
  // text HF would be given). GGUF "gpt2": raw bytes are kept (they round-trip).
  bool replace_invalid_utf8 = false;

  void Finish();
  int32_t Find(std::string_view text) const {
    const auto a = added_ids.find(text);
    if (a != added_ids.end()) return a->second;
    if (bpe) return bpe->Find(text);
    const auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  void ModelEncode(const std::string& piece, std::vector<int32_t>* out) const {
    if (bpe) {
      bpe->Encode(piece, out);
    } else {
      const std::vector<int32_t> ids = unigram->Encode(piece);
      out->insert(out->end(), ids.begin(), ids.end());
    }
  }
  void EncodeText(const std::string& normalized, bool at_start, std::vector<int32_t>* out) const {
    std::vector<Piece> pieces{{normalized, at_start}};
    if (pre_tokenizer) pre_tokenizer->Apply(&pieces);
    for (const Piece& p : pieces) ModelEncode(p.text, out);
  }
};

HfTokenizer::HfTokenizer() : impl_(new Impl()) {}
HfTokenizer::~HfTokenizer() = default;

// Indexes ids and added tokens once the model and added_tokens are in place.
void HfTokenizer::Impl::Finish() {
  if (bpe) {
    id_to_token = std::move(bpe->id_to_token);  // the model itself only needs the vocab map
  } else {
    id_to_token.clear();
    for (int32_t i = 0; i < unigram->size(); ++i) id_to_token.push_back(unigram->piece(i).text);
  }
  for (const HfAddedToken& t : added) {
    if (t.id >= static_cast<int32_t>(id_to_token.size())) id_to_token.resize(t.id + 1);
    id_to_token[t.id] = t.content;
  }
  token_to_id.clear();
  if (!bpe) {
    token_to_id.reserve(id_to_token.size() * 2);
    for (int32_t i = 0; i < unigram->size(); ++i) token_to_id[unigram->piece(i).text] = i;
  }
  added_ids.clear();
  for (const HfAddedToken& t : added) added_ids[t.content] = t.id;  // added tokens win
  added_kind.assign(id_to_token.size(), 0);
  byte_token.assign(id_to_token.size(), false);
  std::vector<const HfAddedToken*> raw, norm;
  for (const HfAddedToken& t : added) {
    added_kind[t.id] = t.special ? 2 : 1;
    (t.normalized && normalizer ? norm : raw).push_back(&t);
  }
  raw_matcher.Build(raw);
  norm_matcher.Build(norm);
  const bool fallback = bpe ? bpe->byte_fallback : unigram->byte_fallback();
  if (fallback) {
    for (size_t i = 0; i < id_to_token.size(); ++i) {
      byte_token[i] = added_kind[i] == 0 && ParseByteToken(id_to_token[i]) >= 0;
    }
  }
}

namespace {

// `model_size`: ids the model uses; added token ids must stay near it (holes are allowed, a
// huge id would only allocate a huge table).
StatusOr<std::vector<HfAddedToken>> ParseAddedTokens(const Obj& root, int64_t model_size) {
  std::vector<HfAddedToken> out;
  const json* arr = root.Find("added_tokens");
  if (arr == nullptr) return out;
  if (!arr->is_array()) return TypeError(root.what, "added_tokens", "an array", *arr);
  for (size_t i = 0; i < arr->size(); ++i) {
    ASSIGN_OR_RETURN(Obj o, AsObj((*arr)[i], "added_tokens[" + std::to_string(i) + "]", root.what));
    HfAddedToken t;
    ASSIGN_OR_RETURN(int64_t id, o.Int("id"));
    const int64_t limit = model_size + 2 * static_cast<int64_t>(arr->size()) + 1024;
    if (id < 0 || id >= limit) {
      return InvalidArgument(root.what + ": " + o.At("id") + " = " + std::to_string(id) +
                             " is not a valid token id (the model has " +
                             std::to_string(model_size) + " ids; added ids must be below " +
                             std::to_string(limit) + ")");
    }
    t.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(t.content, o.Str("content"));
    if (t.content.empty()) return InvalidArgument(root.what + ": " + o.At("content") + " is empty");
    ASSIGN_OR_RETURN(t.special, o.Bool("special", false));
    ASSIGN_OR_RETURN(t.normalized, o.Bool("normalized", !t.special));
    ASSIGN_OR_RETURN(t.lstrip, o.Bool("lstrip", false));
    ASSIGN_OR_RETURN(t.rstrip, o.Bool("rstrip", false));
    ASSIGN_OR_RETURN(t.single_word, o.Bool("single_word", false));
    out.push_back(std::move(t));
  }
  return out;
}

Status ParseBpe(const Obj& m, BpeModel* bpe) {
  const std::string& what = m.what;
  if (const json* d = m.Find("dropout")) {
    if (!d->is_number()) return TypeError(what, m.At("dropout"), "a number", *d);
    if (d->get<double>() != 0.0) {
      return Unimplemented(what + ": " + m.At("dropout") + " = " + BriefJson(*d) +
                           ": BPE dropout is not supported");
    }
  }
  ASSIGN_OR_RETURN(bpe->byte_fallback, m.Bool("byte_fallback", false));
  ASSIGN_OR_RETURN(bpe->fuse_unk, m.Bool("fuse_unk", false));
  ASSIGN_OR_RETURN(bpe->ignore_merges, m.Bool("ignore_merges", false));
  ASSIGN_OR_RETURN(bpe->prefix, m.Str("continuing_subword_prefix", std::string()));
  ASSIGN_OR_RETURN(bpe->suffix, m.Str("end_of_word_suffix", std::string()));
  ASSIGN_OR_RETURN(Obj vocab, m.Object("vocab"));
  bpe->vocab.Reserve(vocab.v.size());
  for (auto it = vocab.v.begin(); it != vocab.v.end(); ++it) {
    if (!it->is_number_integer()) {
      return TypeError(what, vocab.At(Quote(it.key())), "an integer id", *it);
    }
    const int64_t id = it->get<int64_t>();
    // Holes are allowed, but not an id that would only allocate a huge table.
    const int64_t limit = 2 * static_cast<int64_t>(vocab.v.size()) + 1024;
    if (id < 0 || id >= limit) {
      return InvalidArgument(what + ": " + vocab.At(Quote(it.key())) + " = " + std::to_string(id) +
                             " is not a valid token id (a vocabulary of " +
                             std::to_string(vocab.v.size()) + " entries takes ids below " +
                             std::to_string(limit) + ")");
    }
    bpe->vocab.Set(it.key(), static_cast<int32_t>(id));
    if (id >= static_cast<int64_t>(bpe->id_to_token.size())) bpe->id_to_token.resize(id + 1);
    bpe->id_to_token[id] = it.key();
  }
  if (const json* u = m.Find("unk_token")) {
    if (!u->is_string()) return TypeError(what, m.At("unk_token"), "a string", *u);
    bpe->unk = bpe->Find(u->get<std::string>());
    if (bpe->unk < 0) {
      return InvalidArgument(what + ": " + m.At("unk_token") + " = " +
                             Quote(u->get<std::string>()) + " is not in model.vocab");
    }
  }
  ASSIGN_OR_RETURN(const json* merges, m.Array("merges"));
  bpe->merges.Reserve(merges->size());
  for (size_t r = 0; r < merges->size(); ++r) {
    const json& e = (*merges)[r];
    const std::string where = what + ": " + m.At("merges") + "[" + std::to_string(r) + "]";
    std::string_view a, b;
    if (e.is_string()) {
      if (!SplitMerge(e.get_ref<const std::string&>(), &a, &b)) {
        return InvalidArgument(where + " = " + BriefJson(e) + " is not of the form \"left right\"");
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      return InvalidArgument(where + ": expected \"left right\" or [left, right], got " +
                             BriefJson(e));
    }
    RETURN_IF_ERROR(AddMerge(bpe, a, b, static_cast<int32_t>(r), where));
  }
  bpe->InitByteIds();
  return OkStatus();
}

StatusOr<UnigramModel> ParseUnigram(const Obj& m) {
  const std::string& what = m.what;
  ASSIGN_OR_RETURN(const json* vocab, m.Array("vocab"));
  std::vector<UnigramModel::Piece> pieces;
  pieces.reserve(vocab->size());
  for (size_t i = 0; i < vocab->size(); ++i) {
    const json& e = (*vocab)[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number()) {
      return InvalidArgument(what + ": " + m.At("vocab") + "[" + std::to_string(i) +
                             "]: expected [piece, score], got " + BriefJson(e));
    }
    pieces.push_back({e[0].get<std::string>(), e[1].get<double>()});
  }
  ASSIGN_OR_RETURN(int64_t unk, m.Int("unk_id", -1));
  if (unk < -1 || unk >= static_cast<int64_t>(pieces.size())) {
    return InvalidArgument(what + ": " + m.At("unk_id") + " = " + std::to_string(unk) +
                           " is out of range for " + std::to_string(pieces.size()) + " pieces");
  }
  ASSIGN_OR_RETURN(bool byte_fallback, m.Bool("byte_fallback", false));
  auto u = UnigramModel::Build(std::move(pieces), static_cast<int32_t>(unk), byte_fallback);
  if (!u.ok()) return u.status().WithContext(what + ": model");
  return u;
}

// The specials a post-processor puts around a single sequence.
Status ParsePostProcessor(const json& v, const std::string& path, const std::string& what,
                          const HfTokenizer& ids, std::vector<int32_t>* prefix,
                          std::vector<int32_t>* suffix) {
  if (v.is_null()) return OkStatus();
  ASSIGN_OR_RETURN(Obj o, AsObj(v, path, what));
  ASSIGN_OR_RETURN(std::string type, o.Str("type"));
  if (type == "ByteLevel") return OkStatus();  // offsets only
  if (type == "TemplateProcessing") {
    ASSIGN_OR_RETURN(const json* single, o.Array("single"));
    // special_tokens: {name: {id, ids, tokens}}
    std::unordered_map<std::string, std::vector<int32_t>> specials;
    if (const json* st = o.Find("special_tokens")) {
      if (!st->is_object()) return TypeError(what, o.At("special_tokens"), "an object", *st);
      for (auto it = st->begin(); it != st->end(); ++it) {
        ASSIGN_OR_RETURN(Obj e, AsObj(*it, o.At("special_tokens") + "." + it.key(), what));
        ASSIGN_OR_RETURN(const json* arr, e.Array("ids"));
        std::vector<int32_t> list;
        for (size_t k = 0; k < arr->size(); ++k) {
          const json& x = (*arr)[k];
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
            return InvalidArgument(what + ": " + e.At("ids") + "[" + std::to_string(k) +
                                   "]: expected a token id, got " + BriefJson(x));
          }
          list.push_back(x.get<int32_t>());
        }
        specials[it.key()] = std::move(list);
      }
    }
    bool seen_a = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const std::string at = o.At("single") + "[" + std::to_string(i) + "]";
      ASSIGN_OR_RETURN(Obj piece, AsObj((*single)[i], at, what));
      if (piece.Find("Sequence") != nullptr) {
        ASSIGN_OR_RETURN(Obj seq, piece.Object("Sequence"));
        ASSIGN_OR_RETURN(std::string id, seq.Str("id"));
        if (id != "A") {
          return InvalidArgument(what + ": " + seq.At("id") + " = " + Quote(id) +
                                 ": a single-sequence template can only hold $A");
        }
        seen_a = true;
        continue;
      }
      ASSIGN_OR_RETURN(Obj sp, piece.Object("SpecialToken"));
      ASSIGN_OR_RETURN(std::string name, sp.Str("id"));
      const auto it = specials.find(name);
      std::vector<int32_t> list;
      if (it != specials.end()) {
        list = it->second;
      } else {
        const int32_t id = ids.TokenId(name);
        if (id < 0) {
          return InvalidArgument(what + ": " + sp.At("id") + " = " + Quote(name) +
                                 " is neither in special_tokens nor in the vocabulary");
        }
        list = {id};
      }
      std::vector<int32_t>* dst = seen_a ? suffix : prefix;
      dst->insert(dst->end(), list.begin(), list.end());
    }
    return OkStatus();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      ASSIGN_OR_RETURN(const json* arr, o.Array(key));
      if (arr->size() != 2 || !(*arr)[0].is_string() || !(*arr)[1].is_number_integer() ||
          (*arr)[1].get<int64_t>() < 0 || (*arr)[1].get<int64_t>() > INT32_MAX) {
        return InvalidArgument(what + ": " + o.At(key) + ": expected [token, id], got " +
                               BriefJson(*arr));
      }
      (std::string(key) == "cls" ? prefix : suffix)->push_back((*arr)[1].get<int32_t>());
    }
    return OkStatus();
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const json* arr, o.Array("processors"));
    for (size_t i = 0; i < arr->size(); ++i) {
      RETURN_IF_ERROR(ParsePostProcessor((*arr)[i],
                                         o.At("processors") + "[" + std::to_string(i) + "]", what,
                                         ids, prefix, suffix));
    }
    return OkStatus();
  }
  return UnsupportedType(o, "post-processor", type);
}

}  // namespace

StatusOr<std::shared_ptr<HfTokenizer>> HfTokenizer::FromJsonText(std::string_view text,
                                                                 const std::string& what) {
  ASSIGN_OR_RETURN(json j, ParseUntrustedJson(text, what));
  return FromJson(j, what);
}

StatusOr<std::shared_ptr<HfTokenizer>> HfTokenizer::FromJson(const json& j,
                                                             const std::string& what) {
  std::shared_ptr<HfTokenizer> tok(new HfTokenizer());
  Impl& im = *tok->impl_;
  im.what = what;
  im.replace_invalid_utf8 = true;
  ASSIGN_OR_RETURN(Obj root, AsObj(j, "(top level)", what));
  root.path.clear();
  // truncation and padding are batching options, irrelevant to encoding one text.
  static const json kNull;
  auto member = [&](const char* key) -> const json& {
    const json* f = root.Find(key);
    return f ? *f : kNull;
  };
  ASSIGN_OR_RETURN(im.normalizer, ParseNormalizer(member("normalizer"), "normalizer", what));
  ASSIGN_OR_RETURN(im.pre_tokenizer,
                   ParsePreTokenizer(member("pre_tokenizer"), "pre_tokenizer", what));
  ASSIGN_OR_RETURN(im.decoder, ParseDecoder(member("decoder"), "decoder", what));
  ASSIGN_OR_RETURN(Obj model, root.Object("model"));
  // Old files leave out model.type; HF then tells the model by its fields.
  std::string type;
  if (model.Find("type") != nullptr) {
    ASSIGN_OR_RETURN(type, model.Str("type"));
  } else if (model.Find("merges") != nullptr) {
    type = "BPE";
  } else if (model.Find("vocab") != nullptr && model.Find("vocab")->is_array()) {
    type = "Unigram";
  }
  if (type == "BPE") {
    im.bpe.emplace();
    RETURN_IF_ERROR(ParseBpe(model, &*im.bpe));
    im.unk = im.bpe->unk;
  } else if (type == "Unigram") {
    ASSIGN_OR_RETURN(UnigramModel u, ParseUnigram(model));
    im.unk = u.unk_id();
    im.unigram.emplace(std::move(u));
  } else {
    return Unimplemented(what + ": model.type: unsupported model type " + Quote(type) +
                         " (supported: BPE, Unigram)");
  }
  const int64_t model_size = im.bpe ? static_cast<int64_t>(im.bpe->id_to_token.size())
                                    : static_cast<int64_t>(im.unigram->size());
  ASSIGN_OR_RETURN(im.added, ParseAddedTokens(root, model_size));
  im.Finish();
  RETURN_IF_ERROR(ParsePostProcessor(member("post_processor"), "post_processor", what, *tok,
                                     &im.prefix, &im.suffix));
  for (const int32_t id : im.prefix) {
    if (id >= static_cast<int32_t>(im.id_to_token.size())) {
      return InvalidArgument(what + ": post_processor: special token id " + std::to_string(id) +
                             " is outside the vocabulary");
    }
  }
  for (const int32_t id : im.suffix) {
    if (id >= static_cast<int32_t>(im.id_to_token.size())) {
      return InvalidArgument(what + ": post_processor: special token id " + std::to_string(id) +
                             " is outside the vocabulary");
    }
  }
  return tok;
}

StatusOr<std::shared_ptr<HfTokenizer>> HfTokenizer::FromByteLevelBpe(ByteLevelBpeSpec spec) {
  std::shared_ptr<HfTokenizer> tok(new HfTokenizer());
  Impl& im = *tok->impl_;
  im.what = spec.what;
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  for (const std::string& r : spec.regexes) {
    auto re = RegexSplitter::Compile(r);
    if (!re.ok()) return re.status().WithContext(spec.what + ".pre");
    steps.emplace_back(new SplitPreTokenizer(std::move(*re), SplitBehavior::kIsolated, false));
  }
  steps.emplace_back(new ByteLevelPreTokenizer(false, std::nullopt));
  im.pre_tokenizer.reset(new SequencePreTokenizer(std::move(steps)));
  im.decoder.reset(new ByteLevelDecoder());
  im.bpe.emplace();
  BpeModel& bpe = *im.bpe;
  bpe.vocab.Reserve(spec.tokens.size());
  for (int32_t i = 0; i < static_cast<int32_t>(spec.tokens.size()); ++i) {
    bpe.vocab.Set(spec.tokens[i], i);  // last wins, as llama.cpp's token_to_id
  }
  bpe.id_to_token = std::move(spec.tokens);
  bpe.unk = spec.unk;
  bpe.ignore_merges = spec.ignore_merges;
  im.unk = spec.unk;
  bpe.merges.Reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const std::string& m = spec.merges[r];
    const std::string where = spec.what + ".merges[" + std::to_string(r) + "] = " + Quote(m);
    std::string_view a, b;
    if (!SplitMerge(m, &a, &b))
      return InvalidArgument(where + " is not of the form \"left right\"");
    RETURN_IF_ERROR(AddMerge(&bpe, a, b, static_cast<int32_t>(r), where));
  }
  bpe.InitByteIds();
  im.added = std::move(spec.added);
  for (HfAddedToken& t : im.added) t.normalized = false;  // no normalizer: matched on raw text
  im.Finish();
  return tok;
}

std::vector<int32_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens,
                                         bool split_special_tokens) const {
  const Impl& im = *impl_;
  if (im.replace_invalid_utf8 && !IsValidUtf8(text)) {
    return Encode(ReplaceInvalidUtf8(text), add_special_tokens, split_special_tokens);
  }
  std::vector<int32_t> out;
  if (add_special_tokens) out = im.prefix;
  std::vector<Segment> segs, norm_segs;
  const Segment whole{std::string(text), -1, true};
  if (im.raw_matcher.empty()) {
    if (!text.empty()) segs.push_back(whole);
  } else {
    SplitAdded(im.raw_matcher, split_special_tokens, whole, &segs);
  }
  for (Segment& s : segs) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    if (im.normalizer) im.normalizer->Apply(&s.text);
    norm_segs.clear();
    if (im.norm_matcher.empty()) {
      norm_segs.push_back(std::move(s));
    } else {
      SplitAdded(im.norm_matcher, split_special_tokens, s, &norm_segs);
    }
    for (const Segment& n : norm_segs) {
      if (n.id >= 0) {
        out.push_back(n.id);
      } else if (!n.text.empty()) {
        im.EncodeText(n.text, n.at_start, &out);
      }
    }
  }
  if (add_special_tokens) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
  return out;
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<DecTok> toks;
  toks.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(im.id_to_token.size())) continue;
    if (skip_special_tokens && im.added_kind[id] == 2) continue;
    toks.push_back({im.id_to_token[id], im.added_kind[id] != 0});
  }
  if (!im.decoder) {  // HF joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i].text;
    return out;
  }
  im.decoder->Apply(&toks, true);
  std::string out;
  for (const DecTok& t : toks) out += t.text;
  return out;
}

std::string HfTokenizer::DecodeToken(int32_t id) const {
  const Impl& im = *impl_;
  if (id < 0 || id >= static_cast<int32_t>(im.id_to_token.size())) return "";
  std::vector<DecTok> toks{{im.id_to_token[id], im.added_kind[id] != 0}};
  if (!im.decoder) return toks[0].text;
  im.decoder->Apply(&toks, false);
  std::string out;
  for (const DecTok& t : toks) out += t.text;
  return out;
}

std::string HfTokenizer::Normalize(std::string_view text) const {
  std::string s(text);
  if (impl_->normalizer) impl_->normalizer->Apply(&s);
  return s;
}

std::vector<std::string> HfTokenizer::PreTokenize(std::string_view normalized,
                                                  bool at_start) const {
  std::vector<Piece> pieces{{std::string(normalized), at_start}};
  if (impl_->pre_tokenizer) impl_->pre_tokenizer->Apply(&pieces);
  std::vector<std::string> out;
  for (Piece& p : pieces) out.push_back(std::move(p.text));
  return out;
}

int32_t HfTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

const std::string& HfTokenizer::token_text(int32_t id) const {
  STRATA_CHECK_MSG(id >= 0 && id < vocab_size(), "token id %d out of range [0, %d)", id,
                   vocab_size());
  return impl_->id_to_token[id];
}

int32_t HfTokenizer::TokenId(std::string_view text) const { return impl_->Find(text); }

const std::vector<HfAddedToken>& HfTokenizer::added_tokens() const { return impl_->added; }

bool HfTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->added_kind[id] == 2;
}
bool HfTokenizer::IsAdded(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->added_kind[id] != 0;
}
bool HfTokenizer::IsByteToken(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->byte_token[id];
}
int32_t HfTokenizer::unk_id() const { return impl_->unk; }
const std::vector<int32_t>& HfTokenizer::prefix_special_ids() const { return impl_->prefix; }
const std::vector<int32_t>& HfTokenizer::suffix_special_ids() const { return impl_->suffix; }

void HfTokenizer::SetSpecialTemplate(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  impl_->prefix = std::move(prefix);
  impl_->suffix = std::move(suffix);
}

}  // namespace strata
