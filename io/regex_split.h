// RegexSplitter: a compiled PCRE2 (UTF-8, Unicode properties) pattern that splits text the way
// the HF `tokenizers` library's Split pre-tokenizer / NormalizedString::split does.
//
// HF's patterns are written for Oniguruma (Rust `onig`) and fancy-regex; the constructs they use
// (\p{..} classes, lookahead, possessive and counted quantifiers, (?i:..)) mean the same in PCRE2
// with PCRE2_UCP. The few places where the dialects differ are rewritten in one function,
// TranslateOnigurumaPattern (regex_split.cc), documented there.
//
// Invalid UTF-8 never fails or crashes: patterns are compiled with PCRE2_MATCH_INVALID_UTF, so
// an invalid byte simply cannot be part of a match and ends up in a gap.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata {

// What to do with the matches (HF's SplitDelimiterBehavior).
enum class SplitBehavior {
  kRemoved,             // drop the matches, keep the gaps
  kIsolated,            // matches and gaps each become a piece
  kMergedWithPrevious,  // a match is appended to the piece before it
  kMergedWithNext,      // a match is prepended to the piece after it
  kContiguous,          // consecutive matches (and consecutive gaps) fuse into one piece
};

// Parses HF's behavior names ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
// "Contiguous"); InvalidArgument naming the value otherwise.
StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

// Oniguruma -> PCRE2 pattern rewrite (see regex_split.cc). Exposed for tests.
std::string TranslateOnigurumaPattern(std::string_view pattern);

class RegexSplitter {
 public:
  // Compiles an HF (Oniguruma-syntax) regex. The error names the pattern and carries PCRE2's
  // message and the offset of the problem.
  static StatusOr<RegexSplitter> Compile(std::string_view pattern);
  // Matches `literal` verbatim (HF's Split with {"String": ...}).
  static StatusOr<RegexSplitter> CompileLiteral(std::string_view literal);

  // Non-overlapping matches of the pattern in `text` as [begin, end) byte offsets, leftmost
  // first, as Rust's find_iter yields them: an empty match is kept (it splits a gap) unless it
  // sits right where the previous match ended.
  void FindMatches(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

  // HF's split semantics: the text is cut into the matches and the gaps between them, `invert`
  // swaps which of the two count as matches, then `behavior` decides what becomes of them.
  // Empty pieces are never emitted. Appends to `out`.
  void Split(std::string_view text, SplitBehavior behavior, bool invert,
             std::vector<std::string>* out) const;
  // The same, as [begin, end) spans of `text` (no copies).
  void SplitSpans(std::string_view text, SplitBehavior behavior, bool invert,
                  std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const;

 private:
  struct Code;
  explicit RegexSplitter(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  static StatusOr<RegexSplitter> CompileImpl(std::string_view pattern, bool literal,
                                             std::string original);
  std::shared_ptr<const Code> code_;  // immutable once compiled: copies share it
};

}  // namespace strata
