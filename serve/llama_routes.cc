// llama-server's native endpoints beside the OpenAI ones, in llama-server's JSON shapes:
// POST /tokenize, POST /detokenize, GET /props. A field these do not implement is a 400 naming it.
#include <nlohmann/json.hpp>

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
