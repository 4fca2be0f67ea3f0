// End-to-end tests of `strata serve` over loopback (httplib's client, a free port per server):
// the OpenAI wire format, streaming == non-streaming == `strata generate`, concurrency with mixed
// policies, disconnects, the queue and the KV budget, bad input, and SIGTERM on the real binary.
#include "serve/server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "core/status_testing.h"
#include "core/test_refs.h"
#include "kv/registry.h"
#include "model/synth.h"

namespace strata::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

struct Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
  json j;  // the body parsed (discarded when not JSON)
};

Reply Post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  c.set_write_timeout(120, 0);
  auto r = c.Post(path, headers, body, "application/json");
  Reply out;
  if (!r) {
    ADD_FAILURE() << "POST " << path << ": no response (" << httplib::to_string(r.error()) << ")";
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  out.j = json::parse(r->body, nullptr, false);
  return out;
}

Reply Get(int port, const std::string& path, const httplib::Headers& headers = {}) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto r = c.Get(path, headers);
  Reply out;
  if (!r) {
    ADD_FAILURE() << "GET " << path << ": no response";
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  out.j = json::parse(r->body, nullptr, false);
  return out;
}

// A server-sent-event body: the JSON of every `data:` event, and whether it ended with [DONE].
struct Sse {
  std::vector<json> events;
  bool done = false;
  std::string text;  // the concatenated text (completions) or delta contents (chat)
  std::string finish_reason;
};
Sse ParseSse(const std::string& body) {
  Sse s;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(at, end - at);
    at = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    const std::string data = ev.substr(6);
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    EXPECT_FALSE(s.done) << "an event after [DONE]";
    json j = json::parse(data, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << data;
    if (j.is_discarded()) continue;
    for (const json& c : j.value("choices", json::array())) {
      if (c.contains("text")) s.text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) {
        s.text += c["delta"]["content"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
    }
    s.events.push_back(std::move(j));
  }
  return s;
}

// `s` with every invalid UTF-8 byte replaced by U+FFFD, as the server's JSON carries generated
// text (the synthetic vocabulary has byte tokens that do not form characters).
std::string AsJsonText(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// Runs a program, returns its stdout (stderr goes to the test log).
std::string RunProgram(const std::vector<std::string>& args, int* code) {
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

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);  // as `strata serve` does: a hung-up client is a failed write
    dir_ =
        new std::string(fs::temp_directory_path() / ("strata_serve_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    SynthOptions so;
    so.seed = 7;
    ASSERT_OK(SynthGguf(so, Path("tiny.gguf")));
    auto m = Model::Load(Path("tiny.gguf"));
    ASSERT_OK(m);
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  static ServerOptions Options() {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.parallel = 4;
    o.queue = 16;
    o.threads = 1;
    return o;
  }
  // Starts a server on a free loopback port.
  std::unique_ptr<Server> Start(ServerOptions o, int* port) {
    auto s = Server::Create(model_, std::move(o));
    EXPECT_OK(s);
    if (!s.ok()) return nullptr;
    auto p = (*s)->Start();
    EXPECT_OK(p);
    *port = p.ok() ? *p : 0;
    return std::move(s).value();
  }

  static inline std::string* dir_ = nullptr;
  static inline Model* model_ = nullptr;
};

json Completion(const std::string& prompt, int max_tokens, double temp, int seed,
                const std::string& policy, bool stream) {
  json j = {{"model", "tiny"},     {"prompt", prompt}, {"max_tokens", max_tokens},
            {"temperature", temp}, {"seed", seed},     {"stream", stream}};
  if (!policy.empty()) j["strata"] = {{"policy", policy}};
  return j;
}

// Policies that run on the synthetic llama (GQA) cache.
const std::vector<std::string>& GqaPolicies() {
  static const auto* p = new std::vector<std::string>{
      "full", "streaming:ratio=4", "h2o:ratio=2", "snapkv:ratio=2", "geodesia:bits=2", "kivi4",
      "full", "streaming:ratio=2"};
  return *p;
}

// Polls /metrics until `line` appears (the scheduler updates gauges once per step).
bool WaitForMetric(int port, const std::string& line) {
  for (int i = 0; i < 400; ++i) {
    if (Has(Get(port, "/metrics").body, line)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

TEST_F(ServeTest, CompletionsStreamedEqualsNonStreamedEqualsGenerate) {
  int port = 0;
  auto server = Start(Options(), &port);
  ASSERT_TRUE(server);
  const std::string prompt = "The quick brown fox";
  for (const std::string policy : {"full", "streaming:ratio=4"}) {
    const Reply r =
        Post(port, "/v1/completions", Completion(prompt, 12, 0.8, 5, policy, false).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j["object"], "text_completion");
    ASSERT_EQ(r.j["choices"].size(), 1u);
    const std::string text = r.j["choices"][0]["text"];
    const std::string finish = r.j["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
    const json& usage = r.j["usage"];
    EXPECT_EQ(usage["total_tokens"].get<int>(),
              usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
    EXPECT_EQ(usage["prompt_tokens"].get<size_t>(),
              model_->tokenizer()->Encode(prompt, true).size());
    if (finish == "length") {
      EXPECT_EQ(usage["completion_tokens"], 12);
    }

    const Reply s =
        Post(port, "/v1/completions", Completion(prompt, 12, 0.8, 5, policy, true).dump());
    ASSERT_EQ(s.status, 200) << s.body;
    const Sse sse = ParseSse(s.body);
    EXPECT_TRUE(sse.done);
    EXPECT_GE(sse.events.size(), 2u);
    EXPECT_EQ(sse.text, text) << policy;
    EXPECT_EQ(sse.finish_reason, finish);
    for (const json& e : sse.events) {
      EXPECT_EQ(e["object"], "text_completion");
      EXPECT_EQ(e["id"], sse.events[0]["id"]);
      EXPECT_EQ(e["model"], "tiny");
    }

    // `strata generate` prints the prompt, the text and a newline.
    int code = -1;
    const std::string gen =
        RunProgram({STRATA_BIN, "generate", "-m", Path("tiny.gguf"), "-p", prompt, "-n", "12",
                    "--temp", "0.8", "--seed", "5", "--threads", "1", "--policy", policy},
                   &code);
    ASSERT_EQ(code, 0);
    EXPECT_EQ(AsJsonText(gen), prompt + text + "\n") << policy;
  }
}

TEST_F(ServeTest, StopSequencesAndUsageInStreams) {
  int port = 0;
  auto server = Start(Options(), &port);
  ASSERT_TRUE(server);
  // Greedy: take the 30-token text, then stop at a piece of it.
  const Reply full = Post(port, "/v1/completions", Completion("Hello", 30, 0, 1, "", false).dump());
  ASSERT_EQ(full.status, 200);
  const std::string text = full.j["choices"][0]["text"];
  ASSERT_GE(text.size(), 12u) << text;
  const std::string stop = text.substr(6, 3);
  const std::string cut = text.substr(0, text.find(stop));
  json req = Completion("Hello", 30, 0, 1, "", false);
  req["stop"] = {stop, "\x01never"};
  const Reply r = Post(port, "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.j["choices"][0]["text"], cut);
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "stop");
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const Reply s = Post(port, "/v1/completions", req.dump());
  const Sse sse = ParseSse(s.body);
  EXPECT_EQ(sse.text, cut);
  EXPECT_EQ(sse.finish_reason, "stop");
  ASSERT_FALSE(sse.events.empty());
  const json& last = sse.events.back();  // the usage chunk: no choices
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"], r.j["usage"]);
}

TEST_F(ServeTest, ChatWithChatml) {
  ServerOptions o = Options();
  o.chat_template = "chatml";
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  const std::vector<ChatMessage> msgs = {{"system", "You are terse."}, {"user", "Hi there"}};
  json body = {{"model", "tiny"},
               {"messages",
                {{{"role", "system"}, {"content", "You are terse."}},
                 {{"role", "user"}, {"content", "Hi there"}}}},
               {"max_tokens", 10},
               {"temperature", 0.7},
               {"seed", 11}};
  const Reply r = Post(port, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["object"], "chat.completion");
  EXPECT_EQ(r.j["choices"][0]["message"]["role"], "assistant");
  // The prompt is the chatml rendering, encoded with special tokens parsed and no extra BOS.
  auto t = ChatTemplate::ByName("chatml");
  ASSERT_OK(t);
  const Tokenizer& tok = *model_->tokenizer();
  const std::string rendered =
      t->Render(msgs, true, tok.token_text(tok.bos_id()), tok.token_text(tok.eos_id()));
  EXPECT_TRUE(Has(rendered, "<|im_start|>assistant\n")) << rendered;
  EXPECT_EQ(r.j["usage"]["prompt_tokens"].get<size_t>(), tok.Encode(rendered, false, true).size());
  body["stream"] = true;
  const Reply s = Post(port, "/v1/chat/completions", body.dump());
  const Sse sse = ParseSse(s.body);
  EXPECT_TRUE(sse.done);
  ASSERT_GE(sse.events.size(), 2u);
  EXPECT_EQ(sse.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(sse.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(sse.text, r.j["choices"][0]["message"]["content"]);
  EXPECT_EQ(sse.finish_reason, r.j["choices"][0]["finish_reason"]);
  EXPECT_TRUE(sse.events.back()["choices"][0]["delta"].empty());

  // A server whose model has no template and no --chat-template: chat is a 400 naming the flag,
  // completions still work.
  int port2 = 0;
  auto plain = Start(Options(), &port2);
  const Reply no = Post(port2, "/v1/chat/completions", body.dump());
  EXPECT_EQ(no.status, 400);
  EXPECT_TRUE(Has(no.j["error"]["message"], "--chat-template")) << no.body;
}

TEST_F(ServeTest, ConcurrentStreamsWithMixedPoliciesEqualTheirSoloRuns) {
  // 32 streams on 8 slots: 24 wait in the queue and join as others finish.
  ServerOptions o = Options();
  o.parallel = 8;
  o.queue = 32;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  const int n = 32;
  auto policy = [&](int i) { return GqaPolicies()[i % GqaPolicies().size()]; };
  auto request = [&](int i) {
    return Completion("Stream number " + std::to_string(i), 24, 0.9, 100 + i, policy(i), true)
        .dump();
  };
  std::vector<std::string> solo(n);
  for (int i = 0; i < n; ++i) {
    const Reply r = Post(port, "/v1/completions", request(i));
    ASSERT_EQ(r.status, 200) << policy(i) << ": " << r.body;
    solo[i] = ParseSse(r.body).text;
  }
  // All at once: Model::Decode per sequence inside the step, so the results are bit-identical
  // to the solo runs (with a batched GEMM the tolerance must be restated here).
  std::vector<std::string> together(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back(
        [&, i] { together[i] = ParseSse(Post(port, "/v1/completions", request(i)).body).text; });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) EXPECT_EQ(together[i], solo[i]) << policy(i);
  // The request counter is bumped once a response is written, just after the client has it.
  EXPECT_TRUE(WaitForMetric(port,
                            "strata_requests_total{endpoint=\"/v1/completions\",status="
                            "\"200\"} " +
                                std::to_string(2 * n) + "\n"));
  EXPECT_TRUE(WaitForMetric(port, "strata_active_sequences 0\n"));
}

TEST_F(ServeTest, BadInputIsA4xxAndTheServerKeepsServing) {
  ServerOptions o = Options();
  o.ctx = 64;
  o.max_body_bytes = 1 << 20;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  struct Case {
    std::string body;
    int status;
    const char* says;
  };
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  const std::vector<Case> cases = {
      {"{not json", 400, "not valid JSON"},
      {R"({"prompt": 3})", 400, "must be a string"},
      {R"({"prompt": "x", "max_tokens": -5})", 400, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1000000})", 400, "maximum context length is 64"},
      {std::string(10 << 20, ' '), 413, "larger than the server's limit"},
      {R"({"prompt": "x", "strata": {"policy": "nosuch:ratio=2"}})", 400, "nosuch"},
      {R"({"prompt": "x", "model": "other"})", 404, "'other' does not exist"},
      // Valid for the registry, but the model has no MLA layer.
      {R"({"prompt": "x", "strata": {"policy": "vestige"}})", 400, "cannot run on this model"},
      {json{{"prompt", long_prompt}}.dump(), 400, "this model's context is 64 tokens"},
  };
  for (const Case& c : cases) {
    const Reply r = Post(port, "/v1/completions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80);
    ASSERT_TRUE(r.j.is_object()) << r.body;
    EXPECT_TRUE(Has(r.j["error"]["message"], c.says)) << r.body;
    EXPECT_TRUE(r.j["error"].contains("type"));
    // Still serving.
    EXPECT_EQ(Get(port, "/health").status, 200);
  }
  const Reply unknown = Get(port, "/v1/nothing");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_TRUE(Has(unknown.j["error"]["message"], "no route GET /v1/nothing"));
  const Reply ok = Post(port, "/v1/completions", Completion("fine", 4, 0, 1, "", false).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  const Reply models = Get(port, "/v1/models");
  EXPECT_EQ(models.j["data"][0]["id"], "tiny");
  EXPECT_TRUE(WaitForMetric(port,
                            "strata_requests_total{endpoint=\"/v1/completions\",status="
                            "\"400\"} 7\n"));
  EXPECT_TRUE(WaitForMetric(port,
                            "strata_requests_total{endpoint=\"/v1/completions\",status="
                            "\"413\"} 1\n"));
  EXPECT_TRUE(WaitForMetric(port,
                            "strata_requests_total{endpoint=\"/v1/completions\",status="
                            "\"404\"} 1\n"));
}

TEST_F(ServeTest, ApiKey) {
  ServerOptions o = Options();
  o.api_key = "sekrit";
  int port = 0;
  auto server = Start(o, &port);
  const std::string body = Completion("x", 2, 0, 1, "", false).dump();
  const Reply none = Post(port, "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.j["error"]["code"], "invalid_api_key");
  EXPECT_EQ(Post(port, "/v1/completions", body, {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(Get(port, "/metrics").status, 401);
  EXPECT_EQ(Get(port, "/health").status, 200);  // probes need no key
  EXPECT_EQ(Post(port, "/v1/completions", body, {{"Authorization", "Bearer sekrit"}}).status, 200);
}

TEST_F(ServeTest, DisconnectFreesTheSlotAndAFullQueueIs429) {
  ServerOptions o = Options();
  o.parallel = 1;
  o.queue = 1;
  o.ctx = 1 << 20;  // the first stream runs until its client goes away
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  std::atomic<bool> got_token{false}, release{false};
  std::thread first([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    json body = Completion("long", 500000, 1.0, 3, "", true);
    body["ignore_eos"] = true;  // the synthetic model samples EOS now and then
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      got_token = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return false;  // hang up
    };
    c.send(req);
  });
  while (!got_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(WaitForMetric(port, "strata_active_sequences 1\n"));
  // The second waits in the queue; the third finds it full.
  Reply second;
  std::thread queued([&] {
    second = Post(port, "/v1/completions", Completion("next", 3, 0, 1, "", false).dump());
  });
  EXPECT_TRUE(WaitForMetric(port, "strata_queue_depth 1\n"));
  const Reply third = Post(port, "/v1/completions", Completion("x", 3, 0, 1, "", false).dump());
  EXPECT_EQ(third.status, 429);
  EXPECT_EQ(third.j["error"]["code"], "queue_full");
  auto retry = third.headers.find("Retry-After");
  ASSERT_NE(retry, third.headers.end());
  EXPECT_EQ(retry->second, "1");
  // The first client hangs up: its slot goes to the queued request.
  release = true;
  first.join();
  queued.join();
  EXPECT_EQ(second.status, 200) << second.body;
  EXPECT_TRUE(WaitForMetric(port, "strata_cancelled_total 1\n"));
  EXPECT_TRUE(WaitForMetric(port, "strata_active_sequences 0\n"));
  EXPECT_TRUE(WaitForMetric(port, "strata_queue_depth 0\n"));
}

TEST_F(ServeTest, ALongPrefillIsInterleavedWithTheRunningStreams) {
  ServerOptions o = Options();
  o.parallel = 2;
  o.ctx = 1 << 20;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  std::atomic<bool> got_token{false}, release{false};
  std::thread running([&] {
    httplib::Client c("127.0.0.1", port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    json body = Completion("running", 500000, 1.0, 3, "", true);
    body["ignore_eos"] = true;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      got_token = true;
      return !release.load();
    };
    c.send(req);
  });
  while (!got_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string p;
  for (int i = 0; i < 400; ++i) p += "a long prompt ";
  const Reply r = Post(port, "/v1/completions", Completion(p, 2, 0, 1, "", false).dump());
  release = true;
  running.join();
  ASSERT_EQ(r.status, 200) << r.body;
  // Chunks of --prefill-chunk tokens: the running stream took a step at every chunk boundary
  // (counted exactly in serve/scheduler_test.cc).
  const int64_t n_prompt = r.j["usage"]["prompt_tokens"];
  const int chunk = server->options().prefill_chunk;
  ASSERT_EQ(chunk, kDefaultPrefillChunk);
  ASSERT_GT(n_prompt, 3 * chunk);
  EXPECT_GE(server->metrics().interleaved_steps(), (n_prompt - 1) / chunk);
}

TEST_F(ServeTest, ASequenceOverTheKvBudgetStopsWithLength) {
  auto policy = MakePolicy(PolicySpec{"full", {}});
  ASSERT_OK(policy);
  auto probe = model_->NewCache(std::move(policy).value());
  ASSERT_OK(probe);
  const int64_t per_token = (*probe)->FullBytesPerToken();
  ServerOptions o = Options();
  // Three 64-row pages of the full cache for everything (the store allocates whole pages).
  o.kv_budget = per_token * 64 * 3;
  int port = 0;
  auto server = Start(o, &port);
  json req = Completion("budget", 400, 0.5, 2, "", false);
  req["ignore_eos"] = true;
  const Reply r = Post(port, "/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(Has(r.j["strata"]["message"], "--kv-budget")) << r.body;
  // Never past the budget: the cache holds every token but the last sampled one.
  EXPECT_LE(r.j["usage"]["total_tokens"].get<int>() - 1, 64 * 3);
  EXPECT_GT(r.j["usage"]["completion_tokens"].get<int>(), 64);
  // A prompt whose prefill alone is over the budget is refused up front.
  std::string p;
  for (int i = 0; i < 300; ++i) p += "many words ";
  const Reply big = Post(port, "/v1/completions", json{{"prompt", p}, {"max_tokens", 1}}.dump());
  EXPECT_EQ(big.status, 400);
  EXPECT_TRUE(Has(big.j["error"]["message"], "--kv-budget")) << big.body;
  EXPECT_TRUE(Has(Get(port, "/metrics").body, "strata_kv_budget_stops_total 1\n"));
}

int64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The sum of the strata_kv_bytes_resident gauges in a /metrics text.
int64_t ResidentGauge(const std::string& metrics) {
  int64_t total = 0;
  std::regex re("\nstrata_kv_bytes_resident\\{[^}]*\\} (\\d+)");
  for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), re);
       it != std::sregex_iterator(); ++it) {
    total += std::stoll((*it)[1]);
  }
  return total;
}

// A bounded soak: 2,000 mixed requests (streamed or not, four policies, stop strings, one in ten
// malformed) from 8 clients on 4 slots under a small budget. Every answer is the expected status,
// the KV bytes never pass the budget, and at the end nothing is held: no sequence, no cache, and
// no more process memory than a few MiB of allocator slack.
TEST_F(ServeTest, SoakOfTwoThousandMixedRequests) {
  ServerOptions o = Options();
  o.parallel = 4;
  o.queue = 16;
  auto policy = MakePolicy(PolicySpec{"full", {}});
  ASSERT_OK(policy);
  auto probe = model_->NewCache(std::move(policy).value());
  ASSERT_OK(probe);
  o.kv_budget = (*probe)->FullBytesPerToken() * 64 * 6;  // six pages of full cache
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  const std::vector<std::string> policies = {"full", "streaming:ratio=2", "kivi4",
                                             "geodesia:bits=2"};
  // Warm-up (allocator pools, httplib threads) before the memory baseline.
  for (int i = 0; i < 20; ++i) {
    Post(port, "/v1/completions", Completion("w", 4, 0, 1, "", i % 2).dump());
  }
  const int64_t rss0 = RssBytes();
  std::atomic<bool> done{false};
  std::atomic<int64_t> max_resident{0};
  std::thread watcher([&] {
    while (!done) {
      const int64_t r = ResidentGauge(Get(port, "/metrics").body);
      if (r > max_resident) max_resident = r;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::atomic<int> wrong{0}, ok{0}, bad{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 250; ++i) {
        const int k = c * 250 + i;
        if (k % 10 == 3) {
          const Reply r = Post(port, "/v1/completions", R"({"prompt": "x", "max_tokens": "many"})");
          (r.status == 400 ? bad : wrong)++;
          continue;
        }
        json req = Completion("soak " + std::to_string(k), 1 + k % 7, 0.8, k,
                              policies[k % policies.size()], k % 2 == 0);
        if (k % 5 == 0) req["stop"] = "e";
        const Reply r = Post(port, "/v1/completions", req.dump());
        if (r.status != 200) {
          ++wrong;
        } else if (k % 2 == 0 && !ParseSse(r.body).done) {
          ++wrong;
        } else {
          ++ok;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  watcher.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load(), 1800);
  EXPECT_EQ(bad.load(), 200);
  EXPECT_GT(max_resident.load(), 0);  // the watcher saw sequences running
  EXPECT_LE(max_resident.load(), o.kv_budget);
  EXPECT_TRUE(WaitForMetric(port, "strata_active_sequences 0\n"));
  EXPECT_EQ(ResidentGauge(Get(port, "/metrics").body), 0);
  const int64_t growth = RssBytes() - rss0;
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer freed memory sits in its quarantine (256 MiB by default) and the
  // shadow grows with it, so RSS says nothing about the server; LeakSanitizer checks at exit.
  std::printf("[soak] RSS grew by %lld bytes (ASan build: not checked)\n",
              static_cast<long long>(growth));
#else
  EXPECT_LT(growth, int64_t{32} << 20) << "RSS grew by " << growth << " bytes";
#endif
}

// Stop() in process: a non-streamed request that is still generating gets a 503 naming the
// shutdown, a queued one too, and the caches are gone.
TEST_F(ServeTest, StopAnswersWaitingRequestsAndReleasesTheCaches) {
  ServerOptions o = Options();
  o.parallel = 1;
  o.ctx = 1 << 20;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  json req = Completion("forever", 500000, 1.0, 9, "", false);
  req["ignore_eos"] = true;
  Reply running, queued;
  std::thread a([&] { running = Post(port, "/v1/completions", req.dump()); });
  ASSERT_TRUE(WaitForMetric(port, "strata_active_sequences 1\n"));
  std::thread b([&] { queued = Post(port, "/v1/completions", req.dump()); });
  ASSERT_TRUE(WaitForMetric(port, "strata_queue_depth 1\n"));
  server->Stop();
  a.join();
  b.join();
  for (const Reply* r : {&running, &queued}) {
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_TRUE(Has(r->body, "the server is shutting down")) << r->body;
  }
  const Metrics::Gauges g = server->metrics().gauges();
  EXPECT_EQ(g.active_sequences, 0);
  EXPECT_EQ(g.queue_depth, 0);
  EXPECT_TRUE(g.resident_by_policy.empty());
  server->Stop();  // idempotent
}

TEST_F(ServeTest, TheServeCommandRefusesBadFlagsByName) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--kv-budget", "8XB"}, "--kv-budget '8XB' has an unknown unit 'XB'"},
      {{"--kv-budget", "lots"}, "--kv-budget 'lots' is not a size"},
      {{"--parallel", "0"}, "--parallel must be >= 1, got 0"},
      {{"--queue", "-1"}, "--queue must be >= 0, got -1"},
      {{"--prefill-chunk", "0"}, "--prefill-chunk must be >= 1, got 0"},
      {{"--prefill-chunk", "2000000"}, "--prefill-chunk must be <= 1048576, got 2000000"},
      {{"--policy", "nosuch"}, "unknown policy 'nosuch'"},
      {{"--policy", "vestige"}, "none of the model's 2 attention layers is MLA"},
      {{"--chat-template", "jinja"}, "unknown chat template \"jinja\""},
      {{"--port", "70000"}, "--port must be <= 65535"},
      {{"--header-timeout", "0"}, "--header-timeout must be >= 1, got 0"},
      {{"--max-connections-per-peer", "-1"}, "--max-connections-per-peer must be >= 0, got -1"},
  };
  for (const auto& [flags, says] : cases) {
    std::string cmd = std::string(STRATA_BIN) + " serve -m " + Path("tiny.gguf");
    for (const auto& f : flags) cmd += " '" + f + "'";
    int code = -1;
    const std::string out = RunProgram({"sh", "-c", cmd + " 2>&1"}, &code);
    EXPECT_EQ(code, 2) << cmd << "\n" << out;
    EXPECT_TRUE(Has(out, "error: ")) << out;
    EXPECT_TRUE(Has(out, says)) << cmd << "\n" << out;
  }
}

TEST_F(ServeTest, SigtermEndsStreamsAndLeavesNoArchiveFiles) {
  const std::string mla = std::string(STRATA_SOURCE_DIR) + "/models/nope-mla.gguf";
  const std::string archive = Path("archive");
  fs::create_directories(archive);
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    close(out_pipe[0]);
    execl(STRATA_BIN, STRATA_BIN, "serve", "-m", mla.c_str(), "--port", "0", "--threads", "1", "-c",
          "100000", "--policy", ("vestige@256:block=256:kappa=4:archive=file:" + archive).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  std::string line;
  char ch;
  while (read(out_pipe[0], &ch, 1) == 1 && ch != '\n') line += ch;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, std::regex("listening on http://127.0.0.1:(\\d+)")))
      << line;
  const int port = std::stoi(m[1]);
  // A long prompt (archive pages are written once blocks close), then a stream that runs until
  // the server stops.
  std::string prompt;
  for (int i = 0; i < 60; ++i) prompt += "and the lord said ";
  std::atomic<bool> got{false};
  std::string body;
  std::thread stream([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", prompt}, {"max_tokens", 90000}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      body.append(d, n);
      got = true;
      return true;
    };
    c.send(req);
  });
  while (!got) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The prompt's closed blocks are archived in files by now: the check below is not vacuous.
  EXPECT_FALSE(fs::is_empty(archive));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  stream.join();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(out_pipe[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const Sse sse = ParseSse(body);
  EXPECT_TRUE(sse.done) << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_TRUE(Has(body, "the server is shutting down") || sse.finish_reason == "length") << body;
  EXPECT_TRUE(fs::is_empty(archive)) << "archive files left in " << archive;
}

// A real client: the official `openai` Python package (tools/ref/openai_client.py, in the virtual
// environment scripts/setup.sh makes) against a server on a free loopback port, with an API key.
TEST_F(ServeTest, TheOpenAiPythonClientGetsTheSameTextStreamedAndNot) {
  const std::string python = testing_refs::VenvPython("openai");
  STRATA_NEED_REF(python.empty(), "the openai Python client (.venv)");
  int code = -1;
  ServerOptions o = Options();
  o.chat_template = "chatml";
  o.api_key = "test-key";
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  const std::string prompt = "In the beginning";
  const std::string out =
      RunProgram({python, std::string(STRATA_SOURCE_DIR) + "/tools/ref/openai_client.py",
                  "http://127.0.0.1:" + std::to_string(port) + "/v1", "tiny", prompt},
                 &code);
  ASSERT_EQ(code, 0) << out;
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["completion_stream"], j["completion"]);
  EXPECT_EQ(j["completion_stream_finish"], j["completion_finish"]);
  EXPECT_EQ(j["chat_stream"], j["chat"]);
  EXPECT_EQ(j["chat_role"], "assistant");
  EXPECT_EQ(j["chat_stream_role"], "assistant");
  EXPECT_EQ(j["chat_stream_usage"], j["chat_usage"]);
  EXPECT_EQ(j["bad_status"], 400);
  EXPECT_TRUE(Has(j.value("bad_message", ""), "max_tokens")) << out;
  EXPECT_EQ(j["models"], json::array({"tiny"}));
  // The same text as `strata generate` for the prompt, seed and sampling settings.
  const std::string gen = RunProgram({STRATA_BIN, "generate", "-m", Path("tiny.gguf"), "-p", prompt,
                                      "-n", "12", "--temp", "0.8", "--seed", "5", "--threads", "1"},
                                     &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(AsJsonText(gen), prompt + j["completion"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace strata::serve
