// Request parsing and validation for the OpenAI-compatible endpoints.
#include "serve/request.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "io/json_input.h"
#include "kv/registry.h"

namespace strata::serve {

namespace {

using nlohmann::json;


ApiError WrongType(const std::string& param, const json& v, const std::string& want) {
  return BadRequest(param, "'" + param + "' must be " + want + ", got " + JsonTypeName(v));
}

// An integer-valued JSON number (5 or 5.0); other numbers and types are refused.
std::optional<ApiError> GetInt(const json& v, const std::string& param, int64_t* out) {
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return std::nullopt;
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return BadRequest(param, "'" + param + "' " + std::to_string(u) + " is too large");
    }
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      *out = static_cast<int64_t>(d);
      return std::nullopt;
    }
    return BadRequest(param, "'" + param + "' must be an integer, got " + v.dump());
  }
  return WrongType(param, v, "an integer");
}

std::optional<ApiError> GetReal(const json& v, const std::string& param, double* out) {
  if (!v.is_number()) return WrongType(param, v, "a number");
  *out = v.get<double>();
  return std::nullopt;
}

std::string Num(double v) {
  json j = v;
  return j.dump();
}

}  // namespace

nlohmann::json ErrorJson(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json() : json(e.param)},
            {"code", e.code.empty() ? json() : json(e.code)}}}};
}

ApiError BadRequest(const std::string& param, const std::string& message) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  return e;
}

namespace {
std::optional<ApiError> ParseChecked(const std::string& body, Endpoint endpoint,
                                     const RequestContext& ctx, GenerationRequest* out);
}  // namespace

std::optional<ApiError> ParseGenerationRequest(const std::string& body, Endpoint endpoint,
                                               const RequestContext& ctx, GenerationRequest* out) {
  *out = GenerationRequest{};
  out->endpoint = endpoint;
  // The nesting limit of every untrusted JSON text, before a node is built: a body of nested
  // brackets would otherwise cost ~30x its size in nodes before it is refused.
  if (const int64_t at = JsonDepthExceededAt(body); at >= 0) {
    return BadRequest("", "the request body nests deeper than " + std::to_string(kMaxJsonDepth) +
                              " levels (at byte " + std::to_string(at) + ")");
  }
  try {
    return ParseChecked(body, endpoint, ctx, out);
  } catch (const json::exception& e) {
    // Every field is type-checked before it is read; this is the net under a missed check, so
    // that a wrong type is a 400 and never a 500.
    return BadRequest("", std::string("the request does not have the expected shape: ") + e.what());
  }
}

namespace {

std::optional<ApiError> ParseChecked(const std::string& body, Endpoint endpoint,
                                     const RequestContext& ctx, GenerationRequest* out) {
  // Not the exception-throwing parse: a malformed body is a request error, not an exception.
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return BadRequest(
        "", "the request body is not valid JSON (" + std::to_string(body.size()) + " bytes)");
  }
  if (!j.is_object())
    return BadRequest("", "the request body must be a JSON object, got " + JsonTypeName(j));
  auto field = [&](const char* name) -> const json* {
    auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };

  if (const json* v = field("model")) {
    if (!v->is_string()) return WrongType("model", *v, "a string");
    out->model = v->get<std::string>();
    if (out->model != ctx.model_name) {
      ApiError e;
      e.http_status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = "The model '" + out->model + "' does not exist; this server serves '" +
                  ctx.model_name + "' (GET /v1/models)";
      return e;
    }
  }

