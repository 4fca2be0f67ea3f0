// The scheduler's thread: admission against slots and the KV budget, chunked prefill interleaved
// with decode steps, and the per-sequence sampling and stop rules (those of `strata generate`).
#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace strata::serve {

namespace {

// The model's log-softmax at `id`, and the `top` most likely tokens' (ties by id), in float64.
Sequence::TokenLogprob Logprobs(const float* logits, int64_t n, int32_t id, int top) {
  double max = logits[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - max);
  const double log_z = max + std::log(sum);
  Sequence::TokenLogprob out;
  out.id = id;
  out.logprob = static_cast<float>(double(logits[id]) - log_z);
  if (top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
    const int64_t k = std::min<int64_t>(top, n);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int64_t i = 0; i < k; ++i) {
      out.top.emplace_back(ids[i], static_cast<float>(double(logits[ids[i]]) - log_z));
    }
  }
  return out;
}

// The most a decode step can add to a cache's resident bytes: one row per layer, or a whole new
// page of them when the row starts one (the store allocates LayerStore::kPageRows rows at once).
int64_t StepGrowth(const KvCache& c) {
  const int64_t rows = c.n_tokens() % LayerStore::kPageRows == 0 ? LayerStore::kPageRows : 1;
  return c.FullBytesPerToken() * rows;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes at the end of `s` that start a UTF-8 character not yet complete (0 when it ends on a
// character boundary). Invalid bytes count as complete: they are shown as they are.
size_t IncompleteUtf8Tail(const std::string& s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0   ? 2
                        : (c & 0xF0) == 0xE0 ? 3
                        : (c & 0xF8) == 0xF0 ? 4
                                             : 1;
    return need > back ? back : 0;
  }
  return 0;
}

std::string BytesText(int64_t b) {
  const double mib = static_cast<double>(b) / (1024.0 * 1024.0);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", mib);
  return buf;
}

}  // namespace

StopText::StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

bool StopText::Append(const std::string& piece) {
  if (stopped_) return true;
  const size_t before = text_.size();
  text_ += piece;
  // A stop sequence that ends in the new piece starts at most max_stop_ - 1 bytes before it.
  const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, text_.find(s, from));
  if (cut == std::string::npos) return false;
  text_.resize(std::max(cut, taken_));  // never before what was already shown (held back)
  stopped_ = true;
  return true;
}

std::string StopText::TakeReady() {
  size_t end = text_.size();
  if (!stopped_) {
    // Hold back the longest tail that is a prefix of a stop sequence.
    size_t hold = 0;
    for (const auto& s : stops_) {
      for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    end -= hold;
    end -= IncompleteUtf8Tail(text_.substr(0, end));
  }
  if (end <= taken_) return "";
  std::string out = text_.substr(taken_, end - taken_);
  taken_ = end;
  return out;
}

std::string StopText::TakeRest() {
  std::string out = text_.substr(std::min(taken_, text_.size()));
  taken_ = text_.size();
  return out;
}

void Sequence::Push(std::string delta, int64_t tokens) {
  if (delta.empty()) return;
  std::lock_guard<std::mutex> l(mu_);
  deltas_.push_back(std::move(delta));
  pushed_tokens_ = tokens;
  cv_.notify_all();
}

void Sequence::Finish(Result r) {
  std::lock_guard<std::mutex> l(mu_);
  result_ = std::move(r);
  cv_.notify_all();
}

bool Sequence::Next(std::chrono::milliseconds timeout, std::string* delta,
                    std::optional<Result>* result, int64_t* tokens,
                    std::vector<TokenLogprob>* logprobs) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return !deltas_.empty() || result_.has_value(); })) {
    return false;
  }
  delta->clear();
  while (!deltas_.empty()) {
    *delta += deltas_.front();
    deltas_.pop_front();
  }
  if (tokens) *tokens = pushed_tokens_;
  if (logprobs) {
    logprobs->assign(logprobs_.begin() + static_cast<std::ptrdiff_t>(logprobs_taken_),
                     logprobs_.end());
    logprobs_taken_ = logprobs_.size();
  }
  // The end is reported once every delta before it is taken.
  if (result_.has_value()) *result = result_;
  return true;
}

Sequence::Result Sequence::Wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return result_.has_value(); });
  deltas_.clear();
  return *result_;
}

bool Sequence::WaitFor(std::chrono::milliseconds timeout, Result* out) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return result_.has_value(); })) return false;
  deltas_.clear();
  *out = *result_;
  return true;
}

