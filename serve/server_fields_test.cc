// `strata serve`'s sampling fields and llama-server's own endpoints over loopback: every sampler
// field gives the text `strata generate` gives with the same flags, logprobs come in OpenAI's
// shapes, fields the server does not implement are refused by name, and /completion, /slots
// answer in llama-server's shapes.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/status_testing.h"
#include "model/synth.h"
#include "serve/server.h"

namespace strata::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// stdout of a command (stderr dropped) and its exit code.
std::string RunCmd(const std::vector<std::string>& args, int* code) {
  std::string cmd;
  for (const auto& a : args) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += q + "' ";
  }
  FILE* p = popen((cmd + "2>/dev/null").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// Generated text as the server's JSON carries it (invalid UTF-8 replaced).
std::string AsJsonText(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

class ServeFieldsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_serve_fields_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    SynthOptions so;
    so.seed = 7;
    ASSERT_OK(SynthGguf(so, Path()));
    auto m = Model::Load(Path());
    ASSERT_OK(m);
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Path() { return *dir_ + "/tiny.gguf"; }
  void SetUp() override {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.parallel = 2;
    o.queue = 4;
    auto s = Server::Create(model_, o);
    ASSERT_OK(s);
    server_ = std::move(s).value();
    auto p = server_->Start();
    ASSERT_OK(p);
    port_ = *p;
  }
  void TearDown() override { server_.reset(); }

  std::pair<int, json> Post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::string RawPost(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    return r ? r->body : "";
  }

  static inline Model* model_ = nullptr;
  static inline std::string* dir_ = nullptr;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

TEST_F(ServeFieldsTest, EverySamplerFieldGivesGeneratesText) {
  const std::string prompt = "The quick brown fox";
  const int32_t banned = model_->tokenizer()->Encode(" the", false).front();
  struct Case {
    json fields;
    std::vector<std::string> flags;
  };
  const std::vector<Case> cases = {
      {{{"temperature", 0}, {"repeat_penalty", 1.3}, {"repeat_last_n", -1}},
       {"--temp", "0", "--repeat-penalty", "1.3", "--repeat-last-n", "-1"}},
      {{{"temperature", 0}, {"presence_penalty", 1.5}, {"frequency_penalty", 0.5}},
       {"--temp", "0", "--presence-penalty", "1.5", "--frequency-penalty", "0.5"}},
      {{{"temperature", 0}, {"logit_bias", {{std::to_string(banned), -100}}}},
       {"--temp", "0", "--logit-bias", std::to_string(banned) + "-100"}},
      {{{"temperature", 1}, {"top_k", 5}, {"min_p", 0.1}, {"seed", 3}},
       {"--temp", "1", "--top-k", "5", "--min-p", "0.1", "--seed", "3"}},
  };
  for (const Case& c : cases) {
    json body = {{"prompt", prompt}, {"max_tokens", 12}};
    body.update(c.fields);
    auto [status, j] = Post("/v1/completions", body);
    ASSERT_EQ(status, 200) << j.dump();
    const std::string text = j["choices"][0]["text"];
    std::vector<std::string> args = {STRATA_BIN, "generate", "-m", Path(),      "-p",
                                      prompt,     "-n",       "12", "--threads", "1"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    int code = -1;
    const std::string gen = RunCmd(args, &code);
    ASSERT_EQ(code, 0) << c.fields.dump();
    EXPECT_EQ(AsJsonText(gen), prompt + text + "\n") << c.fields.dump();
  }
  // top_k 1 at any temperature is greedy.
  auto [s1, greedy] = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8},
                                               {"temperature", 0}, {"ignore_eos", true}});
  auto [s2, k1] = Post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8},
                                           {"temperature", 1.5}, {"top_k", 1}, {"seed", 9},
                                           {"ignore_eos", true}});
  ASSERT_EQ(s1, 200);
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(greedy["choices"][0]["text"], k1["choices"][0]["text"]);
}

