#include "io/json_input.h"

namespace strata {

int64_t JsonDepthExceededAt(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return static_cast<int64_t>(i);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return -1;
}

StatusOr<nlohmann::json> ParseUntrustedJson(std::string_view text, const std::string& what) {
  const int64_t deep = JsonDepthExceededAt(text);
  if (deep >= 0) {
    return DataLoss(what + ": JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels (at byte " + std::to_string(deep) + ")");
  }
  nlohmann::json j = nlohmann::json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  // Say where: parse again with exceptions for the parser's position message.
  std::string why = "parse error";
  try {
    [[maybe_unused]] nlohmann::json ignored = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    why = e.what();
    if (why.size() > 200) why = why.substr(0, 200) + "...";  // the parser quotes the bad token
  }
  return DataLoss(what + ": not valid JSON (" + why + ")");
}

std::string BriefJson(const nlohmann::json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/false,
                         nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

std::string JsonTypeName(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

}  // namespace strata
