// Unit tests of request parsing and validation, byte sizes, stop-sequence text and metrics.
#include "serve/request.h"

#include <gtest/gtest.h>

#include "core/status_testing.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace strata::serve {
namespace {

const RequestContext kCtx{"tiny", 512};

// The error for a completions body (nullopt when it parsed).
std::optional<ApiError> Bad(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  GenerationRequest g;
  return ParseGenerationRequest(body, ep, kCtx, &g);
}

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(Request, TokenIdPrompts) {
  for (const char* body : {R"({"prompt": [1, 7, 511]})", R"({"prompt": [[1, 7, 511]]})"}) {
    GenerationRequest g;
    ASSERT_FALSE(ParseGenerationRequest(body, Endpoint::kCompletions, kCtx, &g)) << body;
    EXPECT_TRUE(g.prompt_ids_given);
    EXPECT_EQ(g.prompt_ids, (std::vector<int32_t>{1, 7, 511}));
    EXPECT_TRUE(g.prompt.empty());
  }
  GenerationRequest g;
  ASSERT_FALSE(ParseGenerationRequest(R"({"prompt": "hi"})", Endpoint::kCompletions, kCtx, &g));
  EXPECT_FALSE(g.prompt_ids_given);
}

TEST(Request, ParsesEveryField) {
  GenerationRequest g;
  ASSERT_FALSE(ParseGenerationRequest(
      R"({"model":"tiny","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,
          "stop":["a","bc"],"seed":42,"n":1,"stream":true,"ignore_eos":true,
          "stream_options":{"include_usage":true},
          "strata":{"policy":"vestige:ratio=32"},"user":"x","presence_penalty":0})",
      Endpoint::kCompletions, kCtx, &g));
  EXPECT_EQ(g.prompt, "hi");
  EXPECT_EQ(*g.max_tokens, 7);
  EXPECT_FLOAT_EQ(g.sampler.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.sampler.top_p, 0.9f);
  EXPECT_EQ(g.sampler.seed, 42u);
  EXPECT_TRUE(g.seed_given);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.ignore_eos);
  EXPECT_TRUE(g.include_usage);
  EXPECT_EQ(g.policy, "vestige:ratio=32");
  // Defaults: OpenAI's temperature 1, no max_tokens (the endpoint's default), one stop string.
  ASSERT_FALSE(ParseGenerationRequest(R"({"prompt":["one"],"stop":"\n"})", Endpoint::kCompletions,
                                      kCtx, &g));
  EXPECT_EQ(g.prompt, "one");
  EXPECT_FLOAT_EQ(g.sampler.temperature, 1.f);
  EXPECT_FALSE(g.max_tokens.has_value());
  EXPECT_FALSE(g.seed_given);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"\n"}));
}

TEST(Request, ParsesChatMessages) {
  GenerationRequest g;
  ASSERT_FALSE(ParseGenerationRequest(
      R"({"messages":[{"role":"developer","content":"be brief"},
                      {"role":"user","content":[{"type":"text","text":"hel"},
                                                {"type":"text","text":"lo"}]}],
          "max_completion_tokens":3})",
      Endpoint::kChat, kCtx, &g));
  ASSERT_EQ(g.messages.size(), 2u);
  EXPECT_EQ(g.messages[0].role, "system");
  EXPECT_EQ(g.messages[1].content, "hello");
  EXPECT_EQ(*g.max_tokens, 3);
}

