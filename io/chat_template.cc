// Built-in chat renderers, one per supported template family, and template recognition by
// fingerprint. Each renderer is the non-tool path of its family's published Jinja template,
// written out by hand; testdata/chat/ref.json holds the Jinja engine's output they must match.
#include "io/chat_template.h"

#include <cstdio>
#include <iterator>

namespace strata {
namespace {

constexpr char kQwen25DefaultSystem[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
constexpr char kQwen2DefaultSystem[] = "You are a helpful assistant.";
constexpr char kKimiDefaultSystem[] = "You are Kimi, an AI assistant created by Moonshot AI.";
// Llama 3.1's template writes this date unless the caller defines date_string (3.2 and later
// use strftime_now when defined; without it they fall back to the same date).
constexpr char kLlama31Date[] = "26 Jul 2024";

// DeepSeek's full-width bars and U+2581 "lower one eighth block" are part of the token texts.
constexpr char kDsUser[] = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
constexpr char kDsAssistant[] =
    "<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
constexpr char kDsEndOfSentence[] =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

// In ChatTemplate::Kind order (ByName checks the count).
constexpr const char* kBuiltinNames[] = {
    "chatml",   "qwen2",     "qwen2.5",   "qwen3",   "llama3",
    "llama3.1", "deepseek2", "deepseek3", "kimi-k2",   "gemma",
};

std::string JoinNames() {
  std::string out;
  for (const char* name : kBuiltinNames) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Length of the Python-whitespace character (str.isspace(), what Jinja's `trim` filter strips)
// starting at s[i], or 0. Covers ASCII \t\n\v\f\r, \x1c-\x1f and space, and the Unicode
// White_Space code points U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000 in UTF-8.
size_t SpaceAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) -> uint8_t {
    return i + k < s.size() ? static_cast<uint8_t>(s[i + k]) : 0;
  };
  const uint8_t c = b(0);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;
  if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return 3;  // U+1680
  if (c == 0xE2 && b(1) == 0x80) {
    const uint8_t d = b(2);
    if ((d >= 0x80 && d <= 0x8A) || d == 0xA8 || d == 0xA9 || d == 0xAF) return 3;
  }
  if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return 3;  // U+3000
  return 0;
}

// Jinja's `trim` (Python str.strip()).
std::string Trim(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t n = SpaceAt(s, begin);
    if (n == 0) break;
    begin += n;
  }
  // Scan forward so multi-byte spaces are recognised from their lead byte.
  size_t end = begin, i = begin;
  while (i < s.size()) {
    const size_t n = SpaceAt(s, i);
    if (n == 0) {
      ++i;
      end = i;
    } else {
      i += n;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

std::string_view LStripNewlines(std::string_view s) {
  const size_t p = s.find_first_not_of('\n');
  return p == std::string_view::npos ? std::string_view() : s.substr(p);
}
std::string_view RStripNewlines(std::string_view s) {
  const size_t p = s.find_last_not_of('\n');
  return p == std::string_view::npos ? std::string_view() : s.substr(0, p + 1);
}
std::string_view StripNewlines(std::string_view s) { return LStripNewlines(RStripNewlines(s)); }

void AppendChatMl(std::string_view role, std::string_view content, std::string* out) {
  *out += "<|im_start|>";
  *out += role;
  *out += '\n';
  *out += content;
  *out += "<|im_end|>\n";
}

void AppendLlamaHeader(std::string_view role, std::string* out) {
  *out += "<|start_header_id|>";
  *out += role;
  *out += "<|end_header_id|>\n\n";
}

// Qwen3's assistant turn: a reasoning block written in the content ("<think>r</think>answer") is
// split off; it is kept (normalised to "<think>\nr\n</think>\n\n") only on turns after the last
// real user query, i.e. the turn being continued and tool-use steps since that query, and
// dropped from older history.
void AppendQwen3Assistant(std::string_view text, bool after_last_query, bool last,
                          std::string* out) {
  std::string_view content = text;
  std::string_view reasoning;
  const size_t close = text.find("</think>");
  if (close != std::string_view::npos) {
    // content.split('</think>')[-1].lstrip('\n')
    const size_t last_close = text.rfind("</think>");
    content = LStripNewlines(text.substr(last_close + 8));
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
    std::string_view before = RStripNewlines(text.substr(0, close));
    const size_t open = before.rfind("<think>");
    if (open != std::string_view::npos) before = before.substr(open + 7);
    reasoning = LStripNewlines(before);
  }
  *out += "<|im_start|>assistant\n";
  if (after_last_query && (last || !reasoning.empty())) {
    *out += "<think>\n";
    *out += StripNewlines(reasoning);
    *out += "\n</think>\n\n";
    *out += LStripNewlines(content);
  } else {
    *out += content;
  }
  *out += "<|im_end|>\n";
}

// Index of the last user message that is a real query (not a "<tool_response>...</tool_response>"
// wrapper), or the last index when there is none: the namespace `last_query_index` of Qwen3's
// template.
size_t Qwen3LastQueryIndex(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" &&
        !(StartsWith(m.content, "<tool_response>") && EndsWith(m.content, "</tool_response>"))) {
      return i;
    }
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

// True when a ChatML template writes a literal system turn (`<|im_start|>system` followed by a
// newline, real or escaped, and then text rather than the closing quote before `+ content`):
// a default system prompt plain ChatML would not render.
bool HasLiteralSystemTurn(std::string_view t) {
  constexpr std::string_view kStart = "<|im_start|>system";
  for (size_t p = t.find(kStart); p != std::string_view::npos; p = t.find(kStart, p + 1)) {
    size_t q = p + kStart.size();
    if (t.substr(q, 1) == "\n") {
      q += 1;
    } else if (t.substr(q, 2) == "\\n") {
      q += 2;
    } else {
      continue;
    }
    if (q < t.size() && t[q] != '\'' && t[q] != '"') return true;
  }
  return false;
}

// The Qwen2 / Qwen1.5 template with its default system prompt cut out. Templates of exactly this
// shape differ only in that prompt, so Detect() accepts any text there; anything else about the
// template (an open last turn, extra rules) makes it a different template.
constexpr std::string_view kQwen2ShapeHead =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\n";
constexpr std::string_view kQwen2ShapeTail =
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant"
    "\n' }}{% endif %}";

// `s` with every real newline written as the two characters \n, as a Jinja source may spell it.
std::string EscapeNewlines(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The value of the Jinja single-quoted string body `body` (escapes \n \t \\ \' \"), or false
// when it is not one: an unescaped quote would end the literal early.
bool UnquoteJinja(std::string_view body, std::string* out) {
  out->clear();
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\'') return false;
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i == body.size()) return false;
    switch (body[i]) {
      case 'n':
        out->push_back('\n');
        break;
      case 't':
        out->push_back('\t');
        break;
      case '\\':
      case '\'':
      case '"':
        out->push_back(body[i]);
        break;
      default:
        return false;
    }
  }
  return true;
}

// If `t` is the Qwen2-shaped template (newlines real or escaped; trailing whitespace ignored),
// stores its default system prompt and returns true.
bool MatchQwen2Shape(std::string_view t, std::string* default_system) {
  const size_t end = t.find_last_not_of(" \t\r\n");
  t = end == std::string_view::npos ? std::string_view() : t.substr(0, end + 1);
  for (const bool escaped : {false, true}) {
    const std::string head =
        escaped ? EscapeNewlines(kQwen2ShapeHead) : std::string(kQwen2ShapeHead);
    const std::string tail =
        escaped ? EscapeNewlines(kQwen2ShapeTail) : std::string(kQwen2ShapeTail);
    if (t.size() < head.size() + tail.size() || !StartsWith(t, head) || !EndsWith(t, tail))
      continue;
    if (UnquoteJinja(t.substr(head.size(), t.size() - head.size() - tail.size()), default_system)) {
      return true;
    }
  }
  return false;
}

// Printable form of the start of an unrecognised template for the error message.
std::string Preview(std::string_view t) {
  std::string out;
  size_t i = 0;
  for (; i < t.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  // Do not cut a UTF-8 sequence in half.
  while (i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) out.push_back(t[i++]);
  return out + (i < t.size() ? "..." : "");
}

}  // namespace

std::vector<std::string> ChatTemplate::BuiltinNames() {
  std::vector<std::string> names;
  for (const char* name : kBuiltinNames) names.emplace_back(name);
  return names;
}

StatusOr<ChatTemplate> ChatTemplate::ByName(std::string_view name) {
  static_assert(std::size(kBuiltinNames) == static_cast<size_t>(Kind::kGemma) + 1,
                "one name per Kind");
  for (size_t i = 0; i < std::size(kBuiltinNames); ++i) {
    if (name != kBuiltinNames[i]) continue;
    ChatTemplate tmpl(static_cast<Kind>(i), kBuiltinNames[i]);
    if (tmpl.kind_ == Kind::kQwen2) tmpl.default_system_ = kQwen2DefaultSystem;
    return tmpl;
  }
  return InvalidArgument("unknown chat template \"" + std::string(name) + "\"; the built-in " +
                         "templates are " + JoinNames());
}

StatusOr<ChatTemplate> ChatTemplate::Detect(std::string_view t) {
  if (t.empty()) {
    return NotFound(
        "the model has no chat template (tokenizer.chat_template is empty); use "
        "--chat-template NAME, one of " +
        JoinNames());
  }
  // Most specific first. The reasoning checks come before the generic families: a template
  // with think-block rules other than Qwen3's (QwQ, DeepSeek R1 / V3.1) renders history
  // differently, so it is refused rather than rendered as plain ChatML or DeepSeek V3.
  const char* name = nullptr;
  const bool thinks = Contains(t, "</think>");
  std::string qwen2_default;
  if (Contains(t, "<|im_assistant|>") && Contains(t, "<|im_middle|>")) {
    name = "kimi-k2";  // Kimi K2 / Kimi Linear
  } else if (Contains(t, "<|im_start|>")) {
    if (Contains(t, "last_query_index") && thinks) {
      name = "qwen3";
    } else if (thinks || Contains(t, "<think>")) {
      name = nullptr;
    } else if (Contains(t, kQwen25DefaultSystem)) {
      name = "qwen2.5";
    } else if (MatchQwen2Shape(t, &qwen2_default)) {
      auto tmpl = ByName("qwen2");
      tmpl->default_system_ = std::move(qwen2_default);
      return tmpl;
    } else if (!HasLiteralSystemTurn(t)) {
      name = "chatml";
    }
  } else if (Contains(t, "<|start_header_id|>") && Contains(t, "<|end_header_id|>")) {
    name = Contains(t, "Cutting Knowledge Date") ? "llama3.1" : "llama3";
  } else if (Contains(t, "<start_of_turn>") && Contains(t, "<end_of_turn>")) {
    name = "gemma";
  } else if (Contains(t, "'Assistant: ' + message['content'] + eos_token")) {
    name = "deepseek2";
  } else if (Contains(t, kDsAssistant) && Contains(t, kDsUser) && Contains(t, kDsEndOfSentence) &&
             !thinks) {
    name = "deepseek3";
  }
  if (name == nullptr) {
    return Unimplemented("unrecognised chat template (\"" + Preview(t) +
                         "\"); use --chat-template NAME, one of " + JoinNames());
  }
  return ByName(name);
}

Status ChatTemplate::Validate(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) {
    return InvalidArgument("chat template " + name_ + ": the conversation has no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant") {
      return InvalidArgument("chat template " + name_ + ": message " + std::to_string(i) +
                             " has role \"" + r +
                             "\"; the roles are \"system\", \"user\" and \"assistant\"");
    }
  }
  if (kind_ == Kind::kGemma) {
    // Gemma's template raises unless the turns after an optional first system message alternate
    // user / assistant, starting with the user.
    const size_t first = messages[0].role == "system" ? 1 : 0;
    for (size_t i = first; i < messages.size(); ++i) {
      const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
      if (messages[i].role != want) {
        return InvalidArgument("chat template gemma: message " + std::to_string(i) + " has role \"" +
                               messages[i].role + "\" where \"" + want +
                               "\" is due (after an optional first system message, the roles "
                               "must alternate user / assistant)");
      }
    }
  }
  return OkStatus();
}

std::vector<std::string> ChatTemplate::TurnMarkers() const {
  switch (kind_) {
    case Kind::kChatMl:
    case Kind::kQwen2:
    case Kind::kQwen25:
    case Kind::kQwen3:
      return {"<|im_start|>", "<|im_end|>"};
    case Kind::kLlama3:
    case Kind::kLlama31:
      return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case Kind::kDeepSeek2:
      return {};
    case Kind::kDeepSeek3:
      return {kDsUser, kDsAssistant, kDsEndOfSentence};
    case Kind::kKimiK2:
      return {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"};
    case Kind::kGemma:
      return {"<start_of_turn>", "<end_of_turn>"};
  }
  return {};
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, std::string_view bos_text,
                                 std::string_view eos_text) const {
  std::string out;
  const size_t n = messages.size();
  const bool first_is_system = n > 0 && messages[0].role == "system";
  switch (kind_) {
    case Kind::kChatMl:
      for (const ChatMessage& m : messages) AppendChatMl(m.role, m.content, &out);
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;

    case Kind::kQwen2:
      // The default system turn is written inside the loop, so not for an empty conversation.
      if (n > 0 && !first_is_system) AppendChatMl("system", default_system_, &out);
      for (const ChatMessage& m : messages) AppendChatMl(m.role, m.content, &out);
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;

    case Kind::kQwen25:
      AppendChatMl("system",
                   first_is_system ? std::string_view(messages[0].content)
                                   : std::string_view(kQwen25DefaultSystem),
                   &out);
      for (size_t i = first_is_system ? 1 : 0; i < n; ++i) {
        AppendChatMl(messages[i].role, messages[i].content, &out);
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;

    case Kind::kQwen3: {
      if (first_is_system) AppendChatMl("system", messages[0].content, &out);
      const size_t last_query = Qwen3LastQueryIndex(messages);
      for (size_t i = first_is_system ? 1 : 0; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "assistant") {
          AppendQwen3Assistant(m.content, i > last_query, i + 1 == n, &out);
        } else if (m.role == "user" || m.role == "system") {
          AppendChatMl(m.role, m.content, &out);
        }
      }
      if (add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (disable_thinking_) out += "<think>\n\n</think>\n\n";
      }
      break;
    }

    case Kind::kLlama3:
      for (size_t i = 0; i < n; ++i) {
        if (i == 0) out += bos_text;
        AppendLlamaHeader(messages[i].role, &out);
        out += Trim(messages[i].content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) AppendLlamaHeader("assistant", &out);
      break;

    case Kind::kLlama31:
      // The system turn is always written: the knowledge-cutoff lines, then the (trimmed) first
      // message when it is a system message.
      out += bos_text;
      AppendLlamaHeader("system", &out);
      out += "Cutting Knowledge Date: December 2023\nToday Date: ";
      out += kLlama31Date;
      out += "\n\n";
      if (first_is_system) out += Trim(messages[0].content);
      out += "<|eot_id|>";
      for (size_t i = first_is_system ? 1 : 0; i < n; ++i) {
        AppendLlamaHeader(messages[i].role, &out);
        out += Trim(messages[i].content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) AppendLlamaHeader("assistant", &out);
      break;

    case Kind::kDeepSeek2:
      out += bos_text;
      for (const ChatMessage& m : messages) {
        if (m.role == "user") {
          out += "User: " + m.content + "\n\n";
        } else if (m.role == "assistant") {
          out += "Assistant: " + m.content;
          out += eos_text;
        } else if (m.role == "system") {
          out += m.content + "\n\n";
        }
      }
      if (add_generation_prompt) out += "Assistant:";
      break;

    case Kind::kDeepSeek3: {
      // Every system message, wherever it is, joins the prefix after BOS.
      std::string system;
      bool first_system = true;
      for (const ChatMessage& m : messages) {
        if (m.role != "system") continue;
        if (!first_system) system += "\n\n";
        system += m.content;
        first_system = false;
      }
      out += bos_text;
      out += system;
      for (const ChatMessage& m : messages) {
        if (m.role == "user") {
          out += kDsUser + m.content;
        } else if (m.role == "assistant") {
          out += kDsAssistant + m.content + kDsEndOfSentence;
        }
      }
      if (add_generation_prompt) out += kDsAssistant;
      break;
    }

    case Kind::kKimiK2:
      if (n > 0 && !first_is_system) {
        out += "<|im_system|>system<|im_middle|>";
        out += kKimiDefaultSystem;
        out += "<|im_end|>";
      }
      for (size_t i = 0; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
          out += "<|im_user|>user<|im_middle|>";
        } else if (m.role == "assistant") {
          out += "<|im_assistant|>assistant<|im_middle|>";
        } else {
          out += "<|im_system|>" + m.role + "<|im_middle|>";
        }
        out += m.content;
        // The last turn stays open without a generation prompt, so a caller can prefill the
        // assistant's reply and have the model continue it.
        if (i + 1 < n || add_generation_prompt) out += "<|im_end|>";
      }
      if (add_generation_prompt) out += "<|im_assistant|>assistant<|im_middle|>";
      break;

    case Kind::kGemma: {
      // Gemma 3's template: BOS, then the turns with "assistant" called "model"; a leading
      // system message is no turn of its own but its text + "\n\n" opens the first turn; every
      // turn's content is trimmed (the system text is not).
      out += bos_text;
      const size_t first = first_is_system ? 1 : 0;
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        out += "<start_of_turn>";
        out += m.role == "assistant" ? "model" : m.role;
        out += '\n';
        if (i == first && first_is_system) out += messages[0].content + "\n\n";
        out += Trim(m.content);
        out += "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
  }
  return out;
}

StatusOr<ChatTemplate> ChatTemplate::ForModel(std::string_view jinja_source,
                                              bool vocab_has_gemma_turns) {
  if (jinja_source.empty() && vocab_has_gemma_turns) return ByName("gemma");
  return Detect(jinja_source);
}

}  // namespace strata
