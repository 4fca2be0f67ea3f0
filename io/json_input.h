// Untrusted JSON (config.json, safetensors headers, tokenizer files): parsed with a nesting limit.
//
// nlohmann's parser is iterative, but dump(), copies and comparisons of a parsed value recurse
// once per level: a 200 KB file of nested brackets overflows the stack there (~52,000 levels in a
// release build). Every JSON text from outside goes through ParseUntrustedJson, which refuses
// nesting deeper than kMaxJsonDepth before nlohmann sees it, so no later recursion can overflow.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace strata {

// Far above any real file (HF configs nest 3 levels, tokenizer.json about 6).
inline constexpr int kMaxJsonDepth = 64;

// Byte offset of the first bracket that opens level `max_depth + 1`, or -1 if the text never
// nests that deep. Brackets inside strings (with escapes) do not count; invalid JSON is left to
// the parser.
int64_t JsonDepthExceededAt(std::string_view text, int max_depth = kMaxJsonDepth);

// Parses `text`; `what` names the source in errors (DataLoss: "what: not valid JSON (parse error
// at byte N ...)" or "what: JSON nests deeper than 64 levels (at byte N)").
StatusOr<nlohmann::json> ParseUntrustedJson(std::string_view text, const std::string& what);

// What a value is, for messages that say what a field was: "null", "a boolean", "a string",
// "an integer", "a number", "an array", "an object".
std::string JsonTypeName(const nlohmann::json& v);

// A value as JSON text for an error message, cut to about max_chars ("..." marks the cut).
std::string BriefJson(const nlohmann::json& v, size_t max_chars = 80);

}  // namespace strata