TEST_F(ServeFieldsTest, LogprobsInOpenAisShapesStreamedAndNot) {
  // Completions: logprobs N.
  json body = {{"prompt", "Hello"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 3},
               {"ignore_eos", true}};
  auto [status, j] = Post("/v1/completions", body);
  ASSERT_EQ(status, 200) << j.dump();
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  std::string joined;
  for (size_t i = 0; i < 5; ++i) {
    // Byte offsets into the text (the synthetic vocabulary's byte tokens arrive in JSON as
    // U+FFFD, so only their order is checked here).
    if (i == 0) EXPECT_EQ(lp["text_offset"][i].get<size_t>(), 0u);
    if (i > 0) EXPECT_GE(lp["text_offset"][i].get<size_t>(), lp["text_offset"][i - 1].get<size_t>());
    joined += lp["tokens"][i].get<std::string>();
    const double l = lp["token_logprobs"][i];
    EXPECT_LE(l, 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(l, best, 1e-6);
  }
  EXPECT_EQ(AsJsonText(joined), j["choices"][0]["text"]);
  // Chat-style fields on completions are refused by name.
  auto [bad_status, bad] = Post("/v1/completions", {{"prompt", "x"}, {"top_logprobs", 2}});
  EXPECT_EQ(bad_status, 400);
  EXPECT_EQ(bad["error"]["param"], "top_logprobs");
  // Streamed: the chunks' logprobs add up to the same tokens.
  body["stream"] = true;
  const std::string sse = RawPost("/v1/completions", body);
  std::vector<double> streamed;
  size_t at = 0;
  while ((at = sse.find("data: {", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const json ev = json::parse(sse.substr(at + 6, end - at - 6));
    at = end;
    const json& l = ev["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const auto& v : l["token_logprobs"]) streamed.push_back(v);
  }
  ASSERT_EQ(streamed.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(streamed[i], lp["token_logprobs"][i].get<double>());
}

TEST_F(ServeFieldsTest, UnimplementedFieldsAreRefusedByName) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"response_format", {{"type", "json_object"}}},
           {"tools", json::array({{{"type", "function"}}})},
           {"suffix", "x"},
           {"made_up", 1}}) {
    json body = {{"prompt", "x"}, {field, value}};
    auto [status, j] = Post("/v1/completions", body);
    EXPECT_EQ(status, 400) << field;
    EXPECT_EQ(j["error"]["param"], field) << j.dump();
  }
  // Not refused: the text response format, an empty tool list, user.
  auto [ok_status, ok] = Post("/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                               {"response_format", {{"type", "text"}}},
                               {"tools", json::array()},
                               {"user", "u"},
                               {"max_tokens", 2}});
  // The synthetic model may lack a chat template: either it answers, or it names the template.
  EXPECT_TRUE(ok_status == 200 || Has(ok.dump(), "chat template")) << ok.dump();
  // max_completion_tokens wins over max_tokens.
  auto [s, j] = Post("/v1/completions", {{"prompt", "x"},
                                         {"max_tokens", 3},
                                         {"max_completion_tokens", 2},
                                         {"ignore_eos", true},
                                         {"temperature", 0}});
  ASSERT_EQ(s, 200) << j.dump();
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
}

