// Tests for the built-in chat renderers against @huggingface/jinja's renderings of the real
// templates (testdata/chat/ref.json, made by tools/ref/render_chat.py), template recognition
// of every testdata/chat/*.jinja file, and the errors for unknown names, unrecognised templates
// and bad roles.
#include "io/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/status_testing.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

const std::string kChatDir = std::string(STRATA_SOURCE_DIR) + "/testdata/chat/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const nlohmann::json& Ref() {
  static const nlohmann::json ref = nlohmann::json::parse(ReadFile(kChatDir + "ref.json"));
  return ref;
}

std::vector<ChatMessage> Conversation(const std::string& name) {
  std::vector<ChatMessage> out;
  for (const auto& m : Ref().at("conversations").at(name)) {
    out.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return out;
}

// Shows control characters so a failing comparison is readable.
std::string Visible(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

TEST(ChatTemplateTest, RendersLikeTheJinjaTemplates) {
  const nlohmann::json& ref = Ref();
  const auto& renders = ref.at("renders");
  ASSERT_GE(renders.size(), 200u);
  std::set<std::string> builtins_covered;
  int compared = 0, refused = 0;
  for (const auto& r : renders) {
    const std::string file = r.at("template");
    const nlohmann::json& info = ref.at("templates").at(file);
    const std::string builtin = info.at("builtin");
    // The way a model's template is used: recognised from its text, then rendered.
    auto detected = ChatTemplate::Detect(ReadFile(kChatDir + file));
    ASSERT_OK(detected);
    ASSERT_EQ(detected->name(), builtin) << file;
    const bool thinking = r.value("enable_thinking", true);
    if (!thinking) detected->set_enable_thinking(false);
    const std::string conv = r.at("conversation");
    const bool gen = r.at("add_generation_prompt");
    if (r.contains("error")) {
      // The Jinja template raises on this conversation (Gemma's: roles must alternate): Validate
      // refuses it too.
      EXPECT_FALSE(detected->Validate(Conversation(conv)).ok()) << file << " conversation " << conv;
      ++refused;
      continue;
    }
    EXPECT_TRUE(detected->Validate(Conversation(conv)).ok()) << file << " conversation " << conv;
    const std::string want = r.at("text");
    const std::string bos = info.at("bos"), eos = info.at("eos");
    EXPECT_EQ(Visible(detected->Render(Conversation(conv), gen, bos, eos)), Visible(want))
        << file << " (" << builtin << ") conversation " << conv << " gen=" << gen
        << " enable_thinking=" << thinking;
    // --chat-template NAME renders the family's canonical template the same way.
    if (info.value("by_name", true)) {
      auto named = ChatTemplate::ByName(builtin);
      ASSERT_OK(named);
      if (!thinking) named->set_enable_thinking(false);
      EXPECT_EQ(Visible(named->Render(Conversation(conv), gen, bos, eos)), Visible(want))
          << file << " by name " << builtin << " conversation " << conv << " gen=" << gen;
    }
    builtins_covered.insert(builtin);
    ++compared;
  }
  const std::vector<std::string> names = ChatTemplate::BuiltinNames();
  EXPECT_EQ(builtins_covered, std::set<std::string>(names.begin(), names.end()))
      << "every built-in is checked against a real template";
  // 13 conversations x 2 generation-prompt settings for 11 files, 13 for llama3-lenml; 3 of the
  // conversations again with enable_thinking=false. Gemma's template refuses 2 of them (roles
  // that do not alternate), with and without the generation prompt.
  EXPECT_EQ(compared + refused, 11 * (13 + 3) * 2 + (13 + 3));
  EXPECT_EQ(refused, 4);
}

TEST(ChatTemplateTest, DetectsEveryTemplateFile) {
  const nlohmann::json& templates = Ref().at("templates");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kChatDir)) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string file = entry.path().filename().string();
    ASSERT_TRUE(templates.contains(file)) << file << " is not in ref.json";
    auto tmpl = ChatTemplate::Detect(ReadFile(entry.path().string()));
    ASSERT_OK(tmpl);
    EXPECT_EQ(tmpl->name(), templates.at(file).at("builtin").get<std::string>()) << file;
    ++files;
  }
  EXPECT_EQ(files, static_cast<int>(templates.size()));
}

TEST(ChatTemplateTest, ByNameKnowsEveryBuiltinAndListsThemOnError) {
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    auto tmpl = ChatTemplate::ByName(name);
    ASSERT_OK(tmpl);
    EXPECT_EQ(tmpl->name(), name);
  }
  auto bad = ChatTemplate::ByName("llama2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find("\"llama2\""), std::string::npos) << msg;
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;
  }
}

