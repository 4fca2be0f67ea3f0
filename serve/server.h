// `strata serve`'s HTTP server: the OpenAI-compatible endpoints over the transport in http.h, one
// model, the scheduler behind them, and a graceful stop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/chat_template.h"
#include "model/model.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/scheduler.h"

namespace strata::serve::http {
class Server;
struct Response;
}

namespace strata::serve {

// llama-server's "timings" object of a finished sequence, measured by the scheduler: prompt_ms =
// admission to the first token (the prefill), predicted_ms = the first token to the last;
// predicted_per_second = (predicted_n - 1) / predicted_ms, the tokens made in that time.
nlohmann::json TimingsJson(const Sequence::Result& r);

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked
  int port = 8080;                 // 0: any free port (Start returns it)
  std::string model_name;          // the name /v1/models lists and requests must use
  int parallel = 4;
  int64_t kv_budget = int64_t{8} << 30;
  int queue = 64;
  int prefill_chunk = kDefaultPrefillChunk;  // SchedulerOptions::prefill_chunk (tokens per step)
  std::string policy = "full";  // the default cache policy (NAME[:key=value...])
  std::string chat_template;    // "" : detected from the model's tokenizer.chat_template
  std::string api_key;          // "" : no authentication
  int threads = 1;
  int64_t ctx = 0;  // context size (0: the model's trained length; none there: no limit)
  int64_t max_body_bytes = int64_t{4} << 20;
  int header_timeout_s = 10;  // a request's headers must arrive within this (else 408)
  int read_timeout_s = 30;    // and its body within this after the headers (else 408)
  int write_timeout_s = 30;   // a client that reads nothing for this long is dropped
  // Connections held at once, in all and from one client address (0: the defaults,
  // 2 x (parallel + queue) + 16 in all, parallel + queue + 8 per address); beyond them a new
  // connection is answered 503.
  int max_connections = 0;
  int max_connections_per_peer = 0;
};

class Server {
 public:
  // Checks the options (the default policy through the registry; --chat-template by name) and
  // builds the scheduler. `model` must outlive the server.
  static StatusOr<std::unique_ptr<Server>> Create(Model* model, ServerOptions o);
  ~Server();  // Stop()

  // Binds and starts serving on a background thread; returns the port (useful with port 0).
  StatusOr<int> Start();
  // Graceful stop: new requests are refused (503), queued and running sequences end (their
  // streams get a final chunk and [DONE]; their caches, and archive files, are released), then
  // the listener stops and its threads are joined. Idempotent.
  void Stop();

  Metrics& metrics() { return metrics_; }
  // Connections answered 503 at once because they were over the caps.
  int64_t refused_connections() const;
  const ServerOptions& options() const { return o_; }
  // The chat template in use; null when none (chat requests then get an error naming
  // --chat-template).
  const ChatTemplate* chat_template() const { return chat_ ? &*chat_ : nullptr; }

 private:
  Server(Model* model, ServerOptions o);
  void Routes();
  // Checks a parsed request against the model and the server (prompt length, context, policy,
  // budget) and queues its sequence; null with `res` holding the error otherwise. `native`:
  // llama-server's /completion (no max_tokens given: to the end of the context).
  std::shared_ptr<Sequence> Admit(const GenerationRequest& g, Endpoint ep, bool native,
                                  http::Response& res);
  // llama-server's own endpoints (llama_routes.cc): /completion, /tokenize, /detokenize,
  // /props, /slots.
  void LlamaRoutes();

  Model* model_;
  ServerOptions o_;
  Metrics metrics_;
  std::optional<ChatTemplate> chat_;
  std::string chat_error_;  // why there is no template
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<http::Server> http_;
  std::atomic<bool> stopping_{false};  // refuse new requests
  std::mutex stop_mu_;                 // Stop() runs once, to the end, whoever calls it
  bool stopped_ = false;
  std::atomic<int64_t> next_id_{1};
};

}  // namespace strata::serve
