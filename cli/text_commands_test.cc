// In-process tests of the text-facing commands: `strata tokenize`, `generate -f / --stop /
// --special` and the sampler flags, and `strata chat` driven through a pipe.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "cli/common.h"
#include "io/chat_template.h"
#include "io/gguf.h"
#include "model/model.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// The ChatML template text as Qwen-style models ship it (recognised as "chatml").
constexpr const char* kChatMlJinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

// A small chat model made from the suite's synthesized tiny llama (random weights, so every
// reply depends on the whole context): a character-level SentencePiece vocabulary without the
// space prefix ("▁", the printable ASCII characters and byte fallback), <|im_start|> (354) and
// <|im_end|> (355, also EOS) as control tokens, the rest unused, and the ChatML template in
// tokenizer.chat_template. The output rows of the tokens whose text would not read back as
// the same id (the specials, byte tokens of printable characters, <|im_start|>, unused ids)
// are zeroed, so greedy decoding never picks them (some other logit is above 0). Then every
// generated token is the canonical tokenization of its text, and a conversation fed turn by
// turn is the same token sequence as its whole rendering, which is what the tests compare.
// `eos`: the EOS id (-1: <|im_end|>). `endless`: <|im_end|>'s output row is zeroed too, so with
// a dead EOS (e.g. 1, <s>) no reply ever ends by itself. `printable`: the byte tokens of control
// characters are zeroed too, so replies hold printable characters and spaces only.
// `space_boost`: the output row of the space "▁" is scaled by it (an f16 row).
Status WriteChatModel(const std::string& from, const std::string& out, int eos = -1,
                      bool endless = false, bool printable = false, float space_boost = 1.f) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(from));
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, f->GetStringArray("tokenizer.ggml.tokens"));
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> types(n, 5);  // UNUSED
  std::vector<float> scores(n, 0.f);
  std::vector<bool> dead(n, false);  // output row zeroed
  types[0] = 2;                      // <unk>
  types[1] = types[2] = 3;           // <s>, </s>
  dead[0] = dead[1] = dead[2] = true;
  for (int b = 0; b < 256; ++b) {
    types[3 + b] = 6;  // BYTE
    dead[3 + b] = (b >= 0x20 && b < 0x7f) || (printable && b < 0x20);
  }
  int id = 259;
  tokens[id] = "\xE2\x96\x81";  // the SentencePiece space
  types[id++] = 1;
  for (char c = 33; c < 127; ++c) {
    tokens[id] = std::string(1, c);
    types[id++] = 1;
  }
  const int im_start = id++, im_end = id++;
  tokens[im_start] = "<|im_start|>";
  tokens[im_end] = "<|im_end|>";
  types[im_start] = types[im_end] = 3;
  dead[im_start] = true;
  dead[im_end] = endless;
  for (int i = id; i < n; ++i) {
    tokens[i] = "<unused" + std::to_string(i) + ">";
    dead[i] = true;
  }
  GgufWriter w;
  w.set_alignment(f->alignment());
  for (const auto& [key, value] : f->metadata()) {
    if (key != "general.alignment") w.Set(key, value);
  }
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  w.Set("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  w.Set("tokenizer.ggml.scores", GgufValue::F32Array(scores));
  w.Set("tokenizer.ggml.eos_token_id", GgufValue::U32(eos >= 0 ? eos : im_end));
  w.Set("tokenizer.ggml.add_space_prefix", GgufValue::Bool(false));
  w.Set("tokenizer.chat_template", GgufValue::String(kChatMlJinja));
  for (const GgufTensorInfo& t : f->tensors()) {
    ASSIGN_OR_RETURN(TensorView view, f->Tensor(t.name));
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(view.data),
                               static_cast<const uint8_t*>(view.data) + t.n_bytes);
    if (t.name == "output.weight") {
      const size_t row = t.n_bytes / n;
      for (int i = 0; i < n; ++i) {
        if (dead[i]) std::fill(bytes.begin() + i * row, bytes.begin() + (i + 1) * row, 0);
      }
      if (space_boost != 1.f) {
        if (t.dtype != DType::kF16) return InvalidArgument("space_boost: output.weight not f16");
        uint16_t* r = reinterpret_cast<uint16_t*>(bytes.data() + 259 * row);
        for (size_t k = 0; k < row / 2; ++k) r[k] = F32ToF16(F16ToF32(r[k]) * space_boost);
      }
    }
    RETURN_IF_ERROR(w.AddTensor(t.name, t.dtype, t.shape, bytes.data(), bytes.size()));
  }
  return w.WriteFile(out);
}

