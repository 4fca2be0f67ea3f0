// The HTTP routes of `strata serve` (OpenAI's wire format: response objects, SSE chunks, errors).
#include "serve/server.h"

#include <chrono>
#include <ctime>
#include <random>

#include "kv/registry.h"
#include "serve/http.h"

namespace strata::serve {

namespace {

using nlohmann::json;

// Generated text may hold invalid UTF-8 (a byte token cut by max_tokens): replaced, never thrown.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendError(http::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.stream = nullptr;
  res.content_type = "application/json";
  res.body = Dump(ErrorJson(e));
}

void SendJson(http::Response& res, const json& j) {
  res.content_type = "application/json";
  res.body = Dump(j);
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
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                        "/metrics", "/tokenize", "/detokenize", "/props", "/completion",
                        "/slots"}) {
    if (path == p) return p;
  }
  return "other";
}

std::string SseEvent(const json& j) { return "data: " + Dump(j) + "\n\n"; }

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

}  // namespace

nlohmann::json TimingsJson(const Sequence::Result& r) {
  const double prompt_ms = r.prompt_s * 1e3, predicted_ms = r.predicted_s * 1e3;
  const int64_t after_first = std::max<int64_t>(r.completion_tokens - 1, 0);
  auto per = [](double n, double ms) { return ms > 0 ? n / ms * 1e3 : 0.0; };
  return json{{"prompt_n", r.prompt_tokens},
              {"prompt_ms", prompt_ms},
              {"prompt_per_second", per(static_cast<double>(r.prompt_tokens), prompt_ms)},
              {"predicted_n", r.completion_tokens},
              {"predicted_ms", predicted_ms},
              {"predicted_per_token_ms",
               after_first > 0 ? predicted_ms / static_cast<double>(after_first) : 0.0},
              {"predicted_per_second", per(static_cast<double>(after_first), predicted_ms)}};
}

