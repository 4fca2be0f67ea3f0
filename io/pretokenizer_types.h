// The pre-tokenizer of each GGUF `tokenizer.ggml.pre` type (llama.cpp's names), as the PCRE2
// regexes that split text before byte-level BPE, and the reverse: the type of a tokenizer.json.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata {

// The regexes llama.cpp applies for `pre` (llm_tokenizer_bpe's regex_exprs), in PCRE2 syntax
// (UTF + UCP): applied in order, each one splits every piece the previous ones produced, keeping
// both the matches and the text between them (HF's Split behavior "Isolated"). "" (key absent)
// is "default", as in llama.cpp. Where llama.cpp rewrote a pattern for its std::regex engine
// (its \p{..} classes collapse to a few categories; Kimi K2 is a hand-written splitter), the
// original Unicode pattern of the model's tokenizer is given instead, written for PCRE2
// (e.g. Kimi's class intersections [..&&[^\p{Han}]] as a negative lookahead per character).
// Case-insensitive contractions are spelled '[sS]... as llama.cpp does (PCRE2's (?i) would also
// fold U+017F and U+212A). An unknown name: InvalidArgument listing the supported names.
StatusOr<std::vector<std::string>> PreTokenizerRegexes(std::string_view pre);

// Whether llama.cpp sets ignore_merges for `pre` (llama3, tekken: a piece that is a whole
// vocabulary token is emitted as that token without running the merges). False for unknown names.
bool PreTokenizerIgnoresMerges(std::string_view pre);

// Every name PreTokenizerRegexes accepts (aliases included; "" is not listed).
std::vector<std::string> SupportedPreTokenizers();

// The `tokenizer.ggml.pre` name for a byte-level BPE tokenizer.json (the whole file's JSON),
// recognised by the fingerprint of its normalizer and pre_tokenizer: the Split regexes (and their
// behavior/invert), ByteLevel's use_regex / add_prefix_space, Digits. Accepted normalizers: none,
// an empty Sequence, NFC (Qwen; llama.cpp does not normalize, see the .cc). Unknown: InvalidArgument
// naming what was found (the pre-tokenizer steps and regexes).
StatusOr<std::string> PreTypeOfTokenizerJson(const nlohmann::json& tokenizer_json);

}  // namespace strata