TEST_F(ServeFieldsTest, LlamaServerCompletionAndSlots) {
  const std::string prompt = "The quick brown fox";
  auto [status, j] = Post("/completion", {{"prompt", prompt},
                                          {"n_predict", 6},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"cache_prompt", true},
                                          {"n_probs", 2}});
  ASSERT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["tokens_predicted"], 6);
  EXPECT_EQ(j["tokens_evaluated"].get<size_t>(), model_->tokenizer()->Encode(prompt, true).size());
  EXPECT_EQ(j["stop"], true);
  EXPECT_EQ(j["stop_type"], "limit");
  EXPECT_EQ(j["completion_probabilities"].size(), 6u);
  EXPECT_TRUE(Has(j["strata"]["note"], "cache_prompt has no effect")) << j.dump();
  // The same text as the OpenAI endpoint, greedy.
  auto [s2, o] = Post("/v1/completions", {{"prompt", prompt},
                                          {"max_tokens", 6},
                                          {"temperature", 0},
                                          {"ignore_eos", true}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(j["content"], o["choices"][0]["text"]);
  // Streamed: {"content", "stop": false} events, then the final one with "stop": true.
  const std::string sse = RawPost("/completion", {{"prompt", prompt},
                                                  {"n_predict", 6},
                                                  {"temperature", 0},
                                                  {"ignore_eos", true},
                                                  {"stream", true}});
  std::string text;
  bool stopped = false;
  size_t at = 0;
  while ((at = sse.find("data: {", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const json ev = json::parse(sse.substr(at + 6, end - at - 6));
    at = end;
    text += ev["content"].get<std::string>();
    if (ev["stop"].get<bool>()) stopped = true;
  }
  EXPECT_TRUE(stopped);
  EXPECT_FALSE(Has(sse, "[DONE]"));
  EXPECT_EQ(text, j["content"]);
  // Refused by name: a field /completion does not implement, a zero n_predict.
  auto [s3, bad] = Post("/completion", {{"prompt", "x"}, {"mirostat", 2}});
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(bad["error"]["param"], "mirostat");
  auto [s4, bad2] = Post("/completion", {{"prompt", "x"}, {"n_predict", 0}});
  EXPECT_EQ(s4, 400);
  EXPECT_EQ(bad2["error"]["param"], "n_predict");

  // /slots while a long request runs: its policy, tokens and bytes. The synthetic model decodes
  // a request in milliseconds, so each try polls until it sees the slot or the request ends, and
  // tries again in the rare case it ended first.
  json seen;
  for (int attempt = 0; attempt < 50 && seen.is_null(); ++attempt) {
    std::atomic<bool> done{false};
    std::thread runner([&] {
      Post("/v1/completions", {{"prompt", prompt},
                               {"max_tokens", 1500},
                               {"ignore_eos", true},
                               {"temperature", 0},
                               {"strata", {{"policy", "streaming:ratio=2"}}}});
      done = true;
    });
    httplib::Client c("127.0.0.1", port_);
    while (!done && seen.is_null()) {
      auto r = c.Get("/slots");
      ASSERT_TRUE(r);
      const json slots = json::parse(r->body);
      ASSERT_EQ(slots.size(), 2u);
      for (const json& s : slots) {
        if (s["is_processing"].get<bool>() && s.value("n_decoded", 0) > 0) seen = s;
      }
    }
    runner.join();
  }
  ASSERT_FALSE(seen.is_null()) << "no running slot seen";
  EXPECT_TRUE(Has(seen["policy"], "streaming")) << seen.dump();
  EXPECT_GT(seen["kv_resident_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(seen["n_prompt_tokens"].get<size_t>(), model_->tokenizer()->Encode(prompt, true).size());
}

// llama-server's "timings": in a non-streamed response, the last chunk of a stream and
// /completion's answer; the counts are the usage's and the times those of the scheduler.
TEST_F(ServeFieldsTest, TimingsAsLlamaServerReportsThem) {
  const json body = {{"prompt", "The quick brown fox"},
                     {"max_tokens", 200},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  auto check = [](const json& t, int64_t prompt_n, int64_t predicted_n) {
    ASSERT_TRUE(t.is_object()) << t.dump();
    EXPECT_EQ(t["prompt_n"].get<int64_t>(), prompt_n);
    EXPECT_EQ(t["predicted_n"].get<int64_t>(), predicted_n);
    EXPECT_GE(t["prompt_ms"].get<double>(), 0);
    const double ms = t["predicted_ms"].get<double>();
    EXPECT_GT(ms, 0) << t.dump();  // 199 decode steps take some time
    EXPECT_NEAR(t["predicted_per_second"].get<double>(), (predicted_n - 1) / ms * 1e3,
                1e-9 * t["predicted_per_second"].get<double>());
    EXPECT_NEAR(t["predicted_per_token_ms"].get<double>(), ms / (predicted_n - 1), 1e-9 * ms);
  };
  auto [status, j] = Post("/v1/completions", body);
  ASSERT_EQ(status, 200) << j.dump();
  check(j["timings"], j["usage"]["prompt_tokens"], 200);
  const std::string sse = RawPost("/v1/completions",
                                  {{"prompt", "hi"},
                                   {"max_tokens", 50},
                                   {"ignore_eos", true},
                                   {"stream", true}});
  json last;
  size_t at = 0;
  while ((at = sse.find("data: {", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    const json ev = json::parse(sse.substr(at + 6, end - at - 6));
    at = end;
    if (ev.contains("timings")) last = ev;
  }
  ASSERT_FALSE(last.is_null()) << sse;
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["timings"]["predicted_n"], 50);
  auto [s2, native] = Post("/completion", {{"prompt", "The quick brown fox"},
                                           {"n_predict", 200},
                                           {"ignore_eos", true}});
  ASSERT_EQ(s2, 200) << native.dump();
  check(native["timings"], native["tokens_evaluated"], 200);
}

}  // namespace
}  // namespace strata::serve
