// The scheduler's step budget, counted in steps (SchedulerOptions::on_event), not time: a long
// prompt admitted while a stream runs is prefilled at most prefill_chunk tokens at a time, with a
// decode step of the running stream after every chunk, so the stream is never held back by more
// than one budgeted chunk; and the chunked prompt's result is the unchunked one's.
#include "serve/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/status_testing.h"
#include "io/gguf.h"
#include "kv/registry.h"
#include "model/synth.h"

namespace strata::serve {
namespace {

namespace fs = std::filesystem;

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(fs::temp_directory_path() /
                           ("strata_scheduler_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    SynthOptions so;
    so.seed = 11;
    ASSERT_OK(SynthGguf(so, *dir_ + "/tiny.gguf"));
    auto m = Model::Load(*dir_ + "/tiny.gguf");
    ASSERT_OK(m);
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }

  static std::shared_ptr<Sequence> MakeSequence(std::vector<int32_t> prompt, int64_t max_tokens) {
    auto s = std::make_shared<Sequence>();
    s->prompt = std::move(prompt);
    s->max_tokens = max_tokens;
    s->ignore_eos = true;
    auto c = model_->NewCache(MakePolicy(PolicySpec{"full", {}}).value());
    EXPECT_OK(c);
    s->policy_name = "full";
    s->cache = std::move(c).value();
    return s;
  }
  static std::vector<int32_t> Prompt(int64_t n, int32_t salt) {
    std::vector<int32_t> p(n);
    const int32_t v = static_cast<int32_t>(model_->config().n_vocab);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 7919 + salt) % (v - 3)) + 3;
    return p;
  }

  static Model* model_;
  static std::string* dir_;
};
Model* SchedulerTest::model_ = nullptr;
std::string* SchedulerTest::dir_ = nullptr;

TEST_F(SchedulerTest, ALongPromptHoldsRunningStreamsBackByOneBudgetedChunkAtMost) {
  constexpr int kBudget = 16;
  constexpr int64_t kLong = 200;  // 13 chunks: 12 of 16 tokens and one of 8
  std::mutex mu;
  std::vector<StepEvent> events;
  bool recording = false;
  SchedulerOptions o;
  o.parallel = 3;
  o.prefill_chunk = kBudget;
  o.on_event = [&](const StepEvent& e) {
    std::lock_guard<std::mutex> l(mu);
    if (recording) events.push_back(e);
  };
  Metrics metrics;
  ThreadPool pool(1);
  Scheduler sched(model_, &pool, o, &metrics);
  // Two streams generating until cancelled.
  auto a = MakeSequence(Prompt(5, 1), 1 << 20), b = MakeSequence(Prompt(9, 2), 1 << 20);
  ASSERT_EQ(sched.Submit(a), Scheduler::Admission::kQueued);
  ASSERT_EQ(sched.Submit(b), Scheduler::Admission::kQueued);
  for (auto* s : {a.get(), b.get()}) {
    std::string delta;
    std::optional<Sequence::Result> r;
    int64_t tokens = 0;
    while (tokens < 2) {
      ASSERT_TRUE(s->Next(std::chrono::seconds(60), &delta, &r, &tokens));
      ASSERT_FALSE(r.has_value());
    }
  }
  {
    std::lock_guard<std::mutex> l(mu);
    recording = true;  // both streams run: from here on every step is theirs or the long prompt's
  }
  auto c = MakeSequence(Prompt(kLong, 3), 1);
  ASSERT_EQ(sched.Submit(c), Scheduler::Admission::kQueued);
  const Sequence::Result rc = c->Wait();
  EXPECT_TRUE(rc.error.ok()) << rc.error.ToString();
  EXPECT_EQ(rc.completion_tokens, 1);
  // The long prompt's token was sampled in the step after its last chunk, before that step's
  // decode: wait until an event follows the last chunk, so that the decode is recorded too.
  for (int i = 0; i < 60000; ++i) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!events.empty() && events.back().kind == StepEvent::Kind::kDecode) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  a->Cancel();
  b->Cancel();
  a->Wait();
  b->Wait();
  std::lock_guard<std::mutex> l(mu);

  // The long prompt's chunks, and what ran between them.
  std::vector<size_t> chunk_at;
  int64_t prefilled = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind != StepEvent::Kind::kPrefillChunk) continue;
    EXPECT_LE(events[i].tokens, kBudget) << "chunk " << chunk_at.size();
    EXPECT_EQ(events[i].running, 2) << "chunk " << chunk_at.size();
    prefilled += events[i].tokens;
    chunk_at.push_back(i);
  }
  EXPECT_EQ(prefilled, kLong);
  ASSERT_EQ(chunk_at.size(), static_cast<size_t>((kLong + kBudget - 1) / kBudget));
  // Between two chunks exactly one decode step, of both running streams; and one right after the
  // last chunk (the loop's own step, which also samples the long prompt's one token).
  for (size_t j = 0; j + 1 < chunk_at.size(); ++j) {
    ASSERT_EQ(chunk_at[j + 1], chunk_at[j] + 2) << "between chunks " << j << " and " << j + 1;
    const StepEvent& d = events[chunk_at[j] + 1];
    EXPECT_EQ(d.kind, StepEvent::Kind::kDecode);
    EXPECT_EQ(d.tokens, 2) << "the running streams each decode one token between chunks";
  }
  ASSERT_GT(events.size(), chunk_at.back() + 1);
  EXPECT_EQ(events[chunk_at.back() + 1].kind, StepEvent::Kind::kDecode);
  EXPECT_EQ(metrics.interleaved_steps(), static_cast<int64_t>(chunk_at.size()) - 1);
}

