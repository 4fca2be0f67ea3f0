// The load generator of `strata bench serve` against an in-process server on a tiny synthetic
// model: counts, token totals, percentiles, the decode window, and its refusals.
#include "serve/loadgen.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "core/status_testing.h"
#include "model/synth.h"
#include "serve/server.h"

namespace strata::serve {
namespace {

namespace fs = std::filesystem;

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(LoopbackUrl, AcceptsLoopbackOnly) {
  struct Ok {
    const char* url;
    const char* host;
    int port;
  };
  for (const Ok& c : {Ok{"http://127.0.0.1:8080", "127.0.0.1", 8080},
                      Ok{"http://localhost:9/", "127.0.0.1", 9},
                      Ok{"http://[::1]:80", "::1", 80}, Ok{"http://127.1.2.3:5", "127.1.2.3", 5}}) {
    auto u = ParseLoopbackUrl(c.url);
    ASSERT_OK(u);
    EXPECT_EQ(u->host, c.host) << c.url;
    EXPECT_EQ(u->port, c.port) << c.url;
  }
  const std::pair<const char*, const char*> bad[] = {
      {"http://10.0.0.1:80", "host '10.0.0.1' is not a loopback address"},
      {"http://example.com:80", "host 'example.com' is not a loopback address"},
      {"http://127.0.0.256:80", "not a loopback address"},
      {"http://127.0.0:80", "not a loopback address"},
      {"http://0.0.0.0:80", "not a loopback address"},
      {"https://127.0.0.1:443", "https is not supported"},
      {"127.0.0.1:8080", "not an http:// URL"},
      {"http://127.0.0.1", "no port"},
      {"http://127.0.0.1:8080/v1", "a path is not allowed"},
      {"http://127.0.0.1:99999", "the port must be in [1, 65535]"},
      {"http://127.0.0.1:80a", "is not a number"},
  };
  for (const auto& [url, says] : bad) {
    auto u = ParseLoopbackUrl(url);
    ASSERT_FALSE(u.ok()) << url;
    EXPECT_TRUE(Has(u.status().message(), says)) << url << " -> " << u.status().message();
    EXPECT_TRUE(Has(u.status().message(), url)) << u.status().message();
  }
}

TEST(Percentiles, NearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  const Percentiles p = Summarize(v);
  EXPECT_EQ(p.n, 100);
  EXPECT_DOUBLE_EQ(p.p50, 50);
  EXPECT_DOUBLE_EQ(p.p90, 90);
  EXPECT_DOUBLE_EQ(p.p99, 99);
  EXPECT_DOUBLE_EQ(p.max, 100);
  EXPECT_DOUBLE_EQ(p.mean, 50.5);
  const Percentiles one = Summarize({0.25});
  EXPECT_DOUBLE_EQ(one.p50, 0.25);
  EXPECT_DOUBLE_EQ(one.p99, 0.25);
  EXPECT_EQ(Summarize({}).n, 0);
}

class LoadgenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_loadgen_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    SynthOptions so;
    so.seed = 7;
    ASSERT_OK(SynthGguf(so, *dir_ + "/tiny.gguf"));
    auto m = Model::Load(*dir_ + "/tiny.gguf");
    ASSERT_OK(m);
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  std::unique_ptr<Server> Start(int parallel, int64_t ctx, int* port) {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.parallel = parallel;
    o.queue = 16;
    o.threads = 1;
    o.ctx = ctx;
    auto s = Server::Create(model_, o);
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

TEST_F(LoadgenTest, EveryRequestStreamsTheTokensItAskedFor) {
  int port = 0;
  auto server = Start(4, 256, &port);
  ASSERT_TRUE(server);
  LoadOptions o;
  o.port = port;
  o.streams = 4;
  o.requests_per_stream = 2;
  o.prompt_tokens = 9;
  o.max_tokens = 40;
  int progress_lines = 0;
  o.progress = [&](const std::string&) { ++progress_lines; };
  auto r = RunLoad(o);
  ASSERT_OK(r);
  EXPECT_EQ(r->model, "tiny");
  EXPECT_EQ(r->streams, 4);
  EXPECT_EQ(r->requests, 8);
  EXPECT_EQ(r->ok, 8) << (r->errors.empty() ? "" : r->errors[0]);
  EXPECT_EQ(r->failed, 0);
  EXPECT_EQ(r->cut, 0);
  // Tokens equal what was asked, by the usage and by the chunks' counts.
  EXPECT_EQ(r->completion_tokens, 8 * 40);
  EXPECT_EQ(r->streamed_tokens, 8 * 40);
  EXPECT_EQ(r->prompt_tokens, 8 * 9);
  // One TTFT per request; an ITL sample per token after the first (fewer when the first chunk
  // carries several tokens: their gaps are unknown).
  EXPECT_EQ(r->ttft_s.n, 8);
  EXPECT_LE(r->itl_s.n, 8 * 39);
  // No lower bound on the ITL samples: the tiny model outruns the handler, so chunks carry many
  // tokens, and on a busy host every request's 40 tokens once came in its first chunk (0 samples).
  for (const Percentiles& p : {r->ttft_s, r->itl_s}) {
    if (p.n == 0) continue;
    EXPECT_GE(p.p50, 0);
    EXPECT_LE(p.p50, p.p90);
    EXPECT_LE(p.p90, p.p99);
    EXPECT_LE(p.p99, p.max);
  }
  EXPECT_GT(r->wall_s, 0);
  EXPECT_NEAR(r->aggregate_tok_s, r->streamed_tokens / r->wall_s, 1e-6 * r->aggregate_tok_s);
  // The decode window lies inside the level and holds at most every token but the first ones.
  EXPECT_LE(r->decode_window_s, r->wall_s);
  EXPECT_LE(r->decode_window_tokens, r->streamed_tokens - 8);
  if (r->decode_window_s > 0) {
    EXPECT_NEAR(r->decode_tok_s, r->decode_window_tokens / r->decode_window_s, 1e-6 * r->decode_tok_s);
  }
  // The server's timings: every token after each request's first, in a positive time.
  EXPECT_EQ(r->server_decode_tokens, 8 * 39);
  EXPECT_GT(r->server_decode_s, 0);
  // The server counted the same tokens.
  EXPECT_TRUE(Has(server->metrics().Text(), "strata_completion_tokens_total 320\n"))
      << server->metrics().Text();
}

TEST(DecodeWindowTest, AllStreamsGenerating) {
  // Stream a: chunks at 1, 2, 3, 4 s (1 token each); b: first chunk at 2.5 s with 2 tokens, then
  // 3.5 and 5 s. Both generate from 2.5 s to 4 s; the chunks inside (2.5, 4] are a's at 3 and 4
  // and b's at 3.5 (b's first chunk opens the window and is not counted).
  const std::vector<std::vector<std::pair<double, int64_t>>> ev = {
      {{1.0, 1}, {2.0, 2}, {3.0, 3}, {4.0, 4}}, {{2.5, 2}, {3.5, 3}, {5.0, 6}}};
  const DecodeWindow w = ComputeDecodeWindow(ev, 2);
  EXPECT_DOUBLE_EQ(w.seconds, 1.5);
  EXPECT_EQ(w.tokens, 1 + 1 + 1);
  // One stream at a time: a's whole span, every token after its first chunk.
  const DecodeWindow one = ComputeDecodeWindow({ev[0]}, 1);
  EXPECT_DOUBLE_EQ(one.seconds, 3.0);
  EXPECT_EQ(one.tokens, 3);
  // Never three at once: no window.
  EXPECT_EQ(ComputeDecodeWindow(ev, 3).seconds, 0);
  EXPECT_EQ(ComputeDecodeWindow(ev, 3).tokens, 0);
  // Disjoint spans never make a window of two, and a request without tokens is ignored.
  const DecodeWindow apart = ComputeDecodeWindow({{{0.0, 1}, {1.0, 2}}, {{1.0, 1}, {2.0, 2}}, {}}, 2);
  EXPECT_EQ(apart.seconds, 0);
}

TEST_F(LoadgenTest, RefusalsAreCountedWithTheServersMessage) {
  int port = 0;
  auto server = Start(2, 128, &port);
  ASSERT_TRUE(server);
  LoadOptions o;
  o.port = port;
  o.streams = 2;
  o.prompt_tokens = 4;
  o.max_tokens = 4;
  o.policy = "nosuch";
  auto r = RunLoad(o);
  ASSERT_OK(r);
  EXPECT_EQ(r->ok, 0);
  EXPECT_EQ(r->failed, 2);
  ASSERT_FALSE(r->errors.empty());
  EXPECT_TRUE(Has(r->errors[0], "HTTP 400")) << r->errors[0];
  EXPECT_TRUE(Has(r->errors[0], "nosuch")) << r->errors[0];
  // The server keeps serving.
  o.policy = "kivi4";
  auto good = RunLoad(o);
  ASSERT_OK(good);
  EXPECT_EQ(good->ok, 2);
  EXPECT_EQ(good->completion_tokens, 8);
}

TEST_F(LoadgenTest, BadOptionsAndUnreachableServers) {
  int port = 0;
  auto server = Start(1, 64, &port);
  ASSERT_TRUE(server);
  LoadOptions o;
  o.port = port;
  o.prompt_tokens = 60;
  o.max_tokens = 10;
  auto r = RunLoad(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Has(r.status().message(), "more than the server's context 64")) << r.status().message();
  o.prompt_tokens = 4;
  o.streams = 0;
  EXPECT_TRUE(Has(RunLoad(o).status().message(), "--streams"));
  o.streams = 1;
  o.max_tokens = 0;
  EXPECT_TRUE(Has(RunLoad(o).status().message(), "--max-tokens"));
  o.max_tokens = 4;
  o.duration_s = 0;
  EXPECT_TRUE(Has(RunLoad(o).status().message(), "--duration"));
  o.duration_s = 10;
  server->Stop();
  server.reset();
  auto gone = RunLoad(o);
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(Has(gone.status().message(), "no server at http://127.0.0.1:")) << gone.status().message();
}

TEST_F(LoadgenTest, TheDurationBoundHangsUpRunningStreams) {
  int port = 0;
  auto server = Start(1, 1 << 20, &port);
  ASSERT_TRUE(server);
  LoadOptions o;
  o.port = port;
  o.prompt_tokens = 4;
  o.max_tokens = 500000;  // far more than 0.5 s generates
  o.duration_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunLoad(o);
  ASSERT_OK(r);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  EXPECT_EQ(r->cut, 1);
  EXPECT_EQ(r->ok, 0);
  EXPECT_EQ(r->failed, 0);
  EXPECT_GT(r->streamed_tokens, 0);
}

}  // namespace
}  // namespace strata::serve
