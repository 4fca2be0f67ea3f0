// The server's scheduler: a fixed number of decode slots and one KV memory budget, a bounded
// admission queue, and one thread that runs continuous-batching steps (one token for every
// active sequence per step, new prompts' prefill interleaved chunk by chunk).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/tokenizer.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "serve/metrics.h"

namespace strata::serve {

using Clock = std::chrono::steady_clock;

// Generated text as it may be shown: stop sequences are cut off (the text ends before the first
// one), and while a tail of the text could still become a stop sequence or is an incomplete UTF-8
// character it is held back, so a stream never shows text that the final answer does not have.
class StopText {
 public:
  explicit StopText(std::vector<std::string> stops);
  // Adds a decoded piece; true when the text now contains a stop sequence (the text is cut
  // before it and nothing more may be appended).
  bool Append(const std::string& piece);
  // The text not yet taken that can be shown now.
  std::string TakeReady();
  // At the end: everything not yet taken.
  std::string TakeRest();
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  size_t max_stop_ = 0;
  std::string text_;
  size_t taken_ = 0;
  bool stopped_ = false;
};

// One generation request as the scheduler runs it, shared with the HTTP handler that streams
// its output. The handler fills the inputs and calls Scheduler::Submit; the scheduler pushes text
// deltas and, once, the end; the handler reads them with Next. Cancel() (a client that went
// away) frees the sequence's slot and cache at the next step.
class Sequence {
 public:
  // Inputs (set before Submit).
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerOptions sampler;
  std::vector<std::string> stop;
  // End-of-generation tokens are never sampled (their logits -inf, as llama-server's ignore_eos
  // and `strata generate --ignore-eos`): every request runs to max_tokens.
  bool ignore_eos = false;
  // Log-probabilities: -1 off; else each generated token's and that many of the most likely
  // alternatives' (at most kMaxTopLogprobs), from the model's distribution (the softmax of its
  // logits, before bias, penalties, truncation and temperature).
  int top_logprobs = -1;
  std::unique_ptr<KvCache> cache;  // bound to its policy; released by the scheduler at the end
  std::string policy_name;         // Policy::name(), the metrics label
  Clock::time_point arrival = Clock::now();

  struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.f;
    std::vector<std::pair<int32_t, float>> top;  // most likely first (ties by id)
  };
  // The end of a sequence.
  struct Result {
    std::string finish_reason;  // "stop" | "length"
    std::string message;        // why it stopped early ("" when it simply ended)
    Status error;               // not OK: the model or cache failed (an HTTP 500)
    int64_t prompt_tokens = 0, completion_tokens = 0;
    std::string text;       // all of it (the concatenation of the deltas)
    bool shutdown = false;  // ended by Scheduler::Stop (the server is shutting down)
    std::vector<TokenLogprob> logprobs;  // every generated token's, when asked
    bool stopped_by_text = false;        // finish_reason "stop" from a stop string, not EOS
    // Server-side times, as llama-server's "timings" reports them: prompt = admission (the
    // prefill's start) to the first token; predicted = the first token to the last, in which
    // completion_tokens - 1 tokens were made. 0 when there was no token.
    double prompt_s = 0, predicted_s = 0;
  };
  // Waits up to `timeout` for output. Returns true with `delta` set (possibly empty) when there
  // was some or the sequence ended (then `*result` is set); false on timeout.
  // `tokens` (may be null): the tokens generated up to the end of `delta` (a delta may carry
  // several tokens, and a token whose text is held back arrives with a later delta).
  // `logprobs` (may be null): the generated tokens' log-probabilities not yet taken.
  bool Next(std::chrono::milliseconds timeout, std::string* delta, std::optional<Result>* result,
            int64_t* tokens = nullptr, std::vector<TokenLogprob>* logprobs = nullptr);
  // Blocks until the end and returns it.
  Result Wait();
  // Waits up to `timeout` for the end: true with `*out` set when it came (the deltas are dropped,
  // as Wait does).
  bool WaitFor(std::chrono::milliseconds timeout, Result* out);
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Scheduler;
  void Push(std::string delta, int64_t tokens);
  void Finish(Result r);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> deltas_;
  int64_t pushed_tokens_ = 0;  // the tokens generated up to the last delta pushed
  std::vector<TokenLogprob> logprobs_;  // all so far (scheduler appends under mu_)
  size_t logprobs_taken_ = 0;
  std::optional<Result> result_;
  std::atomic<bool> cancelled_{false};

  // Scheduler-thread state.
  int64_t order_ = 0;  // admission order (the youngest is stopped first when the budget is short)
  int64_t reserve_ = 0;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<StopText> text_;
  std::vector<float> logits_;  // [n_vocab] of the last forward
  int64_t generated_ = 0;
  bool stopped_by_text_ = false;
  Clock::time_point last_token_;
  Clock::time_point prefill_start_, first_token_;
};

