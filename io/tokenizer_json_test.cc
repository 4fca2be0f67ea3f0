// AddHfTokenizerJson: the tokenizer.ggml.* keys written for hand-built HF directories (token
// types, holes, merges, SpecialVocab's ids and add_* flags, chat templates) and its errors.
#include "io/tokenizer_json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"

namespace strata {
namespace {

using nlohmann::json;

std::string MakeDir(const std::string& name, const json& tok, const json* tc, const json* cfg) {
  const std::string dir = ::testing::TempDir() + "/strata_tokjson_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  if (tc != nullptr) std::ofstream(dir + "/tokenizer_config.json") << tc->dump();
  if (cfg != nullptr) std::ofstream(dir + "/config.json") << cfg->dump();
  return dir;
}

json Added(int id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"special", special}, {"normalized", false},
          {"lstrip", false}, {"rstrip", false}, {"single_word", false}};
}

json ByteLevelBpe(json added, json post) {
  return {{"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xC4\xA0", 3}}},
            {"merges", json::array({json::array({"a", "b"}), json::array({"a b", "c"})})}}},
          {"added_tokens", std::move(added)},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"use_regex", true}}},
          {"post_processor", std::move(post)}};
}

std::unique_ptr<GgufFile> Convert(const std::string& dir, HfTokenizerConversion* conv) {
  GgufWriter w;
  auto r = AddHfTokenizerJson(dir, &w);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  *conv = *r;
  auto f = GgufFile::FromBuffer(w.ToBytes(), "test");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(AddHfTokenizerJsonTest, TokensTypesMergesAndSpecialVocab) {
  const json special = {{"id", "<s>"}, {"type_id", 0}};
  const json post = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", special}}, {{"Sequence", {{"id", "A"}}}}})},
      {"pair", json::array({{{"SpecialToken", special}}, {{"Sequence", {{"id", "A"}}}},
                            {{"SpecialToken", special}}, {{"Sequence", {{"id", "B"}}}}})}};
  const json tok = ByteLevelBpe(json::array({Added(5, "<s>", true), Added(6, "</s>", true),
                                             Added(7, "<|tool|>", false),
                                             Added(8, "\xE2\x96\x81hi", false)}),
                                post);
  const json tc = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                   {"eos_token", "</s>"},
                   {"add_eos_token", true},
                   {"chat_template", json::array({{{"name", "default"}, {"template", "T0"}},
                                                  {{"name", "tool use"}, {"template", "T1"}}})}};
  const json cfg = {{"vocab_size", 10}, {"pad_token_id", 6}, {"bos_token_id", 0}};
  HfTokenizerConversion conv;
  auto f = Convert(MakeDir("a", tok, &tc, &cfg), &conv);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(conv.model, "gpt2");
  EXPECT_EQ(conv.pre, "gpt-2");
  EXPECT_EQ(conv.n_tokens, 10);
  EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(*f->GetStringArray("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "ab", "\xC4\xA0", "[PAD4]", "<s>", "</s>",
                                      "<|tool|>", " hi", "[PAD9]"}));
  // NORMAL x4, UNUSED hole, CONTROL (special), CONTROL (special), CONTROL (looks special),
  // USER_DEFINED (its U+2581 written as a space), UNUSED hole.
  EXPECT_EQ(*f->GetIntArray("tokenizer.ggml.token_type"),
            (std::vector<int64_t>{1, 1, 1, 1, 5, 3, 3, 3, 4, 5}));
  // Pairs joined by a space; a space inside a part becomes U+0120.
  EXPECT_EQ(*f->GetStringArray("tokenizer.ggml.merges"),
            (std::vector<std::string>{"a b", "a\xC4\xA0" "b c"}));
  // bos from tokenizer_config.json (config.json's bos_token_id 0 comes second and is ignored),
  // eos likewise, pad from config.json; all u32.
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.bos_token_id"), 5);
  EXPECT_EQ(f->Find("tokenizer.ggml.bos_token_id")->type, GgufType::kU32);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 6);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.padding_token_id"), 6);
  EXPECT_FALSE(f->Has("tokenizer.ggml.unknown_token_id"));
  // The template's leading <s> is bos: add_bos; add_eos from tokenizer_config.json; the pair
  // template "<s> A <s> B" has no sep between A and B: add_sep false.
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_eos_token"));
  EXPECT_FALSE(*f->GetBool("tokenizer.ggml.add_sep_token"));
  EXPECT_EQ(*f->GetString("tokenizer.chat_template"), "T0");
  EXPECT_EQ(*f->GetString("tokenizer.chat_template.tool_use"), "T1");
  EXPECT_EQ(*f->GetStringArray("tokenizer.chat_templates"), std::vector<std::string>{"tool_use"});
}

