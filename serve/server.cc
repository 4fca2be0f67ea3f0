// The HTTP routes of `strata serve` (OpenAI's wire format: response objects, SSE chunks, errors).
#include "serve/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <random>

#include "kv/registry.h"

namespace strata::serve {

namespace {

using nlohmann::json;

// Generated text may hold invalid UTF-8 (a byte token cut by max_tokens): replaced, never thrown.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

ApiError Error(int status, const std::string& type, const std::string& code,
               const std::string& message) {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.code = code;
  e.message = message;
  return e;
}

// The metrics label of a path: the known endpoints, else "other" (a client probing random paths
// must not grow the label set without bound).
std::string EndpointLabel(const std::string& path) {
  for (const char* p :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
    if (path == p) return p;
  }
  return "other";
}

// Connections waiting to be accepted (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 1024;

std::string SseEvent(const json& j) { return "data: " + Dump(j) + "\n\n"; }

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

Server::Server(Model* model, ServerOptions o) : model_(model), o_(std::move(o)) {}

Server::~Server() { Stop(); }

StatusOr<std::unique_ptr<Server>> Server::Create(Model* model, ServerOptions o) {
  const Tokenizer* tok = model->tokenizer();
  if (!tok) return InvalidArgument("the model has no tokenizer (tokenizer.ggml.* metadata)");
  if (o.parallel < 1)
    return InvalidArgument("--parallel must be >= 1, got " + std::to_string(o.parallel));
  if (o.queue < 0) return InvalidArgument("--queue must be >= 0, got " + std::to_string(o.queue));
  if (o.prefill_chunk < 1) {
    return InvalidArgument("--prefill-chunk must be >= 1, got " + std::to_string(o.prefill_chunk));
  }
  if (o.threads < 1)
    return InvalidArgument("--threads must be >= 1, got " + std::to_string(o.threads));
  if (o.kv_budget < 1) return InvalidArgument("--kv-budget must be at least 1 byte");
  if (o.port < 0 || o.port > 65535) {
    return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(o.port));
  }
  if (o.ctx < 0) return InvalidArgument("--ctx-size must be >= 0, got " + std::to_string(o.ctx));
  if (o.ctx == 0) o.ctx = model->config().n_ctx_train;  // 0 there too: no limit
  // The default policy: the registry's checks, then a bind to this model's cache geometry (a
  // policy that cannot run here is a startup error, not every request's).
  {
    StatusOr<PolicySpec> spec = ParsePolicySpec(o.policy);
    if (!spec.ok()) return InvalidArgument("--policy " + o.policy + ": " + spec.status().message());
    StatusOr<std::unique_ptr<Policy>> p = MakePolicy(*spec);
    if (!p.ok()) return InvalidArgument("--policy " + o.policy + ": " + p.status().message());
    StatusOr<std::unique_ptr<KvCache>> c = model->NewCache(std::move(p).value());
    if (!c.ok()) return InvalidArgument("--policy " + o.policy + ": " + c.status().message());
  }
  std::unique_ptr<Server> s(new Server(model, o));
  if (!s->o_.chat_template.empty()) {
    StatusOr<ChatTemplate> t = ChatTemplate::ByName(s->o_.chat_template);
    if (!t.ok()) return InvalidArgument("--chat-template: " + t.status().message());
    s->chat_ = *t;
  } else if (tok->chat_template().empty() && !tok->HasGemmaTurns()) {
    std::string names;
    for (const auto& n : ChatTemplate::BuiltinNames()) names += (names.empty() ? "" : ", ") + n;
    s->chat_error_ =
        "the model has no chat template (tokenizer.chat_template): start the server "
        "with --chat-template NAME (one of " +
        names + ")";
  } else {
    StatusOr<ChatTemplate> t = ChatTemplate::ForModel(tok->chat_template(), tok->HasGemmaTurns());
    if (t.ok()) {
      s->chat_ = *t;
    } else {
      s->chat_error_ = t.status().message();
    }
  }
  s->pool_ = std::make_unique<ThreadPool>(o.threads);
  SchedulerOptions so;
  so.parallel = o.parallel;
  so.kv_budget = o.kv_budget;
  so.queue = o.queue;
  so.prefill_chunk = o.prefill_chunk;
  so.ctx = s->o_.ctx;
  s->scheduler_ = std::make_unique<Scheduler>(model, s->pool_.get(), so, &s->metrics_);
  s->http_ = std::make_unique<httplib::Server>();
  s->Routes();
  return s;
}

StatusOr<int> Server::Start() {
  // Debian's cpp-httplib 0.11 listens with a backlog of 5 (compiled into the library): a burst of
  // clients overflows it, and the kernel drops their SYNs (a 1 s retry) or, worse, the handshakes
  // it completed. The listening socket is remembered when httplib creates it and listen() is
  // called again after the bind, which on Linux raises the backlog of a listening socket.
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = static_cast<int>(sock);
  });
  int port = o_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(o_.host);
    if (port < 0) return IoError("cannot bind to " + o_.host + " (any port)");
  } else if (!http_->bind_to_port(o_.host, port)) {
    return IoError("cannot bind to " + o_.host + ":" + std::to_string(port) +
                   " (in use, or not an address of this machine)");
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, kListenBacklog);
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return port;
}