class TextCommandsTest : public TinyModelSuite<TextCommandsTest> {
 public:
  static constexpr const char* kDirPrefix = "strata_text_commands_test_";
  static void SetUpTestSuite() {
    TinyModelSuite<TextCommandsTest>::SetUpTestSuite();
    const Status st = WriteChatModel(Path("tiny.gguf"), Path("chat.gguf"));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  static std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string p = Path(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // The ids the model's tokenizer gives `text`.
  static std::vector<int32_t> Encode(const std::string& model, const std::string& text,
                                     bool with_bos, bool special) {
    auto m = Model::Load(model);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return (*m)->tokenizer()->Encode(text, with_bos, special);
  }
  // What greedy `generate` appends to `prompt` (its stdout is the prompt, the text, "\n").
  static std::string Continuation(const std::string& model, const std::string& prompt,
                                  const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"generate", "-m", model, "-p", prompt, "--special"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = Strata(args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
    EXPECT_EQ(r.out.back(), '\n');
    return r.out.substr(prompt.size(), r.out.size() - prompt.size() - 1);
  }
  static std::string ChatMl(const std::vector<ChatMessage>& messages) {
    auto t = ChatTemplate::ByName("chatml");
    EXPECT_TRUE(t.ok());
    return t->Render(messages, /*add_generation_prompt=*/true, "<s>", "<|im_end|>");
  }
};

// ---- tokenize ----

TEST_F(TextCommandsTest, TokenizePrintsIdsAndPiecesLikeLlamaTokenize) {
  const std::string m = Path("tiny.gguf");
  const std::string text = "Hello world</s>";
  const std::vector<int32_t> ids = Encode(m, text, true, false);
  CliResult r = Strata({"tokenize", "-m", m, "-p", text});
  ASSERT_EQ(r.code, 0) << r.err;
  // One "%6d -> 'piece'" line per token; BOS (a control token) is shown by its text.
  std::string want;
  auto m_or = Model::Load(m);
  ASSERT_TRUE(m_or.ok());
  const Tokenizer& tok = *(*m_or)->tokenizer();
  for (const int32_t id : ids) {
    char head[16];
    std::snprintf(head, sizeof(head), "%6d", id);
    want += std::string(head) + " -> '" +
            (id == tok.bos_id() ? tok.token_text(id) : tok.DecodeToken(id)) + "'\n";
  }
  EXPECT_EQ(r.out, want);
  EXPECT_EQ(r.out.rfind("     1 -> '<s>'\n", 0), 0u) << r.out;

  // --ids: a Python-style list; --special turns the written "</s>" into EOS (id 2).
  CliResult plain = Strata({"tokenize", "-m", m, "-p", text, "--ids"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  std::string list = "[";
  for (size_t i = 0; i < ids.size(); ++i) list += (i ? ", " : "") + std::to_string(ids[i]);
  EXPECT_EQ(plain.out, list + "]\n");
  EXPECT_EQ(plain.out.find(", 2]"), std::string::npos);
  CliResult special = Strata({"tokenize", "-m", m, "-p", text, "--ids", "--special"});
  ASSERT_EQ(special.code, 0) << special.err;
  const std::vector<int32_t> sids = Encode(m, text, true, true);
  EXPECT_EQ(sids.back(), 2);
  EXPECT_LT(sids.size(), ids.size());
  EXPECT_NE(special.out.find(", 2]\n"), std::string::npos) << special.out;

  // --no-bos drops the leading 1; --json has ids, pieces and count.
  CliResult j = Strata({"tokenize", "-m", m, "-p", text, "--json", "--no-bos"});
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json doc = nlohmann::json::parse(j.out);
  const std::vector<int32_t> no_bos(ids.begin() + 1, ids.end());
  EXPECT_EQ(doc["ids"].get<std::vector<int32_t>>(), no_bos);
  EXPECT_EQ(doc["count"], no_bos.size());
  ASSERT_EQ(doc["pieces"].size(), no_bos.size());
  std::string joined;
  for (const auto& p : doc["pieces"]) joined += p.get<std::string>();
  EXPECT_EQ(joined, " " + text);  // the SentencePiece space prefix, then the text

  // --pieces: a Python-style list with quotes and newlines escaped.
  CliResult p = Strata({"tokenize", "-m", m, "-p", "a'b\nc", "--pieces", "--no-bos"});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(p.out, "[' a', '\\'', 'b', '\\n', 'c']\n");

  // -f reads the text from a file: the same tokens.
  CliResult f = Strata({"tokenize", "-m", m, "-f", WriteFile("t.txt", text), "--ids"});
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(f.out, plain.out);
  // An empty -p is a text too (just BOS).
  CliResult e = Strata({"tokenize", "-m", m, "-p", "", "--ids"});
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.out, "[1]\n");
}

// --tokenizer reads an HF tokenizer.json: the ids are the reference implementation's
// (testdata/tokenizer/ref_kimi_style.json, written by tools/ref/make_refs.py with HF tokenizers),
// with the post-processor's BOS by default and without it under --no-bos.
TEST_F(TextCommandsTest, TokenizeFromATokenizerJsonMatchesTheReference) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/testdata/tokenizer/";
  std::ifstream rf(dir + "ref_kimi_style.json");
  ASSERT_TRUE(rf) << dir;
  const nlohmann::json ref = nlohmann::json::parse(rf);
  const std::string tj = dir + "fixtures/kimi_style/tokenizer.json";
  int checked = 0;
  for (const auto& c : ref["cases"]) {
    if (c["name"] != "hello" && c["name"] != "trailing_space") continue;
    const std::string text = c["decoded"];
    CliResult with = Strata({"tokenize", "--tokenizer", tj, "-p", text, "--json"});
    ASSERT_EQ(with.code, 0) << with.err;
    EXPECT_EQ(nlohmann::json::parse(with.out)["ids"], c["ids_special"]) << text;
    CliResult without = Strata({"tokenize", "--tokenizer", tj, "-p", text, "--ids", "--no-bos"});
    ASSERT_EQ(without.code, 0) << without.err;
    std::string list = "[";
    for (size_t i = 0; i < c["ids"].size(); ++i) {
      list += (i ? ", " : "") + std::to_string(c["ids"][i].get<int>());
    }
    EXPECT_EQ(without.out, list + "]\n") << text;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST_F(TextCommandsTest, TokenizeErrorsNameTheProblem) {
  const std::string m = Path("tiny.gguf");
  const std::string hf = Path("hf_no_tok");
  ASSERT_EQ(Strata({"synth", "--arch", "llama", "--format", "safetensors", "-o", hf}).code, 0);
  const struct {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"tokenize", "-m", m}, "no text to tokenize: give -p TEXT or -f FILE"},
      {{"tokenize", "-p", "x"}, "give the tokenizer with -m MODEL or --tokenizer tokenizer.json"},
      {{"tokenize", "-m", m, "--tokenizer", Path("tokenizer.json"), "-p", "x"},
       "give the tokenizer with -m MODEL or --tokenizer tokenizer.json (one of them)"},
      {{"tokenize", "--tokenizer", Path("missing.json"), "-p", "x"},
       "--tokenizer " + Path("missing.json")},
      {{"tokenize", "-m", m, "-p", "x", "-f", Path("t.txt")},
       "-p and -f both give the text; use one"},
      {{"tokenize", "-m", m, "-p", "x", "--ids", "--json"},
       "--ids, --pieces and --json are different outputs; give one"},
      {{"tokenize", "-m", m, "-f", Path("missing.txt")},
       "-f: cannot read '" + Path("missing.txt") + "': No such file or directory"},
      {{"tokenize", "-m", m, "-f", Path("")}, "is a directory"},
      {{"tokenize", "-m", Path("missing.gguf"), "-p", "x"}, "missing.gguf"},
      {{"tokenize", "-m", hf, "-p", "x"}, "has no tokenizer"},
  };
  for (const auto& c : cases) {
    CliResult r = Strata(c.args);
    EXPECT_EQ(r.code, 2) << c.expect << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
}

// ---- generate ----

TEST_F(TextCommandsTest, GenerateReadsThePromptFromAFile) {
  const std::string m = Path("tiny.gguf");
  const std::string prompt = "Once upon a time\nthere was";
  CliResult p = Strata({"generate", "-m", m, "-p", prompt, "-n", "8"});
  CliResult f = Strata({"generate", "-m", m, "-f", WriteFile("prompt.txt", prompt), "-n", "8"});
  ASSERT_EQ(p.code, 0) << p.err;
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(f.out, p.out);
  EXPECT_EQ(f.out.rfind(prompt, 0), 0u);  // the file's text is echoed as the prompt

  CliResult both = Strata({"generate", "-m", m, "-p", "x", "-f", Path("prompt.txt")});
  EXPECT_EQ(both.code, 2);
  EXPECT_NE(both.err.find("-p and -f both give the prompt; use one"), std::string::npos)
      << both.err;
  CliResult missing = Strata({"generate", "-m", m, "-f", Path("nope.txt")});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("-f: cannot read '" + Path("nope.txt") + "'"), std::string::npos)
      << missing.err;
}

TEST(StopStrings, HoldsBackAPossibleMatchAndCutsBeforeIt) {
  StopStrings s({"STOP"});
  EXPECT_EQ(s.Push("abc S"), "abc ");  // "S" might start STOP
  EXPECT_EQ(s.Push("TO"), "");         // "STO" still might
  EXPECT_EQ(s.Push("X"), "STOX");      // it did not
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.Push("ST"), "");
  EXPECT_EQ(s.Push("OP and more"), "");  // the stop string and what follows are never printed
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "STOP");
  EXPECT_EQ(s.text(), "abc STOX");
  EXPECT_EQ(s.Push("later"), "");
  EXPECT_EQ(s.Flush(), "");

  // The earliest match wins among several; text before it in the same piece is printed.
  StopStrings two({"yz", "b"});
  EXPECT_EQ(two.Push("axyzb"), "ax");
  EXPECT_EQ(two.matched(), "yz");
  // At the end the held-back tail is printed: it matched nothing.
  StopStrings tail({"\n\n"});
  EXPECT_EQ(tail.Push("line\n"), "line");
  EXPECT_EQ(tail.Flush(), "\n");
  EXPECT_EQ(tail.text(), "line\n");
  // A match that spans three pieces.
  StopStrings span({"<end>"});
  EXPECT_EQ(span.Push("x<e"), "x");
  EXPECT_EQ(span.Push("n"), "");
  EXPECT_EQ(span.Push("d>y"), "");
  EXPECT_EQ(span.text(), "x");

  EXPECT_FALSE(StopStrings::Check({"a", ""}).ok());
  EXPECT_TRUE(StopStrings::Check({"a"}).ok());
}

TEST_F(TextCommandsTest, GenerateStopsAtAStopStringWithoutPrintingIt) {
  const std::string m = Path("tiny.gguf");
  const std::string prompt = "hello there";
  const std::string full = Continuation(m, prompt, {"-n", "16"});
  ASSERT_GE(full.size(), 8u) << full;
  // A stop string from the middle of the greedy text: the output ends just before its first
  // occurrence.
  const std::string stop = full.substr(4, 3);
  const size_t at = full.find(stop);
  const std::string json = Path("stop.json");
  CliResult r =
      Strata({"generate", "-m", m, "-p", prompt, "-n", "16", "--stop", stop, "--stop",
              "never-there", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, prompt + full.substr(0, at) + "\n");
  EXPECT_NE(r.err.find("(stopped at --stop '" + stop + "')"), std::string::npos) << r.err;
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["text"], full.substr(0, at));
  EXPECT_EQ(j["stopped_at_stop"], stop);
  // A stop string that never matches changes nothing.
  CliResult none = Strata({"generate", "-m", m, "-p", prompt, "-n", "16", "--stop", "\x01"});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out, prompt + full + "\n");

