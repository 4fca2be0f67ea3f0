// The server's counters, gauges and latency histograms, written out in Prometheus' text format
// for GET /metrics. Thread-safe: the HTTP threads and the scheduler thread both record.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strata::serve {

// A cumulative histogram over fixed upper bounds (seconds), as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // "NAME_bucket{le=...} N" lines, then NAME_sum and NAME_count.
  void Write(const std::string& name, std::string* out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds_.size() + 1]; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One finished HTTP request on `endpoint` ("/v1/completions") with its status code.
  void CountRequest(const std::string& endpoint, int status);
  void AddTokens(int64_t prompt, int64_t completion);
  void CountCancelled();
  void CountBudgetStop();
  // A decode step of the running sequences taken between two chunks of a new prompt's prefill.
  void CountInterleavedStep();
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterToken(double seconds);
  // Set by the scheduler after every step.
  struct Gauges {
    int64_t queue_depth = 0;
    int64_t active_sequences = 0;
    int64_t slots = 0;
    int64_t kv_budget_bytes = 0;
    // per policy name: resident bytes now, bytes read by the last decode step, sequences
    std::map<std::string, int64_t> resident_by_policy, read_by_policy, sequences_by_policy;
  };
  void SetGauges(Gauges g);
  Gauges gauges() const;
  int64_t requests(const std::string& endpoint, int status) const;
  int64_t cancelled() const;
  int64_t interleaved_steps() const;

  // The Prometheus text exposition.
  std::string Text() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cancelled_ = 0, budget_stops_ = 0,
          interleaved_steps_ = 0;
  Histogram ttft_, itl_;
  Gauges gauges_;
};

}  // namespace strata::serve