void Server::Stop() {
  std::lock_guard<std::mutex> l(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  // Sequences first (their streams end with a final chunk and [DONE], their caches go), then
  // the listener, whose worker threads are joined when listen_after_bind returns.
  if (scheduler_) scheduler_->Stop();
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

void Server::Routes() {
  httplib::Server& h = *http_;
  h.set_payload_max_length(static_cast<size_t>(o_.max_body_bytes));
  h.set_read_timeout(o_.read_timeout_s, 0);
  h.set_write_timeout(o_.write_timeout_s, 0);
  h.set_keep_alive_timeout(5);
  // A handler thread per connection that waits (queued or streaming), plus a few for quick
  // requests (health, metrics, refusals), so a full queue is answered 429 and not left waiting.
  const size_t threads = static_cast<size_t>(o_.parallel + o_.queue + 8);
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(EndpointLabel(req.path), res.status);
  });
  h.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      SendError(res, Error(413, "invalid_request_error", "request_too_large",
                           "the request body is larger than the server's limit of " +
                               std::to_string(o_.max_body_bytes) + " bytes"));
    } else if (res.status == 404) {
      SendError(res, Error(404, "invalid_request_error", "not_found",
                           "no route " + req.method + " " + req.path +
                               " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                               "GET /health, GET /metrics)"));
    } else {
      SendError(
          res, Error(res.status, "invalid_request_error", "",
                     "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path));
    }
  });
  h.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        SendError(res, Error(500, "server_error", "", "internal error: " + what));
      });
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (o_.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + o_.api_key) {
      SendError(res, Error(401, "invalid_request_error", "invalid_api_key",
                           auth.empty() ? "no API key: send the header Authorization: Bearer KEY"
                                        : "the API key is not valid"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_) {
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
      return;
    }
    res.set_content(Dump({{"status", "ok"},
                          {"slots", o_.parallel},
                          {"active", scheduler_->active()},
                          {"queue", scheduler_->queue_depth()}}),
                    "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Text(), "text/plain; version=0.0.4");
  });
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", o_.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "strata"},
                  {"meta", {{"n_ctx", o_.ctx}, {"n_vocab", model_->config().n_vocab}}}};
    res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });

  auto generate = [this](Endpoint ep) {
    return [this, ep](const httplib::Request& req, httplib::Response& res) {
      if (stopping_) {
        SendError(res, Error(503, "server_error", "shutting_down", "the server is shutting down"));
        return;
      }
      GenerationRequest g;
      RequestContext rc{o_.model_name, model_->config().n_vocab};
      if (auto e = ParseGenerationRequest(req.body, ep, rc, &g)) return SendError(res, *e);
      const Tokenizer& tok = *model_->tokenizer();

      std::vector<int32_t> prompt;
      if (ep == Endpoint::kCompletions && g.prompt_ids_given) {
        prompt = g.prompt_ids;  // token ids are the prompt as given (no BOS added)
      } else if (ep == Endpoint::kCompletions) {
        prompt = tok.Encode(g.prompt, /*with_bos=*/true);
      } else {
        if (!chat_) return SendError(res, BadRequest("messages", chat_error_));
        if (Status st = chat_->Validate(g.messages); !st.ok()) {
          return SendError(res, BadRequest("messages", st.message()));
        }
        const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
        const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
        // The rendering carries BOS where the family wants it: no second one.
        prompt = tok.Encode(chat_->Render(g.messages, /*add_generation_prompt=*/true, bos, eos),
                            /*with_bos=*/false, /*parse_special=*/true);
      }
      const char* prompt_param = ep == Endpoint::kCompletions ? "prompt" : "messages";
      if (prompt.empty()) {
        return SendError(res, BadRequest(prompt_param, "the prompt is empty (0 tokens)"));
      }
      const int64_t n_prompt = static_cast<int64_t>(prompt.size());
      const int64_t ctx = o_.ctx;
      if (ctx > 0 && n_prompt >= ctx) {
        ApiError e =
            BadRequest(prompt_param, "the prompt is " + std::to_string(n_prompt) +
                                         " tokens; this model's context is " + std::to_string(ctx) +
                                         " tokens, which leaves no room to generate");
        e.code = "context_length_exceeded";
        return SendError(res, e);
      }
      int64_t max_tokens = 0;
      if (g.max_tokens) {
        max_tokens = *g.max_tokens;
        if (ctx > 0 && n_prompt + max_tokens > ctx) {
          ApiError e = BadRequest(
              "max_tokens", "this model's maximum context length is " + std::to_string(ctx) +
                                " tokens; you requested " + std::to_string(n_prompt + max_tokens) +
                                " tokens (" + std::to_string(n_prompt) + " in the prompt, " +
                                std::to_string(max_tokens) + " in the completion)");
          e.code = "context_length_exceeded";
          return SendError(res, e);
        }
      } else {
        // OpenAI's defaults: 16 for completions; chat runs to the end of the context (4096
        // tokens when the model states none).
        max_tokens = ep == Endpoint::kCompletions ? 16 : 4096;
        if (ctx > 0) max_tokens = std::min(max_tokens, ctx - n_prompt);
      }

      const std::string policy_text = g.policy.empty() ? o_.policy : g.policy;
      StatusOr<PolicySpec> spec = ParsePolicySpec(policy_text);
      StatusOr<std::unique_ptr<Policy>> policy =
          spec.ok() ? MakePolicy(*spec) : StatusOr<std::unique_ptr<Policy>>(spec.status());
      StatusOr<std::unique_ptr<KvCache>> cache =
          policy.ok() ? model_->NewCache(std::move(policy).value())
                      : StatusOr<std::unique_ptr<KvCache>>(policy.status());
      if (!cache.ok()) {
        return SendError(res, BadRequest("strata.policy", "policy '" + policy_text +
                                                              "' cannot run on this model: " +
                                                              cache.status().message()));
      }
      const int64_t reserve = Scheduler::PromptReserve(**cache, n_prompt);
      if (reserve > o_.kv_budget) {
        return SendError(
            res, BadRequest(prompt_param, "the prompt's " + std::to_string(n_prompt) +
                                              " tokens need " + std::to_string(reserve) +
                                              " bytes of KV cache while prefilled, more than the "
                                              "server's whole --kv-budget (" +
                                              std::to_string(o_.kv_budget) + " bytes)"));
      }

      auto seq = std::make_shared<Sequence>();
      seq->prompt = std::move(prompt);
      seq->max_tokens = max_tokens;
      seq->sampler = g.sampler;
      if (!g.seed_given)
        seq->sampler.seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
      seq->stop = g.stop;
      seq->ignore_eos = g.ignore_eos;
      seq->policy_name = (*cache)->policy().name();
      seq->cache = std::move(cache).value();
      seq->arrival = Clock::now();

      switch (scheduler_->Submit(seq)) {
        case Scheduler::Admission::kQueued:
          break;
        case Scheduler::Admission::kQueueFull:
          res.set_header("Retry-After", "1");
          return SendError(res, Error(429, "rate_limit_exceeded", "queue_full",
                                      "the server is busy: " + std::to_string(o_.parallel) +
                                          " sequences are running and " + std::to_string(o_.queue) +
                                          " requests are waiting (--queue); retry later"));
        case Scheduler::Admission::kStopping:
          return SendError(
              res, Error(503, "server_error", "shutting_down", "the server is shutting down"));
      }

      const bool chat = ep == Endpoint::kChat;
      const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
      const int64_t created = Now();
      const std::string model_name = o_.model_name;
      auto usage = [](const Sequence::Result& r) {
        return json{{"prompt_tokens", r.prompt_tokens},
                    {"completion_tokens", r.completion_tokens},
                    {"total_tokens", r.prompt_tokens + r.completion_tokens}};
      };
      auto extension = [](const Sequence::Result& r, json* j) {
        if (!r.message.empty()) (*j)["strata"] = {{"message", r.message}};
      };

      if (!g.stream) {
        const Sequence::Result r = seq->Wait();
        if (!r.error.ok()) {
          return SendError(
              res, Error(500, "server_error", "", "generation failed: " + r.error.ToString()));
        }
        if (r.shutdown) {
          return SendError(res, Error(503, "server_error", "shutting_down", r.message));
        }
        json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", r.text}};
        } else {
          choice["text"] = r.text;
        }
        json out = {{"id", id},
                    {"object", chat ? "chat.completion" : "text_completion"},
                    {"created", created},
                    {"model", model_name},
                    {"choices", json::array({choice})},
                    {"usage", usage(r)}};
        extension(r, &out);
        res.set_content(Dump(out), "application/json");
        return;
      }

      // Streaming: one SSE event per delta, then the finishing chunk, usage if asked, [DONE].
      const bool include_usage = g.include_usage;
      auto chunk = [=](const json& choice) {
        return json{{"id", id},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", model_name},
                    {"choices", json::array({choice})}};
      };
      auto sent_role = std::make_shared<bool>(false);
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [=](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& s) {
              if (sink.write(s.data(), s.size())) return true;
              seq->Cancel();  // the client went away: its slot is freed at the next step
              return false;
            };
            if (chat && !*sent_role) {
              *sent_role = true;
              if (!write(SseEvent(chunk({{"index", 0},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}})))) {
                return false;
              }
            }
            std::string delta;
            std::optional<Sequence::Result> r;
            int64_t tokens = 0;
            while (!seq->Next(std::chrono::milliseconds(100), &delta, &r, &tokens)) {
              if (!sink.is_writable()) {
                seq->Cancel();
                return false;
              }
            }
            if (!delta.empty()) {
              json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
              if (chat) {
                c["delta"] = {{"content", delta}};
              } else {
                c["text"] = delta;
              }
              // The extension: tokens generated so far (a chunk may carry several), so a client
              // can time tokens, not chunks (`strata bench serve`).
              json ev = chunk(c);
              ev["strata"] = {{"completion_tokens", tokens}};
              if (!write(SseEvent(ev))) return false;
            }
            if (!r) return true;  // more to come
            if (!r->error.ok()) {
              ApiError e =
                  Error(500, "server_error", "", "generation failed: " + r->error.ToString());
              write(SseEvent(ErrorJson(e)));
            } else {
              json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", r->finish_reason}};
              if (chat) {
                c["delta"] = json::object();
              } else {
                c["text"] = "";
              }
              json last = chunk(c);
              extension(*r, &last);
              // All the tokens, also those whose text was empty (no chunk carried their count).
              last["strata"]["completion_tokens"] = r->completion_tokens;
              if (!write(SseEvent(last))) return false;
              if (include_usage) {
                json u = chunk(c);
                u["choices"] = json::array();
                u["usage"] = usage(*r);
                if (!write(SseEvent(u))) return false;
              }
            }
            if (!write("data: [DONE]\n\n")) return false;
            sink.done();
            return true;
          },
          [seq](bool success) {
            if (!success) seq->Cancel();
          });
    };
  };
  h.Post("/v1/completions", generate(Endpoint::kCompletions));
  h.Post("/v1/chat/completions", generate(Endpoint::kChat));
}

}  // namespace strata::serve