namespace {

// Log-probabilities in OpenAI's shapes: chat's {"content": [{token, logprob, bytes,
// top_logprobs}]}, completions' {tokens, token_logprobs, top_logprobs, text_offset}.
// `offset` is the text offset of the first token (completions), advanced past the last.
json LogprobsJson(const std::vector<Sequence::TokenLogprob>& lps, const Tokenizer& tok, bool chat,
                  size_t* offset) {
  if (chat) {
    json content = json::array();
    for (const auto& lp : lps) {
      json top = json::array();
      for (const auto& [id, l] : lp.top) {
        const std::string t = tok.DecodeToken(id);
        top.push_back({{"token", t}, {"logprob", l}, {"bytes", Bytes(t)}});
      }
      const std::string t = tok.DecodeToken(lp.id);
      content.push_back(
          {{"token", t}, {"logprob", lp.logprob}, {"bytes", Bytes(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       text_offset = json::array();
  for (const auto& lp : lps) {
    const std::string t = tok.DecodeToken(lp.id);
    tokens.push_back(t);
    token_logprobs.push_back(lp.logprob);
    json alt = json::object();
    for (const auto& [id, l] : lp.top) alt[tok.DecodeToken(id)] = l;
    top.push_back(alt);
    text_offset.push_back(*offset);
    *offset += t.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", text_offset}};
}

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
  for (const auto& [flag, v] : {std::pair<const char*, int>{"--header-timeout", o.header_timeout_s},
                                {"--read-timeout", o.read_timeout_s},
                                {"--write-timeout", o.write_timeout_s}}) {
    if (v < 1) return InvalidArgument(std::string(flag) + " must be >= 1 s, got " + std::to_string(v));
  }
  if (o.max_connections < 0 || o.max_connections_per_peer < 0) {
    return InvalidArgument("--max-connections and --max-connections-per-peer must be >= 0 (0: "
                           "the default), got " +
                           std::to_string(o.max_connections) + " and " +
                           std::to_string(o.max_connections_per_peer));
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
  http::Options ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.max_body_bytes = o.max_body_bytes;
  ho.header_timeout_s = o.header_timeout_s;
  ho.body_timeout_s = o.read_timeout_s;
  ho.write_timeout_s = o.write_timeout_s;
  ho.max_connections =
      o.max_connections > 0 ? o.max_connections : 2 * (o.parallel + o.queue) + 16;
  ho.max_connections_per_peer =
      o.max_connections_per_peer > 0 ? o.max_connections_per_peer : o.parallel + o.queue + 8;
  s->http_ = std::make_unique<http::Server>(ho);
  s->Routes();
  return s;
}

StatusOr<int> Server::Start() {
  StatusOr<int> port = http_->Bind();
  if (!port.ok()) return port.status();
  http_->Start();
  return *port;
}

int64_t Server::refused_connections() const { return http_ ? http_->refused_connections() : 0; }

void Server::Stop() {
  std::lock_guard<std::mutex> l(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  // Sequences first (their streams end with a final chunk and [DONE], their caches go), then
  // the listener, whose worker threads are joined when listen_after_bind returns.
  if (scheduler_) scheduler_->Stop();
  if (http_) http_->Stop();
}

std::shared_ptr<Sequence> Server::Admit(const GenerationRequest& g, Endpoint ep, bool native,
                                        http::Response& res) {
  auto Refuse = [](http::Response& r, const ApiError& e) -> std::shared_ptr<Sequence> {
    SendError(r, e);
    return nullptr;
  };
  const Tokenizer& tok = *model_->tokenizer();

  std::vector<int32_t> prompt;
  if (ep == Endpoint::kCompletions && g.prompt_ids_given) {
    prompt = g.prompt_ids;  // token ids are the prompt as given (no BOS added)
  } else if (ep == Endpoint::kCompletions) {
    prompt = tok.Encode(g.prompt, /*with_bos=*/true);
  } else {
    if (!chat_) return Refuse(res, BadRequest("messages", chat_error_));
    if (Status st = chat_->Validate(g.messages); !st.ok()) {
      return Refuse(res, BadRequest("messages", st.message()));
    }
    const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
    const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
    // The rendering carries BOS where the family wants it: no second one.
    prompt = tok.Encode(chat_->Render(g.messages, /*add_generation_prompt=*/true, bos, eos),
                        /*with_bos=*/false, /*parse_special=*/true);
  }
  const char* prompt_param = ep == Endpoint::kCompletions ? "prompt" : "messages";
  if (prompt.empty()) {
    return Refuse(res, BadRequest(prompt_param, "the prompt is empty (0 tokens)"));
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t ctx = o_.ctx;
  if (ctx > 0 && n_prompt >= ctx) {
    ApiError e =
        BadRequest(prompt_param, "the prompt is " + std::to_string(n_prompt) +
                                     " tokens; this model's context is " + std::to_string(ctx) +
                                     " tokens, which leaves no room to generate");
    e.code = "context_length_exceeded";
    return Refuse(res, e);
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
      return Refuse(res, e);
    }
  } else {
    // OpenAI's defaults: 16 for completions; chat runs to the end of the context (4096
    // tokens when the model states none).
    // (llama-server's /completion: n_predict -1, to the end of the context.)
    max_tokens = native ? kMaxTokensCap : ep == Endpoint::kCompletions ? 16 : 4096;
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
    return Refuse(res, BadRequest("strata.policy", "policy '" + policy_text +
                                                          "' cannot run on this model: " +
                                                          cache.status().message()));
  }
  const int64_t reserve = Scheduler::PromptReserve(**cache, n_prompt);
  if (reserve > o_.kv_budget) {
    return Refuse(
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
  seq->top_logprobs = g.top_logprobs;
  seq->policy_name = (*cache)->policy().name();
  seq->cache = std::move(cache).value();
  seq->arrival = Clock::now();

  switch (scheduler_->Submit(seq)) {
    case Scheduler::Admission::kQueued:
      break;
    case Scheduler::Admission::kQueueFull:
      res.SetHeader("Retry-After", "1");
      return Refuse(res, Error(429, "rate_limit_exceeded", "queue_full",
                                  "the server is busy: " + std::to_string(o_.parallel) +
                                      " sequences are running and " + std::to_string(o_.queue) +
                                      " requests are waiting (--queue); retry later"));
    case Scheduler::Admission::kStopping:
      return Refuse(
          res, Error(503, "server_error", "shutting_down", "the server is shutting down"));
  }

  return seq;
}

void Server::Routes() {
  http::Server& h = *http_;
  h.SetLogger([this](const http::Request& req, const http::Response& res) {
    metrics_.CountRequest(EndpointLabel(req.path), res.status);
  });
  h.SetErrorFormatter([](http::Response& res, int status, const std::string& code,
                         const std::string& message) {
    SendError(res, Error(status, status >= 500 ? "server_error" : "invalid_request_error", code,
                         message));
  });
  h.SetPreRouting([this](const http::Request& req, http::Response& res) {
    if (o_.api_key.empty() || req.path == "/health") return false;
    const std::string auth = req.Header("authorization");
    if (auth != "Bearer " + o_.api_key) {
      SendError(res, Error(401, "invalid_request_error", "invalid_api_key",
                           auth.empty() ? "no API key: send the header Authorization: Bearer KEY"
                                        : "the API key is not valid"));
      return true;
    }
    return false;
  });

  h.Route("GET", "/health", [this](const http::Request&, http::Response& res, http::Connection&) {
    if (stopping_) {
      res.status = 503;
      res.body = R"({"status":"shutting down"})";
      return;
    }
    SendJson(res, {{"status", "ok"},
                   {"slots", o_.parallel},
                   {"active", scheduler_->active()},
                   {"queue", scheduler_->queue_depth()},
                   {"connections", http_->active_connections()}});
  });
  h.Route("GET", "/metrics", [this](const http::Request&, http::Response& res, http::Connection&) {
    res.content_type = "text/plain; version=0.0.4";
    res.body = metrics_.Text();
  });
  auto model_json = [this] {
    return json{{"id", o_.model_name},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "strata"},
                {"meta", {{"n_ctx", o_.ctx}, {"n_vocab", model_->config().n_vocab}}}};
  };
  h.Route("GET", "/v1/models",
          [model_json](const http::Request&, http::Response& res, http::Connection&) {
            SendJson(res, {{"object", "list"}, {"data", json::array({model_json()})}});
          });
  h.RoutePrefix("GET", "/v1/models/",
                [this, model_json](const http::Request& req, http::Response& res,
                                   http::Connection&) {
                  const std::string id = req.path.substr(std::string("/v1/models/").size());
                  if (id != o_.model_name) {
                    return SendError(res, Error(404, "invalid_request_error", "model_not_found",
                                                "The model '" + id +
                                                    "' does not exist; this server serves '" +
                                                    o_.model_name + "'"));
                  }
                  SendJson(res, model_json());
                });

  auto generate = [this](Endpoint ep) {
    return [this, ep](const http::Request& req, http::Response& res, http::Connection& conn) {
      if (stopping_) {
        SendError(res, Error(503, "server_error", "shutting_down", "the server is shutting down"));
        return;
      }
      GenerationRequest g;
      RequestContext rc{o_.model_name, model_->config().n_vocab};
      if (auto e = ParseGenerationRequest(req.body, ep, rc, &g)) return SendError(res, *e);
      std::shared_ptr<Sequence> seq = Admit(g, ep, /*native=*/false, res);
      if (!seq) return;
      const Tokenizer& tok = *model_->tokenizer();
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
        // The client may hang up while it waits: checked every 100 ms, and its sequence is
        // cancelled (its slot and cache freed at the next step), as a stream's is.
        Sequence::Result r;
        while (!seq->WaitFor(std::chrono::milliseconds(100), &r)) {
          if (conn.ClientGone()) {
            seq->Cancel();
            r = seq->Wait();
            res.status = 499;  // nobody reads it; the metrics count a client that left
            return;
          }
        }
        if (!r.error.ok()) {
          return SendError(
              res, Error(500, "server_error", "", "generation failed: " + r.error.ToString()));
        }
        if (r.shutdown) {
          return SendError(res, Error(503, "server_error", "shutting_down", r.message));
        }
        size_t offset = 0;
        json choice = {{"index", 0},
                       {"logprobs", g.top_logprobs >= 0 ? LogprobsJson(r.logprobs, tok, chat, &offset)
                                                        : json()},
                       {"finish_reason", r.finish_reason}};
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
                    {"usage", usage(r)},
                    {"timings", TimingsJson(r)}};
        extension(r, &out);
        SendJson(res, out);
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
      res.SetHeader("Cache-Control", "no-cache");
      res.content_type = "text/event-stream";
      const bool want_logprobs = g.top_logprobs >= 0;
      const Tokenizer* tokp = &tok;
      res.stream = [=](http::StreamSink& sink) {
        const Tokenizer& tok = *tokp;
        size_t offset = 0;
        std::vector<Sequence::TokenLogprob> lps;
        auto write = [&](const std::string& s) {
          if (sink.Write(s)) return true;
          seq->Cancel();  // the client went away: its slot is freed at the next step
          return false;
        };
        if (chat && !write(SseEvent(chunk({{"index", 0},
                                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}})))) {
          return;
        }
        for (;;) {
          std::string delta;
          std::optional<Sequence::Result> r;
          int64_t tokens = 0;
          while (!seq->Next(std::chrono::milliseconds(100), &delta, &r, &tokens,
                            want_logprobs ? &lps : nullptr)) {
            if (sink.ClientGone()) {
              seq->Cancel();
              return;
            }
          }
          if (!delta.empty() || !lps.empty()) {
            json c = {{"index", 0},
                      {"logprobs", want_logprobs ? LogprobsJson(lps, tok, chat, &offset) : json()},
                      {"finish_reason", nullptr}};
            lps.clear();
            if (chat) {
              c["delta"] = {{"content", delta}};
            } else {
              c["text"] = delta;
            }
            // The extension: tokens generated so far (a chunk may carry several), so a client
            // can time tokens, not chunks (`strata bench serve`).
            json ev = chunk(c);
            ev["strata"] = {{"completion_tokens", tokens}};
            if (!write(SseEvent(ev))) return;
          }
          if (!r) continue;  // more to come
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
            last["timings"] = TimingsJson(*r);
            extension(*r, &last);
            // All the tokens, also those whose text was empty (no chunk carried their count).
            last["strata"]["completion_tokens"] = r->completion_tokens;
            if (!write(SseEvent(last))) return;
            if (include_usage) {
              json u = chunk(c);
              u["choices"] = json::array();
              u["usage"] = usage(*r);
              if (!write(SseEvent(u))) return;
            }
          }
          write("data: [DONE]\n\n");
          return;
        }
      };
    };
  };
  LlamaRoutes();
  h.Route("POST", "/v1/completions", generate(Endpoint::kCompletions));
  h.Route("POST", "/v1/chat/completions", generate(Endpoint::kChat));
}

}  // namespace strata::serve
