// `strata serve` against hostile or careless clients, over loopback: one server per port, clients
// that hang up while a non-streamed request runs, slow clients and connection caps, impossible
// Content-Lengths, deeply nested bodies, wrong field types, bodies whatever their Content-Type,
// and the routes' 405s.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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
using Clock = std::chrono::steady_clock;

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// A raw TCP client (optionally from another loopback address), for what httplib's client
// will not send.
class Raw {
 public:
  explicit Raw(int port, const char* from = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from) {
      sockaddr_in src{};
      src.sin_family = AF_INET;
      inet_pton(AF_INET, from, &src.sin_addr);
      EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    timeval tv{60, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Raw() { ::close(fd_); }
  bool ok() const { return ok_; }
  bool Send(const std::string& s) { return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) > 0; }
  // Everything until the server closes (or 60 s pass).
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd_, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return 0;
  return std::stoi(response.substr(9, 3));
}

class ServeLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_serve_limits_" + std::to_string(getpid())));
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
  static ServerOptions Options() {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.parallel = 2;
    o.queue = 4;
    return o;
  }
  std::unique_ptr<Server> Start(ServerOptions o, int* port) {
    auto s = Server::Create(model_, std::move(o));
    EXPECT_OK(s);
    if (!s.ok()) return nullptr;
    auto p = (*s)->Start();
    EXPECT_OK(p);
    *port = p.ok() ? *p : 0;
    return std::move(s).value();
  }
  static json Health(int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10, 0);
    auto r = c.Get("/health");
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  static inline Model* model_ = nullptr;
  static inline std::string* dir_ = nullptr;
};

TEST_F(ServeLimitsTest, ASecondServerOnTheSamePortIsRefused) {
  ServerOptions o = Options();
  o.api_key = "k";
  int port = 0;
  auto first = Start(o, &port);
  ASSERT_TRUE(first);
  ServerOptions o2 = Options();
  o2.port = port;
  auto second = Server::Create(model_, o2);
  ASSERT_OK(second);
  StatusOr<int> p = (*second)->Start();
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status().message(), "port " + std::to_string(port))) << p.status().ToString();
  EXPECT_TRUE(Has(p.status().message(), "in use")) << p.status().ToString();
  // The command says so and exits 2.
  const std::string cmd = std::string(STRATA_BIN) + " serve -m " + *dir_ + "/tiny.gguf --port " +
                          std::to_string(port) + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int st = pclose(f);
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 2) << out;
  EXPECT_TRUE(Has(out, "error: port " + std::to_string(port) + " on 127.0.0.1 is in use")) << out;
  // Every request still meets the key.
  for (int i = 0; i < 4; ++i) {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
}

TEST_F(ServeLimitsTest, ANonStreamedRequestWhoseClientHungUpIsCancelled) {
  ServerOptions o = Options();
  o.ctx = 1 << 20;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  {
    Raw r(port);
    ASSERT_TRUE(r.ok());
    const std::string body =
        R"({"prompt": "long", "max_tokens": 500000, "ignore_eos": true, "temperature": 1})";
    ASSERT_TRUE(r.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body));
    // Wait until it runs, then hang up.
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (Health(port).value("active", 0) != 1 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(Health(port).value("active", 0), 1);
  }
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Health(port).value("active", 1) != 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Health(port).value("active", 1), 0);
  EXPECT_EQ(server->metrics().cancelled(), 1);
}

TEST_F(ServeLimitsTest, SlowClientsMeetADeadlineAndTheCapsAnswer503) {
  ServerOptions o = Options();
  o.header_timeout_s = 2;
  o.max_connections_per_peer = 3;
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  // Three slow clients from 127.0.0.2 take that address's share; a fourth is refused at once.
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(std::make_unique<Raw>(port, "127.0.0.2"));
    ASSERT_TRUE(slow.back()->ok());
    ASSERT_TRUE(slow.back()->Send("GET /health HTTP/1.1\r\n"));
  }
  const auto t0 = Clock::now();
  {
    const auto until = Clock::now() + std::chrono::seconds(10);
    // The three, and the probe's own connection.
    while (Health(port).value("connections", 0) < 4 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Raw extra(port, "127.0.0.2");
  ASSERT_TRUE(extra.ok());
  extra.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refused = extra.ReadAll();
  EXPECT_EQ(StatusOf(refused), 503) << refused;
  EXPECT_TRUE(Has(refused, "--max-connections-per-peer")) << refused;
  // Another address is served meanwhile.
  EXPECT_EQ(Health(port).value("status", ""), "ok");
  // The slow ones keep sending a header line each, but the deadline is absolute: a 408.
  for (int round = 0; round < 2; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    for (auto& s : slow) s->Send("X-Slow: 1\r\n");
  }
  for (auto& s : slow) {
    const std::string r = s->ReadAll();
    EXPECT_EQ(StatusOf(r), 408) << r;
    EXPECT_TRUE(Has(r, "did not arrive within 2 s")) << r;
  }
  // Bounded by the deadline, not by how long the clients keep trickling.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  EXPECT_GE(server->refused_connections(), 1);
}

TEST_F(ServeLimitsTest, AnImpossibleContentLengthIsRefusedAtOnce) {
  int port = 0;
  auto server = Start(Options(), &port);
  ASSERT_TRUE(server);
  struct Case {
    const char* length;
    int status;
  };
  for (const Case& c : {Case{"9223372036854775807", 413}, Case{"-1", 400},
                        Case{"18446744073709551617", 400}, Case{"12x", 400}}) {
    Raw r(port);
    ASSERT_TRUE(r.ok());
    const auto t0 = Clock::now();
    r.Send(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ") + c.length +
           "\r\n\r\n{");
    const std::string reply = r.ReadAll();
    EXPECT_EQ(StatusOf(reply), c.status) << c.length << ": " << reply;
    // At once: not after the 30 s body deadline.
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20)) << c.length;
  }
  EXPECT_EQ(Health(port).value("status", ""), "ok");
}

