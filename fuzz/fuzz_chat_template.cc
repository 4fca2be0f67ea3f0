// libFuzzer target: chat-template detection from a model's template text
// (ChatTemplate::ForModel / Detect) and rendering of a small fuzzed conversation with the
// detected template and with every built-in one (io/chat_template.h).
//
// Input: the template text, kFileSeparator (fuzz/fuzz_util.h), then the conversation: one flag
// byte (bit 0: the vocabulary has Gemma's turn markers; bit 1: add_generation_prompt; bit 2:
// BOS/EOS texts given; bit 3: Qwen3's enable_thinking set to false), then messages separated by
// the byte 0x1E, each a role byte (0 system, 1 user, 2 assistant, 3 "developer", else "tool": the
// last two are roles Validate refuses) followed by the content.
//
// Checked beyond "no crash, no sanitizer report": ForModel is Detect except that an empty
// template with Gemma's turn markers is "gemma"; a recognised template is one of BuiltinNames()
// and ByName gives it back; Validate accepts exactly a non-empty conversation of system, user and
// assistant messages (for Gemma, alternating as fuzz/chat_rules.h says); Render never fails (it
// runs on refused conversations too).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/chat_rules.h"
#include "fuzz/fuzz_util.h"
#include "io/chat_template.h"

namespace {

volatile uint64_t g_sink = 0;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_chat_template: %s\n", what.c_str());
  std::abort();
}

void RenderAll(const strata::ChatTemplate& t, const std::vector<strata::ChatMessage>& msgs,
               uint8_t flags) {
  const bool valid = strata::fuzz::ChatTemplateAccepts(t.name(), msgs);
  const strata::Status st = t.Validate(msgs);
  if (st.ok() != valid) {
    Fail("template " + t.name() + ": Validate says " + st.ToString() + " on " +
         std::to_string(msgs.size()) + " messages that are " + (valid ? "valid" : "invalid"));
  }
  const std::string_view bos = (flags & 4) ? "<|begin_of_text|>" : "";
  const std::string_view eos = (flags & 4) ? "<|end_of_text|>" : "";
  g_sink = g_sink + t.Render(msgs, (flags & 2) != 0, bos, eos).size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using strata::ChatTemplate;
  const std::vector<std::string_view> parts = strata::fuzz::SplitParts(data, size, 2);
  const std::string_view source = parts[0];
  std::string_view conv = parts.size() > 1 ? parts[1] : std::string_view();
  uint8_t flags = 0;
  if (!conv.empty()) {
    flags = static_cast<uint8_t>(conv[0]);
    conv.remove_prefix(1);
  }
  std::vector<strata::ChatMessage> msgs;
  while (!conv.empty() && msgs.size() < 64) {
    const size_t end = std::min(conv.find('\x1e'), conv.size());
    std::string_view m = conv.substr(0, end);
    conv.remove_prefix(std::min(end + 1, conv.size()));
    strata::ChatMessage cm;
    const uint8_t r = m.empty() ? 1 : static_cast<uint8_t>(m[0]);
    static const char* const kRoles[] = {"system", "user", "assistant", "developer"};
    cm.role = r < 4 ? kRoles[r] : "tool";
    if (!m.empty()) m.remove_prefix(1);
    cm.content = std::string(m);
    msgs.push_back(std::move(cm));
  }
  const bool gemma_turns = (flags & 1) != 0;

  const auto detected = ChatTemplate::Detect(source);
  auto t = ChatTemplate::ForModel(source, gemma_turns);
  if (source.empty() && gemma_turns) {
    if (!t.ok() || t->name() != "gemma") Fail("ForModel(\"\", gemma turns) is not gemma");
  } else if (t.ok() != detected.ok() || (t.ok() && t->name() != detected->name())) {
    Fail("ForModel differs from Detect");
  }
  const std::vector<std::string> names = ChatTemplate::BuiltinNames();
  if (t.ok()) {
    if (std::find(names.begin(), names.end(), t->name()) == names.end()) {
      Fail("detected template '" + t->name() + "' is not a built-in name");
    }
    auto again = ChatTemplate::ByName(t->name());
    if (!again.ok() || again->name() != t->name()) Fail("ByName(" + t->name() + ") failed");
    if (flags & 8) t->set_enable_thinking(false);
    RenderAll(*t, msgs, flags);
  } else if (t.status().message().empty()) {
    Fail("an unrecognised template without a message");
  }
  for (const std::string& name : names) {
    auto b = ChatTemplate::ByName(name);
    if (!b.ok()) Fail("ByName(" + name + ") failed");
    if (flags & 8) b->set_enable_thinking(false);
    RenderAll(*b, msgs, flags);
  }
  return 0;
}
