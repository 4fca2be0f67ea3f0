// RegexSplitter: PCRE2 matching (JIT when available) and HF's split behaviors.
#include "io/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <optional>

namespace strata {

StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgument("split behavior \"" + std::string(name) +
                         "\" is not one of Removed, Isolated, MergedWithPrevious, "
                         "MergedWithNext, Contiguous");
}

// The one place where Oniguruma syntax (what HF's tokenizer.json regexes are written in) is
// rewritten for PCRE2. Everything the real tokenizers use (\p{L}, \p{N}, \p{M}, \s, lookahead,
// possessive/counted quantifiers, (?i:...)) already means the same in both with PCRE2_UCP; in
// particular PCRE2's \s matches Unicode White_Space (U+0085 and U+00A0 included), as Oniguruma's
// does. What differs:
//   \h, \H    Oniguruma: a hexadecimal digit / not one. PCRE2: horizontal whitespace.
//             Rewritten to [0-9a-fA-F] / [^0-9a-fA-F] (inside a class: the bare ranges; \H
//             inside a class is left alone, there is no bare-range form of its complement).
//   \uHHHH    Oniguruma: a code point. PCRE2 (default options): an error. Rewritten to \x{HHHH}.
std::string TranslateOnigurumaPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 8);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'h') {
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (e == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else if (e == 'u' && i + 5 < p.size() &&
                 std::isxdigit(static_cast<unsigned char>(p[i + 2])) &&
                 std::isxdigit(static_cast<unsigned char>(p[i + 3])) &&
                 std::isxdigit(static_cast<unsigned char>(p[i + 4])) &&
                 std::isxdigit(static_cast<unsigned char>(p[i + 5]))) {
        out += "\\x{";
        out.append(p, i + 2, 4);
        out += '}';
        i += 4;
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

namespace {

void FreeCode(pcre2_code* c) { pcre2_code_free(c); }

// One match-data block per thread, reused across calls (only the whole-match pair is read).
pcre2_match_data* ThreadMatchData() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

}  // namespace

struct RegexSplitter::Code {
  std::string pattern;  // as given (before translation), for errors and pattern()
  std::unique_ptr<pcre2_code, decltype(&FreeCode)> code{nullptr, &FreeCode};
  bool jit = false;
};

StatusOr<RegexSplitter> RegexSplitter::Compile(std::string_view pattern) {
  return CompileImpl(TranslateOnigurumaPattern(pattern), false, std::string(pattern));
}

StatusOr<RegexSplitter> RegexSplitter::CompileLiteral(std::string_view literal) {
  return CompileImpl(literal, true, std::string(literal));
}

StatusOr<RegexSplitter> RegexSplitter::CompileImpl(std::string_view pattern, bool literal,
                                                   std::string original) {
  auto code = std::make_shared<Code>();
  code->pattern = std::move(original);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  opts |= literal ? PCRE2_LITERAL : PCRE2_UCP;  // PCRE2 refuses UCP with LITERAL (no classes)
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts,
                                &err, &err_off, nullptr);
  if (c == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument("regex \"" + code->pattern +
                           "\" does not compile: " + reinterpret_cast<const char*>(msg) +
                           " (at offset " + std::to_string(err_off) + ")");
  }
  code->code.reset(c);
  // JIT is an optimisation only: when the library was built without it (or it refuses the
  // pattern), the interpreter runs the same pattern.
  code->jit = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
  return RegexSplitter(std::move(code));
}

const std::string& RegexSplitter::pattern() const { return code_->pattern; }

void RegexSplitter::FindMatches(std::string_view text,
                                std::vector<std::pair<size_t, size_t>>* out) const {
  pcre2_match_data* md = ThreadMatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  uint32_t opts = 0;
  std::optional<size_t> last_end;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code.get(), subject, text.size(), start, opts, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && code_->jit) {
      // JIT stack exhausted (or another JIT-only limit): retry with the interpreter, whose
      // heap-allocated backtracking frames go much further.
      rc = pcre2_match(code_->code.get(), subject, text.size(), start, opts | PCRE2_NO_JIT, md,
                       nullptr);
    }
    // No match, or a resource limit even for the interpreter (pathological backtracking): the
    // rest of the text is a gap. This never errors out, so tokenization always completes.
    if (rc < 0) return;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    // Empty matches count (they split a gap, as in HF), except one right where the previous
    // match ended: Rust's find_iter (onig, regex) skips those, Perl's //g would not.
    if (e > b || !last_end.has_value() || *last_end != b) out->emplace_back(b, e);
    last_end = e;
    // After an empty match the next one must not be empty at the same place (Perl's rule).
    opts = e == b ? PCRE2_NOTEMPTY_ATSTART : 0;
    start = e;
    if (e == b && e == text.size()) return;
  }
}

void RegexSplitter::SplitSpans(std::string_view text, SplitBehavior behavior, bool invert,
                               std::vector<std::pair<size_t, size_t>>* out) const {
  if (text.empty()) return;
  std::vector<std::pair<size_t, size_t>> matches;
  FindMatches(text, &matches);
  // Matches and gaps in order, flagged (HF's Pattern::find_matches), then inverted if asked.
  struct Span {
    size_t b, e;
    bool match;
  };
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->emplace_back(b, e);
  };
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) emit(s.b, s.e);
      }
      return;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) emit(s.b, s.e);
      return;
    case SplitBehavior::kContiguous: {
      // Runs of equal flags fuse.
      std::vector<Span> acc;
      for (const Span& s : spans) {
        if (!acc.empty() && acc.back().match == s.match) {
          acc.back().e = s.e;
        } else {
          acc.push_back(s);
        }
      }
      for (const Span& s : acc) emit(s.b, s.e);
      return;
    }
    case SplitBehavior::kMergedWithPrevious: {
      std::vector<Span> acc;
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match && !prev_match && !acc.empty()) {
          acc.back().e = s.e;
        } else {
          acc.push_back(s);
        }
        prev_match = s.match;
      }
      for (const Span& s : acc) emit(s.b, s.e);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      // Walk backwards: a match joins the piece after it unless that piece is a match too.
      std::vector<Span> acc;
      bool next_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !next_match && !acc.empty()) {
          acc.back().b = it->b;
        } else {
          acc.push_back(*it);
        }
        next_match = it->match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->b, it->e);
      return;
    }
  }
}

void RegexSplitter::Split(std::string_view text, SplitBehavior behavior, bool invert,
                          std::vector<std::string>* out) const {
  std::vector<std::pair<size_t, size_t>> spans;
  SplitSpans(text, behavior, invert, &spans);
  for (const auto& [b, e] : spans) out->emplace_back(text.substr(b, e - b));
}

}  // namespace strata
