// `strata bench serve`'s clients: one thread per stream, each a cpp-httplib client reading the
// server-sent events of its completions as they arrive.
#include "serve/loadgen.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/rng.h"

namespace strata::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One request as its client saw it. Times are seconds since the level started.
struct Record {
  bool sent = false;
  double send = 0;
  std::vector<std::pair<double, int64_t>> events;  // (arrival, tokens generated so far)
  bool done = false;                                // [DONE] arrived
  bool cut = false;                                 // hung up by the duration bound
  std::string error;                                // "" when none
  std::string finish_reason, message;
  int64_t usage_prompt = -1, usage_completion = -1;
  // The server's "timings" of the final chunk (llama-server's; -1 when absent).
  int64_t predicted_n = -1;
  double predicted_ms = -1;
};

// Reads SSE events out of the bytes of a stream as they come.
class SseReader {
 public:
  explicit SseReader(Record* r, Clock::time_point t0) : r_(r), t0_(t0) {}
  void Feed(const char* data, size_t n) {
    buf_.append(data, n);
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      Event(buf_.substr(0, end));
      buf_.erase(0, end + 2);
    }
  }

 private:
  void Event(const std::string& ev) {
    if (ev.rfind("data: ", 0) != 0) return;
    const std::string data = ev.substr(6);
    if (data == "[DONE]") {
      r_->done = true;
      return;
    }
    const json j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (r_->error.empty()) r_->error = "an event that is not JSON: " + data.substr(0, 200);
      return;
    }
    if (j.contains("error")) {
      if (r_->error.empty()) r_->error = j["error"].value("message", j["error"].dump());
      return;
    }
    const double t = Since(t0_, Clock::now());
    if (j.contains("usage") && j["usage"].is_object()) {
      r_->usage_prompt = j["usage"].value("prompt_tokens", int64_t{-1});
      r_->usage_completion = j["usage"].value("completion_tokens", int64_t{-1});
    }
    if (j.contains("timings") && j["timings"].is_object()) {
      const json& tm = j["timings"];
      if (tm.contains("predicted_n") && tm["predicted_n"].is_number_integer() &&
          tm.contains("predicted_ms") && tm["predicted_ms"].is_number()) {
        r_->predicted_n = tm["predicted_n"].get<int64_t>();
        r_->predicted_ms = tm["predicted_ms"].get<double>();
      }
    }
    if (j.contains("strata") && j["strata"].is_object()) {
      const json& s = j["strata"];
      if (s.contains("completion_tokens") && s["completion_tokens"].is_number_integer()) {
        r_->events.emplace_back(t, s["completion_tokens"].get<int64_t>());
      }
      if (s.contains("message") && s["message"].is_string()) r_->message = s["message"];
    }
    if (j.contains("choices") && j["choices"].is_array()) {
      for (const json& c : j["choices"]) {
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
          r_->finish_reason = c["finish_reason"];
        }
      }
    }
  }

  Record* r_;
  Clock::time_point t0_;
  std::string buf_;
};

std::string ErrorMessage(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object()) {
    return j["error"].value("message", body);
  }
  return body.substr(0, 300);
}

}  // namespace

