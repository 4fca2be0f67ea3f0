// Prometheus text exposition of the server's metrics.
#include "serve/metrics.h"

#include <cstdio>

namespace strata::serve {

namespace {

std::string Real(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void Header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// Label values are policy names and endpoint paths; escape what the format requires anyway.
std::string Label(const std::string& v) {
  std::string s;
  for (char c : v) {
    if (c == '\\' || c == '"') s += '\\';
    if (c == '\n') {
      s += "\\n";
      continue;
    }
    s += c;
  }
  return s;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Write(const std::string& name, std::string* out) const {
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += name + "_bucket{le=\"" + Real(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  *out += name + "_sum " + Real(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    // Time to first token spans queueing and prefill (up to minutes for long prompts); the
    // inter-token gap is one decode step (milliseconds), so the two get different ranges.
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{endpoint, status}];
}
void Metrics::AddTokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}
void Metrics::CountCancelled() {
  std::lock_guard<std::mutex> l(mu_);
  ++cancelled_;
}
void Metrics::CountBudgetStop() {
  std::lock_guard<std::mutex> l(mu_);
  ++budget_stops_;
}
void Metrics::CountInterleavedStep() {
  std::lock_guard<std::mutex> l(mu_);
  ++interleaved_steps_;
}
int64_t Metrics::interleaved_steps() const {
  std::lock_guard<std::mutex> l(mu_);
  return interleaved_steps_;
}
void Metrics::ObserveTimeToFirstToken(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.Observe(s);
}
void Metrics::ObserveInterToken(double s) {
  std::lock_guard<std::mutex> l(mu_);
  itl_.Observe(s);
}
void Metrics::SetGauges(Gauges g) {
  std::lock_guard<std::mutex> l(mu_);
  gauges_ = std::move(g);
}
Metrics::Gauges Metrics::gauges() const {
  std::lock_guard<std::mutex> l(mu_);
  return gauges_;
}
int64_t Metrics::requests(const std::string& endpoint, int status) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = requests_.find({endpoint, status});
  return it == requests_.end() ? 0 : it->second;
}
int64_t Metrics::cancelled() const {
  std::lock_guard<std::mutex> l(mu_);
  return cancelled_;
}

std::string Metrics::Text() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  Header(&o, "strata_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [k, n] : requests_) {
    o += "strata_requests_total{endpoint=\"" + Label(k.first) + "\",status=\"" +
         std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
  }
  Header(&o, "strata_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
  o += "strata_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  Header(&o, "strata_completion_tokens_total", "counter", "Tokens generated.");
  o += "strata_completion_tokens_total " + std::to_string(completion_tokens_) + "\n";
  Header(&o, "strata_cancelled_total", "counter",
         "Sequences whose client went away before they finished (their slot freed at once).");
  o += "strata_cancelled_total " + std::to_string(cancelled_) + "\n";
  Header(&o, "strata_kv_budget_stops_total", "counter",
         "Sequences stopped (finish_reason length) because the KV budget was exhausted.");
  o += "strata_kv_budget_stops_total " + std::to_string(budget_stops_) + "\n";
  Header(&o, "strata_prefill_interleaved_steps_total", "counter",
         "Decode steps of the running sequences taken between chunks of a new prompt's prefill.");
  o += "strata_prefill_interleaved_steps_total " + std::to_string(interleaved_steps_) + "\n";
  Header(&o, "strata_queue_depth", "gauge", "Requests waiting for a decode slot.");
  o += "strata_queue_depth " + std::to_string(gauges_.queue_depth) + "\n";
  Header(&o, "strata_active_sequences", "gauge", "Sequences holding a decode slot.");
  o += "strata_active_sequences " + std::to_string(gauges_.active_sequences) + "\n";
  Header(&o, "strata_slots", "gauge", "Decode slots (--parallel).");
  o += "strata_slots " + std::to_string(gauges_.slots) + "\n";
  Header(&o, "strata_kv_budget_bytes", "gauge", "The KV memory budget (--kv-budget).");
  o += "strata_kv_budget_bytes " + std::to_string(gauges_.kv_budget_bytes) + "\n";
  Header(&o, "strata_kv_bytes_resident", "gauge",
         "KV cache bytes resident, by policy (the policies' own accounting).");
  for (const auto& [p, b] : gauges_.resident_by_policy) {
    o += "strata_kv_bytes_resident{policy=\"" + Label(p) + "\"} " + std::to_string(b) + "\n";
  }
  Header(&o, "strata_kv_bytes_read_per_step", "gauge",
         "KV cache bytes read by the last decode step, by policy.");
  for (const auto& [p, b] : gauges_.read_by_policy) {
    o += "strata_kv_bytes_read_per_step{policy=\"" + Label(p) + "\"} " + std::to_string(b) + "\n";
  }
  Header(&o, "strata_sequences_by_policy", "gauge", "Active sequences, by policy.");
  for (const auto& [p, b] : gauges_.sequences_by_policy) {
    o += "strata_sequences_by_policy{policy=\"" + Label(p) + "\"} " + std::to_string(b) + "\n";
  }
  Header(&o, "strata_time_to_first_token_seconds", "histogram",
         "From a request's arrival to its first generated token (queueing and prefill).");
  ttft_.Write("strata_time_to_first_token_seconds", &o);
  Header(&o, "strata_inter_token_latency_seconds", "histogram",
         "Between consecutive tokens of one sequence.");
  itl_.Write("strata_inter_token_latency_seconds", &o);
  return o;
}

}  // namespace strata::serve
