// Tokenizer built from GGUF metadata (llama.cpp keys): SentencePiece-style (`tokenizer.ggml.model`
// = "llama": scores, U+2581 word marker, byte fallback tokens <0xNN>) and byte-level BPE ("gpt2":
// merges, GPT-2 byte-to-unicode map), or from an HF tokenizer.json (FromHfJson).
//
// Behaviour follows llama.cpp (llm_tokenizer_spm / llm_tokenizer_bpe) so that real GGUF files
// tokenize the same way, with these deliberate differences:
// - "gpt2" runs on the tokenizer.json pipeline (io/hf_tokenizer.h): the pre-tokenizer regexes of
//   its `tokenizer.ggml.pre` type (PCRE2, real Unicode classes) as Split Isolated steps, then
//   byte-level BPE and the ByteLevel decoder. An unknown `pre` is an error at load. Control (and
//   unknown) tokens are special added tokens, user-defined tokens non-special ones; added tokens
//   are matched leftmost-longest (HF's AddedVocabulary; llama.cpp tries them longest first).
// - Invalid UTF-8 never throws. "llama": stray bytes become one-byte pieces and still
//   round-trip. "gpt2" and a tokenizer.json read each maximal bad sequence as U+FFFD, as llama.cpp
//   does and as HF is given text, so their ids are the references' (the round trip then gives
//   the repaired text).
// - A "gpt2" file without tokenizer.ggml.add_bos_token takes llama.cpp's default: BOS for the
//   llama3 group, tekken and chameleon, none for the other pre types.
// - Decode drops the leading space added by add_space_prefix even when a BOS precedes the text
//   (llama.cpp keeps it in that case), so Decode(Encode(x)) == x. Clean-up of spaces before
//   punctuation (clean_up_tokenization_spaces) is not done, for the same reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

class GgufFile;

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // <s>, </s>, <|im_start|>: never printed by Decode
  kUserDefined = 4,  // matched verbatim in the input text, printed verbatim
  kUnused = 5,
  kByte = 6,  // SentencePiece byte fallback <0xNN>
};

// Everything the tokenizer is built from, decoupled from the GGUF container. Field names follow
// the tokenizer.ggml.* keys; optional arrays may be empty.
struct TokenizerData {
  std::string model;                 // "llama" (SentencePiece) or "gpt2" (byte-level BPE)
  std::vector<std::string> tokens;   // [n_vocab]
  std::vector<float> scores;         // [n_vocab] or empty (all 0)
  std::vector<int32_t> token_types;  // [n_vocab] TokenType values, or empty (inferred)
  std::vector<std::string> merges;   // "left right", rank = index (gpt2 only)
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;  // -1: none
  bool add_bos = true;
  bool add_space_prefix = true;  // "llama" only: prepend U+2581 to the text
  std::string pre;               // tokenizer.ggml.pre: the pre-tokenizer type ("gpt2" only)
  // End-of-turn / end-of-message / fill-in-the-middle ids (tokenizer.ggml.{eot,eom,fim_pad,
  // fim_rep,fim_sep}_token_id); they join the end-of-generation set (Tokenizer::eog_ids()).
  int32_t eot = -1, eom = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;  // -1: none
  std::string chat_template;  // tokenizer.chat_template (Jinja source), "" if none
};

class Tokenizer {
 public:
  // kTokenizerJson: built by FromHfJson (whatever model the tokenizer.json holds).
  enum class Kind { kSentencePiece, kBytePairGpt2, kTokenizerJson };

