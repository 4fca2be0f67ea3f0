// What ChatTemplate::Validate (io/chat_template.cc) accepts, restated for the fuzz targets that
// check it: at least one message, every role system / user / assistant, and for Gemma the turns
// after an optional first system message alternating user / assistant from the user (Gemma's
// Jinja template raises otherwise).
#pragma once

#include <string>
#include <vector>

#include "io/chat_template.h"

namespace strata::fuzz {

inline bool ChatTemplateAccepts(const std::string& name, const std::vector<ChatMessage>& msgs) {
  if (msgs.empty()) return false;
  for (const ChatMessage& m : msgs) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") return false;
  }
  if (name != "gemma") return true;
  const size_t first = msgs[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < msgs.size(); ++i) {
    if (msgs[i].role != ((i - first) % 2 == 0 ? "user" : "assistant")) return false;
  }
  return true;
}

}  // namespace strata::fuzz
