// Tokenizers beside an HF checkpoint turned into llama.cpp's tokenizer.ggml.* GGUF keys: the
// description tools/testbed writes (strata_tokenizer.json), and a real HF tokenizer.json (with
// tokenizer_config.json / config.json) converted as llama.cpp's convert_hf_to_gguf.py does.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/gguf.h"

namespace strata {

inline constexpr const char* kTokenizerJsonName = "strata_tokenizer.json";

// Reads `path` ({"model", "tokens", "token_types", "scores", "merges", "bos_token_id",
// "eos_token_id", "add_bos_token", "add_space_prefix"}; ids < 0 mean none) and sets the keys on
// `w`. Errors name the file and the bad field.
Status AddTokenizerJson(const std::string& path, GgufWriter* w);

// What AddHfTokenizerJson wrote.
struct HfTokenizerConversion {
  std::string model;    // tokenizer.ggml.model ("gpt2")
  std::string pre;      // tokenizer.ggml.pre
  int32_t n_tokens = 0;
  int32_t n_merges = 0;
};

// Converts `dir`/tokenizer.json (a byte-level BPE model) as convert_hf_to_gguf.py's
// _set_vocab_gpt2 + gguf-py's SpecialVocab do:
// - tokenizer.ggml.model "gpt2"; .pre from the tokenizer.json fingerprint
//   (PreTypeOfTokenizerJson; llama.cpp hashes token ids of a test text instead).
// - .tokens: the vocabulary and the added tokens by id, config.json's vocab_size long (holes are
//   "[PAD<i>]"); .token_type: NORMAL, an added token CONTROL when special or when it looks
//   special (<|..|>, <｜..｜>, <pad>, <mask>, ...), else USER_DEFINED (its U+2581 written as ' '),
//   holes UNUSED.
// - .merges as "left right" (the [left, right] form joined, spaces inside written as U+0120).
// - bos/eos/unk/sep/pad/mask (and eot/eom) ids: tokenizer_config.json's <type>_token looked up
//   among the added tokens, then config.json's <type>_token_id; the post-processor's template
//   sets add_bos/add_eos (TemplateProcessing) or bos/eos/sep (RobertaProcessing), and
//   tokenizer_config.json's add_<type>_token overrides; written as u32 / bool.
// - tokenizer.chat_template from tokenizer_config.json (or chat_template.jinja / .json; a list
//   of named templates gives tokenizer.chat_template.<name> too).
// Errors name the file and what is not supported (a Unigram or SentencePiece-style model, a
// pre-tokenizer Strata does not recognise, an id beyond the vocabulary).
StatusOr<HfTokenizerConversion> AddHfTokenizerJson(const std::string& dir, GgufWriter* w);

}  // namespace strata