// One running sequence as GET /slots shows it (a snapshot the scheduler publishes each step).
struct SlotInfo {
  int64_t id = 0;  // admission order
  std::string policy;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t resident_bytes = 0;     // its cache's ResidentBytes
  int64_t read_bytes_step = 0;    // bytes its last decode step read
  bool prefilling = false;
};

// What one scheduler step did (SchedulerOptions::on_event): a decode step of the running
// sequences, or one prefill chunk of the prompt being admitted.
struct StepEvent {
  enum class Kind { kDecode, kPrefillChunk };
  Kind kind = Kind::kDecode;
  int64_t tokens = 0;   // kDecode: sequences decoded (one token each); kPrefillChunk: its tokens
  int64_t running = 0;  // sequences decoding at that moment (the one being prefilled excluded)
};

// The default prefill step budget (tokens). On a CPU a 128-token chunk of a 125M model costs
// about as much as a few decode steps of a small batch, so a long prompt delays the running
// streams' next token by that much at most (docs/serve.md has the measurement).
inline constexpr int kDefaultPrefillChunk = 128;

struct SchedulerOptions {
  int parallel = 4;                      // decode slots
  int64_t kv_budget = int64_t{8} << 30;  // bytes, over every active sequence's ResidentBytes
  int queue = 64;                        // requests waiting for a slot; more are refused
  // The step budget of prefill: a new prompt is fed to the model in chunks of at most this many
  // tokens (one Model::Prefill call whose chunks these are), and between two chunks every running
  // sequence decodes one token, so a prompt being admitted holds a running stream's next token
  // back by one chunk, never by the whole prompt. Chunking changes no result beyond the f32
  // rounding of the prefill (model/model_test.cc DecodeEqualsFullRecomputeAndChunkingIsInvariant).
  int prefill_chunk = kDefaultPrefillChunk;
  int64_t ctx = 0;  // context size (0: no limit)
  // Tests and benchmarks (may be empty): called on the scheduler thread after every decode step
  // and every prefill chunk, in the order they ran.
  std::function<void(const StepEvent&)> on_event;
};

// The one call through which a step runs the model for every sequence in it: B tokens, B
// caches, logits [B, n_vocab], through Model::DecodeBatch (weights read once per step; each
// sequence bit-identical to its solo Decode).
Status DecodeBatch(Model* model, const int32_t* tokens, int batch, KvCache* const* caches,
                   ThreadPool* pool, float* logits);

class Scheduler {
 public:
  // The model, pool and metrics must outlive the scheduler; the pool is used by its thread only.
  Scheduler(Model* model, ThreadPool* pool, SchedulerOptions o, Metrics* metrics);
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return o_; }
  // The KV bytes a prompt of `n_prompt` tokens is reserved at admission: the most its cache can
  // hold while it has n_prompt rows, as its policy declares it (KvCache::PeakResidentBytes: the
  // page-rounded full rows, plus what the policy holds beside them while it prefills, e.g.
  // Geodesia's second copy until the compression point). A prompt whose reserve is over the
  // whole budget can never be admitted (the server refuses it with a 400).
  static int64_t PromptReserve(const KvCache& cache, int64_t n_prompt);

  enum class Admission { kQueued, kQueueFull, kStopping };
  // Queues a sequence (its cache created, its prompt tokenized and checked). kQueueFull: the
  // queue holds options().queue requests beyond the free slots already (a 429); kStopping: the
  // server is shutting down.
  Admission Submit(std::shared_ptr<Sequence> seq);
  // Ends every queued and running sequence (finish_reason "length", message naming the
  // shutdown), releases their caches, and joins the thread. Idempotent.
  void Stop();

  int64_t queue_depth() const;
  int64_t active() const;
  // The running sequences (and the one being prefilled) as of the last step.
  std::vector<SlotInfo> Slots() const;

 private:
  void Loop();
  // Samples the next token of every running sequence, ends those that are done, checks the
  // budget, and decodes the rest as one batch.
  void Step();
  void End(Sequence* s, std::string finish_reason, std::string message, Status error = {},
           bool shutdown = false);
  void RemoveEnded();
  int64_t ResidentTotal() const;
  void UpdateGauges();

  Model* model_;
  ThreadPool* pool_;
  SchedulerOptions o_;
  Metrics* metrics_;
  const Tokenizer* tok_;
  int64_t n_vocab_;
  std::vector<int32_t> eog_ids_;  // the vocabulary's end-of-generation tokens (ignore_eos bans)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Sequence>> queue_;
  bool stopping_ = false;
  std::atomic<int64_t> active_{0};
  mutable std::mutex slots_mu_;
  std::vector<SlotInfo> slots_;
  // Scheduler-thread state.
  std::vector<std::shared_ptr<Sequence>> running_;
  std::shared_ptr<Sequence> prefilling_;  // admitted, its prompt not yet in the cache
  int64_t next_order_ = 0;
  std::vector<int32_t> batch_tokens_;
  std::vector<KvCache*> batch_caches_;
  std::vector<float> batch_logits_;
  std::thread thread_;
};

}  // namespace strata::serve