  CliResult empty = Strata({"generate", "-m", m, "--stop", ""});
  EXPECT_EQ(empty.code, 2);
  EXPECT_NE(empty.err.find("--stop: a stop string must not be empty"), std::string::npos);
}

TEST_F(TextCommandsTest, GenerateSamplerFlags) {
  const std::string m = Path("tiny.gguf");
  const std::vector<std::string> base = {"generate", "-m", m, "-p", "hello there", "-n", "12"};
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return Strata(a);
  };
  CliResult greedy = run({});
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  // Top-k 1 leaves only the argmax, at any temperature and seed.
  CliResult k1 = run({"--temp", "1.5", "--top-k", "1", "--seed", "9"});
  ASSERT_EQ(k1.code, 0) << k1.err;
  EXPECT_EQ(k1.out, greedy.out);
  // min-p 1 keeps only the top token too.
  CliResult p1 = run({"--temp", "1.5", "--min-p", "1", "--seed", "9"});
  EXPECT_EQ(p1.out, greedy.out);
  // Seeded sampling with the whole chain on is reproducible.
  const std::vector<std::string> chain = {"--temp",           "0.9", "--top-k",        "40",
                                          "--top-p",          "0.95", "--min-p",       "0.05",
                                          "--repeat-penalty", "1.3", "--repeat-last-n", "-1",
                                          "--seed",           "5"};
  CliResult s1 = run(chain), s2 = run(chain);
  ASSERT_EQ(s1.code, 0) << s1.err;
  EXPECT_EQ(s1.out, s2.out);
  // The penalty reaches greedy decoding: below 1 it rewards the tokens of the window (positive
  // logits divided by 0.01), so the text is made of the prompt's characters; a window of 0
  // turns it off.
  CliResult pen = run({"--repeat-penalty", "0.01", "--repeat-last-n", "-1"});
  ASSERT_EQ(pen.code, 0) << pen.err;
  EXPECT_NE(pen.out, greedy.out);
  const std::string text = pen.out.substr(11, pen.out.size() - 12);
  EXPECT_EQ(text.find_first_not_of("hello there"), std::string::npos) << text;
  EXPECT_EQ(run({"--repeat-penalty", "0.01", "--repeat-last-n", "0"}).out, greedy.out);

  const struct {
    std::vector<std::string> extra;
    std::string expect;
  } bad[] = {
      {{"--top-k", "-1"}, "--top-k must be >= 0 (0 = off), got -1"},
      {{"--min-p", "1.5"}, "--min-p must be in [0, 1] (0 = off), got 1.5"},
      {{"--repeat-penalty", "0"}, "--repeat-penalty must be a finite number > 0 (1 = off), got 0"},
      {{"--repeat-last-n", "-2"}, "--repeat-last-n must be >= -1"},
      {{"--top-p", "0"}, "--top-p must be in (0, 1], got 0"},
  };
  for (const auto& c : bad) {
    CliResult r = run(c.extra);
    EXPECT_EQ(r.code, 2) << c.expect;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
}

// ---- chat ----

// The value of row `name` in a printed statistic/value table ("" when absent).
std::string Row(const std::string& table, const std::string& name) {
  const size_t at = table.find("\n" + name + "  ");
  if (at == std::string::npos) return "";
  const size_t end = table.find('\n', at + 1);
  std::string line = table.substr(at + 1 + name.size(), end - at - 1 - name.size());
  line.erase(0, line.find_first_not_of(' '));
  return line;
}