  if (endpoint == Endpoint::kCompletions) {
    const json* p = field("prompt");
    if (!p) return BadRequest("prompt", "'prompt' is required");
    // A list of token ids (or a batch of one such list), as OpenAI accepts them.
    auto token_ids = [&](const json& a) -> std::optional<ApiError> {
      if (a.empty()) return BadRequest("prompt", "'prompt' is an empty list of token ids");
      out->prompt_ids.reserve(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const std::string param = "prompt[" + std::to_string(i) + "]";
        if (!a[i].is_number()) return WrongType(param, a[i], "a token id (an integer)");
        int64_t id = 0;
        if (auto e = GetInt(a[i], param, &id)) return e;
        if (id < 0 || (ctx.n_vocab > 0 && id >= ctx.n_vocab)) {
          return BadRequest(param, "token id " + std::to_string(id) +
                                       " is outside the vocabulary [0, " +
                                       std::to_string(ctx.n_vocab) + ")");
        }
        out->prompt_ids.push_back(static_cast<int32_t>(id));
      }
      out->prompt_ids_given = true;
      return std::nullopt;
    };
    if (p->is_string()) {
      out->prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      out->prompt = (*p)[0].get<std::string>();  // a batch of one prompt
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      if (auto e = token_ids(*p)) return e;
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
      if (auto e = token_ids((*p)[0])) return e;  // a batch of one token list
    } else if (p->is_array()) {
      return BadRequest("prompt",
                        "'prompt' must be a string, a list of one string or a list of "
                        "token ids (one prompt per request), got a list of " +
                            std::to_string(p->size()) + " items");
    } else {
      return WrongType("prompt", *p, "a string");
    }
  } else {
    const json* m = field("messages");
    if (!m) return BadRequest("messages", "'messages' is required");
    if (!m->is_array()) return WrongType("messages", *m, "an array");
    if (m->empty()) return BadRequest("messages", "'messages' must hold at least one message");
    for (size_t i = 0; i < m->size(); ++i) {
      const std::string at = "messages[" + std::to_string(i) + "]";
      const json& msg = (*m)[i];
      if (!msg.is_object()) return WrongType(at, msg, "an object");
      auto role = msg.find("role");
      if (role == msg.end() || !role->is_string()) {
        return BadRequest(at + ".role", "'" + at + ".role' must be a string");
      }
      ChatMessage cm;
      cm.role = role->get<std::string>();
      if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for it
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
        return BadRequest(at + ".role", "'" + at + ".role' is '" + cm.role +
                                            "'; supported roles: system, user, assistant");
      }
      auto content = msg.find("content");
      if (content == msg.end() || content->is_null()) {
        return BadRequest(at + ".content", "'" + at + ".content' is required");
      }
      if (content->is_string()) {
        cm.content = content->get<std::string>();
      } else if (content->is_array()) {
        // The content-parts form: text parts are joined; other kinds (images) are refused.
        for (size_t k = 0; k < content->size(); ++k) {
          const json& part = (*content)[k];
          const std::string pat = at + ".content[" + std::to_string(k) + "]";
          const auto type = part.is_object() ? part.find("type") : part.end();
          if (!part.is_object() || type == part.end() || !type->is_string() ||
              type->get<std::string>() != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return BadRequest(pat, "'" + pat +
                                       "' must be {\"type\": \"text\", \"text\": ...} "
                                       "(only text content is supported)");
          }
          cm.content += part["text"].get<std::string>();
        }
      } else {
        return WrongType(at + ".content", *content, "a string");
      }
      out->messages.push_back(std::move(cm));
    }
  }

  // Every field is one this server implements (or `user`, which changes no output); any other
  // is refused by name, so that no setting a client relies on is silently dropped.
  {
    static const char* const kCommon[] = {
        "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "logit_bias",
        "seed", "n", "best_of", "echo", "stop", "stream", "stream_options", "ignore_eos",
        "strata", "user", "logprobs"};
    static const char* const kChatOnly[] = {"messages", "top_logprobs", "response_format",
                                            "tools"};
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      bool known = k == (endpoint == Endpoint::kCompletions ? "prompt" : "");
      for (const char* c : kCommon) known = known || k == c;
      if (endpoint == Endpoint::kChat) {
        for (const char* c : kChatOnly) known = known || k == c;
      }
      if (!known) {
        return BadRequest(k, "'" + k + "' is not implemented by this server" +
                                 (endpoint == Endpoint::kChat ? " for chat completions"
                                                              : " for completions") +
                                 " (docs/serve.md lists the fields it takes)");
      }
    }
    if (const json* v = field("response_format")) {
      if (!v->is_object() || v->value("type", json()) != json("text") || v->size() != 1) {
        return BadRequest("response_format",
                          "'response_format' other than {\"type\": \"text\"} is not "
                          "implemented by this server (no JSON mode or schema)");
      }
    }
    if (const json* v = field("tools"); v && !(v->is_array() && v->empty())) {
      return BadRequest("tools", "'tools' is not implemented by this server (no tool calls)");
    }
  }

  // max_completion_tokens wins over max_tokens (OpenAI's newer name for it).
  const char* max_name = "max_completion_tokens";
  const json* mt = field("max_completion_tokens");
  if (!mt) {
    mt = field("max_tokens");
    max_name = "max_tokens";
  }
  if (mt) {
    int64_t v = 0;
    if (auto e = GetInt(*mt, max_name, &v)) return e;
    if (v < 1 || v > kMaxTokensCap) {
      return BadRequest(max_name, std::string("'") + max_name + "' must be in [1, " +
                                      std::to_string(kMaxTokensCap) + "], got " +
                                      std::to_string(v));
    }
    out->max_tokens = v;
  }

  out->sampler.temperature = 1.f;  // OpenAI's default
  out->sampler.top_p = 1.f;
  if (const json* v = field("temperature")) {
    double t = 0;
    if (auto e = GetReal(*v, "temperature", &t)) return e;
    if (!(t >= 0 && t <= 2)) {
      return BadRequest("temperature", "'temperature' must be in [0, 2], got " + Num(t));
    }
    out->sampler.temperature = static_cast<float>(t);
  }
  if (const json* v = field("top_p")) {
    double p = 0;
    if (auto e = GetReal(*v, "top_p", &p)) return e;
    if (!(p > 0 && p <= 1)) return BadRequest("top_p", "'top_p' must be in (0, 1], got " + Num(p));
    out->sampler.top_p = static_cast<float>(p);
  }
  if (const json* v = field("top_k")) {
    int64_t k = 0;
    if (auto e = GetInt(*v, "top_k", &k)) return e;
    if (k < 0 || k > INT32_MAX) {
      return BadRequest("top_k", "'top_k' must be >= 0 (0 = off), got " + std::to_string(k));
    }
    out->sampler.top_k = static_cast<int32_t>(k);
  }
  // A real-valued field checked in [lo, hi] (as a double; Validate checks it again as a float).
  auto real = [&](const char* name, double lo, double hi, bool lo_open, float* dst,
                  const char* meaning) -> std::optional<ApiError> {
    const json* v = field(name);
    if (!v) return std::nullopt;
    double x = 0;
    if (auto e = GetReal(*v, name, &x)) return e;
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) {
      return BadRequest(name, std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") +
                                  Num(lo) + ", " + Num(hi) + "] (" + meaning + "), got " + Num(x));
    }
    *dst = static_cast<float>(x);
    return std::nullopt;
  };
  if (auto e = real("min_p", 0, 1, false, &out->sampler.min_p, "0 = off")) return e;
  if (auto e = real("repeat_penalty", 0, 1e6, true, &out->sampler.repeat_penalty, "1 = off")) {
    return e;
  }
  if (auto e = real("presence_penalty", -2, 2, false, &out->sampler.presence_penalty, "0 = off")) {
    return e;
  }
  if (auto e =
          real("frequency_penalty", -2, 2, false, &out->sampler.frequency_penalty, "0 = off")) {
    return e;
  }
  if (const json* v = field("repeat_last_n")) {
    int64_t n = 0;
    if (auto e = GetInt(*v, "repeat_last_n", &n)) return e;
    if (n < -1 || n > INT32_MAX) {
      return BadRequest("repeat_last_n", "'repeat_last_n' must be >= -1 (-1 = the whole context, "
                                         "0 = off), got " + std::to_string(n));
    }
    out->sampler.repeat_last_n = static_cast<int32_t>(n);
  }
  if (const json* v = field("logit_bias")) {
    if (!v->is_object()) return WrongType("logit_bias", *v, "an object of token id -> bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string at = "logit_bias." + it.key();
      const std::string& k = it.key();
      char* end = nullptr;
      const long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || !std::isdigit(static_cast<unsigned char>(k[0])) ||
          id < 0 || (ctx.n_vocab > 0 && id >= ctx.n_vocab)) {
        return BadRequest(at, "'logit_bias' keys must be token ids in [0, " +
                                  std::to_string(ctx.n_vocab) + "), got '" + k + "'");
      }
      double b = 0;
      if (auto e = GetReal(*it, at, &b)) return e;
      if (!(b >= -100 && b <= 100)) {
        return BadRequest(at, "'" + at + "' must be in [-100, 100], got " + Num(b));
      }
      out->sampler.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (const json* v = field("logprobs")) {
    if (endpoint == Endpoint::kChat) {
      if (!v->is_boolean()) return WrongType("logprobs", *v, "a boolean");
      if (v->get<bool>()) out->top_logprobs = 0;
    } else {
      int64_t n = 0;
      if (auto e = GetInt(*v, "logprobs", &n)) return e;
      if (n < 0 || n > kMaxTopLogprobs) {
        return BadRequest("logprobs", "'logprobs' must be in [0, " +
                                          std::to_string(kMaxTopLogprobs) + "], got " +
                                          std::to_string(n));
      }
      out->top_logprobs = static_cast<int>(n);
    }
  }
  if (const json* v = field("top_logprobs")) {
    int64_t n = 0;
    if (auto e = GetInt(*v, "top_logprobs", &n)) return e;
    if (n < 0 || n > kMaxTopLogprobs) {
      return BadRequest("top_logprobs", "'top_logprobs' must be in [0, " +
                                            std::to_string(kMaxTopLogprobs) + "], got " +
                                            std::to_string(n));
    }
    if (out->top_logprobs < 0) {
      return BadRequest("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    out->top_logprobs = static_cast<int>(n);
  }
  if (const json* v = field("seed")) {
    int64_t s = 0;
    if (auto e = GetInt(*v, "seed", &s)) return e;
    out->sampler.seed = static_cast<uint64_t>(s);  // negative seeds wrap: still one stream each
    out->seed_given = true;
  }
  for (const char* one : {"n", "best_of"}) {
    if (const json* v = field(one)) {
      int64_t n = 0;
      if (auto e = GetInt(*v, one, &n)) return e;
      if (n != 1) {
        return BadRequest(one, std::string("'") + one +
                                   "' must be 1 (one choice per request), got " +
                                   std::to_string(n));
      }
    }
  }
  if (const json* v = field("echo"); v && !(v->is_boolean() && !v->get<bool>())) {
    return BadRequest("echo", "'echo' is not supported (must be false or absent)");
  }
  if (const json* v = field("stop")) {
    if (v->is_string()) {
      out->stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > kMaxStops) {
        return BadRequest("stop", "'stop' holds at most " + std::to_string(kMaxStops) +
                                      " sequences, got " + std::to_string(v->size()));
      }
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) {
          return WrongType("stop[" + std::to_string(i) + "]", (*v)[i], "a string");
        }
        out->stop.push_back((*v)[i].get<std::string>());
      }
    } else {
      return WrongType("stop", *v, "a string or a list of strings");
    }
    for (const std::string& s : out->stop) {
      if (s.empty()) return BadRequest("stop", "'stop' sequences must not be empty");
    }
  }
  if (const json* v = field("stream")) {
    if (!v->is_boolean()) return WrongType("stream", *v, "a boolean");
    out->stream = v->get<bool>();
  }
  if (const json* v = field("ignore_eos")) {
    if (!v->is_boolean()) return WrongType("ignore_eos", *v, "a boolean");
    out->ignore_eos = v->get<bool>();
  }
  if (const json* v = field("stream_options")) {
    if (!v->is_object()) return WrongType("stream_options", *v, "an object");
    if (auto u = v->find("include_usage"); u != v->end() && !u->is_null()) {
      if (!u->is_boolean()) {
        return WrongType("stream_options.include_usage", *u, "a boolean");
      }
      out->include_usage = u->get<bool>();
    }
  }
  if (const json* v = field("strata")) {
    if (!v->is_object()) return WrongType("strata", *v, "an object");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (it.key() != "policy") {
        return BadRequest("strata." + it.key(), "unknown field 'strata." + it.key() +
                                                    "' (the strata extension takes: "
                                                    "policy)");
      }
    }
    if (auto p = v->find("policy"); p != v->end() && !p->is_null()) {
      if (!p->is_string()) return WrongType("strata.policy", *p, "a string");
      out->policy = p->get<std::string>();
      // The registry's own checks: the name, every key, every value's type and range.
      StatusOr<PolicySpec> spec = ParsePolicySpec(out->policy);
      Status st = spec.ok() ? ValidatePolicySpec(*spec) : spec.status();
      if (!st.ok()) {
        return BadRequest("strata.policy",
                          "policy '" + out->policy + "' is not valid: " + st.message());
      }
    }
  }
  // The sampler's own checks on the values as it will hold them (a top_p of 1e-300 is > 0 as a
  // double and 0 as a float).
  if (Status st = out->sampler.Validate(); !st.ok()) {
    std::string m = st.message(), param;
    for (const auto& [flag, name] :
         {std::pair<const char*, const char*>{"--temp", "temperature"},
          {"--top-p", "top_p"},
          {"--min-p", "min_p"},
          {"--repeat-penalty", "repeat_penalty"}}) {
      if (m.rfind(flag, 0) == 0) {
        param = name;
        m = "'" + param + "'" + m.substr(std::string(flag).size());
      }
    }
    return BadRequest(param, m + " (as the sampler's 32-bit float)");
  }
  return std::nullopt;
}

}  // namespace

StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text) {
  const std::string example = " (e.g. " + flag + " 8GiB; units B, KiB, MiB, GiB, TiB)";
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return InvalidArgument(flag + " '" + text + "' is not a size" + example);
  }
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return InvalidArgument(flag + " '" + text + "' has an unknown unit '" + std::string(end) + "'" +
                           example);
  }
  const double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 9.0e18) {
    return InvalidArgument(flag + " '" + text + "' must be at least 1 byte and at most 8 EiB" +
                           example);
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace strata::serve