StatusOr<LoopbackUrl> ParseLoopbackUrl(const std::string& url) {
  const std::string scheme = "http://";
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--url '" + url + "': " + why +
                           " (expected http://127.0.0.1:PORT; the load generator only talks to "
                           "servers on this machine's loopback)");
  };
  if (url.rfind("https://", 0) == 0) return bad("https is not supported");
  if (url.rfind(scheme, 0) != 0) return bad("not an http:// URL");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) return bad("a path is not allowed");
  LoopbackUrl out;
  std::string port_text;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return bad("an unclosed '['");
    out.host = rest.substr(1, close - 1);
    if (close + 1 >= rest.size() || rest[close + 1] != ':') return bad("no port");
    port_text = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    out.host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("the port '" + port_text + "' is not a number");
  }
  out.port = std::stoi(port_text);
  if (out.port < 1 || out.port > 65535) return bad("the port must be in [1, 65535]");
  bool loopback = out.host == "localhost" || out.host == "::1";
  if (!loopback && out.host.rfind("127.", 0) == 0) {
    // 127.a.b.c with three numeric parts in [0, 255].
    int parts = 0;
    bool ok = true;
    size_t at = 4;
    while (ok && at <= out.host.size()) {
      const size_t dot = std::min(out.host.find('.', at), out.host.size());
      const std::string p = out.host.substr(at, dot - at);
      ok = !p.empty() && p.size() <= 3 &&
           std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
           std::stoi(p) <= 255;
      ++parts;
      at = dot + 1;
    }
    loopback = ok && parts == 3;
  }
  if (!loopback) return bad("host '" + out.host + "' is not a loopback address");
  if (out.host == "localhost") out.host = "127.0.0.1";
  return out;
}

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.n = static_cast<int64_t>(v.size());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  auto rank = [&](double q) {
    const size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(k, 1, v.size()) - 1];
  };
  p.p50 = rank(0.50);
  p.p90 = rank(0.90);
  p.p99 = rank(0.99);
  p.max = v.back();
  return p;
}

DecodeWindow ComputeDecodeWindow(
    const std::vector<std::vector<std::pair<double, int64_t>>>& events, int streams) {
  std::vector<std::pair<double, int>> edges;
  for (const auto& ev : events) {
    if (ev.empty()) continue;
    edges.emplace_back(ev.front().first, +1);
    edges.emplace_back(ev.back().first, -1);
  }
  std::sort(edges.begin(), edges.end());  // at a tie an end (-1) comes before a start
  std::vector<std::pair<double, double>> window;
  int cover = 0;
  for (size_t i = 0; i < edges.size(); ++i) {
    cover += edges[i].second;
    if (cover >= streams && i + 1 < edges.size() && edges[i + 1].first > edges[i].first) {
      window.emplace_back(edges[i].first, edges[i + 1].first);
    }
  }
  DecodeWindow w;
  for (const auto& s : window) w.seconds += s.second - s.first;
  for (const auto& ev : events) {
    for (size_t i = 1; i < ev.size(); ++i) {
      const double t = ev[i].first;
      for (const auto& s : window) {
        if (t > s.first && t <= s.second) {
          w.tokens += ev[i].second - ev[i - 1].second;
          break;
        }
      }
    }
  }
  return w;
}