Status DecodeBatch(Model* model, const int32_t* tokens, int batch, KvCache* const* caches,
                   ThreadPool* pool, float* logits) {
  // One step for the whole batch: each weight matrix is read once, and every sequence's logits
  // are bit-identical to its solo Model::Decode (model/decode_batch_test.cc). A sequence whose
  // policy fails mid-step fails its own cache only (KvCache::status names it).
  std::vector<Status> rows;
  Model::DecodeBatchOptions opt;
  opt.row_status = &rows;
  Status st = model->DecodeBatch(tokens, batch, caches, pool, logits, opt);
  if (st.ok() || !rows.empty()) return st;
  // Refused before any cache saw an event (e.g. one sequence at its limit, a bad token): run the
  // sequences one by one so only the offending one fails and the others still advance.
  const int64_t n_vocab = model->config().n_vocab;
  Status first;
  for (int b = 0; b < batch; ++b) {
    Status one = model->Decode(tokens[b], caches[b], pool, logits + b * n_vocab);
    if (!one.ok() && first.ok()) first = one;
  }
  return first;
}

Scheduler::Scheduler(Model* model, ThreadPool* pool, SchedulerOptions o, Metrics* metrics)
    : model_(model),
      pool_(pool),
      o_(o),
      metrics_(metrics),
      tok_(model->tokenizer()),
      n_vocab_(model->config().n_vocab) {
  if (tok_) {
    for (int32_t id = 0; id < n_vocab_; ++id) {
      if (tok_->IsEog(id)) eog_ids_.push_back(id);
    }
  }
  UpdateGauges();
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Stop(); }

int64_t Scheduler::PromptReserve(const KvCache& cache, int64_t n_prompt) {
  return cache.PeakResidentBytes(n_prompt);
}

Scheduler::Admission Scheduler::Submit(std::shared_ptr<Sequence> seq) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return Admission::kStopping;
  // Requests for free slots pass through the queue too, so they do not count against it (with
  // --queue 0 a request is taken only when a slot is free).
  const int64_t free_slots = std::max<int64_t>(0, o_.parallel - active_.load());
  if (static_cast<int64_t>(queue_.size()) >= o_.queue + free_slots) return Admission::kQueueFull;
  queue_.push_back(std::move(seq));
  cv_.notify_all();
  return Admission::kQueued;
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

int64_t Scheduler::queue_depth() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Scheduler::active() const { return active_.load(); }

int64_t Scheduler::ResidentTotal() const {
  int64_t total = 0;
  for (const auto& s : running_) total += s->cache->ResidentBytes();
  if (prefilling_) total += prefilling_->reserve_;
  return total;
}

void Scheduler::End(Sequence* s, std::string finish_reason, std::string message, Status error,
                    bool shutdown) {
  Sequence::Result r;
  r.shutdown = shutdown;
  r.finish_reason = std::move(finish_reason);
  r.message = std::move(message);
  r.error = std::move(error);
  r.prompt_tokens = static_cast<int64_t>(s->prompt.size());
  r.completion_tokens = s->generated_;
  r.stopped_by_text = s->stopped_by_text_;
  if (s->generated_ > 0) {
    r.prompt_s = Seconds(s->prefill_start_, s->first_token_);
    r.predicted_s = Seconds(s->first_token_, s->last_token_);
  }
  if (s->text_) {
    s->Push(s->text_->TakeRest(), s->generated_);
    r.text = s->text_->text();
  }
  {
    std::lock_guard<std::mutex> l(s->mu_);
    r.logprobs = s->logprobs_;
  }
  metrics_->AddTokens(0, s->generated_);
  // The cache (and any archive file of its policy) goes now, not when the handler lets go.
  s->cache.reset();
  s->logits_.clear();
  s->logits_.shrink_to_fit();
  s->Finish(std::move(r));
}

void Scheduler::RemoveEnded() {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const std::shared_ptr<Sequence>& s) { return !s->cache; }),
                 running_.end());
  active_.store(static_cast<int64_t>(running_.size()) + (prefilling_ ? 1 : 0));
}

