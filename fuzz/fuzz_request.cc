// libFuzzer target: a request body of `strata serve` through serve::ParseGenerationRequest, and a
// chat request that parses through what the server does with it next: every built-in chat
// template's Validate, then Render (io/chat_template.h).
//
// Input: one mode byte, then the body. Mode bit 0: the endpoint (0 /v1/completions, 1
// /v1/chat/completions); bit 1: the vocabulary is checked (n_vocab 1000) or not (0); bit 2: the
// tokenizer has BOS/EOS texts or none (""); bit 3: Qwen3's enable_thinking is set to false.
//
// Checked beyond "no crash, no sanitizer report": a refusal is a 400 or a 404 (model_not_found)
// whose error JSON serializes; an accepted request holds what request.h promises (the endpoint's
// prompt or messages, max_tokens, temperature, top_p and stop within their ranges, a policy that
// parses); the server's own sequence for chat then holds: every built-in template's Validate
// accepts the messages (the parser admits exactly the roles and the non-empty lists it requires;
// Gemma also wants alternating turns, fuzz/chat_rules.h), and Render renders them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/chat_rules.h"
#include "io/chat_template.h"
#include "kv/registry.h"
#include "serve/request.h"

namespace {

volatile uint64_t g_sink = 0;

[[noreturn]] void Fail(const std::string& what, const std::string& body) {
  std::fprintf(stderr, "fuzz_request: %s\nbody (%zu bytes): %.2000s\n", what.c_str(), body.size(),
               body.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  using namespace strata::serve;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const Endpoint ep = (mode & 1) ? Endpoint::kChat : Endpoint::kCompletions;
  RequestContext ctx;
  ctx.model_name = "strata-fuzz";
  ctx.n_vocab = (mode & 2) ? 1000 : 0;

  GenerationRequest g;
  if (std::optional<ApiError> e = ParseGenerationRequest(body, ep, ctx, &g)) {
    if (e->http_status != 400 && !(e->http_status == 404 && e->code == "model_not_found")) {
      Fail("a refusal with HTTP status " + std::to_string(e->http_status), body);
    }
    if (e->message.empty()) Fail("a refusal without a message", body);
    // As the server sends it (serve/server.cc: invalid UTF-8 replaced, never a throw).
    g_sink = g_sink + ErrorJson(*e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                          .size();
    return 0;
  }
  if (g.endpoint != ep) Fail("the request's endpoint is not the one parsed for", body);
  if (g.max_tokens && (*g.max_tokens < 1 || *g.max_tokens > kMaxTokensCap)) {
    Fail("max_tokens " + std::to_string(*g.max_tokens) + " accepted", body);
  }
  if (!(g.sampler.temperature >= 0.f && g.sampler.temperature <= 2.f)) {
    Fail("temperature " + std::to_string(g.sampler.temperature) + " accepted", body);
  }
  if (!(g.sampler.top_p > 0.f && g.sampler.top_p <= 1.f)) {
    Fail("top_p " + std::to_string(g.sampler.top_p) + " accepted", body);
  }
  if (g.stop.size() > static_cast<size_t>(kMaxStops)) Fail("more than 4 stops accepted", body);
  for (const std::string& s : g.stop) {
    if (s.empty()) Fail("an empty stop accepted", body);
  }
  if (!g.policy.empty() && !ParsePolicySpec(g.policy).ok()) {
    Fail("a policy that does not parse accepted: " + g.policy, body);
  }
  if (ep == Endpoint::kCompletions) {
    if (!g.messages.empty()) Fail("a completions request with messages", body);
    if (g.prompt_ids_given) {
      if (g.prompt_ids.empty()) Fail("an empty token-id prompt accepted", body);
      for (int32_t id : g.prompt_ids) {
        if (id < 0 || (ctx.n_vocab > 0 && id >= ctx.n_vocab)) {
          Fail("token id " + std::to_string(id) + " accepted", body);
        }
      }
    } else if (!g.prompt_ids.empty()) {
      Fail("token ids without prompt_ids_given", body);
    }
    return 0;
  }
  if (g.messages.empty()) Fail("a chat request without messages accepted", body);
  const std::string bos = (mode & 4) ? "<s>" : "", eos = (mode & 4) ? "</s>" : "";
  for (const std::string& name : ChatTemplate::BuiltinNames()) {
    StatusOr<ChatTemplate> t = ChatTemplate::ByName(name);
    if (!t.ok()) Fail("ChatTemplate::ByName(" + name + ") failed: " + t.status().ToString(), body);
    if (mode & 8) t->set_enable_thinking(false);
    const Status st = t->Validate(g.messages);
    if (st.ok() != fuzz::ChatTemplateAccepts(name, g.messages)) {
      Fail("template " + name + ": Validate says " + st.ToString() + " on parsed messages", body);
    }
    g_sink = g_sink + t->Render(g.messages, /*add_generation_prompt=*/true, bos, eos).size();
  }
  return 0;
}