TEST(AddHfTokenizerJsonTest, TemplateEndingInAnotherTokenMakesTheOldEosEot) {
  // Llama 3 Instruct style: the single template appends <|eot_id|> while eos_token is
  // <|end_of_text|>; SpecialVocab then takes <|eot_id|> as eos and the old eos as eot.
  const json post = {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"Sequence", {{"id", "A"}}}},
                                             {{"SpecialToken", {{"id", "<|eot_id|>"}}}}})}};
  const json tok = ByteLevelBpe(
      json::array({Added(4, "<|end_of_text|>", true), Added(5, "<|eot_id|>", true)}), post);
  const json tc = {{"eos_token", "<|end_of_text|>"}, {"chat_template", "{{ x }}"}};
  HfTokenizerConversion conv;
  auto f = Convert(MakeDir("b", tok, &tc, nullptr), &conv);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(conv.n_tokens, 6);  // no config.json: the vocabulary's size
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 5);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eot_token_id"), 4);
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_eos_token"));
  EXPECT_FALSE(f->Has("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f->GetString("tokenizer.chat_template"), "{{ x }}");
}

TEST(AddHfTokenizerJsonTest, WithoutTokenizerConfigOnlyConfigJsonIds) {
  const json tok = ByteLevelBpe(json::array({Added(4, "<|endoftext|>", true)}), nullptr);
  const json cfg = {{"vocab_size", 8}, {"eos_token_id", 4}, {"bos_token_id", json::array({4})}};
  HfTokenizerConversion conv;
  auto f = Convert(MakeDir("c", tok, nullptr, &cfg), &conv);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 4);
  EXPECT_FALSE(f->Has("tokenizer.ggml.bos_token_id"));  // a list is not an id (as gguf-py)
  EXPECT_FALSE(f->Has("tokenizer.chat_template"));
}

TEST(AddHfTokenizerJsonTest, ErrorsNameWhatIsNotSupported) {
  GgufWriter w;
  auto missing = AddHfTokenizerJson(::testing::TempDir() + "/strata_no_such_dir", &w);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  json unigram = {{"model", {{"type", "Unigram"}, {"unk_id", 0},
                             {"vocab", json::array({json::array({"<unk>", 0.0})})}}}};
  auto u = AddHfTokenizerJson(MakeDir("d", unigram, nullptr, nullptr), &w);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("Unigram"), std::string::npos) << u.status().message();

  json split = ByteLevelBpe(json::array(), nullptr);
  split["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}},
                            {"behavior", "Isolated"}, {"invert", false}};
  auto s = AddHfTokenizerJson(MakeDir("e", split, nullptr, nullptr), &w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("[a-z]+"), std::string::npos) << s.status().message();

  const json small = {{"vocab_size", 3}};
  auto v = AddHfTokenizerJson(MakeDir("f", ByteLevelBpe(json::array(), nullptr), nullptr, &small),
                              &w);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("vocab_size 3"), std::string::npos) << v.status().message();

  const json bad_id = {{"eos_token_id", 99}};
  auto b = AddHfTokenizerJson(MakeDir("g", ByteLevelBpe(json::array(), nullptr), nullptr, &bad_id),
                              &w);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("99"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace strata