StatusOr<LoadResult> RunLoad(const LoadOptions& o) {
  if (o.streams < 1 || o.streams > 4096) {
    return InvalidArgument("--streams values must be in [1, 4096], got " + std::to_string(o.streams));
  }
  if (o.requests_per_stream < 1) {
    return InvalidArgument("--requests-per-stream must be >= 1, got " +
                           std::to_string(o.requests_per_stream));
  }
  if (o.prompt_tokens < 1) {
    return InvalidArgument("the prompt must have at least 1 token, got " +
                           std::to_string(o.prompt_tokens));
  }
  if (o.max_tokens < 1) {
    return InvalidArgument("--max-tokens must be >= 1, got " + std::to_string(o.max_tokens));
  }
  if (!(o.duration_s > 0)) {
    return InvalidArgument("--duration must be > 0 seconds, got " + std::to_string(o.duration_s));
  }
  httplib::Headers auth;
  if (!o.api_key.empty()) auth.emplace("Authorization", "Bearer " + o.api_key);
  const std::string where = "http://" + o.host + ":" + std::to_string(o.port);

  // The served model: its name and vocabulary (for the token-id prompts) and context.
  LoadResult res;
  res.streams = o.streams;
  int64_t n_vocab = 0, n_ctx = 0;
  {
    httplib::Client c(o.host, o.port);
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(30, 0);
    auto r = c.Get("/v1/models", auth);
    if (!r) {
      return IoError("no server at " + where + " (GET /v1/models: " + httplib::to_string(r.error()) +
                     ")");
    }
    if (r->status != 200) {
      return IoError("GET " + where + "/v1/models answered " + std::to_string(r->status) + ": " +
                     ErrorMessage(r->body));
    }
    const json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].is_object()) {
      return IoError("GET " + where + "/v1/models: not a model list: " + r->body.substr(0, 200));
    }
    const json& m = j["data"][0];
    res.model = m.value("id", "");
    if (m.contains("meta") && m["meta"].is_object()) {
      n_vocab = m["meta"].value("n_vocab", int64_t{0});
      n_ctx = m["meta"].value("n_ctx", int64_t{0});
    }
    if (n_vocab < 4) {
      return IoError("GET " + where + "/v1/models gives no vocabulary size (meta.n_vocab): " +
                     "the load generator needs a strata server");
    }
  }
  if (n_ctx > 0 && o.prompt_tokens + o.max_tokens > n_ctx) {
    return InvalidArgument("the requests need " + std::to_string(o.prompt_tokens + o.max_tokens) +
                           " tokens of context (prompt " + std::to_string(o.prompt_tokens) +
                           " + --max-tokens " + std::to_string(o.max_tokens) +
                           "), more than the server's context " + std::to_string(n_ctx) +
                           " (start it with a larger -c)");
  }

  const int K = o.streams;
  const int R = o.requests_per_stream;
  std::vector<Record> recs(static_cast<size_t>(K) * R);
  std::atomic<int64_t> finished{0}, tokens_seen{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(50);
  const Clock::time_point deadline =
      t0 + std::chrono::microseconds(static_cast<int64_t>(o.duration_s * 1e6));

  auto client = [&](int k) {
    httplib::Client c(o.host, o.port);
    c.set_connection_timeout(10, 0);
    c.set_write_timeout(30, 0);
    ++ready;
    while (!go.load()) std::this_thread::yield();
    std::this_thread::sleep_until(t0);
    for (int i = 0; i < R; ++i) {
      Record& rec = recs[static_cast<size_t>(k) * R + i];
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      // Reads may wait in the server's queue for as long as the level may still run.
      const double left = Since(now, deadline) + 1.0;
      c.set_read_timeout(static_cast<time_t>(left), 0);
      Rng rng(o.seed * 1000003u + static_cast<uint64_t>(k) * 7919u + static_cast<uint64_t>(i));
      json ids = json::array();
      for (int64_t t = 0; t < o.prompt_tokens; ++t) {
        ids.push_back(3 + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n_vocab - 3))));
      }
      json body = {{"model", res.model},
                   {"prompt", ids},
                   {"max_tokens", o.max_tokens},
                   {"temperature", 0},
                   {"seed", o.seed + static_cast<uint64_t>(k) * R + i},
                   {"ignore_eos", true},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      if (!o.policy.empty()) body["strata"] = {{"policy", o.policy}};
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.headers = auth;
      req.set_header("Content-Type", "application/json");
      req.body = body.dump();
      int status = 0;
      std::string error_body;
      SseReader reader(&rec, t0);
      req.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        return true;
      };
      req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        if (status != 200) {
          if (error_body.size() < 65536) error_body.append(d, n);
          return true;
        }
        const size_t before = rec.events.size();
        reader.Feed(d, n);
        if (rec.events.size() > before) {
          const int64_t prev = before ? rec.events[before - 1].second : 0;
          tokens_seen += rec.events.back().second - prev;
        }
        if (Clock::now() >= deadline && !rec.done) {
          rec.cut = true;
          return false;  // hang up: the server frees the sequence
        }
        return true;
      };
      rec.sent = true;
      rec.send = Since(t0, Clock::now());
      auto r = c.send(req);
      if (!r) {
        if (Clock::now() >= deadline) {
          rec.cut = true;
        } else if (rec.error.empty()) {
          rec.error = "no response (" + httplib::to_string(r.error()) + ")";
        }
      } else if (r->status != 200 || status != 200) {
        rec.error = "HTTP " + std::to_string(r->status) + ": " +
                    ErrorMessage(error_body.empty() ? r->body : error_body);
      } else if (!rec.done && rec.error.empty() && !rec.cut) {
        rec.error = "the stream ended without [DONE]";
      }
      ++finished;
      if (rec.cut) break;
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(K);
  for (int k = 0; k < K; ++k) threads.emplace_back(client, k);
  while (ready.load() < K) std::this_thread::yield();
  go = true;
  // Progress while the clients run (the main thread only watches).
  const int64_t total = static_cast<int64_t>(K) * R;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> all_done{false};
  std::thread watcher([&] {
    std::unique_lock<std::mutex> l(mu);
    while (!cv.wait_for(l, std::chrono::seconds(1), [&] { return all_done.load(); })) {
      if (o.progress) {
        o.progress("  " + std::to_string(finished.load()) + " / " + std::to_string(total) +
                   " requests done, " + std::to_string(tokens_seen.load()) + " tokens, " +
                   std::to_string(static_cast<int64_t>(Since(t0, Clock::now()))) + " s");
      }
    }
  });
  for (auto& t : threads) t.join();
  {
    std::lock_guard<std::mutex> l(mu);
    all_done = true;
  }
  cv.notify_all();
  watcher.join();

  // The figures.
  double last = 0;
  std::vector<double> ttft, itl;
  struct Span {
    double first, last;
  };
  std::vector<Span> spans;
  for (const Record& r : recs) {
    if (!r.sent) continue;
    ++res.requests;
    if (!r.events.empty()) {
      res.streamed_tokens += r.events.back().second;
      ttft.push_back(r.events.front().first - r.send);
      for (size_t i = 1; i < r.events.size(); ++i) {
        const int64_t k = r.events[i].second - r.events[i - 1].second;
        const double gap = r.events[i].first - r.events[i - 1].first;
        for (int64_t j = 0; j < k; ++j) itl.push_back(gap / static_cast<double>(k));
      }
      spans.push_back({r.events.front().first, r.events.back().first});
      last = std::max(last, r.events.back().first);
    }
    if (r.cut) {
      ++res.cut;
      continue;
    }
    std::string why = r.error;
    if (why.empty() && r.usage_completion >= 0 && r.usage_completion != o.max_tokens) {
      why = "generated " + std::to_string(r.usage_completion) + " tokens, not " +
            std::to_string(o.max_tokens) + (r.message.empty() ? "" : ": " + r.message);
    }
    if (why.empty() && r.usage_completion < 0) why = "no usage in the stream";
    if (why.empty() && !r.message.empty()) why = "ended early: " + r.message;
    if (!why.empty()) {
      ++res.failed;
      if (res.errors.size() < 5) res.errors.push_back(why);
      continue;
    }
    ++res.ok;
    if (r.predicted_n > 1 && r.predicted_ms > 0) {
      res.server_decode_tokens += r.predicted_n - 1;
      res.server_decode_s += r.predicted_ms * 1e-3;
    }
    res.prompt_tokens += r.usage_prompt;
    res.completion_tokens += r.usage_completion;
  }
  res.wall_s = last;
  res.aggregate_tok_s = last > 0 ? static_cast<double>(res.streamed_tokens) / last : 0;
  res.ttft_s = Summarize(ttft);
  res.itl_s = Summarize(itl);
  std::vector<std::vector<std::pair<double, int64_t>>> events;
  events.reserve(recs.size());
  for (const Record& r : recs) events.push_back(r.events);
  const DecodeWindow w = ComputeDecodeWindow(events, K);
  res.decode_window_s = w.seconds;
  res.decode_window_tokens = w.tokens;
  if (res.decode_window_s > 0) {
    res.decode_tok_s = static_cast<double>(res.decode_window_tokens) / res.decode_window_s;
  }
  return res;
}

}  // namespace strata::serve