void Scheduler::Step() {
  const auto now = Clock::now();
  std::vector<Sequence*> batch;
  std::vector<int32_t> ids;
  for (const auto& sp : running_) {
    Sequence* s = sp.get();
    if (s->cancelled()) {
      metrics_->CountCancelled();
      End(s, "length", "cancelled: the client went away");
      continue;
    }
    const int64_t n_prompt = static_cast<int64_t>(s->prompt.size());
    // Token i sits at position n_prompt + i: the context is full once that reaches ctx.
    if (o_.ctx > 0 && n_prompt + s->generated_ >= o_.ctx) {
      End(s, "length", "the context size " + std::to_string(o_.ctx) + " is reached");
      continue;
    }
    const StatusOr<int32_t> next =
        s->sampler_->Next(s->logits_.data(), n_vocab_, n_prompt + s->generated_);
    if (!next.ok()) {  // non-finite logits: a failed generation, never a made-up token
      End(s, "length", "", next.status());
      continue;
    }
    const int32_t id = *next;
    if (!s->ignore_eos && tok_->IsEog(id)) {
      End(s, "stop", "");
      continue;
    }
    s->sampler_->Accept(id);  // the penalties' window (a no-op when they are off)
    if (s->top_logprobs >= 0) {
      Sequence::TokenLogprob lp = Logprobs(s->logits_.data(), n_vocab_, id, s->top_logprobs);
      std::lock_guard<std::mutex> l(s->mu_);
      s->logprobs_.push_back(std::move(lp));
    }
    ++s->generated_;
    if (s->generated_ == 1) {
      s->first_token_ = now;
      metrics_->ObserveTimeToFirstToken(Seconds(s->arrival, now));
    } else {
      metrics_->ObserveInterToken(Seconds(s->last_token_, now));
    }
    s->last_token_ = now;
    const bool stopped = s->text_->Append(tok_->DecodeToken(id));
    s->Push(s->text_->TakeReady(), s->generated_);
    if (stopped) {
      s->stopped_by_text_ = true;
      End(s, "stop", "");
      continue;
    }
    if (s->generated_ >= s->max_tokens) {  // the last token's logits are never used
      End(s, "length", "");
      continue;
    }
    batch.push_back(s);
    ids.push_back(id);
  }
  // The budget: a decoded token adds at most StepGrowth bytes to its cache. When the step could
  // take the resident total over the budget, the youngest sequences stop first (the older ones
  // have run longer and are nearer their end).
  int64_t total = 0;
  for (const auto& sp : running_) {
    if (sp->cache) total += sp->cache->ResidentBytes();
  }
  if (prefilling_) total += prefilling_->reserve_;
  int64_t growth = 0;
  for (Sequence* s : batch) growth += StepGrowth(*s->cache);
  while (!batch.empty() && total + growth > o_.kv_budget) {
    size_t youngest = 0;
    for (size_t i = 1; i < batch.size(); ++i) {
      if (batch[i]->order_ > batch[youngest]->order_) youngest = i;
    }
    Sequence* s = batch[youngest];
    const int64_t held = s->cache->ResidentBytes();
    growth -= StepGrowth(*s->cache);
    metrics_->CountBudgetStop();
    End(s, "length",
        "stopped: the next token would take the KV cache past the server's budget (--kv-budget " +
            BytesText(o_.kv_budget) + "; " + BytesText(total) + " resident, this sequence " +
            BytesText(held) + ")");
    total -= held;
    batch.erase(batch.begin() + youngest);
    ids.erase(ids.begin() + youngest);
  }
  if (!batch.empty()) {
    const int b = static_cast<int>(batch.size());
    batch_caches_.assign(b, nullptr);
    for (int i = 0; i < b; ++i) batch_caches_[i] = batch[i]->cache.get();
    batch_logits_.resize(static_cast<size_t>(b) * n_vocab_);
    Status st =
        DecodeBatch(model_, ids.data(), b, batch_caches_.data(), pool_, batch_logits_.data());
    if (o_.on_event) {
      o_.on_event({StepEvent::Kind::kDecode, b, static_cast<int64_t>(running_.size())});
    }
    // A failed cache names itself (KvCache::status); an error no cache of the batch records is
    // the whole batch's.
    bool any_cache_failed = false;
    for (int i = 0; i < b; ++i) any_cache_failed |= !batch[i]->cache->status().ok();
    for (int i = 0; i < b; ++i) {
      Sequence* s = batch[i];
      const Status own = s->cache->status();
      if (!own.ok() || (!st.ok() && !any_cache_failed)) {
        End(s, "length", "", own.ok() ? st : own);
        continue;
      }
      std::memcpy(s->logits_.data(), batch_logits_.data() + static_cast<size_t>(i) * n_vocab_,
                  sizeof(float) * n_vocab_);
    }
  }
  RemoveEnded();
  UpdateGauges();
}

std::vector<SlotInfo> Scheduler::Slots() const {
  std::lock_guard<std::mutex> l(slots_mu_);
  return slots_;
}

