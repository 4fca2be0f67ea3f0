// Model::DecodeBatch (issue 16, many sequences): one decode step for B sequences, each with its own
// cache, policy and position, must give every sequence the logits (bit for bit) and the cache
// events of its solo Decode, for every architecture and weight dtype; bad batches are refused
// before any cache sees an event; one sequence's policy failure leaves the others exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "kv/registry.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_decode_batch_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

struct Variant {
  std::string label;
  Arch arch;
  bool nope = false;
  std::string dims;
  std::vector<std::string> policies;  // cycled over the sequences (ParsePolicySpec syntax)
};

// Every architecture path: GQA (llama adjacent RoPE, qwen2 neox + biases, MHA tied), MLA with RoPE
// and NoPE, q LoRA, softmax and sigmoid MoE with and without shared experts, a dense deepseek2.
// Compressed policies where the geometry allows: kivi4 and h2o everywhere, geodesia on a head dim
// of 64 (its group), vestige on MLA.
std::vector<Variant> Variants() {
  const std::vector<std::string> gqa = {"full", "kivi4", "h2o:ratio=2"};
  const std::vector<std::string> mla = {"full", "vestige:ratio=2:block=64:kappa=2", "kivi4",
                                        "h2o:ratio=2"};
  return {
      {"llama", Arch::kLlama, false, "", gqa},
      {"llama_mha_tied", Arch::kLlama, false, "kv_heads=4,tied=1", gqa},
      {"llama_hd64", Arch::kLlama, false, "d_model=128,heads=4,kv_heads=2,head_dim=64",
       {"full", "geodesia:bits=4", "geodesia:bits=2"}},
      {"qwen2", Arch::kQwen2, false, "", gqa},
      {"deepseek2_rope", Arch::kDeepseek2, false, "", mla},
      {"deepseek2_nope", Arch::kDeepseek2, true, "", mla},
      {"deepseek2_qlora_sigmoid", Arch::kDeepseek2, false, "q_lora=24,gating=2,shared_experts=0",
       mla},
      {"deepseek2_dense", Arch::kDeepseek2, false, "experts=0,dense_layers=2", mla},
  };
}