// The first token of a chunked prompt is the unchunked one's (greedy; the chunking changes the
// logits by f32 rounding only: model/model_test.cc
// DecodeEqualsFullRecomputeAndChunkingIsInvariant), and the scheduler's generated tokens follow a
// solo Prefill + Decode of the same prompt.
TEST_F(SchedulerTest, ChunkedPrefillGivesTheSoloTokens) {
  const std::vector<int32_t> prompt = Prompt(150, 5);
  // Solo: one prefill call, then greedy decode.
  std::vector<int32_t> solo;
  {
    auto c = model_->NewCache(MakePolicy(PolicySpec{"full", {}}).value());
    ASSERT_OK(c);
    const int64_t v = model_->config().n_vocab;
    std::vector<float> logits(v);
    ASSERT_OK(model_->Prefill(prompt.data(), static_cast<int64_t>(prompt.size()), 1 << 20, c->get(),
                              nullptr, logits.data()));
    for (int i = 0; i < 6; ++i) {
      const int32_t id =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      solo.push_back(id);
      ASSERT_OK(model_->Decode(id, c->get(), nullptr, logits.data()));
    }
  }
  std::string solo_text;
  for (int32_t id : solo) solo_text += model_->tokenizer()->DecodeToken(id);
  for (int chunk : {7, 64}) {
    SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
    SchedulerOptions o;
    o.prefill_chunk = chunk;
    Metrics metrics;
    ThreadPool pool(1);
    Scheduler sched(model_, &pool, o, &metrics);
    auto s = MakeSequence(prompt, 6);
    ASSERT_EQ(sched.Submit(s), Scheduler::Admission::kQueued);
    const Sequence::Result r = s->Wait();
    ASSERT_TRUE(r.error.ok()) << r.error.ToString();
    EXPECT_EQ(r.completion_tokens, 6);
    EXPECT_EQ(r.text, solo_text);
  }
}

// A model whose logits are NaN (its output norm's weights NaN, as a corrupt file's would be): the
// sequence ends as a failed generation whose error names the position, not with tokens made up
// from NaN logits (the old argmax returned token 0 every step).
TEST_F(SchedulerTest, NonFiniteLogitsFailTheGenerationNamingThePosition) {
  auto f = GgufFile::Open(*dir_ + "/tiny.gguf");
  ASSERT_OK(f);
  GgufWriter w;
  for (const auto& [k, v] : (*f)->metadata()) {
    if (k != "general.alignment") w.Set(k, v);
  }
  bool poisoned = false;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    auto v = (*f)->Tensor(t.name);
    ASSERT_OK(v);
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(v->data),
                               static_cast<const uint8_t*>(v->data) + t.n_bytes);
    if (t.name == "output_norm.weight") {
      ASSERT_EQ(t.dtype, DType::kF32);
      const float nan = std::nanf("");
      for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
        std::memcpy(&bytes[i], &nan, sizeof(float));
      }
      poisoned = true;
    }
    ASSERT_OK(w.AddTensor(t.name, t.dtype, t.shape, bytes.data(), bytes.size()));
  }
  ASSERT_TRUE(poisoned);
  ASSERT_OK(w.WriteFile(*dir_ + "/nan.gguf"));
  auto m = Model::Load(*dir_ + "/nan.gguf");
  ASSERT_OK(m);
  Metrics metrics;
  ThreadPool pool(1);
  Scheduler sched(m->get(), &pool, SchedulerOptions{}, &metrics);
  auto s = std::make_shared<Sequence>();
  s->prompt = Prompt(5, 1);
  s->max_tokens = 4;
  s->ignore_eos = true;
  auto c = (*m)->NewCache(MakePolicy(PolicySpec{"full", {}}).value());
  ASSERT_OK(c);
  s->policy_name = "full";
  s->cache = std::move(c).value();
  ASSERT_EQ(sched.Submit(s), Scheduler::Admission::kQueued);
  const Sequence::Result r = s->Wait();
  ASSERT_FALSE(r.error.ok());
  EXPECT_EQ(r.error.code(), StatusCode::kDataLoss);
  EXPECT_NE(r.error.message().find("non-finite logits at position 5"), std::string::npos)
      << r.error.ToString();
  EXPECT_EQ(r.completion_tokens, 0);
}

}  // namespace
}  // namespace strata::serve