TEST(ChatTemplateTest, UnrecognisedTemplateIsAClearError) {
  // Mistral's template: none of the fingerprints.
  const std::string gemma =
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' "
      "+ message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif "
      "%}{% endfor %}";
  auto t = ChatTemplate::Detect(gemma);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  const std::string msg = t.status().message();
  EXPECT_EQ(msg.rfind("unrecognised chat template (\"" + gemma.substr(0, 60) +
                          "...\"); use --chat-template NAME, one of ",
                      0),
            0u)
      << msg;
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;
  }
  // A short template is shown whole, newlines escaped.
  auto short_t = ChatTemplate::Detect("{{ x }}\n");
  ASSERT_FALSE(short_t.ok());
  EXPECT_NE(short_t.status().message().find("(\"{{ x }}\\n\")"), std::string::npos)
      << short_t.status().message();

  auto empty = ChatTemplate::Detect("");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no chat template"), std::string::npos);
  EXPECT_NE(empty.status().message().find("--chat-template NAME"), std::string::npos);
}

TEST(ChatTemplateTest, RefusesLookalikesItWouldRenderWrongly) {
  // Qwen1.5 (ChatML with a default system prompt other than Qwen2's, and an open last turn).
  const std::string qwen15 =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
      "+ message['role'] + '\n' + message['content']}}{% if (loop.last and add_generation_prompt) "
      "or not loop.last %}{{ '<|im_end|>' + '\n'}}{% endif %}{% endfor %}";
  EXPECT_FALSE(ChatTemplate::Detect(qwen15).ok());
  // The same with an escaped newline in the Jinja string.
  std::string escaped = qwen15;
  escaped.replace(escaped.find("system\nYou"), 7, "system\\n");
  EXPECT_FALSE(ChatTemplate::Detect(escaped).ok());
  // QwQ-like ChatML with think rules but not Qwen3's last_query_index.
  EXPECT_FALSE(ChatTemplate::Detect("{{'<|im_start|>assistant\\n<think>\\n'}}{% if '</think>' in "
                                    "content %}{% endif %}")
                   .ok());
  // DeepSeek R1: DeepSeek V3 markers plus think-block stripping.
  EXPECT_FALSE(ChatTemplate::Detect("{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>'}}{{'<\xEF\xBD\x9C"
                                    "Assistant\xEF\xBD\x9C>'}}{% set c = c.split('</think>')[-1] "
                                    "%}{{'<\xEF\xBD\x9C"
                                    "end\xE2\x96\x81of\xE2\x96\x81"
                                    "sentence\xEF\xBD\x9C>'}}")
                   .ok());
  // Plain ChatML whose system turn is `'<|im_start|>system\n' + content` is still chatml.
  auto plain = ChatTemplate::Detect(
      "{% for m in messages %}{% if m.role == 'system' %}{{ '<|im_start|>system\\n' + m.content + "
      "'<|im_end|>\\n' }}{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
      "'<|im_end|>\\n' }}{% endif %}{% endfor %}");
  ASSERT_OK(plain);
  EXPECT_EQ(plain->name(), "chatml");
}

TEST(ChatTemplateTest, Qwen2ShapeTakesTheDefaultSystemPrompt) {
  const std::string qwen15 = ReadFile(kChatDir + "qwen1.5.jinja");
  // The same template spelled with escaped newlines, a quote escaped in the prompt, and a
  // trailing newline.
  std::string custom;
  for (const char c : qwen15) {
    if (c == '\n') {
      custom += "\\n";
    } else {
      custom.push_back(c);
    }
  }
  const std::string plain_prompt = "You are a helpful assistant";
  custom.replace(custom.find(plain_prompt), plain_prompt.size(), "Be Bob\\'s helper.\\nAlways.");
  custom += "\n";
  auto t = ChatTemplate::Detect(custom);
  ASSERT_OK(t);
  EXPECT_EQ(t->name(), "qwen2");
  EXPECT_EQ(
      t->Render({{"user", "hi"}}, true, "", ""),
      "<|im_start|>system\nBe Bob's helper.\nAlways.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
      "<|im_start|>assistant\n");
  // An unescaped quote would end the Jinja string: not this shape.
  std::string broken = qwen15;
  broken.replace(broken.find(plain_prompt), plain_prompt.size(), "Bob's");
  EXPECT_FALSE(ChatTemplate::Detect(broken).ok());
  // Anything else changed (here the open last turn of the first Qwen1.5 revision) is refused.
  std::string other = qwen15;
  other.replace(other.find("{% endfor %}"), 0, "{% if loop.last %}{% endif %}");
  EXPECT_FALSE(ChatTemplate::Detect(other).ok());
}

