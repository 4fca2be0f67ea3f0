// Tokenizer built from GGUF metadata (llama.cpp keys): SentencePiece-style (`tokenizer.ggml.model`
// = "llama": scores, U+2581 word marker, byte fallback tokens <0xNN>) and byte-level BPE ("gpt2":
// merges, GPT-2 byte-to-unicode map).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

class GgufFile;

class Tokenizer {
 public:
  enum class Kind { kSentencePiece, kBytePairGpt2 };

  // Reads tokenizer.ggml.{model,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,add_bos_token,add_space_prefix}. Errors name the missing or bad key.
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& f);

  Kind kind() const { return kind_; }
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  const std::string& token_text(int32_t id) const { return tokens_.at(id); }

  // Text -> ids. Prepends BOS when add_bos is true and `with_bos` is set.
  std::vector<int32_t> Encode(const std::string& text, bool with_bos) const;
  // Ids -> text (byte tokens reassembled into UTF-8; BOS/EOS/control tokens dropped).
  std::string Decode(const std::vector<int32_t>& ids) const;
  // Text piece of one id as it should be printed when streaming (may be a partial UTF-8 byte).
  std::string DecodeToken(int32_t id) const;
  // Returns InvalidArgument naming the id when out of range.
  Status CheckId(int32_t id) const;

 private:
  Tokenizer() = default;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  Kind kind_ = Kind::kSentencePiece;
  std::vector<std::string> tokens_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
};

}  // namespace strata
