// The tokenizer description that tools/testbed writes beside an HF checkpoint
// (strata_tokenizer.json), turned into llama.cpp's tokenizer.ggml.* GGUF keys.
#pragma once

#include <string>

#include "core/status.h"
#include "io/gguf.h"

namespace strata {

inline constexpr const char* kTokenizerJsonName = "strata_tokenizer.json";

// Reads `path` ({"model", "tokens", "token_types", "scores", "merges", "bos_token_id",
// "eos_token_id", "add_bos_token", "add_space_prefix"}; ids < 0 mean none) and sets the keys on
// `w`. Errors name the file and the bad field.
Status AddTokenizerJson(const std::string& path, GgufWriter* w);

}  // namespace strata
