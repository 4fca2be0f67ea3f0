// The load generator of `strata bench serve`: K concurrent streaming clients (server-sent events
// on POST /v1/completions) against a `strata serve` on loopback, bounded in requests and in time,
// and the figures a serving benchmark reports: aggregate and decode tokens/s, time to first token
// and inter-token latency percentiles.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata::serve {

// A server address from --url: http://HOST:PORT[/] where HOST is a loopback address (127.x.y.z,
// localhost, [::1]); anything else (another host, https, a path, no port) is an error naming it.
struct LoopbackUrl {
  std::string host;
  int port = 0;
};
StatusOr<LoopbackUrl> ParseLoopbackUrl(const std::string& url);

// Nearest-rank percentiles of a sample (p50 = the smallest value with at least half the samples
// at or below it); all zero when the sample is empty.
struct Percentiles {
  int64_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Percentiles Summarize(std::vector<double> v);

// The decode window of a level: the times at which at least `streams` requests are between their
// first and last token, and the tokens that arrived then (a chunk at the window's opening edge is
// not counted: its tokens were generated before every stream ran). events: per request, (arrival
// seconds, tokens generated so far) per chunk.
struct DecodeWindow {
  double seconds = 0;
  int64_t tokens = 0;
};
DecodeWindow ComputeDecodeWindow(
    const std::vector<std::vector<std::pair<double, int64_t>>>& events, int streams);

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string api_key;            // sent as Authorization: Bearer KEY when not empty
  int streams = 1;                // K clients running at once
  int requests_per_stream = 1;    // each client sends this many, one after the other
  int64_t prompt_tokens = 32;     // sent as token ids (exact length, no tokenizer needed)
  int64_t max_tokens = 32;        // with ignore_eos: every request generates exactly this many
  std::string policy;             // "strata": {"policy": ...}; "" = the server's default
  double duration_s = 300;        // no request starts after this; running streams are hung up
  uint64_t seed = 1;              // prompts' token ids and the requests' seeds
  // Called from the main thread about every second while the level runs (may be empty).
  std::function<void(const std::string&)> progress;
};

struct LoadResult {
  int streams = 0;
  int64_t requests = 0;  // sent
  int64_t ok = 0;        // ended with [DONE] and max_tokens tokens
  int64_t failed = 0;    // refused, errored, or ended early (errors names the first few)
  int64_t cut = 0;       // hung up by the duration bound
  std::vector<std::string> errors;
  int64_t prompt_tokens = 0;      // usage, summed over the completed requests
  int64_t completion_tokens = 0;  // usage, summed over the completed requests
  int64_t streamed_tokens = 0;    // the chunks' token counts, summed over every request
  double wall_s = 0;              // the level's start to its last response
  // streamed tokens / wall: the serving rate, prefills and queueing included.
  double aggregate_tok_s = 0;
  // Decode: tokens that arrived while all K streams were generating (between the last stream's
  // first token and the first stream's last, for one request per stream) over that time; no
  // prefill runs then, so it is the batch decode rate. 0 when the window is empty.
  double decode_tok_s = 0;
  double decode_window_s = 0;
  int64_t decode_window_tokens = 0;
  // The server's own count (its "timings", when it sends them, as strata and llama-server do),
  // summed over the completed requests: tokens after each request's first, and the time from
  // its first token to its last. With one stream this is the decode rate the client could not
  // time when a reply's chunks reached it in one read. 0 when the server sent no timings.
  int64_t server_decode_tokens = 0;
  double server_decode_s = 0;
  // Per request: the send to the first token. Per token after the first: the gap since the
  // previous chunk, shared equally by the tokens a chunk carries.
  Percentiles ttft_s, itl_s;
  std::string model;  // the server's model id (GET /v1/models)
};

// Runs one level: `streams` clients, each sending `requests_per_stream` streaming completions of
// `prompt_tokens` random token ids and max_tokens (ignore_eos, temperature 0). Errors: bad
// options, or a server that cannot be reached or is not a strata server (no n_vocab in
// /v1/models); refusals of individual requests are counted in the result, not errors.
StatusOr<LoadResult> RunLoad(const LoadOptions& o);

}  // namespace strata::serve