void Scheduler::UpdateGauges() {
  Metrics::Gauges g;
  {
    std::lock_guard<std::mutex> l(mu_);
    g.queue_depth = static_cast<int64_t>(queue_.size());
  }
  g.slots = o_.parallel;
  g.kv_budget_bytes = o_.kv_budget;
  g.active_sequences = active_.load();
  for (const auto& s : running_) {
    if (!s->cache) continue;
    g.resident_by_policy[s->policy_name] += s->cache->ResidentBytes();
    g.read_by_policy[s->policy_name] += s->cache->counters().last_step.bytes_read;
    g.sequences_by_policy[s->policy_name] += 1;
  }
  metrics_->SetGauges(std::move(g));
  std::vector<SlotInfo> slots;
  auto add = [&](const Sequence& s, bool prefilling) {
    SlotInfo i;
    i.id = s.order_;
    i.policy = s.policy_name;
    i.prompt_tokens = static_cast<int64_t>(s.prompt.size());
    i.generated_tokens = s.generated_;
    i.resident_bytes = s.cache ? s.cache->ResidentBytes() : 0;
    i.read_bytes_step = s.cache ? s.cache->counters().last_step.bytes_read : 0;
    i.prefilling = prefilling;
    slots.push_back(std::move(i));
  };
  for (const auto& s : running_) add(*s, false);
  if (prefilling_) add(*prefilling_, true);
  std::lock_guard<std::mutex> l(slots_mu_);
  slots_ = std::move(slots);
}

void Scheduler::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty() || !running_.empty(); });
      if (stopping_) break;
      // Admission: a free slot, and room in the budget for the prompt's reserve (the first
      // request is admitted whatever the others hold once nothing runs: the server refused any
      // prompt whose reserve alone is over the budget).
      while (!queue_.empty() && static_cast<int>(running_.size()) < o_.parallel) {
        std::shared_ptr<Sequence> s = queue_.front();
        if (s->cancelled()) {
          queue_.pop_front();
          metrics_->CountCancelled();
          l.unlock();
          End(s.get(), "length", "cancelled: the client went away");
          l.lock();
          continue;
        }
        s->reserve_ = PromptReserve(*s->cache, static_cast<int64_t>(s->prompt.size()));
        if (!running_.empty() && ResidentTotal() + s->reserve_ > o_.kv_budget) break;
        queue_.pop_front();
        prefilling_ = std::move(s);
        break;  // one prefill per iteration, so running streams get a step between prompts
      }
    }
    active_.store(static_cast<int64_t>(running_.size()) + (prefilling_ ? 1 : 0));
    if (prefilling_) {
      Sequence* s = prefilling_.get();
      s->prefill_start_ = Clock::now();
      s->order_ = next_order_++;
      SamplerOptions so = s->sampler;
      if (s->ignore_eos) {
        for (const int32_t id : eog_ids_) {
          so.logit_bias.emplace_back(id, -std::numeric_limits<float>::infinity());
        }
      }
      s->sampler_ = std::make_unique<Sampler>(so);
      // The penalty window spans the prompt, as `strata generate` (and llama.cpp) count it.
      for (const int32_t id : s->prompt) s->sampler_->Accept(id);
      s->text_ = std::make_unique<StopText>(s->stop);
      s->logits_.assign(n_vocab_, 0.f);
      const int64_t n = static_cast<int64_t>(s->prompt.size());
      // The step budget: the prompt goes in chunks of at most prefill_chunk tokens, and after
      // every chunk but the last the running sequences take a decode step (after the last one
      // the loop's own step follows), so between two tokens of a running stream at most one
      // chunk is prefilled. The prefill stays one Model::Prefill call (one compression point),
      // so its result is `strata generate --chunk N`'s.
      int64_t fed = 0;
      auto between_chunks = [&](int64_t done, int64_t total) {
        if (o_.on_event) {
          o_.on_event(
              {StepEvent::Kind::kPrefillChunk, done - fed, static_cast<int64_t>(running_.size())});
        }
        fed = done;
        if (done < total && !running_.empty()) {
          metrics_->CountInterleavedStep();
          Step();
        }
      };
      Status st = model_->Prefill(s->prompt.data(), n, o_.prefill_chunk, s->cache.get(), pool_,
                                  s->logits_.data(), nullptr, between_chunks);
      metrics_->AddTokens(n, 0);
      std::shared_ptr<Sequence> done = std::move(prefilling_);
      prefilling_.reset();
      if (!st.ok()) {
        End(done.get(), "length", "", st.WithContext("prefill"));
      } else if (done->cancelled()) {
        metrics_->CountCancelled();
        End(done.get(), "length", "cancelled: the client went away");
      } else {
        running_.push_back(std::move(done));
      }
      RemoveEnded();
    }
    if (!running_.empty()) Step();
    UpdateGauges();
  }
  // Shutdown: every sequence ends now and its cache is released on this thread.
  std::deque<std::shared_ptr<Sequence>> queued;
  {
    std::lock_guard<std::mutex> l(mu_);
    queued.swap(queue_);
  }
  const std::string why = "the server is shutting down";
  for (auto& s : queued) End(s.get(), "length", why, {}, /*shutdown=*/true);
  for (auto& s : running_) {
    if (s->cache) End(s.get(), "length", why, {}, /*shutdown=*/true);
  }
  running_.clear();
  active_.store(0);
  UpdateGauges();
}

}  // namespace strata::serve
