// Chat templates without a Jinja engine: built-in renderers for the chat formats of the supported
// model families, recognised from a model's `tokenizer.chat_template` text by fingerprint.
//
// A real template is a Jinja program; running arbitrary Jinja is out of scope. Instead each
// family's published template is re-implemented as a small C++ renderer whose output is tested
// byte for byte against @huggingface/jinja running the real template (testdata/chat/ref.json).
// Detect() maps a template text to a renderer through substrings that only that family's template
// contains (as llama.cpp's llm_chat_detect_template does), most specific first.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // "chatml", "qwen2", "qwen2.5", "qwen3", "llama3", "llama3.1", "deepseek2", "deepseek3",
  // "kimi-k2" (also Kimi Linear), "gemma" (Gemma 3).
  static std::vector<std::string> BuiltinNames();
  // The built-in renderer `name`; the error lists BuiltinNames().
  static StatusOr<ChatTemplate> ByName(std::string_view name);
  // The built-in renderer whose fingerprint `jinja_source` carries. Error: "unrecognised chat
  // template (first 60 chars...); use --chat-template NAME, one of ...".
  static StatusOr<ChatTemplate> Detect(std::string_view jinja_source);
  // A model's template: Detect(jinja_source), except that a model without a template whose
  // vocabulary has Gemma's turn markers (<start_of_turn>, <end_of_turn> as single tokens; the
  // gemma3 GGUFs llama.cpp's converter writes from a tokenizer.model carry no template) gets the
  // Gemma template, as llama.cpp's chat falls back to its gemma format for them.
  static StatusOr<ChatTemplate> ForModel(std::string_view jinja_source, bool vocab_has_gemma_turns);

  // Checks what the templates accept: at least one message (the Jinja originals index
  // messages[0]) and every role one of system/user/assistant (tool turns are not supported).
  // Errors name the message index and the bad role. Gemma alone rejects an order, as its Jinja
  // original raises: after an optional first system message the turns must alternate user /
  // assistant, starting with the user. The other built-in families, like their originals, render
  // a system message anywhere (DeepSeek V3 moves every system text to the front), repeated
  // roles, and a conversation that starts with the assistant. Render() never fails; on messages
  // that fail Validate() it renders what it can.
  Status Validate(const std::vector<ChatMessage>& messages) const;

  // The prompt text for `messages`; with add_generation_prompt, the assistant header is appended.
  // bos_text/eos_text: the tokenizer's BOS/EOS token texts (templates such as Llama 3 and
  // DeepSeek write bos_token; pass "" when the tokenizer has none). The text contains control
  // tokens as text and BOS where the family wants it, so encode it with parse_special and
  // without adding another BOS. The rendering of a conversation is not always a prefix of the
  // rendering of its continuation (Qwen3 drops the think blocks of older turns; Kimi K2 leaves
  // the last turn open without a generation prompt), so a chat loop that keeps its cache should
  // compare token ids, not assume an append-only prompt.
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     std::string_view bos_text, std::string_view eos_text) const;

  const std::string& name() const { return name_; }

  // The control-token texts this family writes around turns ("<|im_start|>", "<|im_end|>" for
  // ChatML), each meant to be one token of the model's vocabulary; BOS and EOS, which come from
  // the tokenizer, are not listed. Empty for DeepSeek V2, whose turns are plain text. A chat
  // front end warns when one of them is not a single token: the model would read it as text.
  std::vector<std::string> TurnMarkers() const;

  // Qwen3's `enable_thinking` switch. Left unset (the default, as apply_chat_template leaves it)
  // or set to true, the model decides whether to think; set to false, the generation prompt is
  // followed by an empty "<think>\n\n</think>\n\n" block so the model answers directly. The
  // other families have no such switch and ignore it.
  void set_enable_thinking(bool enable) { disable_thinking_ = !enable; }

 private:
  enum class Kind {
    kChatMl,
    kQwen2,
    kQwen25,
    kQwen3,
    kLlama3,
    kLlama31,
    kDeepSeek2,
    kDeepSeek3,
    kKimiK2,
    kGemma,
  };
  ChatTemplate(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}

  Kind kind_;
  std::string name_;
  // qwen2 only: the system prompt written when the conversation has none. Detect() takes it
  // from the template (Qwen1.5 and Qwen2 differ only in this text); ByName() uses Qwen2's.
  std::string default_system_;
  bool disable_thinking_ = false;  // qwen3: enable_thinking=false was asked for
};

}  // namespace strata