TEST(ChatTemplateTest, ValidateNamesTheBadRole) {
  auto tmpl = ChatTemplate::ByName("qwen3");
  ASSERT_OK(tmpl);
  EXPECT_OK(tmpl->Validate({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}));
  const Status bad = tmpl->Validate({{"user", "u"}, {"tool", "42"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("message 1 has role \"tool\""), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("qwen3"), std::string::npos) << bad.message();
  const Status upper = tmpl->Validate({{"User", "u"}});
  ASSERT_FALSE(upper.ok());
  EXPECT_NE(upper.message().find("message 0 has role \"User\""), std::string::npos);
  const Status empty = tmpl->Validate({});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("no messages"), std::string::npos) << empty.message();
}

TEST(ChatTemplateTest, RenderNeverFailsOnEmptyOrOddInput) {
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    auto tmpl = ChatTemplate::ByName(name);
    ASSERT_OK(tmpl);
    const std::string empty = tmpl->Render({}, true, "<s>", "</s>");
    EXPECT_FALSE(empty.empty()) << name << ": the generation prompt is still written";
    // A role Validate rejects renders without failing; templates that write any role the same
    // way keep its content, as their Jinja originals do.
    const std::string odd = tmpl->Render({{"tool", "payload"}}, false, "<s>", "</s>");
    if (name == "chatml" || name == "llama3" || name == "kimi-k2") {
      EXPECT_NE(odd.find("payload"), std::string::npos) << name << ": " << odd;
    }
  }
  // Spot checks of two generation prompts.
  EXPECT_EQ(ChatTemplate::ByName("deepseek2")->Render({{"user", "hi"}}, true, "<B>", "<E>"),
            "<B>User: hi\n\nAssistant:");
  EXPECT_EQ(ChatTemplate::ByName("kimi-k2")->Render({{"user", "hi"}}, false, "", ""),
            "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
            "AI.<|im_end|><|im_user|>user<|im_middle|>hi");
}

TEST(ChatTemplateTest, Llama3TrimsPythonWhitespace) {
  auto tmpl = ChatTemplate::ByName("llama3");
  ASSERT_OK(tmpl);
  // U+00A0, U+3000 and U+2028 are whitespace to Python's str.strip(); U+200B is not.
  const std::string got = tmpl->Render(
      {{"user", "\xC2\xA0\xE3\x80\x80 x y\t\xE2\x80\xA8"}, {"assistant", "\xE2\x80\x8Bz"}}, false,
      "", "");
  EXPECT_EQ(got,
            "<|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n\xE2\x80\x8Bz<|eot_id|>");
}

// A model without a template whose vocabulary has Gemma's turn markers (the gemma3 GGUFs made
// from a tokenizer.model) gets the Gemma template; any other model without one is an error.
TEST(ChatTemplateTest, GemmaVocabularyWithoutTemplateGetsGemma) {
  auto t = ChatTemplate::ForModel("", /*vocab_has_gemma_turns=*/true);
  ASSERT_OK(t);
  EXPECT_EQ(t->name(), "gemma");
  EXPECT_EQ(t->Render({{"system", "Be brief."}, {"user", " Hi "}}, true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_FALSE(ChatTemplate::ForModel("", false).ok());
  auto chatml = ChatTemplate::ForModel("{{ '<|im_start|>' + message['role'] }}", true);
  ASSERT_OK(chatml);
  EXPECT_EQ(chatml->name(), "chatml");  // the file's own template wins
  const Status bad = t->Validate({{"user", "a"}, {"user", "b"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("message 1"), std::string::npos) << bad.message();
}

// TurnMarkers lists the control texts each family writes around its turns: every one appears in
// the rendering of a short conversation, and what remains once they, BOS and EOS are taken out
// holds no other "<|...|>"-style marker.
TEST(ChatTemplateTest, TurnMarkersAreTheControlTextsTheRenderingWrites) {
  const std::vector<ChatMessage> msgs = {
      {"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}};
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    auto t = ChatTemplate::ByName(name);
    ASSERT_OK(t);
    std::string text = t->Render(msgs, true, "[BOS]", "[EOS]");
    for (const std::string& marker : t->TurnMarkers()) {
      EXPECT_NE(text.find(marker), std::string::npos) << name << ": " << marker;
      for (size_t at; (at = text.find(marker)) != std::string::npos;) text.erase(at, marker.size());
    }
    EXPECT_EQ(text.find("<|"), std::string::npos) << name << ": " << text;
    EXPECT_EQ(text.find("_of_turn>"), std::string::npos) << name << ": " << text;
    // DeepSeek's full-width bar.
    EXPECT_EQ(text.find("\xEF\xBD\x9C"), std::string::npos) << name << ": " << text;
  }
  EXPECT_TRUE(ChatTemplate::ByName("deepseek2")->TurnMarkers().empty());
}

}  // namespace
}  // namespace strata