TEST(Request, EveryBadInputIsA4xxNamingTheField) {
  struct Case {
    const char* body;
    int status;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({"prompt": "x",)", 400, "", "not valid JSON"},
      {R"([1, 2])", 400, "", "must be a JSON object, got an array"},
      {R"({"max_tokens": 5})", 400, "prompt", "'prompt' is required"},
      {R"({"prompt": 5})", 400, "prompt", "'prompt' must be a string, got an integer"},
      {R"({"prompt": ["a", "b"]})", 400, "prompt", "a list of 2 items"},
      {R"({"prompt": [1, 512]})", 400, "prompt[1]", "token id 512 is outside the vocabulary [0, 512)"},
      {R"({"prompt": [1, -3]})", 400, "prompt[1]", "outside the vocabulary"},
      {R"({"prompt": [1, "b"]})", 400, "prompt[1]", "must be a token id (an integer), got a string"},
      {R"({"prompt": [1, 2.5]})", 400, "prompt[1]", "must be an integer, got 2.5"},
      {R"({"prompt": [[]]})", 400, "prompt", "an empty list of token ids"},
      {R"({"prompt": [[1], [2]]})", 400, "prompt", "a list of 2 items"},
      {R"({"prompt": "x", "max_tokens": -1})", 400, "max_tokens", "in [1, 16777216], got -1"},
      {R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", "got 0"},
      {R"({"prompt": "x", "max_tokens": 99999999999})", 400, "max_tokens", "got 99999999999"},
      {R"({"prompt": "x", "max_tokens": 2.5})", 400, "max_tokens", "must be an integer, got 2.5"},
      {R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens", "got a string"},
      {R"({"prompt": "x", "temperature": 3})", 400, "temperature", "in [0, 2], got 3"},
      {R"({"prompt": "x", "temperature": "hot"})", 400, "temperature", "must be a number"},
      {R"({"prompt": "x", "top_p": 0})", 400, "top_p", "(0, 1], got 0"},
      {R"({"prompt": "x", "n": 2})", 400, "n", "must be 1"},
      {R"({"prompt": "x", "best_of": 3})", 400, "best_of", "must be 1"},
      {R"({"prompt": "x", "stop": 5})", 400, "stop", "a string or a list of strings"},
      {R"({"prompt": "x", "stop": ["a", 1]})", 400, "stop[1]", "must be a string"},
      {R"({"prompt": "x", "stop": ["a","b","c","d","e"]})", 400, "stop", "at most 4"},
      {R"({"prompt": "x", "stop": [""]})", 400, "stop", "must not be empty"},
      {R"({"prompt": "x", "stream": "yes"})", 400, "stream", "must be a boolean"},
      {R"({"prompt": "x", "seed": "s"})", 400, "seed", "must be an integer"},
      {R"({"prompt": "x", "ignore_eos": 1})", 400, "ignore_eos", "must be a boolean"},
      {R"({"prompt": "x", "echo": true})", 400, "echo", "not supported"},
      {R"({"prompt": "x", "model": "gpt-4"})", 404, "model", "'gpt-4' does not exist"},
      {R"({"prompt": "x", "model": 3})", 400, "model", "must be a string"},
      {R"({"prompt": "x", "strata": {"policy": "nosuch"}})", 400, "strata.policy",
       "policy 'nosuch' is not valid"},
      {R"({"prompt": "x", "strata": {"policy": "vestige:ratio=0"}})", 400, "strata.policy",
       "'vestige:ratio=0'"},
      {R"({"prompt": "x", "strata": {"policy": "vestige:recal=off"}})", 400, "strata.policy",
       "did you mean 'recall'"},
      {R"({"prompt": "x", "strata": {"polcy": "full"}})", 400, "strata.polcy", "unknown field"},
      {R"({"prompt": "x", "strata": "full"})", 400, "strata", "must be an object"},
  };
  for (const Case& c : cases) {
    std::optional<ApiError> e = Bad(c.body);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->http_status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
    EXPECT_TRUE(Has(e->message, c.says)) << c.body << " -> " << e->message;
    // The wire form is OpenAI's.
    const nlohmann::json j = ErrorJson(*e);
    EXPECT_EQ(j["error"]["message"], e->message);
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param") &&
                j["error"].contains("code"));
  }
  EXPECT_EQ(Bad(R"({"prompt":"x","model":"gpt-4"})")->code, "model_not_found");
}

TEST(Request, BadChatMessages) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "x"})", "'messages' is required"},
      {R"({"messages": []})", "at least one message"},
      {R"({"messages": "hi"})", "must be an array"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "'tool'; supported roles"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content' is required"},
      {R"({"messages": [{"role": "user", "content": 1}]})", "must be a string, got an integer"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "only text content"},
  };
  for (const auto& [body, says] : cases) {
    std::optional<ApiError> e = Bad(body, Endpoint::kChat);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http_status, 400);
    EXPECT_TRUE(Has(e->message, says)) << body << " -> " << e->message;
  }
}

