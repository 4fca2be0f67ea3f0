// llama-server's native endpoints beside the OpenAI ones, in llama-server's JSON shapes:
// POST /completion, POST /tokenize, POST /detokenize, GET /props, GET /slots. A field these do
// not implement is a 400 naming it.
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "io/json_input.h"
#include "serve/http.h"
#include "serve/server.h"

namespace strata::serve {

namespace {

using nlohmann::json;

void Send(http::Response& res, int status, const json& j) {
  res.status = status;
  res.content_type = "application/json";
  res.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void Fail(http::Response& res, const std::string& param, const std::string& message) {
  Send(res, 400, ErrorJson(BadRequest(param, message)));
}

// The body as a JSON object whose keys are all in `known`; else an error is sent and false.
bool ParseBody(const http::Request& req, http::Response& res,
               std::initializer_list<const char*> known, json* out) {
  StatusOr<json> j = ParseUntrustedJson(req.body, "the request body");
  if (!j.ok()) {
    Fail(res, "", j.status().message());
    return false;
  }
  if (!j->is_object()) {
    Fail(res, "", "the request body must be a JSON object, got " + JsonTypeName(*j));
    return false;
  }
  for (auto it = j->begin(); it != j->end(); ++it) {
    bool ok = false;
    std::string list;
    for (const char* k : known) {
      ok = ok || it.key() == k;
      list += (list.empty() ? "" : ", ") + std::string(k);
    }
    if (!ok) {
      Fail(res, it.key(),
           "'" + it.key() + "' is not implemented by " + req.path + " (it takes: " + list + ")");
      return false;
    }
  }
  *out = std::move(j).value();
  return true;
}

// An optional boolean field; false with an error sent when it is not one.
bool GetBool(const json& j, const char* name, bool* v, http::Response& res) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    Fail(res, name, std::string("'") + name + "' must be a boolean, got " + JsonTypeName(*it));
    return false;
  }
  *v = it->get<bool>();
  return true;
}

// llama-server's completion_probabilities entry of one token.
json NativeProbs(const std::vector<Sequence::TokenLogprob>& lps, const Tokenizer& tok) {
  auto bytes = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(c);
    return b;
  };
  json out = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& [id, l] : lp.top) {
      const std::string t = tok.DecodeToken(id);
      top.push_back({{"id", id}, {"token", t}, {"logprob", l}, {"bytes", bytes(t)}});
    }
    const std::string t = tok.DecodeToken(lp.id);
    out.push_back({{"id", lp.id},
                   {"token", t},
                   {"logprob", lp.logprob},
                   {"bytes", bytes(t)},
                   {"top_logprobs", top}});
  }
  return out;
}

// llama-server's /completion body as the OpenAI completions body the common parser checks, with
// llama-server's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05; n_predict -1: to
// the end of the context; seed -1: random). Returns false with the error sent.
bool TranslateNative(const json& in, http::Response& res, json* out, bool* cache_prompt) {
  *out = json{{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}};
  for (auto it = in.begin(); it != in.end(); ++it) {
    const std::string& k = it.key();
    const json& v = *it;
    if (v.is_null()) continue;
    if (k == "prompt" || k == "temperature" || k == "top_k" || k == "top_p" || k == "min_p" ||
        k == "repeat_penalty" || k == "repeat_last_n" || k == "presence_penalty" ||
        k == "frequency_penalty" || k == "stop" || k == "stream" || k == "ignore_eos") {
      (*out)[k] = v;
    } else if (k == "n_predict") {
      if (!v.is_number_integer() || v.get<int64_t>() == 0 || v.get<int64_t>() < -1) {
        Fail(res, k, "'n_predict' must be -1 (to the end of the context) or >= 1, got " +
                         BriefJson(v));
        return false;
      }
      if (v.get<int64_t>() > 0) (*out)["max_tokens"] = v;
    } else if (k == "seed") {
      if (!v.is_number_integer()) {
        Fail(res, k, "'seed' must be an integer (-1: random), got " + JsonTypeName(v));
        return false;
      }
      if (v.get<int64_t>() != -1) (*out)["seed"] = v;
    } else if (k == "n_probs") {
      (*out)["logprobs"] = v;
    } else if (k == "cache_prompt") {
      if (!v.is_boolean()) {
        Fail(res, k, "'cache_prompt' must be a boolean, got " + JsonTypeName(v));
        return false;
      }
      *cache_prompt = v.get<bool>();
    } else if (k == "logit_bias") {
      // [[id, bias], ...] (bias false: the token is banned) or {"id": bias}.
      if (v.is_object()) {
        (*out)["logit_bias"] = v;
      } else if (v.is_array()) {
        json o = json::object();
        for (size_t i = 0; i < v.size(); ++i) {
          const json& pair = v[i];
          if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
              !(pair[1].is_number() || pair[1].is_boolean())) {
            Fail(res, "logit_bias[" + std::to_string(i) + "]",
                 "'logit_bias' entries must be [token id, bias or false], got " +
                     BriefJson(pair));
            return false;
          }
          o[std::to_string(pair[0].get<int64_t>())] =
              pair[1].is_boolean() ? json(pair[1].get<bool>() ? 0.0 : -100.0) : pair[1];
        }
        (*out)["logit_bias"] = o;
      } else {
        Fail(res, k, "'logit_bias' must be a list of [id, bias] or an object, got " +
                         JsonTypeName(v));
        return false;
      }
    } else {
      Fail(res, k,
           "'" + k +
               "' is not implemented by /completion (it takes: prompt, n_predict, temperature, "
               "top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, "
               "frequency_penalty, stop, stream, seed, n_probs, logit_bias, ignore_eos, "
               "cache_prompt)");
      return false;
    }
  }
  return true;
}

}  // namespace