std::unique_ptr<Model> MakeModel(const Variant& v, uint64_t seed, DType dtype,
                                 const std::string& file_type = "") {
  SynthOptions o;
  o.arch = v.arch;
  o.nope = v.nope;
  o.seed = seed;
  o.dtype = dtype;
  o.file_type = file_type;
  EXPECT_TRUE(o.ApplyDims(v.dims).ok());
  const std::string path = TempPath(v.label + "_" + std::string(DTypeName(dtype)) + file_type +
                                    "_" + std::to_string(seed) + ".gguf");
  Status st = SynthGguf(o, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  std::filesystem::remove(path);  // mapped already: the file goes when the model does
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<KvCache> NewCache(const Model& m, const std::string& policy) {
  auto spec = ParsePolicySpec(policy);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto p = MakePolicy(*spec);
  EXPECT_TRUE(p.ok()) << policy << ": " << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto c = m.NewCache(std::move(p).value());
  EXPECT_TRUE(c.ok()) << policy << ": " << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

void ExpectSameBits(const float* a, const float* b, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, a + i, 4);
    std::memcpy(&ub, b + i, 4);
    ASSERT_EQ(ua, ub) << what << " logit " << i << ": " << a[i] << " vs " << b[i];
  }
}

// Caches that took the same events hold the same rows and counted the same reads.
void ExpectSameCache(const KvCache& a, const KvCache& b, const std::string& what) {
  EXPECT_EQ(a.n_tokens(), b.n_tokens()) << what;
  EXPECT_EQ(a.counters().calls, b.counters().calls) << what;
  EXPECT_EQ(a.counters().reads, b.counters().reads) << what;
  EXPECT_EQ(a.counters().bytes_read_total, b.counters().bytes_read_total) << what;
  EXPECT_EQ(a.counters().rows_attended_total, b.counters().rows_attended_total) << what;
  EXPECT_EQ(a.ResidentBytes(), b.ResidentBytes()) << what;
}

// S sequences at different positions (prompts of different lengths, prefilled in chunks) with
// the variant's policies cycled over them: twin caches, one decoded solo, one in batches. Every
// step the batch is a different subset in a different order (B = S, then 1, 3, 2, S), so a
// sequence's result cannot depend on its batch-mates.
void RunVariant(const Variant& v, Model& m, ThreadPool* pool, Rng& rng) {
  const int64_t V = m.config().n_vocab;
  const int S = 5;
  const int prompt_len[S] = {1, 9, 40, 70, 150};
  std::vector<std::unique_ptr<KvCache>> solo(S), batch(S);
  std::vector<std::vector<int32_t>> toks(S);
  for (int s = 0; s < S; ++s) {
    const std::string& policy = v.policies[s % v.policies.size()];
    solo[s] = NewCache(m, policy);
    batch[s] = NewCache(m, policy);
    ASSERT_TRUE(solo[s] && batch[s]);
    toks[s].resize(prompt_len[s]);
    for (auto& t : toks[s]) t = static_cast<int32_t>(rng.Below(V));
    for (KvCache* c : {solo[s].get(), batch[s].get()}) {
      ASSERT_TRUE(m.Prefill(toks[s].data(), prompt_len[s], 16, c, pool, nullptr).ok()) << policy;
    }
  }
  const std::vector<std::vector<int>> steps = {
      {0, 1, 2, 3, 4}, {3}, {4, 0, 2}, {1, 3}, {2, 4, 1, 3, 0}, {0, 1, 2, 3, 4}};
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<int>& members = steps[step];
    const int B = static_cast<int>(members.size());
    std::vector<int32_t> next(B);
    std::vector<KvCache*> caches(B);
    for (int b = 0; b < B; ++b) {
      next[b] = static_cast<int32_t>(rng.Below(V));
      caches[b] = batch[members[b]].get();
    }
    std::vector<float> got(static_cast<size_t>(B) * V, -1.f);
    std::vector<Status> row_status;
    Model::DecodeBatchOptions opts;
    opts.row_status = &row_status;
    Status st = m.DecodeBatch(next.data(), B, caches.data(), pool, got.data(), opts);
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.ToString();
    ASSERT_EQ(row_status.size(), static_cast<size_t>(B));
    std::vector<float> want(V);
    for (int b = 0; b < B; ++b) {
      const int s = members[b];
      EXPECT_TRUE(row_status[b].ok());
      ASSERT_TRUE(m.Decode(next[b], solo[s].get(), pool, want.data()).ok());
      const std::string what = "step " + std::to_string(step) + " sequence " + std::to_string(s) +
                               " (" + solo[s]->policy().name() + ", position " +
                               std::to_string(solo[s]->n_tokens() - 1) + ", B " +
                               std::to_string(B) + ")";
      ExpectSameBits(got.data() + static_cast<size_t>(b) * V, want.data(), V, what);
      ExpectSameCache(*batch[s], *solo[s], what);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(DecodeBatchTest, EqualsSoloDecodeBitForBitEveryArchitecture) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  ThreadPool pool(2);
  for (const Variant& v : Variants()) {
    for (DType dtype : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(v.label + " " + std::string(DTypeName(dtype)) + " seed " +
                   std::to_string(seed));
      auto m = MakeModel(v, seed, dtype);
      ASSERT_TRUE(m);
      RunVariant(v, *m, &pool, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// Quantized weights (the int8-activation kernels): Q8_0, and Q4_K_M's mix of 256-block types
// (Q4_K, Q5_0, Q6_K; tensors whose width is not a multiple of 256 fall back as llama.cpp's mix
// does), on a GQA and an MoE MLA model; no pool too (the caller thread alone). (Every quantized
// product rounds its input to int8 blocks, which hides 1-ulp differences of the hidden state, so
// the float models above are the sharper check of summation order; this one checks the int8
// paths.)
TEST(DecodeBatchTest, EqualsSoloDecodeBitForBitQuantized) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  ThreadPool pool(2);
  const std::vector<Variant> all = Variants();
  for (const char* label : {"llama", "deepseek2_rope"}) {
    const Variant& v = *std::find_if(all.begin(), all.end(),
                                     [&](const Variant& x) { return x.label == label; });
    for (const std::string ft : {"Q8_0", "Q4_K_M"}) {
      SCOPED_TRACE(v.label + " " + ft + " seed " + std::to_string(seed));
      Variant wide = v;
      wide.dims = std::string(v.dims.empty() ? "" : v.dims + ",") + "d_model=256,ff=512";
      auto m = MakeModel(wide, seed, DType::kF32, ft);
      ASSERT_TRUE(m);
      RunVariant(wide, *m, &pool, rng);
      if (HasFatalFailure()) return;
      RunVariant(wide, *m, nullptr, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// A policy that reads like full until its layer holds `fail_rows` rows, then fails every read:
// a stand-in for a policy error mid-generation (e.g. an archive read failure).
class FailingPolicy final : public Policy {
 public:
  explicit FailingPolicy(int64_t fail_rows) : fail_rows_(fail_rows) {}
  std::string name() const override { return "failing"; }
  Status Bind(const std::vector<LayerGeometry>& layers) override { return full_.Bind(layers); }
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override {
    if (store.n_rows() >= fail_rows_) {
      return IoError("injected read failure at " + std::to_string(store.n_rows()) + " rows");
    }
    return full_.Read(layer, store, q, limit, pool, st, stats);
  }

 private:
  FullPolicy full_;
  int64_t fail_rows_;
};

TEST(DecodeBatchTest, OneFailingSequenceLeavesTheOthersExact) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  ThreadPool pool(2);
  for (const Variant& v : {Variants()[0], Variants()[4]}) {
    SCOPED_TRACE(v.label + " seed " + std::to_string(seed));
    auto m = MakeModel(v, seed, DType::kF16);
    ASSERT_TRUE(m);
    const int64_t V = m->config().n_vocab;
    auto bad = m->NewCache(std::make_unique<FailingPolicy>(12));
    ASSERT_TRUE(bad.ok());
    auto a = NewCache(*m, "full"), a_solo = NewCache(*m, "full");
    auto b = NewCache(*m, "kivi4"), b_solo = NewCache(*m, "kivi4");
    std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};  // 11 rows: fails at 12
    for (KvCache* c : {bad->get(), a.get(), a_solo.get(), b.get(), b_solo.get()}) {
      ASSERT_TRUE(m->Prefill(prompt.data(), 11, 4, c, &pool, nullptr).ok());
    }
    KvCache* caches[] = {a.get(), bad->get(), b.get()};
    const int32_t next[] = {7, 8, 9};
    std::vector<float> got(3 * V), want(V);
    std::vector<Status> row_status;
    Model::DecodeBatchOptions opts;
    opts.row_status = &row_status;
    Status st = m->DecodeBatch(next, 3, caches, &pool, got.data(), opts);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("injected read failure"), std::string::npos) << st.ToString();
    ASSERT_EQ(row_status.size(), 3u);
    EXPECT_TRUE(row_status[0].ok());
    EXPECT_FALSE(row_status[1].ok());
    EXPECT_TRUE(row_status[2].ok());
    EXPECT_FALSE((*bad)->status().ok());  // the failed cache refuses every later call
    ASSERT_TRUE(m->Decode(7, a_solo.get(), &pool, want.data()).ok());
    ExpectSameBits(got.data(), want.data(), V, "sequence 0");
    ASSERT_TRUE(m->Decode(9, b_solo.get(), &pool, want.data()).ok());
    ExpectSameBits(got.data() + 2 * V, want.data(), V, "sequence 2");
    ExpectSameCache(*a, *a_solo, "sequence 0");
    ExpectSameCache(*b, *b_solo, "sequence 2");
    // The survivors go on in the next batch; the failed one is refused by name.
    KvCache* again[] = {b.get(), bad->get()};
    st = m->DecodeBatch(next, 2, again, &pool, got.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("sequence 1: the cache failed earlier"), std::string::npos)
        << st.ToString();
    KvCache* survivors[] = {b.get(), a.get()};
    ASSERT_TRUE(m->DecodeBatch(next, 2, survivors, &pool, got.data()).ok());
  }
}

TEST(DecodeBatchTest, BadBatchesAreClearErrorsAndTouchNoCache) {
  const uint64_t seed = TestSeed();
  auto m = MakeModel(Variants()[0], seed, DType::kF32);
  auto other = MakeModel(Variants()[4], seed, DType::kF32);  // MLA: another geometry
  ASSERT_TRUE(m && other);
  const int64_t V = m->config().n_vocab;
  auto a = NewCache(*m, "full");
  auto b = NewCache(*m, "kivi4");
  auto foreign = NewCache(*other, "full");
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  ASSERT_TRUE(m->Prefill(prompt.data(), 5, 5, a.get(), nullptr, nullptr).ok());
  ASSERT_TRUE(m->Prefill(prompt.data(), 3, 5, b.get(), nullptr, nullptr).ok());
  const int64_t a_calls = a->counters().calls, b_calls = b->counters().calls;
  std::vector<float> logits(3 * V);
  const int32_t toks[] = {1, 2, 3};
  auto expect = [&](Status s, StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(text), std::string::npos) << s.ToString();
    // Refused before any event: both caches are as they were.
    EXPECT_EQ(a->n_tokens(), 5);
    EXPECT_EQ(b->n_tokens(), 3);
    EXPECT_EQ(a->counters().calls, a_calls);
    EXPECT_EQ(b->counters().calls, b_calls);
    EXPECT_FALSE(a->in_call());
    EXPECT_FALSE(b->in_call());
  };
  KvCache* ab[] = {a.get(), b.get()};
  expect(m->DecodeBatch(toks, 0, ab, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "DecodeBatch of 0 sequences");
  expect(m->DecodeBatch(toks, -2, ab, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "DecodeBatch of -2 sequences");
  KvCache* with_null[] = {a.get(), nullptr};
  expect(m->DecodeBatch(toks, 2, with_null, nullptr, logits.data()),
         StatusCode::kInvalidArgument, "sequence 1: null cache");
  KvCache* twice[] = {a.get(), b.get(), a.get()};
  expect(m->DecodeBatch(toks, 3, twice, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "cache appears twice");
  KvCache* mixed[] = {a.get(), foreign.get()};
  expect(m->DecodeBatch(toks, 2, mixed, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "sequence 1: the cache was not made for this model");
  const int32_t bad_tok[] = {1, static_cast<int32_t>(V)};
  expect(m->DecodeBatch(bad_tok, 2, ab, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "sequence 1: token id " + std::to_string(V) + " is outside the vocabulary");
  const int32_t neg_tok[] = {-1, 1};
  expect(m->DecodeBatch(neg_tok, 2, ab, nullptr, logits.data()), StatusCode::kInvalidArgument,
         "sequence 0: token id -1");
  Model::DecodeBatchOptions limit;
  limit.ctx_limit = 5;  // a holds 5 tokens: at its limit; b (3) is not
  expect(m->DecodeBatch(toks, 2, ab, nullptr, logits.data(), limit), StatusCode::kOutOfRange,
         "sequence 0: the cache holds 5 tokens, the context limit is 5");
  limit.ctx_limit = -1;
  expect(m->DecodeBatch(toks, 2, ab, nullptr, logits.data(), limit), StatusCode::kInvalidArgument,
         "context limit -1");
  // A cache inside another call.
  ASSERT_TRUE(b->BeginCall(0, CallKind::kDecode).ok());
  {
    KvCache* one[] = {b.get()};
    Status s = m->DecodeBatch(toks, 1, one, nullptr, logits.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("sequence 0: the cache is inside another call"), std::string::npos)
        << s.ToString();
  }
  ASSERT_TRUE(b->EndCall().ok());
  // Below the limit the same batch runs, and logits may be null.
  limit.ctx_limit = 6;
  ASSERT_TRUE(m->DecodeBatch(toks, 2, ab, nullptr, logits.data(), limit).ok());
  ASSERT_TRUE(m->DecodeBatch(toks, 2, ab, nullptr, nullptr).ok());
  EXPECT_EQ(a->n_tokens(), 7);
  EXPECT_EQ(b->n_tokens(), 5);
}

}  // namespace
}  // namespace strata