TEST_F(TextCommandsTest, ChatTurnsFromAPipeEqualAFreshGenerateOfTheWholeConversation) {
  const std::string m = Path("chat.gguf");
  const std::string u1 = "Hello, who are you?", u2 = "Tell me a story.";
  // The template comes from the model (tokenizer.chat_template, recognised as ChatML).
  CliResult c = Strata({"chat", "-m", m, "-n", "24"}, u1 + "\n" + u2 + "\n");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("chat template: chatml"), std::string::npos) << c.err;
  // Turn 1 = greedy generate on the rendering of the first message; turn 2 = generate on the
  // rendering of the whole conversation (the first reply included) from an empty cache.
  const std::string r1 = Continuation(m, ChatMl({{"user", u1}}), {"-n", "24"});
  const std::string r2 =
      Continuation(m, ChatMl({{"user", u1}, {"assistant", r1}, {"user", u2}}), {"-n", "24"});
  EXPECT_EQ(c.out, r1 + "\n" + r2 + "\n");
  EXPECT_EQ(c.out.find("> "), std::string::npos);  // no prompt from a pipe
  // The history matters: the second message alone gets another reply.
  EXPECT_NE(Continuation(m, ChatMl({{"user", u2}}), {"-n", "24"}), r2);

  // Only the new part of the rendering is prefilled: after the second message the context
  // holds the first turn (rendering and 23 fed reply tokens), the second message's new tokens
  // and 23 more, and those new tokens are what the whole rendering adds to the first turn's.
  CliResult st = Strata({"chat", "-m", m, "-n", "24"}, u1 + "\n/stats\n" + u2 + "\n/stats\n");
  ASSERT_EQ(st.code, 0) << st.err;
  const size_t second = st.out.find("statistic", st.out.find("statistic") + 1);
  ASSERT_NE(second, std::string::npos) << st.out;
  const std::string t1 = st.out.substr(0, second), t2 = st.out.substr(second);
  auto count = [](const std::string& v) { return std::stoll(v.substr(0, v.find(' '))); };
  const int64_t ctx1 = count(Row(t1, "tokens in context"));
  const int64_t ctx2 = count(Row(t2, "tokens in context"));
  const int64_t new2 = count(Row(t2, "tokens prefilled, last message"));
  EXPECT_EQ(count(Row(t1, "tokens prefilled, last message")), ctx1 - 23);
  EXPECT_EQ(ctx2, ctx1 + new2 + 23);
  const std::string whole = ChatMl({{"user", u1}, {"assistant", r1}, {"user", u2}});
  EXPECT_EQ(new2, static_cast<int64_t>(Encode(m, whole, true, true).size()) - ctx1);
  EXPECT_LT(new2, ctx1);

  // With a system message and another cache policy: the first reply is still the fresh
  // generate's with the same policy, and each reply is one line.
  CliResult v = Strata({"chat", "-m", m, "-n", "8", "--policy", "streaming", "--system",
                        "In the beginning"},
                       u1 + "\n" + u2 + "\n");
  ASSERT_EQ(v.code, 0) << v.err;
  const std::string v1 = Continuation(m, ChatMl({{"system", "In the beginning"}, {"user", u1}}),
                                      {"-n", "8", "--policy", "streaming"});
  EXPECT_EQ(v.out.rfind(v1 + "\n", 0), 0u) << v.out;
  EXPECT_EQ(std::count(v.out.begin(), v.out.end(), '\n'), 2) << v.out;
}


// The id of printable character `c` in WriteChatModel's vocabulary.
int ChatModelCharId(char c) { return 260 + (c - 33); }

TEST_F(TextCommandsTest, ChatRebuildsTheCacheWhenTheTemplateReRendersHistory) {
  // Llama 3's template trims each message, so a reply that ends in a space is rendered without
  // it once the next message follows: the cached text is no longer a prefix of the rendering,
  // and chat re-reads the whole conversation into a new cache (the reply then equals a fresh
  // generate of that rendering). The repetition penalty below 1 makes this model repeat the
  // prompt's characters ("a n n n n < "), and a model whose EOS is '<' ends the reply after the
  // space, which is fed to the cache (a reply cut by -n leaves its last token unfed).
  const std::string m = Path("chat_eos_lt.gguf");
  const Status st = WriteChatModel(Path("tiny.gguf"), m, ChatModelCharId('<'));
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto t = ChatTemplate::ByName("llama3");
  ASSERT_TRUE(t.ok());
  // generate prepends BOS itself, so its renderings get no BOS text.
  auto render = [&](const std::vector<ChatMessage>& msgs) { return t->Render(msgs, true, "", ""); };
  const std::vector<std::string> flags = {"-n", "16", "--repeat-penalty", "0.01",
                                          "--repeat-last-n", "-1"};
  const std::string u1 = "The end. ", u2 = "next";
  const std::string r1 = Continuation(m, render({{"user", u1}}), flags);
  ASSERT_EQ(r1, "a n n n n ") << "the premise: the first reply ends with a space, then EOS";
  std::vector<std::string> args = {"chat", "-m", m, "--chat-template", "llama3"};
  args.insert(args.end(), flags.begin(), flags.end());
  CliResult c = Strata(args, u1 + "\n" + u2 + "\n");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("note: the llama3 template re-renders the earlier turns differently"),
            std::string::npos)
      << c.err;
  const std::string r2 = Continuation(
      m, render({{"user", u1}, {"assistant", r1}, {"user", u2}}), flags);
  EXPECT_EQ(c.out, r1 + "\n" + r2 + "\n");
}

TEST_F(TextCommandsTest, ChatAndGenerateStopAtTheEndOfGenerationToken) {
  const std::string m = Path("chat.gguf");
  const std::string u1 = "Hello, who are you?";
  const std::string r1 = Continuation(m, ChatMl({{"user", u1}}), {"-n", "24"});
  // A model whose EOS is a character the greedy reply writes: the reply ends before it.
  size_t at = 1;
  while (at < r1.size() && !(r1[at] > 32 && r1[at] < 127)) ++at;
  ASSERT_LT(at, r1.size()) << r1;
  const std::string eos_model = Path("chat_eos.gguf");
  const Status st = WriteChatModel(Path("tiny.gguf"), eos_model, ChatModelCharId(r1[at]));
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::string cut = r1.substr(0, r1.find(r1[at]));
  CliResult c = Strata({"chat", "-m", eos_model, "-n", "24"}, u1 + "\n");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out, cut + "\n");
  const std::string prompt = ChatMl({{"user", u1}});
  CliResult g = Strata({"generate", "-m", eos_model, "-p", prompt, "--special", "-n", "24"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out, prompt + cut + "\n");
  EXPECT_NE(g.err.find("(stopped at end-of-generation token"), std::string::npos) << g.err;
  // --ignore-eos (llama.cpp's): the end-of-generation token is never sampled, all -n tokens come,
  // and the text up to where it stood is the same.
  CliResult i = Strata({"generate", "-m", eos_model, "-p", prompt, "--special", "-n", "24",
                        "--ignore-eos"});
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_EQ(i.out.rfind(prompt + cut, 0), 0u) << i.out;
  EXPECT_GT(i.out.size(), g.out.size()) << i.out;
  EXPECT_EQ(i.out.find(r1[at], prompt.size() + cut.size()), std::string::npos) << i.out;
  EXPECT_EQ(i.err.find("stopped at end-of-generation"), std::string::npos) << i.err;
  EXPECT_NE(i.err.find("24"), std::string::npos) << i.err;
}