  // Reads tokenizer.ggml.{model,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,padding_token_id,eot_token_id,eom_token_id,fim_pad_token_id,
  // fim_rep_token_id,fim_sep_token_id,add_bos_token,add_space_prefix,pre} and
  // tokenizer.chat_template. Errors name the
  // missing or bad key. Absent keys take llama.cpp's defaults ("llama": bos 1, eos 2, unk 0,
  // add_bos and add_space_prefix true; "gpt2": no special ids, add_bos false).
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& f);
  // Validates `data` (model name, array lengths, special ids in range, merges well formed and in
  // the vocabulary, gpt2 byte coverage); errors name the key and the bad value.
  static StatusOr<std::unique_ptr<Tokenizer>> FromData(TokenizerData data);
  // Loads an HF tokenizer.json (io/hf_tokenizer.h). A tokenizer_config.json beside it supplies
  // bos_token / eos_token / pad_token (string or AddedToken object), add_bos_token /
  // add_eos_token (when present they replace the post-processor by "[bos] $A [eos]", as
  // transformers' update_post_processor does) and chat_template (a string, or a list of
  // {name, template} of which "default" is taken). Encode's with_bos applies the
  // post-processor's special tokens; parse_special cuts special added tokens out of the text.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(const std::string& path);

  Kind kind() const { return kind_; }
  int32_t vocab_size() const { return vocab_size_; }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int32_t unk_id() const;
  int32_t pad_id() const;
  bool add_bos() const { return add_bos_; }
  const std::string& token_text(int32_t id) const;  // CHECKs the id (use CheckId first)
  TokenType token_type(int32_t id) const;           // kUndefined for out-of-range ids
  // The id of an exact token text, or -1.
  int32_t TokenId(const std::string& text) const;
  // Whether Gemma's turn markers <start_of_turn> / <end_of_turn> are single tokens.
  bool HasGemmaTurns() const { return TokenId("<start_of_turn>") >= 0 && TokenId("<end_of_turn>") >= 0; }

  // Text -> ids. Prepends BOS when add_bos is true and `with_bos` is set. User-defined tokens
  // in the text are always matched verbatim (as llama.cpp does); control tokens such as
  // "<|im_start|>" only when `parse_special` is set.
  std::vector<int32_t> Encode(const std::string& text, bool with_bos) const;
  std::vector<int32_t> Encode(const std::string& text, bool with_bos, bool parse_special) const;
  // Ids -> text (byte tokens reassembled into UTF-8; BOS/EOS/control tokens dropped; ids out of
  // range skipped). For "llama" with add_space_prefix the first printed space is removed.
  std::string Decode(const std::vector<int32_t>& ids) const;
  // Decode with control and unknown tokens either hidden (as above) or, with render_special,
  // printed as their text (llama.cpp's --special). Rendered, a special token is followed by the
  // text it was encoded with: for "llama" with add_space_prefix the space prefix Encode put
  // after it is removed too, so Decode(Encode(s, false, true), true) == s.
  std::string Decode(const std::vector<int32_t>& ids, bool render_special) const;
  // Text piece of one id as it should be printed when streaming (may be a partial UTF-8 byte;
  // keeps the leading space; "" for control tokens and out-of-range ids).
  std::string DecodeToken(int32_t id) const;
  // The same, printing control and unknown tokens' text when render_special is set.
  std::string DecodeToken(int32_t id, bool render_special) const;

  // End-of-generation tokens (llama.cpp's special_eog_ids): EOS, EOT, EOM and the FIM pad,
  // repo and file-separator ids, plus every token whose text is a known end-of-turn marker
  // (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>,
  // <｜end▁of▁sentence｜>, [EOS], [EOT], ...). Sorted ascending. llama.cpp also retypes such a
  // token as control when the file did not; Strata keeps the stored type.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool IsEog(int32_t id) const;
  // tokenizer.chat_template (FromHfJson: tokenizer_config.json's), "" when the file has none.
  const std::string& chat_template() const { return chat_template_; }
  // Returns InvalidArgument naming the id when out of range.
  Status CheckId(int32_t id) const;

  // The GPT-2 pre-tokenizer regex on its own: the pieces `text` is split into before byte-level
  // BPE (their concatenation is `text`). Exposed for tests and diagnostics.
  static std::vector<std::string> SplitGpt2Words(const std::string& text);

 private:
  Tokenizer() = default;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  Kind kind_ = Kind::kSentencePiece;
  int32_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  // Special-token metadata (see eog_ids(), chat_template()), set by InitSpecialTokens.
  void InitSpecialTokens(const TokenizerData& data);
  std::vector<int32_t> eog_ids_;
  std::string chat_template_;
};

}  // namespace strata