TEST(ByteSize, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteSize("--kv-budget", "8GiB"), int64_t{8} << 30);
  EXPECT_EQ(*ParseByteSize("--kv-budget", "512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("--kv-budget", "1.5g"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("--kv-budget", "4096"), 4096);
  EXPECT_EQ(*ParseByteSize("--kv-budget", "2K"), 2048);
  for (const char* bad : {"", "GiB", "8 GiB", "8XB", "-1GiB", "0", "abc", "1e30T"}) {
    StatusOr<int64_t> r = ParseByteSize("--kv-budget", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(Has(r.status().message(), "--kv-budget '" + std::string(bad) + "'"))
        << r.status().message();
  }
}

TEST(StopTextTest, CutsAtTheFirstStopAndHoldsBackPartialMatches) {
  StopText t({"END", "\n\n"});
  EXPECT_FALSE(t.Append("hello E"));
  EXPECT_EQ(t.TakeReady(), "hello ");  // "E" could start END
  EXPECT_FALSE(t.Append("N"));
  EXPECT_EQ(t.TakeReady(), "");
  EXPECT_TRUE(t.Append("Dafter"));  // END completed across three pieces
  EXPECT_EQ(t.TakeReady(), "");
  EXPECT_EQ(t.TakeRest(), "");
  EXPECT_EQ(t.text(), "hello ");
  // A held-back prefix that does not become a stop is shown.
  StopText u({"END"});
  u.Append("EN");
  EXPECT_EQ(u.TakeReady(), "");
  u.Append("x");
  EXPECT_EQ(u.TakeReady(), "ENx");
  // No stops: incomplete UTF-8 is held until its character is whole.
  StopText v({});
  v.Append("a\xC3");
  EXPECT_EQ(v.TakeReady(), "a");
  v.Append("\xA9!");
  EXPECT_EQ(v.TakeReady(), "\xC3\xA9!");
  v.Append("\xE2\x82");
  EXPECT_EQ(v.TakeReady(), "");
  EXPECT_EQ(v.TakeRest(), "\xE2\x82");  // at the end everything goes
}

TEST(MetricsTest, PrometheusText) {
  Metrics m;
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.AddTokens(10, 3);
  m.ObserveTimeToFirstToken(0.02);
  m.ObserveInterToken(0.003);
  m.ObserveInterToken(5);
  Metrics::Gauges g;
  g.queue_depth = 2;
  g.active_sequences = 3;
  g.resident_by_policy["vestige"] = 1234;
  g.read_by_policy["full"] = 99;
  m.SetGauges(g);
  const std::string t = m.Text();
  EXPECT_TRUE(Has(t, "strata_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"));
  EXPECT_TRUE(Has(t, "strata_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"));
  EXPECT_TRUE(Has(t, "strata_prompt_tokens_total 10\n"));
  EXPECT_TRUE(Has(t, "strata_completion_tokens_total 3\n"));
  EXPECT_TRUE(Has(t, "strata_queue_depth 2\n"));
  EXPECT_TRUE(Has(t, "strata_active_sequences 3\n"));
  EXPECT_TRUE(Has(t, "strata_kv_bytes_resident{policy=\"vestige\"} 1234\n"));
  EXPECT_TRUE(Has(t, "strata_kv_bytes_read_per_step{policy=\"full\"} 99\n"));
  EXPECT_TRUE(Has(t, "strata_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
  EXPECT_TRUE(Has(t, "strata_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"));
  EXPECT_TRUE(Has(t, "strata_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_TRUE(Has(t, "strata_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_TRUE(Has(t, "strata_inter_token_latency_seconds_count 2\n"));
  EXPECT_TRUE(Has(t, "# TYPE strata_time_to_first_token_seconds histogram\n"));
  EXPECT_EQ(m.requests("/v1/completions", 200), 2);
}

}  // namespace
}  // namespace strata::serve