TEST_F(TextCommandsTest, ChatStatsResetAndEof) {
  const std::string m = Path("chat.gguf");
  const std::string u1 = "And God said";
  // Each turn feeds the rendering's new text; the last reply token is not fed (its logits
  // would go unused), so after one turn of -n 6 the context holds the rendering plus 5 tokens.
  // (BOS included: the tokenizer adds one and ChatML does not write it.)
  const size_t rendered = Encode(m, ChatMl({{"user", u1}}), true, true).size();
  CliResult c = Strata({"chat", "-m", m, "-n", "6"},
                       u1 + "\n/stats\n/reset\n/stats\n" + u1 + "\n/stats\n" + u1);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("(conversation and cache cleared)"), std::string::npos) << c.err;
  const std::string reply = Continuation(m, ChatMl({{"user", u1}}), {"-n", "6"});
  // Lines: reply, stats table, stats table, the same reply again (the cache was cleared),
  // stats, and a second-turn reply read from a last line with no newline before EOF.
  std::vector<std::string> tables;
  size_t pos = c.out.find("statistic");
  while (pos != std::string::npos) {
    const size_t next = c.out.find("statistic", pos + 1);
    tables.push_back(c.out.substr(pos, next == std::string::npos ? next : next - pos));
    pos = next;
  }
  ASSERT_EQ(tables.size(), 3u) << c.out;
  EXPECT_EQ(c.out.rfind(reply + "\n", 0), 0u) << c.out;
  const std::string tokens = std::to_string(rendered + 5) + " of ";
  EXPECT_EQ(Row(tables[0], "turns"), "1");
  EXPECT_EQ(Row(tables[0], "tokens in context").rfind(tokens, 0), 0u) << tables[0];
  EXPECT_EQ(Row(tables[0], "policy"), "full");
  EXPECT_NE(Row(tables[0], "KV bytes resident"), "0 (0 B)");
  EXPECT_NE(Row(tables[0], "KV bytes read, last step"), "0 (0 B)");
  EXPECT_EQ(Row(tables[0], "KV resident vs full"), "1.00x");
  // After /reset: nothing in the cache, no turn.
  EXPECT_EQ(Row(tables[1], "turns"), "0");
  EXPECT_EQ(Row(tables[1], "tokens in context").rfind("0 of ", 0), 0u) << tables[1];
  EXPECT_EQ(Row(tables[1], "KV bytes resident"), "0 (0 B)");
  // The same first turn again, then the same figures.
  EXPECT_NE(c.out.find("\n" + reply + "\nstatistic"), std::string::npos) << c.out;
  EXPECT_EQ(Row(tables[2], "tokens in context"), Row(tables[0], "tokens in context"));
  // The last line (no newline, then EOF) is a second turn.
  const std::string r2 = Continuation(
      m, ChatMl({{"user", u1}, {"assistant", reply}, {"user", u1}}), {"-n", "6"});
  EXPECT_EQ(c.out.substr(c.out.size() - r2.size() - 1), r2 + "\n") << c.out;

  // Empty input: nothing on stdout, a clean exit.
  CliResult e = Strata({"chat", "-m", m}, "");
  EXPECT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.out, "");
}

TEST_F(TextCommandsTest, ChatErrorsAndTheContextLimit) {
  const std::string testbed = std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf";
  // No template in the model and no flag: the error lists the built-in names.
  CliResult none = Strata({"chat", "-m", testbed}, "hi\n");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("has no chat template"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("chatml"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("llama3"), std::string::npos) << none.err;
  CliResult bad = Strata({"chat", "-m", testbed, "--chat-template", "nosuch"}, "hi\n");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("nosuch"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("chatml"), std::string::npos) << bad.err;
  // --chat-template works on a model without one.
  CliResult flag = Strata({"chat", "-m", testbed, "--chat-template", "chatml", "-n", "3"}, "hi\n");
  EXPECT_EQ(flag.code, 0) << flag.err;
  EXPECT_EQ(std::count(flag.out.begin(), flag.out.end(), '\n'), 1) << flag.out;
  for (const auto& [args, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"chat", "-m", Path("chat.gguf"), "--top-k", "-3"}, "--top-k must be >= 0"},
           {{"chat", "-m", Path("chat.gguf"), "-n", "-2"}, "-n must be >= -1, got -2"},
           {{"chat", "-m", Path("chat.gguf"), "--policy", "nosuch"}, "nosuch"},
           {{"chat"}, "--model is required"}}) {
    CliResult r = Strata(args, "hi\n");
    EXPECT_EQ(r.code, 2) << expect;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }

  // The context limit: the first reply is cut when the context fills; a message that does not
  // fit is refused with a clear message, and the conversation carries on (here: /reset).
  const std::string m = Path("chat.gguf");
  const size_t first = Encode(m, ChatMl({{"user", "hi"}}), true, true).size();
  const std::string ctx = std::to_string(first + 10);
  CliResult c = Strata({"chat", "-m", m, "-c", ctx},
                       "hi\nand the earth was without form\n/reset\nhi\n/stats\n");
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("note: the context is full (" + ctx + " tokens"), std::string::npos)
      << c.err;
  EXPECT_NE(c.err.find("error: the context is full: this message needs"), std::string::npos)
      << c.err;
  EXPECT_EQ(Row(c.out, "tokens in context"), ctx + " of " + ctx) << c.out;
}

// The chat commands are /reset and /stats; any other /word is an error that lists them and
// reaches neither the model nor the conversation; "//" sends a message that begins with "/".
TEST_F(TextCommandsTest, ChatRefusesAnUnknownCommand) {
  const std::string m = Path("chat.gguf");
  CliResult c = Strata({"chat", "-m", m, "-n", "6"}, "/frobnicate now\n/stats\n");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("error: unknown command '/frobnicate'; the commands are /reset"),
            std::string::npos)
      << c.err;
  EXPECT_NE(c.err.find("/stats"), std::string::npos) << c.err;
  EXPECT_EQ(Row(c.out, "turns"), "0") << c.out;  // nothing was sent to the model
  EXPECT_EQ(Row(c.out, "tokens in context").rfind("0 of ", 0), 0u) << c.out;
  // "//x" is the message "/x".
  CliResult s = Strata({"chat", "-m", m, "-n", "6"}, "//frobnicate\n");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(s.err.find("unknown command"), std::string::npos) << s.err;
  EXPECT_EQ(s.out, Continuation(m, ChatMl({{"user", "/frobnicate"}}), {"-n", "6"}) + "\n");
}

// A reply is bounded by default (-n 4096, strata serve's chat default), and --help says so.
TEST_F(TextCommandsTest, ChatBoundsAReplyByDefault) {
  CliResult h = Strata({"chat", "--help"});
  ASSERT_EQ(h.code, 0) << h.err;
  const std::string help = h.out;
  EXPECT_NE(help.find("-n,--n-predict INT=4096"), std::string::npos) << help;
  EXPECT_NE(help.find("Ctrl-C"), std::string::npos) << help;
  ChatOptions defaults;
  EXPECT_EQ(defaults.n_predict, 4096);
}

// A template whose turn markers the vocabulary does not hold as single tokens gets a warning
// naming each; a model that has them gets none.
TEST_F(TextCommandsTest, ChatWarnsWhenATurnMarkerIsNotOneToken) {
  CliResult plain = Strata({"chat", "-m", Path("tiny.gguf"), "--chat-template", "chatml", "-n",
                            "2"},
                           "hi\n");
  ASSERT_EQ(plain.code, 0) << plain.err;
  for (const char* marker : {"'<|im_start|>'", "'<|im_end|>'"}) {
    EXPECT_NE(plain.err.find(std::string("warning: the chatml template's turn marker ") + marker +
                             " is not a single token in this model's vocabulary"),
              std::string::npos)
        << plain.err;
  }
  CliResult gemma = Strata({"chat", "-m", Path("tiny.gguf"), "--chat-template", "gemma", "-n",
                            "2"},
                           "hi\n");
  EXPECT_NE(gemma.err.find("turn marker '<start_of_turn>'"), std::string::npos) << gemma.err;
  CliResult fits = Strata({"chat", "-m", Path("chat.gguf"), "-n", "2"}, "hi\n");
  ASSERT_EQ(fits.code, 0) << fits.err;
  EXPECT_EQ(fits.err.find("warning"), std::string::npos) << fits.err;
}

