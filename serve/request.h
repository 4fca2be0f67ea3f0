// The OpenAI-compatible request bodies of `strata serve`: parsing and validation of
// /v1/completions and /v1/chat/completions, and the OpenAI error JSON every refusal is sent as.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/chat_template.h"
#include "model/sampler.h"

namespace strata::serve {

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}} with an HTTP
// status. `param` names the request field at fault ("" when none: sent as null).
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;  // "" -> null
};
nlohmann::json ErrorJson(const ApiError& e);
// The common cases.
ApiError BadRequest(const std::string& param, const std::string& message);

enum class Endpoint { kCompletions, kChat };

// A validated generation request (one choice: n = 1).
struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                  // as given ("" when absent: the served model)
  std::string prompt;                 // completions
  // completions: the prompt given as token ids (OpenAI's `prompt: [int, ...]`), used as they are
  // (no BOS added); prompt_ids_given tells it from a text prompt.
  std::vector<int32_t> prompt_ids;
  bool prompt_ids_given = false;
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: the endpoint's default (see the server)
  // temperature, top_p, top_k, min_p, repeat_penalty, repeat_last_n, presence_penalty,
  // frequency_penalty, logit_bias, seed (validated)
  SamplerOptions sampler;
  int top_logprobs = -1;  // -1: no logprobs; else the alternatives per token (0..20)
  bool seed_given = false;
  std::vector<std::string> stop;  // up to kMaxStops non-empty strings
  bool stream = false;
  bool ignore_eos = false;     // llama.cpp's extension: generate through EOG tokens
  bool include_usage = false;  // stream_options.include_usage
  std::string policy;          // strata.policy; "" = the server's default
};

inline constexpr int kMaxStops = 4;
// The most alternatives a token's log-probabilities may list (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;
// max_tokens above this is refused whatever the context (a guard for models with no context
// limit in their metadata).
inline constexpr int64_t kMaxTokensCap = int64_t{1} << 24;

// What the parser checks the request against.
struct RequestContext {
  std::string model_name;  // the one served model; "model" must be it (or absent)
  int64_t n_vocab = 0;     // token-id prompts must be in [0, n_vocab) (0: not checked)
};

// Parses and validates `body` for `endpoint`. Types and ranges are checked field by field (a
// wrong type names the field and the type it has; max_tokens in [1, kMaxTokensCap]; temperature
// in [0, 2]; top_p in (0, 1]; n and best_of only 1; stop a string or a list of at most 4 non-empty
// strings; a completions prompt a string, a list of one string, a non-empty list of token ids in
// [0, n_vocab) or a list of one such list; messages a non-empty list of {role, content} with a
// known role; top_k >= 0; min_p in [0, 1]; repeat_penalty > 0; repeat_last_n >= -1;
// presence_penalty and frequency_penalty in [-2, 2]; logit_bias an object of token id -> bias in
// [-100, 100]; logprobs (completions: an integer 0..20; chat: a boolean, with top_logprobs
// 0..20)); max_completion_tokens wins over max_tokens; an unknown model is a 404 (code
// model_not_found); a policy that the registry refuses is a 400 naming it (param strata.policy).
// `user` is accepted (it changes no output). Every other field, including those OpenAI defines
// that this server does not implement (response_format other than text, tools, suffix, ...), is
// a 400 naming it: never a silent 200.
// The prompt's length against the context is checked by the server once it is tokenized.
std::optional<ApiError> ParseGenerationRequest(const std::string& body, Endpoint endpoint,
                                               const RequestContext& ctx, GenerationRequest* out);

// "8GiB", "512MiB", "1.5G", "4096" (bytes) -> bytes. Units: B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
// T/TB/TiB (all binary, as memory is). Errors name `flag` and the text.
StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text);

}  // namespace strata::serve
