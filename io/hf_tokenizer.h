// HfTokenizer: the HF `tokenizers` pipeline read from a tokenizer.json (normalizer, added
// tokens, pre-tokenizer, BPE/Unigram model, post-processor, decoder), and the same pipeline
// built from GGUF "gpt2" keys (byte-level BPE whose pre-tokenizer regexes come from the `pre`
// type). Tokenizer (io/tokenizer.h) wraps it; tests use it directly.
//
// Encode follows TokenizerImpl::encode: added tokens are cut out first (non-normalized ones on
// the raw text, normalized ones after the normalizer, leftmost-longest as HF's AddedVocabulary),
// the rest is normalized, pre-tokenized, run through the model, then the post-processor's
// special tokens are added. Supported components:
//   normalizers     NFC NFD NFKC NFKD Lowercase Replace Prepend Strip StripAccents Sequence null
//   pre-tokenizers  ByteLevel Split Metaspace Digits Whitespace WhitespaceSplit Punctuation
//                   Sequence null
//   models          BPE (byte-level or SentencePiece-style: byte_fallback, unk_token, fuse_unk,
//                   ignore_merges, continuing_subword_prefix, end_of_word_suffix), Unigram
//   decoders        ByteLevel Metaspace ByteFallback Fuse Strip Replace WordPiece BPEDecoder
//                   Sequence null
//   post-processors TemplateProcessing (single sequence) ByteLevel RobertaProcessing
//                   BertProcessing Sequence null
// Anything else is a clear Unimplemented error naming the component, type and JSON path.
//
// Invalid UTF-8 in the input: a tokenizer.json pipeline sees what HF would be given, the text
// with each maximal invalid subsequence replaced by U+FFFD (Python's errors="replace", the JS
// TextDecoder). An HfTokenizer built for a GGUF "gpt2" vocabulary keeps the raw bytes (they never
// match a regex and become byte-level characters of their own, so they round-trip here), but
// Tokenizer::Encode, the one every command uses, replaces them with U+FFFD before it calls this
// pipeline, as llama.cpp does (io/tokenizer.h).
//
// Deliberate differences from HF: decoding never replaces invalid UTF-8 with U+FFFD (byte
// tokens and byte-level characters give back the exact bytes); BPE dropout is refused; Lowercase
// uses utf8proc's simple case mapping (plus U+0130, the one full mapping that changes length);
// the ByteLevel decoder leaves added tokens as they are (as transformers does; HF's Rust decoder
// would byte-decode an added token made only of byte-level characters).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata {

// GPT-2's bytes_to_unicode: the UTF-8 of the character that stands for byte `b` in byte-level
// vocabularies ("Ġ" for ' ').
const std::string& Gpt2ByteChar(uint8_t b);

// `text` with each maximal invalid UTF-8 subsequence replaced by U+FFFD.
std::string ReplaceInvalidUtf8(std::string_view text);

// One entry of tokenizer.json's added_tokens (HF's AddedToken).
struct HfAddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = true;    // matched on normalized text (else on the raw text)
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool single_word = false;  // only matches when not inside a word
};

// What GGUF "gpt2" metadata gives (tokens indexed by id; merges "left right", rank = index;
// pre-tokenizer regexes in PCRE2 syntax applied in order as Split Isolated steps).
struct ByteLevelBpeSpec {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
  std::vector<std::string> regexes;
  std::vector<HfAddedToken> added;
  int32_t unk = -1;
  bool ignore_merges = false;  // a piece that is a whole token is that token (llama3, tekken)
  std::string what = "tokenizer.ggml";  // names the source in errors
};

class HfTokenizer {
 public:
  // Parses a tokenizer.json text; `what` names it in errors ("tokenizer.json: model.merges[3]:
  // ..."). Every field is type-checked.
  static StatusOr<std::shared_ptr<HfTokenizer>> FromJsonText(std::string_view text,
                                                             const std::string& what);
  static StatusOr<std::shared_ptr<HfTokenizer>> FromJson(const nlohmann::json& j,
                                                         const std::string& what);
  static StatusOr<std::shared_ptr<HfTokenizer>> FromByteLevelBpe(ByteLevelBpeSpec spec);

  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // Text -> ids. `add_special_tokens`: apply the post-processor's special tokens;
  // `split_special_tokens`: cut special added tokens out of the text (HF's default; when false
  // they are encoded as plain text, as HF's encode_special_tokens). Non-special added tokens are
  // always matched.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                              bool split_special_tokens = true) const;
  // Ids -> text through the decoder; ids out of range are skipped.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // One token as printed while streaming: the decoder run as on a token in the middle of a
  // text (no leading-space stripping), may be a partial UTF-8 character.
  std::string DecodeToken(int32_t id) const;

  // The stages on their own (tests, diagnostics).
  std::string Normalize(std::string_view text) const;
  // Pieces of already-normalized text; `at_start`: the text starts the input (Metaspace
  // prepend_scheme "first").
  std::vector<std::string> PreTokenize(std::string_view normalized, bool at_start = true) const;

  // max(id) + 1 over the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  // The token's text ("" for an id no token has). CHECKs the range.
  const std::string& token_text(int32_t id) const;
  int32_t TokenId(std::string_view text) const;  // -1 when absent
  const std::vector<HfAddedToken>& added_tokens() const;
  bool IsSpecial(int32_t id) const;    // a special added token
  bool IsAdded(int32_t id) const;      // any added token
  bool IsByteToken(int32_t id) const;  // "<0xNN>" of a byte_fallback model
  int32_t unk_id() const;
  // What the post-processor puts around a single sequence.
  const std::vector<int32_t>& prefix_special_ids() const;
  const std::vector<int32_t>& suffix_special_ids() const;
  // Replaces the post-processor by `prefix $A suffix` (transformers' update_post_processor for
  // tokenizer_config.json add_bos_token / add_eos_token). Only before the tokenizer is shared.
  void SetSpecialTemplate(std::vector<int32_t> prefix, std::vector<int32_t> suffix);

  struct Impl;

 private:
  HfTokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