// DeepSeek V2's template ends the generation prompt with "Assistant:" and renders a reply as
// "Assistant: " + content: a reply the model begins with a space is kept without it, so the next
// rendering extends the cached text and turn 2 prefills only its new tokens (it used to re-read
// the whole conversation every turn). The replies equal a fresh generate of each rendering.
TEST_F(TextCommandsTest, ChatDeepSeek2KeepsTheCacheAcrossTurns) {
  const std::string m = Path("chat_printable.gguf");
  const Status st =
      WriteChatModel(Path("tiny.gguf"), m, -1, false, /*printable=*/true, /*space_boost=*/8.f);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto t = ChatTemplate::ByName("deepseek2");
  ASSERT_TRUE(t.ok());
  // generate prepends BOS itself, so its renderings get no BOS text.
  auto render = [&](const std::vector<ChatMessage>& msgs) {
    return t->Render(msgs, true, "", "<|im_end|>");
  };
  // The space's boosted logit wins where it is positive, except right after a space (the
  // repetition penalty over the last token), so replies mix spaces and characters.
  const std::vector<std::string> n = {"-n", "12", "--repeat-penalty", "100", "--repeat-last-n",
                                      "1"};
  // A first message whose greedy reply begins with a space (as real models answer after
  // "Assistant:"): the random model does for some messages; take the first of a fixed list.
  std::string u1, r1;
  for (int i = 0; i < 400 && u1.empty(); ++i) {
    const std::string u = "Question " + std::to_string(i) + "?";
    const std::string r = Continuation(m, render({{"user", u}}), n);
    if (r.size() > 1 && r[0] == ' ' && r.find_first_not_of(' ') != std::string::npos) {
      u1 = u;
      r1 = r;
    }
  }
  ASSERT_FALSE(u1.empty()) << "the premise: some message gets a reply that begins with a space";
  const std::string u2 = "And then?";
  std::vector<std::string> args = {"chat", "-m", m, "--chat-template", "deepseek2"};
  args.insert(args.end(), n.begin(), n.end());
  CliResult c = Strata(args, u1 + "\n/stats\n" + u2 + "\n/stats\n");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.err.find("re-renders"), std::string::npos) << c.err;
  const size_t second = c.out.find("statistic", c.out.find("statistic") + 1);
  ASSERT_NE(second, std::string::npos) << c.out;
  const std::string t1 = c.out.substr(0, second), t2 = c.out.substr(second);
  auto count = [](const std::string& v) { return std::stoll(v.substr(0, v.find(' '))); };
  const int64_t ctx1 = count(Row(t1, "tokens in context"));
  const int64_t new2 = count(Row(t2, "tokens prefilled, last message"));
  // The conversation as the template renders it: the reply without the space it writes itself.
  const std::vector<ChatMessage> whole = {{"user", u1}, {"assistant", r1.substr(1)}, {"user", u2}};
  EXPECT_EQ(render(whole).find(render({{"user", u1}}) + r1), 0u);
  EXPECT_EQ(new2, static_cast<int64_t>(Encode(m, render(whole), true, true).size()) - ctx1);
  EXPECT_LT(new2, ctx1);
  // The text: each reply equals a fresh run's on the whole rendering.
  EXPECT_EQ(c.out.rfind(r1 + "\n", 0), 0u) << c.out;
  const std::string r2 = Continuation(m, render(whole), n);
  EXPECT_EQ(t2.rfind("statistic", 0), 0u);
  EXPECT_NE(c.out.find("\n" + r2 + "\nstatistic"), std::string::npos) << c.out << "\n" << r2;
}

#ifdef STRATA_BIN
// Feeds a chat process and reads its stdout and stderr until `done` holds for them (false when
// the process closed both first). The long poll cap only keeps a broken binary from hanging the
// test; nothing waits on it.
bool Pump(int out_fd, int err_fd, std::string* out, std::string* err,
          const std::function<bool()>& done) {
  while (!done()) {
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    if (poll(fds, 2, 120000) <= 0) return false;
    bool open = false;
    for (int k = 0; k < 2; ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP))) {
        open = true;
        continue;
      }
      char buf[4096];
      const ssize_t n = read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        (k == 0 ? out : err)->append(buf, n);
        open = true;
      }
    }
    if (!open) return false;
  }
  return true;
}