TEST_F(ServeLimitsTest, BodiesAreJsonWhateverTheirContentTypeAndNestingIsBounded) {
  int port = 0;
  auto server = Start(Options(), &port);
  ASSERT_TRUE(server);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  // A form-encoded Content-Type over 8 KiB (curl -d @file): read as JSON.
  json big = {{"prompt", "hello"}, {"max_tokens", 2}, {"user", std::string(20000, 'u')}};
  auto r = c.Post("/v1/completions", big.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // 4 MB less a little of nested brackets: refused by its depth before any node is built.
  auto deep = c.Post("/v1/completions", std::string((4 << 20) - 64, '['), "application/json");
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->status, 400);
  EXPECT_TRUE(Has(deep->body, "nests deeper than 64 levels")) << deep->body.substr(0, 200);
  // A wrong type anywhere is a 400 naming the field, never a 500.
  auto bad = c.Post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":[{"type":5}]}]})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_TRUE(Has(bad->body, "messages[0].content[0]")) << bad->body;
  // Valid as a double, 0 as the sampler's float.
  auto tiny = c.Post("/v1/completions", R"({"prompt":"x","top_p":1e-300})", "application/json");
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->status, 400) << tiny->body;
  EXPECT_EQ(json::parse(tiny->body)["error"]["param"], "top_p") << tiny->body;
}

TEST_F(ServeLimitsTest, AWrongMethodIsA405WithAllowAndModelsHaveTheirOwnRoute) {
  int port = 0;
  auto server = Start(Options(), &port);
  ASSERT_TRUE(server);
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_TRUE(Has(r->body, "GET is not allowed on /v1/completions")) << r->body;
  auto m = c.Get("/v1/models/tiny");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(json::parse(m->body)["id"], "tiny");
  auto other = c.Get("/v1/models/other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
}

TEST_F(ServeLimitsTest, LlamaServerTokenizeDetokenizeAndProps) {
  ServerOptions o = Options();
  o.api_key = "k";
  int port = 0;
  auto server = Start(o, &port);
  ASSERT_TRUE(server);
  httplib::Client c("127.0.0.1", port);
  const httplib::Headers key = {{"Authorization", "Bearer k"}};
  const std::string text = "hello world";
  auto t = c.Post("/tokenize", key, json{{"content", text}}.dump(), "application/json");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  const std::vector<int32_t> want = model_->tokenizer()->Encode(text, false, true);
  EXPECT_EQ(json::parse(t->body)["tokens"].get<std::vector<int32_t>>(), want);
  auto p = c.Post("/tokenize", key, json{{"content", text}, {"with_pieces", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(p);
  const json pieces = json::parse(p->body)["tokens"];
  ASSERT_EQ(pieces.size(), want.size());
  EXPECT_EQ(pieces[0]["id"], want[0]);
  EXPECT_TRUE(pieces[0]["piece"].is_string());
  auto d = c.Post("/detokenize", key, json{{"tokens", want}}.dump(), "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ(json::parse(d->body)["content"], model_->tokenizer()->Decode(want));
  // Never silent: a field the endpoint does not implement, an id out of range.
  auto u = c.Post("/tokenize", key, R"({"content":"x","special_sauce":1})", "application/json");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->status, 400);
  EXPECT_TRUE(Has(u->body, "'special_sauce' is not implemented by /tokenize")) << u->body;
  auto bad = c.Post("/detokenize", key, R"({"tokens":[1,-4]})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_TRUE(Has(bad->body, "tokens[1]")) << bad->body;
  auto props = c.Get("/props", key);
  ASSERT_TRUE(props);
  EXPECT_EQ(json::parse(props->body)["total_slots"], 2);
  EXPECT_EQ(c.Get("/props")->status, 401);  // the key covers them too
}

}  // namespace
}  // namespace strata::serve