void Server::LlamaRoutes() {
  http::Server& h = *http_;
  const Tokenizer* tok = model_->tokenizer();
  h.Route("POST", "/tokenize",
          [tok](const http::Request& req, http::Response& res, http::Connection&) {
            json j;
            if (!ParseBody(req, res, {"content", "add_special", "parse_special", "with_pieces"},
                           &j)) {
              return;
            }
            auto c = j.find("content");
            if (c == j.end() || !c->is_string()) {
              return Fail(res, "content", "'content' (a string) is required");
            }
            bool add_special = false, parse_special = true, with_pieces = false;
            if (!GetBool(j, "add_special", &add_special, res) ||
                !GetBool(j, "parse_special", &parse_special, res) ||
                !GetBool(j, "with_pieces", &with_pieces, res)) {
              return;
            }
            const std::vector<int32_t> ids =
                tok->Encode(c->get<std::string>(), add_special, parse_special);
            json tokens = json::array();
            for (int32_t id : ids) {
              if (with_pieces) {
                tokens.push_back({{"id", id}, {"piece", tok->DecodeToken(id, true)}});
              } else {
                tokens.push_back(id);
              }
            }
            Send(res, 200, {{"tokens", tokens}});
          });
  h.Route("POST", "/detokenize",
          [tok](const http::Request& req, http::Response& res, http::Connection&) {
            json j;
            if (!ParseBody(req, res, {"tokens"}, &j)) return;
            auto t = j.find("tokens");
            if (t == j.end() || !t->is_array()) {
              return Fail(res, "tokens", "'tokens' (a list of token ids) is required");
            }
            std::vector<int32_t> ids;
            for (size_t i = 0; i < t->size(); ++i) {
              const json& v = (*t)[i];
              const std::string at = "tokens[" + std::to_string(i) + "]";
              if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
                  v.get<int64_t>() >= tok->vocab_size()) {
                return Fail(res, at,
                            "'" + at + "' must be a token id in [0, " +
                                std::to_string(tok->vocab_size()) + "), got " + BriefJson(v));
              }
              ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
            }
            Send(res, 200, {{"content", tok->Decode(ids)}});
          });
  h.Route("POST", "/completion", [this, tok](const http::Request& req, http::Response& res,
                                             http::Connection& conn) {
    if (stopping_) {
      ApiError e = BadRequest("", "the server is shutting down");
      e.http_status = 503;
      e.type = "server_error";
      return Send(res, 503, ErrorJson(e));
    }
    json in;
    {
      StatusOr<json> j = ParseUntrustedJson(req.body, "the request body");
      if (!j.ok()) return Fail(res, "", j.status().message());
      if (!j->is_object()) {
        return Fail(res, "", "the request body must be a JSON object, got " + JsonTypeName(*j));
      }
      in = std::move(j).value();
    }
    json openai;
    bool cache_prompt = true;
    if (!TranslateNative(in, res, &openai, &cache_prompt)) return;
    GenerationRequest g;
    RequestContext rc{o_.model_name, model_->config().n_vocab};
    if (auto e = ParseGenerationRequest(openai.dump(), Endpoint::kCompletions, rc, &g)) {
      // The OpenAI parser's names are the same fields here but two.
      if (e->param == "max_tokens") e->param = "n_predict";
      if (e->param == "logprobs") e->param = "n_probs";
      return Send(res, e->http_status, ErrorJson(*e));
    }
    std::shared_ptr<Sequence> seq = Admit(g, Endpoint::kCompletions, /*native=*/true, res);
    if (!seq) return;
    const std::string note =
        cache_prompt ? "cache_prompt has no effect: each request's prompt is prefilled in full"
                     : "";
    const bool probs = g.top_logprobs >= 0;
    auto final_json = [this, note, probs, tok](const Sequence::Result& r) {
      json out = {{"content", r.text},
                  {"model", o_.model_name},
                  {"tokens_predicted", r.completion_tokens},
                  {"tokens_evaluated", r.prompt_tokens},
                  {"stop", true},
                  {"stop_type", r.finish_reason == "length" ? "limit"
                                : r.stopped_by_text         ? "word"
                                                            : "eos"},
                  {"truncated", false},
                  {"timings", TimingsJson(r)}};
      if (probs) out["completion_probabilities"] = NativeProbs(r.logprobs, *tok);
      json ext = json::object();
      if (!r.message.empty()) ext["message"] = r.message;
      if (!note.empty()) ext["note"] = note;
      if (!ext.empty()) out["strata"] = ext;
      return out;
    };
    if (!g.stream) {
      Sequence::Result r;
      while (!seq->WaitFor(std::chrono::milliseconds(100), &r)) {
        if (conn.ClientGone()) {
          seq->Cancel();
          seq->Wait();
          res.status = 499;
          return;
        }
      }
      if (!r.error.ok()) {
        ApiError e = BadRequest("", "generation failed: " + r.error.ToString());
        e.http_status = 500;
        e.type = "server_error";
        return Send(res, 500, ErrorJson(e));
      }
      return Send(res, 200, final_json(r));
    }
    // Streamed as llama-server streams /completion: one {"content", "stop": false} event per
    // delta, then the final object with "stop": true (no [DONE]).
    res.content_type = "text/event-stream";
    res.SetHeader("Cache-Control", "no-cache");
    res.stream = [seq, final_json, probs, tok](http::StreamSink& sink) {
      auto event = [](const json& j) {
        return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      };
      for (;;) {
        std::string delta;
        std::optional<Sequence::Result> r;
        std::vector<Sequence::TokenLogprob> lps;
        while (!seq->Next(std::chrono::milliseconds(100), &delta, &r, nullptr,
                          probs ? &lps : nullptr)) {
          if (sink.ClientGone()) {
            seq->Cancel();
            return;
          }
        }
        if (!delta.empty() || !lps.empty()) {
          json ev = {{"content", delta}, {"stop", false}};
          if (probs) ev["completion_probabilities"] = NativeProbs(lps, *tok);
          if (!sink.Write(event(ev))) {
            seq->Cancel();
            return;
          }
        }
        if (!r) continue;
        if (!r->error.ok()) {
          ApiError e = BadRequest("", "generation failed: " + r->error.ToString());
          e.http_status = 500;
          e.type = "server_error";
          sink.Write(event(ErrorJson(e)));
          return;
        }
        json last = final_json(*r);
        last["content"] = "";
        last.erase("completion_probabilities");
        sink.Write(event(last));
        return;
      }
    };
  });
  h.Route("GET", "/slots", [this](const http::Request&, http::Response& res, http::Connection&) {
    const std::vector<SlotInfo> running = scheduler_->Slots();
    json slots = json::array();
    for (int i = 0; i < o_.parallel; ++i) {
      json s = {{"id", i}, {"is_processing", false}};
      if (i < static_cast<int>(running.size())) {
        const SlotInfo& r = running[static_cast<size_t>(i)];
        s["is_processing"] = true;
        s["state"] = r.prefilling ? "prefilling" : "generating";
        s["sequence"] = r.id;
        s["policy"] = r.policy;
        s["n_prompt_tokens"] = r.prompt_tokens;
        s["n_decoded"] = r.generated_tokens;
        s["kv_resident_bytes"] = r.resident_bytes;
        s["kv_read_bytes_last_step"] = r.read_bytes_step;
      }
      slots.push_back(s);
    }
    Send(res, 200, slots);
  });
  h.Route("GET", "/props", [this, tok](const http::Request&, http::Response& res,
                                       http::Connection&) {
    Send(res, 200,
         {{"default_generation_settings",
           {{"n_ctx", o_.ctx}, {"policy", o_.policy}, {"temperature", 1.0}, {"top_p", 1.0}}},
          {"total_slots", o_.parallel},
          {"model_alias", o_.model_name},
          {"chat_template", chat_ ? chat_->name() : std::string()},
          {"bos_token", tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : std::string()},
          {"eos_token", tok->eos_id() >= 0 ? tok->token_text(tok->eos_id()) : std::string()},
          {"build_info", "strata"}});
  });
}

}  // namespace strata::serve