// Ctrl-C during a reply stops it and returns to the prompt (the part printed stays in the
// conversation: /stats counts the turn), and the next line is answered; Ctrl-C at the prompt
// quits with status 0. The real binary, its stdin a pipe; the model never ends a reply by
// itself and the context is far larger than any reply gets before the signal.
TEST_F(TextCommandsTest, ChatCtrlCStopsTheReplyAndCtrlCAtThePromptQuits) {
  const std::string m = Path("chat_endless.gguf");
  const Status st = WriteChatModel(Path("tiny.gguf"), m, /*eos=*/1, /*endless=*/true);
  ASSERT_TRUE(st.ok()) << st.ToString();
  int in_p[2], out_p[2], err_p[2];
  ASSERT_EQ(pipe(in_p), 0);
  ASSERT_EQ(pipe(out_p), 0);
  ASSERT_EQ(pipe(err_p), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in_p[0], 0);
    dup2(out_p[1], 1);
    dup2(err_p[1], 2);
    for (int fd : {in_p[0], in_p[1], out_p[0], out_p[1], err_p[0], err_p[1]}) close(fd);
    execl(STRATA_BIN, STRATA_BIN, "chat", "-m", m.c_str(), "-n", "-1", "-c", "1000000",
          "--threads", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in_p[0]);
  close(out_p[1]);
  close(err_p[1]);
  signal(SIGPIPE, SIG_IGN);
  std::string out, err;
  auto say = [&](const std::string& line) {
    ASSERT_EQ(write(in_p[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
  };
  const std::string stopped = "(reply stopped by Ctrl-C";
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = err.find(what); at != std::string::npos; at = err.find(what, at + 1)) ++n;
    return n;
  };
  say("Hello, who are you?\n");
  // The reply is streaming: stop it.
  ASSERT_TRUE(Pump(out_p[0], err_p[0], &out, &err, [&] { return out.size() >= 8; })) << err;
  kill(pid, SIGINT);
  ASSERT_TRUE(Pump(out_p[0], err_p[0], &out, &err, [&] { return count(stopped) == 1; })) << err;
  // Back at the prompt: /stats shows the stopped reply's turn, then a message is answered.
  say("/stats\n");
  ASSERT_TRUE(Pump(out_p[0], err_p[0], &out, &err,
                   [&] { return out.find("rows kept (of visible)") != std::string::npos; }))
      << out << err;
  EXPECT_EQ(Row(out.substr(out.find("statistic")), "turns"), "1") << out;
  const size_t before = out.size();
  say("Tell me more.\n");
  ASSERT_TRUE(Pump(out_p[0], err_p[0], &out, &err, [&] { return out.size() >= before + 8; }))
      << err;
  kill(pid, SIGINT);
  ASSERT_TRUE(Pump(out_p[0], err_p[0], &out, &err, [&] { return count(stopped) == 2; })) << err;
  // Ctrl-C at the prompt quits.
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(in_p[1]);
  close(out_p[0]);
  close(err_p[0]);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << err;
  EXPECT_EQ(err.find("error"), std::string::npos) << err;
}
#endif

// ---- llama.cpp habits: escapes, -f -, seeds, -t, flags with no effect here ----

TEST(Escapes, ProcessedAsLlamaCppDoesAndMalformedOnesNameTheFlag) {
  const std::pair<std::string, std::string> ok[] = {
      {"a\\nb", "a\nb"},        {"tab\\tend", "tab\tend"}, {"cr\\r", "cr\r"},
      {"back\\\\slash", "back\\slash"}, {"\\\"q\\'", "\"q'"},  {"\\x41\\x62", "Ab"},
      {"\\xe2\\x96\\x81", "\xe2\x96\x81"}, {"keep \\d", "keep \\d"}, {"end\\", "end\\"},
      {"plain", "plain"},       {"", ""}};
  for (const auto& [in, want] : ok) {
    const StatusOr<std::string> got = ProcessEscapes("-p", in);
    ASSERT_TRUE(got.ok()) << in << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << in;
  }
  for (const std::string bad : {"\\x4", "ab\\xZZ", "\\x", "\\xg1"}) {
    const StatusOr<std::string> got = ProcessEscapes("--stop", bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().message().rfind("--stop: malformed escape '\\x", 0), 0u)
        << got.status().message();
    EXPECT_NE(got.status().message().find("--no-escape"), std::string::npos);
  }
}

TEST_F(TextCommandsTest, GenerateProcessesEscapesInThePromptAndStopStrings) {
  const std::string m = Path("tiny.gguf");
  CliResult esc = Strata({"generate", "-m", m, "-p", "line one\\nline\\x20two", "-n", "4"});
  ASSERT_EQ(esc.code, 0) << esc.err;
  EXPECT_EQ(esc.out.rfind("line one\nline two", 0), 0u) << esc.out;
  // -e is the default, as in llama.cpp.
  CliResult e = Strata({"generate", "-m", m, "-e", "-p", "line one\\nline\\x20two", "-n", "4"});
  EXPECT_EQ(e.out, esc.out);
  CliResult raw =
      Strata({"generate", "-m", m, "--no-escape", "-p", "line one\\nline\\x20two", "-n", "4"});
  ASSERT_EQ(raw.code, 0) << raw.err;
  EXPECT_EQ(raw.out.rfind("line one\\nline\\x20two", 0), 0u) << raw.out;
  for (const auto& [args, expect] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"-p", "bad \\x4"}, "-p: malformed escape '\\x4'"},
           {{"-p", "bad \\xZZ"}, "-p: malformed escape '\\xZZ'"},
           {{"--stop", "\\xq"}, "--stop: malformed escape '\\xq'"}}) {
    std::vector<std::string> a = {"generate", "-m", m, "-n", "2"};
    a.insert(a.end(), args.begin(), args.end());
    CliResult r = Strata(a);
    EXPECT_EQ(r.code, 2) << expect;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }
  // A stop string's escapes are processed too: the greedy text cut at its first character,
  // written as \xNN, ends before it.
  const std::string cont = Continuation(m, "hello there", {"-n", "12"});
  ASSERT_FALSE(cont.empty());
  char hex[8];
  std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(cont[0]));
  CliResult stop = Strata({"generate", "-m", m, "-p", "hello there", "--special", "-n", "12",
                           "--stop", hex});
  ASSERT_EQ(stop.code, 0) << stop.err;
  EXPECT_EQ(stop.out, "hello there\n") << stop.out;
  // chat: --system.
  CliResult sys = Strata({"chat", "-m", Path("chat.gguf"), "--system", "be \\xZ"}, "hi\n");
  EXPECT_EQ(sys.code, 2);
  EXPECT_NE(sys.err.find("--system: malformed escape"), std::string::npos) << sys.err;
}

TEST_F(TextCommandsTest, DashFReadsThePromptFromStandardInput) {
  const std::string m = Path("tiny.gguf");
  const std::string prompt = "Once upon a time\nthere was";
  CliResult p = Strata({"generate", "-m", m, "--no-escape", "-p", prompt, "-n", "6"});
  CliResult f = Strata({"generate", "-m", m, "-f", "-", "-n", "6"}, prompt);
  ASSERT_EQ(p.code, 0) << p.err;
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(f.out, p.out);
  CliResult t1 = Strata({"tokenize", "-m", m, "--ids", "-p", prompt});
  CliResult t2 = Strata({"tokenize", "-m", m, "--ids", "-f", "-"}, prompt);
  ASSERT_EQ(t2.code, 0) << t2.err;
  EXPECT_EQ(t2.out, t1.out);
}

TEST_F(TextCommandsTest, DefaultSeedIsRandomPrintedAndRepeatable) {
  const std::string m = Path("tiny.gguf");
  const std::vector<std::string> base = {"generate", "-m", m, "-p", "hello", "-n", "10",
                                         "--temp", "1.5"};
  auto seed_of = [](const std::string& err) -> std::string {
    const size_t at = err.find("seed: ");
    if (at == std::string::npos) return "";
    const size_t end = err.find_first_not_of("0123456789", at + 6);
    return err.substr(at + 6, end - at - 6);
  };
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{}, {"--seed", "-1"}}) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    CliResult r = Strata(a);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string seed = seed_of(r.err);
    ASSERT_FALSE(seed.empty()) << r.err;
    EXPECT_NE(r.err.find("seed: " + seed + " (random; --seed " + seed + " repeats this run)"),
              std::string::npos)
        << r.err;
    // The printed seed repeats the run.
    std::vector<std::string> again = base;
    again.insert(again.end(), {"--seed", seed});
    CliResult r2 = Strata(again);
    ASSERT_EQ(r2.code, 0) << r2.err;
    EXPECT_EQ(r2.out, r.out);
    EXPECT_NE(r2.err.find("seed: " + seed + "\n"), std::string::npos) << r2.err;
  }
  std::vector<std::string> top = base;
  top.insert(top.end(), {"--seed", "18446744073709551615"});
  EXPECT_EQ(Strata(top).code, 0);
  for (const std::string bad : {"-2", "18446744073709551616", "abc", "1.5", ""}) {
    for (const char* cmd : {"generate", "chat"}) {
      CliResult r = Strata({cmd, "-m", Path("chat.gguf"), "--seed", bad}, "hi\n");
      EXPECT_EQ(r.code, 2) << cmd << " " << bad;
      EXPECT_NE(r.err.find("--seed must be an integer in [0, 18446744073709551615] or -1 (a "
                           "random seed), got '" + bad + "'"),
                std::string::npos)
          << r.err;
    }
  }
}

