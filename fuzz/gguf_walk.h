// What the GGUF and HF-directory fuzz targets do with a file that opened: every metadata getter
// on every key, every tensor's first and last byte, the model config, the tokenizer and a
// tokenize/detokenize round of fixed and fuzzed text.
#pragma once

#include <string_view>

#include "io/gguf.h"

namespace strata::fuzz {

// `text`: extra input for the tokenizer (part of the fuzz input).
void WalkGguf(const GgufFile& f, std::string_view text);

}  // namespace strata::fuzz