TEST_F(TextCommandsTest, DashTIsThreadsOnEveryCommandThatHasThreads) {
  const std::vector<std::vector<std::string>> commands = {
      {"demo"},          {"generate"},          {"quantize"},       {"serve"},
      {"chat"},          {"eval", "needle"},    {"eval", "ppl"},    {"eval", "kl"},
      {"eval", "ruler"}, {"bench", "decode"}, {"bench", "capacity"}, {"bench", "attention"},
      {"bench", "serve"}, {"bench", "prefill"}};
  for (const auto& c : commands) {
    std::vector<std::string> a = c;
    a.push_back("--help");
    CliResult h = Strata(a);
    ASSERT_EQ(h.code, 0) << c[0];
    ASSERT_NE(h.out.find("--threads"), std::string::npos) << c[0] << " has no --threads";
    EXPECT_NE(h.out.find("  -t,--threads"), std::string::npos) << c[0] << (c.size() > 1 ? " " + c[1] : "");
  }
  const std::string m = Path("tiny.gguf");
  CliResult t = Strata({"generate", "-m", m, "-p", "hi", "-n", "3", "-t", "1"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(Strata({"generate", "-m", m, "-p", "hi", "-n", "3", "--threads", "1"}).out, t.out);
  CliResult zero = Strata({"generate", "-m", m, "-t", "0"});
  EXPECT_EQ(zero.code, 2);
  EXPECT_NE(zero.err.find("--threads must be >= 1, got 0"), std::string::npos) << zero.err;
}

// -ngl N, -fa [on|off|auto], --mlock and -cnv are accepted with a note, and consume exactly their
// own arguments: -ngl 99 was read as -n "gl" ("Could not convert: --n-predict = gl"), -fa on as
// -f "a".
TEST_F(TextCommandsTest, LlamaCppGpuFlagsAreAcceptedWithANote) {
  const std::string m = Path("tiny.gguf");
  CliResult plain = Strata({"generate", "-m", m, "-p", "hi", "-n", "5"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"-ngl", "99"},
           {"--n-gpu-layers", "99"},
           {"-fa", "on"},
           {"-fa", "auto"},
           {"--flash-attn", "off"},
           {"-fa"},
           {"--mlock"},
           {"-cnv"},
           {"-ngl", "99", "-fa", "-cnv", "--mlock"}}) {
    std::string what;
    for (const auto& e : extra) what += e + " ";
    SCOPED_TRACE(what);
    // Before the other flags and after them (a bare -fa followed by -n takes no value).
    std::vector<std::string> a = {"generate"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), {"-m", m, "-p", "hi", "-n", "5"});
    std::vector<std::string> b = {"generate", "-m", m, "-p", "hi", "-n", "5"};
    b.insert(b.end(), extra.begin(), extra.end());
    for (const auto& args : {a, b}) {
      CliResult r = Strata(args);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(r.out, plain.out);
      EXPECT_NE(r.err.find("has no effect in Strata"), std::string::npos) << r.err;
    }
  }
  CliResult ngl = Strata({"generate", "-m", m, "-p", "hi", "-n", "5", "-ngl", "99"});
  EXPECT_NE(ngl.err.find("note: -ngl/--n-gpu-layers has no effect in Strata (a CPU engine)"),
            std::string::npos)
      << ngl.err;
  EXPECT_EQ(std::count(ngl.err.begin(), ngl.err.end(), '\n'),
            std::count(plain.err.begin(), plain.err.end(), '\n') + 1);
  CliResult fa = Strata({"generate", "-m", m, "-fa", "maybe"});
  EXPECT_EQ(fa.code, 2);
  EXPECT_NE(fa.err.find("-fa/--flash-attn takes on, off or auto"), std::string::npos) << fa.err;
  // Other commands that run a model take them too.
  CliResult chat = Strata({"chat", "-m", Path("chat.gguf"), "-ngl", "99", "-cnv", "-n", "2"}, "hi\n");
  EXPECT_EQ(chat.code, 0) << chat.err;
  EXPECT_NE(chat.err.find("-cnv/--conversation has no effect"), std::string::npos) << chat.err;
}

// A model whose logits are NaN (its output norm's weights NaN, as in a corrupt file) stops
// generate with an error naming the position instead of printing token 0 again and again.
TEST_F(TextCommandsTest, NonFiniteLogitsStopGenerateNamingThePosition) {
  auto f = GgufFile::Open(Path("tiny.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  GgufWriter w;
  for (const auto& [k, v] : (*f)->metadata()) {
    if (k != "general.alignment") w.Set(k, v);
  }
  bool poisoned = false;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    auto v = (*f)->Tensor(t.name);
    ASSERT_TRUE(v.ok());
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(v->data),
                               static_cast<const uint8_t*>(v->data) + t.n_bytes);
    if (t.name == "output_norm.weight") {
      ASSERT_EQ(t.dtype, DType::kF32);
      const float nan = std::nanf("");
      for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
        std::memcpy(&bytes[i], &nan, sizeof(float));
      }
      poisoned = true;
    }
    ASSERT_TRUE(w.AddTensor(t.name, t.dtype, t.shape, bytes.data(), bytes.size()).ok());
  }
  ASSERT_TRUE(poisoned);
  ASSERT_TRUE(w.WriteFile(Path("nan.gguf")).ok());
  const size_t n_prompt = Encode(Path("tiny.gguf"), "hello", true, false).size();
  for (const char* temp : {"0", "0.8"}) {
    CliResult r = Strata({"generate", "-m", Path("nan.gguf"), "-p", "hello", "-n", "8", "--temp",
                          temp});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("error: non-finite logits at position " + std::to_string(n_prompt) +
                         " "),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.out, "hello\n");  // nothing generated
  }
}

// -c / --ctx sizes that no machine holds are refused up front, naming the KV cache bytes and the
// memory present, instead of being accepted (chat, serve) or failing mid-run (bench decode).
TEST_F(TextCommandsTest, ContextSizesAreCheckedAgainstMemoryUpFront) {
  const std::string huge = "1000000000000";
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"generate", "-m", Path("tiny.gguf"), "-c", huge}, "-c"},
           {{"chat", "-m", Path("chat.gguf"), "-c", huge}, "-c"},
           {{"serve", "-m", Path("tiny.gguf"), "--port", "0", "-c", huge}, "-c"},
           {{"bench", "decode", "-m", Path("tiny.gguf"), "--ctx", "0," + huge}, "--ctx"}}) {
    SCOPED_TRACE(args[0]);
    CliResult r = Strata(args, "hi\n");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("error: " + flag + " " + huge + ": one sequence's KV cache would need "),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(" bytes ("), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("of memory available (MemAvailable); lower " + flag), std::string::npos)
        << r.err;
  }
  // A size that fits runs.
  CliResult ok = Strata({"generate", "-m", Path("tiny.gguf"), "-p", "hi", "-n", "2", "-c", "64"});
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST(KvFitsMemory, MessageNamesTheBytesNeededAndPresent) {
  EXPECT_TRUE(CheckKvFitsMemory("-c", 100, 1000, 10, 2000).ok());
  EXPECT_TRUE(CheckKvFitsMemory("-c", 100, 1000, 10, 0).ok());  // memory unknown
  const Status st = CheckKvFitsMemory("-c", 1000000000000, 1024e12, 1024, 32.0 * (1 << 30));
  EXPECT_EQ(st.message(),
            "-c 1000000000000: one sequence's KV cache would need 1024000000000000 bytes "
            "(931.32 TiB) at 1000000000000 tokens (1.00 KiB per token), more than the "
            "34359738368 bytes (32.00 GiB) of memory available (MemAvailable); lower -c");
  EXPECT_GT(AvailableMemoryBytes(), 0);
}

}  // namespace
}  // namespace strata::cli
