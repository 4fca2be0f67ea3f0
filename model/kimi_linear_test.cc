// kimi-linear: the KDA kernels (model/kda.h) against float64 references, MoE routing
// (model/moe.h) against a float64 reference, and a tiny synthetic kimi-linear model end to end:
// prefill chunking and decode handover, the recurrent state in the cache, every cache policy on
// its MLA layers, and bad files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/rng.h"
#include "io/gguf.h"
#include "kv/registry.h"
#include "model/kda.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/synth.h"

namespace strata {
namespace {

// ---------------------------------------------------------------------------------------------
// KDA kernels

struct KdaCase {
  int T, dk, dv;
  std::vector<float> q, k, v, g, beta, S0;
};

void L2(float* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double{x[i]} * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(s));
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

// Random inputs: unit q (then / sqrt(dk)) and k, g in [-strong, 0], beta in (0, 1), S0 != 0.
KdaCase RandomCase(Rng& rng, int T, int dk, int dv, float strong) {
  KdaCase c{T, dk, dv, {}, {}, {}, {}, {}, {}};
  c.q.resize(T * dk);
  c.k.resize(T * dk);
  c.v.resize(T * dv);
  c.g.resize(T * dk);
  c.beta.resize(T);
  c.S0.resize(dk * dv);
  for (auto& x : c.q) x = static_cast<float>(rng.Normal());
  for (auto& x : c.k) x = static_cast<float>(rng.Normal());
  for (auto& x : c.v) x = static_cast<float>(rng.Normal());
  for (int t = 0; t < T; ++t) {
    L2(&c.q[t * dk], dk);
    L2(&c.k[t * dk], dk);
    for (int i = 0; i < dk; ++i) c.q[t * dk + i] /= std::sqrt(static_cast<float>(dk));
    c.beta[t] = 0.02f + 0.96f * static_cast<float>(rng.Uniform());
  }
  // Mostly mild decays, some channels strong (g down to -strong).
  for (auto& x : c.g) {
    x = rng.Uniform() < 0.1 ? -strong * static_cast<float>(rng.Uniform())
                            : -0.5f * static_cast<float>(rng.Uniform());
  }
  for (auto& x : c.S0) x = 0.3f * static_cast<float>(rng.Normal());
  return c;
}

// The float64 per-token reference: outputs [T, dv] and the final state.
void ReferenceF64(const KdaCase& c, std::vector<double>* o, std::vector<double>* S) {
  const int dk = c.dk, dv = c.dv;
  S->assign(c.S0.begin(), c.S0.end());
  o->assign(c.T * dv, 0.0);
  std::vector<double> u(dv);
  for (int t = 0; t < c.T; ++t) {
    for (int i = 0; i < dk; ++i) {
      const double a = std::exp(double{c.g[t * dk + i]});
      for (int j = 0; j < dv; ++j) (*S)[i * dv + j] *= a;
    }
    std::fill(u.begin(), u.end(), 0.0);
    for (int i = 0; i < dk; ++i) {
      for (int j = 0; j < dv; ++j) u[j] += (*S)[i * dv + j] * c.k[t * dk + i];
    }
    for (int j = 0; j < dv; ++j) u[j] = c.beta[t] * (c.v[t * dv + j] - u[j]);
    for (int i = 0; i < dk; ++i) {
      for (int j = 0; j < dv; ++j) (*S)[i * dv + j] += c.k[t * dk + i] * u[j];
    }
    for (int i = 0; i < dk; ++i) {
      for (int j = 0; j < dv; ++j) (*o)[t * dv + j] += (*S)[i * dv + j] * c.q[t * dk + i];
    }
  }
}

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// Per-token and chunked (C = 16 and 64) forms against the float64 reference, for T in {1, 15,
// 16, 17, 100}, strong decays (g down to -20) and a nonzero initial state. Tolerance: 2e-5 of
// the output / state scale (f32 accumulations of ~dk products over up to 100 steps).
TEST(KdaTest, PerTokenAndChunkedMatchFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int T : {1, 15, 16, 17, 100}) {
    for (auto [dk, dv] : {std::pair{16, 16}, std::pair{32, 24}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " dk " + std::to_string(dk));
      const KdaCase c = RandomCase(rng, T, dk, dv, 20.f);
      std::vector<double> o_ref, S_ref;
      ReferenceF64(c, &o_ref, &S_ref);
      const double os = std::max(1.0, MaxAbs(o_ref)), ss = std::max(1.0, MaxAbs(S_ref));
      // Per token.
      std::vector<float> S(c.S0), o(T * dv);
      for (int t = 0; t < T; ++t) {
        KdaStep(&c.q[t * dk], &c.k[t * dk], &c.v[t * dv], &c.g[t * dk], c.beta[t], dk, dv,
                S.data(), &o[t * dv]);
      }
      for (int i = 0; i < T * dv; ++i) ASSERT_NEAR(o[i], o_ref[i], 2e-5 * os) << "step o " << i;
      for (int i = 0; i < dk * dv; ++i) ASSERT_NEAR(S[i], S_ref[i], 2e-5 * ss) << "step S " << i;
      // Chunked, dk == dv layout needs one stride: use a packed [T, max] layout per vector.
      for (int chunk : {16, 64, 5}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk));
        const int st = std::max(dk, dv);
        std::vector<float> q(T * st, 0.f), k(T * st, 0.f), v(T * st, 0.f), g(T * st, 0.f),
            oc(T * st, 0.f);
        for (int t = 0; t < T; ++t) {
          std::copy_n(&c.q[t * dk], dk, &q[t * st]);
          std::copy_n(&c.k[t * dk], dk, &k[t * st]);
          std::copy_n(&c.g[t * dk], dk, &g[t * st]);
          std::copy_n(&c.v[t * dv], dv, &v[t * st]);
        }
        std::vector<float> Sc(c.S0), scratch(KdaChunkScratchFloats(chunk, dk, dv));
        KdaChunked(q.data(), k.data(), v.data(), g.data(), c.beta.data(), st, 1, T, dk, dv, chunk,
                   Sc.data(), oc.data(), scratch.data());
        for (int t = 0; t < T; ++t) {
          for (int j = 0; j < dv; ++j) {
            ASSERT_NEAR(oc[t * st + j], o_ref[t * dv + j], 2e-5 * os) << "t " << t << " j " << j;
            // The chunked form against the per-token f32 form, same tolerance.
            ASSERT_NEAR(oc[t * st + j], o[t * dv + j], 2e-5 * os);
          }
        }
        for (int i = 0; i < dk * dv; ++i) ASSERT_NEAR(Sc[i], S_ref[i], 2e-5 * ss) << "S " << i;
        for (float x : Sc) ASSERT_TRUE(std::isfinite(x));
      }
    }
  }
}

// The decay multiplies key rows: beta = 0, g = 0 except g[b] = -30 leaves Diag(alpha) S0 (row b
// ~ 0, the rest unchanged); a value-axis decay would zero column b instead.
TEST(KdaTest, DecayIsAlongTheKeyAxis) {
  Rng rng(TestSeed());
  const int dk = 8, dv = 6, b = 3;
  std::vector<float> S(dk * dv), S0, q(dk, 0.f), k(dk, 0.f), v(dv, 1.f), g(dk, 0.f), o(dv);
  for (auto& x : S) x = static_cast<float>(rng.Normal());
  S0 = S;
  k[0] = 1.f;
  g[b] = -30.f;
  KdaStep(q.data(), k.data(), v.data(), g.data(), 0.f, dk, dv, S.data(), o.data());
  for (int i = 0; i < dk; ++i) {
    for (int j = 0; j < dv; ++j) {
      if (i == b) {
        EXPECT_LT(std::abs(S[i * dv + j]), 1e-12f);
      } else {
        EXPECT_EQ(S[i * dv + j], S0[i * dv + j]);
      }
    }
  }
}

// Conv orientation: one-hot at the last tap is the identity; at tap 0 a delay of 3 tokens, the
// first 3 outputs seeing the zero tail.
TEST(KdaTest, ShortConvOrientationAndTail) {
  const int C = 5, W = 4;
  for (int tap : {3, 0}) {
    std::vector<float> w(C * W, 0.f), tail(C * (W - 1), 0.f), y(C);
    for (int c = 0; c < C; ++c) w[c * W + tap] = 1.f;
    std::vector<std::vector<float>> xs;
    for (int t = 0; t < 8; ++t) {
      std::vector<float> x(C);
      for (int c = 0; c < C; ++c) x[c] = 1.f + t * 10.f + c;
      ShortConvStep(x.data(), w.data(), C, W, tail.data(), y.data());
      for (int c = 0; c < C; ++c) {
        const float want = tap == 3 ? x[c] : (t >= 3 ? xs[t - 3][c] : 0.f);
        EXPECT_EQ(y[c], want) << "tap " << tap << " t " << t << " c " << c;
      }
      xs.push_back(x);
    }
    for (int c = 0; c < C; ++c) {  // the tail: the last 3 inputs, oldest first
      for (int m = 0; m < 3; ++m) EXPECT_EQ(tail[c * 3 + m], xs[5 + m][c]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MoE routing

// Sigmoid scores, selection by score + bias, weights from the unbiased scores renormalised and
// scaled, against float64; a huge bias forces an expert in with its unbiased weight.
TEST(MoeRoutingTest, SigmoidBiasRenormScaleMatchFloat64) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int E = 16, K = 4;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(E), bias(E);
    for (auto& x : logits) x = 2.f * static_cast<float>(rng.Normal());
    for (auto& x : bias) x = 0.3f * static_cast<float>(rng.Normal());
    const int forced = static_cast<int>(rng.Below(E));
    if (trial % 2) bias[forced] = 100.f;
    RouteParams p;
    p.n_experts = E;
    p.n_used = K;
    p.gating = 2;
    p.renormalize = true;
    p.scale = 2.446f;
    p.bias = bias.data();
    std::vector<float> work(logits);
    std::vector<int> ids(K);
    std::vector<float> w(K);
    RouteExperts(p, work.data(), ids.data(), w.data());
    // float64 reference
    std::vector<double> sc(E), key(E);
    for (int e = 0; e < E; ++e) {
      sc[e] = 1.0 / (1.0 + std::exp(-double{logits[e]}));
      key[e] = sc[e] + bias[e];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
    double sum = 0;
    for (int kk = 0; kk < K; ++kk) sum += sc[order[kk]];
    for (int kk = 0; kk < K; ++kk) {
      ASSERT_EQ(ids[kk], order[kk]) << "trial " << trial;
      ASSERT_NEAR(w[kk], 2.446 * sc[order[kk]] / sum, 1e-6);
    }
    if (trial % 2) {
      EXPECT_EQ(ids[0], forced);
      EXPECT_NEAR(w[0], 2.446 * sc[forced] / sum, 1e-6);  // the bias never enters a weight
    }
    // Without the bias: another selection can result, never other weights for the same set.
    double wsum = 0;
    for (float x : w) wsum += x;
    EXPECT_NEAR(wsum, 2.446, 1e-5);
  }
}

// ---------------------------------------------------------------------------------------------
// The tiny model

std::string TmpDir() {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_kimi_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

std::string TinyPath(uint64_t seed) {
  static std::map<uint64_t, std::string> made;
  if (made.count(seed)) return made[seed];
  SynthOptions o;
  EXPECT_TRUE(o.ApplyPreset("tiny").ok());
  o.SetArch(Arch::kKimiLinear, "tiny");
  o.seed = seed;
  o.dtype = DType::kF32;
  const std::string path = TmpDir() + "/kimi_" + std::to_string(seed) + ".gguf";
  Status st = SynthGguf(o, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  made[seed] = path;
  return path;
}

std::unique_ptr<Model> Tiny(uint64_t seed) {
  auto m = Model::Load(TinyPath(seed));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<KvCache> Cache(const Model& m, const std::string& name,
                               const std::map<std::string, std::string>& settings = {}) {
  auto p = MakePolicy(PolicySpec{name, settings});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto c = m.NewCache(std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<int32_t> Tokens(const Model& m, uint64_t seed, int n) {
  Rng rng(seed ^ 0x70c);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.Below(m.config().n_vocab));
  return t;
}

// Prefill `prompt` tokens in chunks of `chunk`, then decode the rest; every logit row.
std::vector<float> RunSeq(Model& m, KvCache* c, const std::vector<int32_t>& toks, int prompt,
                       int chunk, ThreadPool* pool) {
  const int64_t V = m.config().n_vocab;
  std::vector<float> all;
  Status s = m.Prefill(toks.data(), prompt, chunk, c, pool, nullptr, &all);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<float> logits(V);
  for (size_t i = prompt; i < toks.size(); ++i) {
    s = m.Decode(toks[i], c, pool, logits.data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

float MaxAbsF(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::abs(v));
  return m;
}

// With every prefill chunk in MLA's expanded form (model/mla.h), each policy whose kill switch
// is bit for bit `full` still is: it claims the same dense reads (Policy::ClaimDenseReads) in
// the first prompt, in decode steps' absence, and in a second prompt after the compression
// point (a chat's next turn: vestige's kill switch claims it because nothing is archived). And
// an active vestige prefills exactly like `full` (dense prompt reads until the compression point).
TEST(KimiLinearModelTest, KillSwitchesClaimTheExpandedPrefill) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = Tiny(seed);
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  const std::vector<int32_t> toks = Tokens(*m, seed, 300);
  const int64_t V = m->config().n_vocab;
  const int64_t prev = mla_internal::SetExpandedMinRowsForTest(2);
  // Prefill 200 (chunks of 64), decode 30, prefill 70 more in one call: every logit row.
  auto run = [&](KvCache* c) {
    std::vector<float> all, part;
    EXPECT_TRUE(m->Prefill(toks.data(), 200, 64, c, &pool, nullptr, &all).ok());
    std::vector<float> logits(V);
    for (int i = 200; i < 230; ++i) {
      EXPECT_TRUE(m->Decode(toks[i], c, &pool, logits.data()).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    EXPECT_TRUE(m->Prefill(toks.data() + 230, 70, 70, c, &pool, nullptr, &part).ok());
    all.insert(all.end(), part.begin(), part.end());
    return all;
  };
  auto fc = Cache(*m, "full");
  const std::vector<float> ref = run(fc.get());
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> offs = {
      {"vestige", {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}},
      {"fullrow", {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}},
      {"h2o", {{"ratio", "1"}}},
      {"h2o-recent", {{"ratio", "1"}}},
      {"snapkv", {{"ratio", "1"}}},
      {"quest", {{"ratio", "1"}}},
      {"random", {{"ratio", "1"}}},
  };
  for (const auto& [name, settings] : offs) {
    SCOPED_TRACE(name);
    auto c = Cache(*m, name, settings);
    ASSERT_TRUE(c);
    const std::vector<float> got = run(c.get());
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), 4 * ref.size())) << name << " off != full";
    EXPECT_EQ(c->counters().reads, fc->counters().reads);
    EXPECT_EQ(c->counters().bytes_read_total, fc->counters().bytes_read_total);
  }
  auto v = Cache(*m, "vestige", {{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}});
  ASSERT_TRUE(v);
  std::vector<float> prompt;
  ASSERT_TRUE(m->Prefill(toks.data(), 200, 64, v.get(), &pool, nullptr, &prompt).ok());
  EXPECT_EQ(0, std::memcmp(prompt.data(), ref.data(), 4 * prompt.size()))
      << "vestige's prompt != full's";
  mla_internal::SetExpandedMinRowsForTest(prev);
}

TEST(KimiLinearModelTest, LayoutAndRecurrentGeometry) {
  auto m = Tiny(TestSeed());
  ASSERT_TRUE(m);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, Arch::kKimiLinear);
  ASSERT_EQ(c.n_layers, 4);
  EXPECT_TRUE(c.is_kda_layer(0));
  EXPECT_FALSE(c.is_kda_layer(1));
  EXPECT_TRUE(c.is_kda_layer(2));
  EXPECT_FALSE(c.is_kda_layer(3));
  EXPECT_TRUE(c.mla_nope);
  EXPECT_EQ(c.expert_gating, 2);
  EXPECT_TRUE(c.expert_weights_norm);
  EXPECT_FLOAT_EQ(c.expert_weights_scale, 1.5f);
  const std::vector<LayerGeometry> layers = m->CacheLayers();
  ASSERT_EQ(layers.size(), 2u);  // the MLA layers only
  // Each carries its model layer number: messages and reports name layers 1 and 3, not 0 and 1.
  EXPECT_EQ(layers[0].model_layer, 1);
  EXPECT_EQ(layers[1].model_layer, 3);
  EXPECT_EQ(LayerName(layers[1], 1), "layer 3");
  EXPECT_FALSE(layers[0].rope);
  EXPECT_FLOAT_EQ(layers[0].scale, 1.f / std::sqrt(24.f));  // 1/sqrt(nope 16 + rope 8)
  const RecurrentGeometry r = m->RecurrentLayers();
  EXPECT_EQ(r.n_layers, 2);
  EXPECT_EQ(r.state_floats, 4 * 16 * 16);
  EXPECT_EQ(r.conv_floats, 3 * 64 * 3);
  EXPECT_EQ(r.bytes_per_sequence(), 2 * (1024 + 576) * 4);
  // Per-layer tensors as llama.cpp lays them out (torch order here = reversed ggml ne).
  const GgufFile& f = m->file();
  ASSERT_NE(f.FindTensor("blk.0.ssm_conv1d_q.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.0.ssm_conv1d_q.weight")->shape,
            (std::vector<int64_t>{1, 64, 1, 4}));
  EXPECT_EQ(f.FindTensor("blk.0.ssm_a")->shape, (std::vector<int64_t>{1, 1, 4, 1}));
  EXPECT_EQ(f.FindTensor("blk.1.attn_k_b.weight")->shape, (std::vector<int64_t>{4, 32, 16}));
  EXPECT_EQ(f.FindTensor("blk.1.exp_probs_b.bias")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(f.FindTensor("blk.0.attn_kv_a_mqa.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.1.ssm_conv1d_q.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.0.ffn_gate_inp.weight"), nullptr);  // layer 0 dense
  auto kv = f.GetIntArray("kimi-linear.attention.head_count_kv");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(*kv, (std::vector<int64_t>{0, 1, 0, 1}));
}

// Prefill chunking and the decode handover: one long prefill, prefills in chunks of 1 (every
// token in the per-token form), 5 and 7 (conv and KDA state carried across chunks) followed by
// decode steps all give the same logits within f32 tolerance; the same chunking twice is
// bit-identical. Tolerance 2e-3 of the logit scale, from a sweep of 60 seeds x 5 chunkings: the
// per-position error is ~1e-7 of the scale at most positions (median over the worst of each run
// 7.5e-7, p90 2.1e-5) with a heavy tail to 1.5e-4 at single positions, from two sources that are
// not bugs: near-ties in the top-k expert selection (2 of 8 experts; a flip moves that position's
// output; with every expert used the seeds that showed it fall to ~1e-6) and the chunked delta
// rule's triangular solve, which rounds differently from the per-token products when a chunk's
// keys are nearly collinear. A lost conv or KDA state across a chunk boundary changes the logits
// by more than 10x this bound (the negative controls below).
TEST(KimiLinearModelTest, ChunkedPrefillAndDecodeEqualOneLongPrefill) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = Tiny(seed);
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  const std::vector<int32_t> toks = Tokens(*m, seed, 70);
  auto ref_c = Cache(*m, "full");
  const std::vector<float> ref = RunSeq(*m, ref_c.get(), toks, 70, 70, &pool);
  const float scale = MaxAbsF(ref);
  ASSERT_GT(scale, 0.f);
  struct Way {
    int prompt, chunk;
  };
  for (Way w : {Way{70, 1}, Way{70, 5}, Way{60, 7}, Way{40, 16}, Way{1, 1}}) {
    SCOPED_TRACE("prompt " + std::to_string(w.prompt) + " chunk " + std::to_string(w.chunk));
    auto c = Cache(*m, "full");
    const std::vector<float> got = RunSeq(*m, c.get(), toks, w.prompt, w.chunk, &pool);
    ASSERT_EQ(got.size(), ref.size());
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
    EXPECT_LE(worst, 2e-3f * scale);
  }
  // Negative controls: the bound discriminates. Prefill 40 tokens, then lose the conv tails (or
  // the KDA states) before decoding the other 30, as a chunk-boundary bug would: the decoded
  // logits move by far more than the bound (0.07-0.19 of the scale over 20 seeds).
  for (bool conv : {true, false}) {
    SCOPED_TRACE(conv ? "conv tails lost" : "KDA states lost");
    auto c = Cache(*m, "full");
    const int64_t V = m->config().n_vocab;
    std::vector<float> got;
    ASSERT_TRUE(m->Prefill(toks.data(), 40, 40, c.get(), &pool, nullptr, &got).ok());
    const RecurrentGeometry& r = c->recurrent();
    for (int i = 0; i < r.n_layers; ++i) {
      if (conv) std::fill_n(c->recurrent_conv(i), r.conv_floats, 0.f);
      else std::fill_n(c->recurrent_state(i), r.state_floats, 0.f);
    }
    std::vector<float> logits(V);
    float worst = 0;
    for (size_t i = 40; i < toks.size(); ++i) {
      ASSERT_TRUE(m->Decode(toks[i], c.get(), &pool, logits.data()).ok());
      for (int64_t j = 0; j < V; ++j)
        worst = std::max(worst, std::abs(logits[j] - ref[i * V + j]));
    }
    EXPECT_GT(worst, 10 * 2e-3f * scale) << "ratio " << worst / scale;
  }
  auto a = Cache(*m, "full");
  auto b = Cache(*m, "full");
  const std::vector<float> ga = RunSeq(*m, a.get(), toks, 60, 7, &pool);
  const std::vector<float> gb = RunSeq(*m, b.get(), toks, 60, 7, &pool);
  EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), 4 * ga.size()));
}

// The recurrent state lives in the cache: nonzero after a prefill, zero in a new cache, and a
// second sequence on a new cache gives bit-identical logits (nothing carried in the model).
// Resident bytes count it; it does not grow with the context.
TEST(KimiLinearModelTest, RecurrentStateIsPerSequenceAndCounted) {
  const uint64_t seed = TestSeed();
  auto m = Tiny(seed);
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  const std::vector<int32_t> toks = Tokens(*m, seed, 40);
  auto c1 = Cache(*m, "full");
  const RecurrentGeometry r = c1->recurrent();
  ASSERT_EQ(r.n_layers, 2);
  auto all_zero = [&](const KvCache& c) {
    for (int i = 0; i < r.n_layers; ++i) {
      for (int64_t j = 0; j < r.state_floats; ++j) {
        if (c.recurrent_state(i)[j] != 0.f) return false;
      }
      for (int64_t j = 0; j < r.conv_floats; ++j) {
        if (c.recurrent_conv(i)[j] != 0.f) return false;
      }
    }
    return true;
  };
  EXPECT_TRUE(all_zero(*c1));
  const int64_t empty_bytes = c1->ResidentBytes();
  EXPECT_EQ(empty_bytes, r.bytes_per_sequence() + 0);
  const std::vector<float> first = RunSeq(*m, c1.get(), toks, 30, 8, &pool);
  EXPECT_FALSE(all_zero(*c1));
  auto c2 = Cache(*m, "full");
  EXPECT_TRUE(all_zero(*c2));
  const std::vector<float> second = RunSeq(*m, c2.get(), toks, 30, 8, &pool);
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), 4 * first.size()));
  // Accounting: policy bytes of the MLA layers + the recurrent state, which is one part.
  int64_t policy_bytes = 0;
  for (int l = 0; l < c1->n_layers(); ++l) {
    policy_bytes += c1->policy().ResidentBytes(l, c1->store(l));
  }
  EXPECT_EQ(c1->ResidentBytes(), policy_bytes + r.bytes_per_sequence());
  const ResidentParts parts = c1->ResidentBreakdown();
  EXPECT_EQ(parts.total(), c1->ResidentBytes());
  bool found = false;
  for (const auto& [name, bytes] : parts.parts) {
    if (name == "recurrent state") {
      found = true;
      EXPECT_EQ(bytes, r.bytes_per_sequence());
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(c1->FullBytesPerToken(), 2 * 40 * 2);  // 2 MLA layers x 40-wide bf16 rows
}

// Every registered policy on the tiny kimi-linear model's MLA layers: it binds and runs; its
// kill switch reads like `full` (bit for bit where the conformance suite says so, else within
// its stated tolerance, propagated to the logits as 1e-3 of their scale); the partition
// invariant (per MLA layer the policy's summary sees every row: kept rows <= visible rows =
// tokens) and the accounting (resident = the policy's bytes over the MLA layers + the KDA
// state, the breakdown summing to it).
TEST(KimiLinearModelTest, EveryPolicyOnTheMlaLayers) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto m = Tiny(seed);
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  const std::vector<int32_t> toks = Tokens(*m, seed, 330);
  const int prompt = 300;
  struct Entry {
    std::map<std::string, std::string> active, off;
    float off_tol;  // 0: bit for bit
  };
  const std::map<std::string, Entry> table = {
      {"full", {{}, {}, 0}},
      {"vestige",
       {{{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}},
        {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}, 0}},
      {"fullrow",
       {{{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}},
        {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}, 0}},
      {"geodesia", {{{"bits", "3"}}, {{"bits", "16"}}, 1e-3f}},
      {"cquest", {{}, {{"quest-keep", "1"}}, 1e-3f}},
      {"streaming", {{{"ratio", "4"}}, {}, -1}},
      {"h2o", {{{"ratio", "4"}}, {{"ratio", "1"}}, 0}},
      {"h2o-recent", {{{"ratio", "4"}}, {{"ratio", "1"}}, 0}},
      {"snapkv", {{{"ratio", "4"}}, {{"ratio", "1"}}, 0}},
      {"quest", {{{"ratio", "4"}}, {{"ratio", "1"}}, 0}},
      {"random", {{{"ratio", "4"}}, {{"ratio", "1"}}, 0}},
      {"kivi2", {{}, {}, -1}},
      {"kivi4", {{}, {}, -1}},
      {"q8_0", {{}, {}, -1}},
      {"q4_0", {{}, {}, -1}},
      {"turboquant", {{}, {}, -1}},
      {"coldfp4", {{}, {}, -1}},
  };
  auto fc = Cache(*m, "full");
  const std::vector<float> ref = RunSeq(*m, fc.get(), toks, prompt, 64, &pool);
  const float scale = MaxAbsF(ref);
  const int64_t kda_bytes = m->RecurrentLayers().bytes_per_sequence();
  int ran = 0, refused = 0;
  for (const PolicyInfo& info : Policies()) {
    const std::string& name = info.name;
    SCOPED_TRACE(name);
    auto it = table.find(name);
    ASSERT_NE(it, table.end()) << "policy " << name << " has no entry in this test's table";
    const Entry& e = it->second;
    // A policy for GQA layers only refuses to bind (as on deepseek2), naming itself.
    auto p = MakePolicy(PolicySpec{name, e.active});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto made = m->NewCache(std::move(p).value());
    if (!made.ok()) {
      EXPECT_NE(made.status().ToString().find(name), std::string::npos)
          << made.status().ToString();
      ++refused;
      continue;
    }
    ++ran;
    std::unique_ptr<KvCache> c = std::move(made).value();
    const std::vector<float> got = RunSeq(*m, c.get(), toks, prompt, 64, &pool);
    ASSERT_EQ(got.size(), ref.size());
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    int64_t policy_bytes = 0;
    for (int l = 0; l < c->n_layers(); ++l) {
      policy_bytes += c->policy().ResidentBytes(l, c->store(l));
      const PolicySummary s = c->policy().Summary(l, c->store(l));
      EXPECT_EQ(s.rows_visible, c->n_tokens()) << "layer " << l;
      if (s.rows_kept >= 0) {
        EXPECT_LE(s.rows_kept, s.rows_visible) << "layer " << l;
      }
    }
    EXPECT_EQ(c->n_tokens(), static_cast<int64_t>(toks.size()));
    EXPECT_EQ(c->ResidentBytes(), policy_bytes + kda_bytes);
    EXPECT_EQ(c->ResidentBreakdown().total(), c->ResidentBytes());
    EXPECT_TRUE(c->policy().recovered_error().ok()) << c->policy().recovered_error().ToString();
    if (e.off_tol < 0) continue;  // no kill switch (see kv/conformance_test.cc)
    auto off = Cache(*m, name, e.off);
    ASSERT_TRUE(off);
    const std::vector<float> o = RunSeq(*m, off.get(), toks, prompt, 64, &pool);
    ASSERT_EQ(o.size(), ref.size());
    if (e.off_tol == 0) {
      EXPECT_EQ(0, std::memcmp(o.data(), ref.data(), 4 * ref.size())) << name << " off != full";
    } else {
      float worst = 0;
      for (size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::abs(o[i] - ref[i]));
      EXPECT_LE(worst, e.off_tol * scale);
    }
  }
  EXPECT_GE(ran, 8) << "policies that ran: " << ran << ", refused: " << refused;
}

// A decode batch of kimi-linear sequences equals their solo decodes bit for bit (each row's
// KDA state is its own cache's).
TEST(KimiLinearModelTest, DecodeBatchEqualsSoloDecodes) {
  const uint64_t seed = TestSeed();
  auto m = Tiny(seed);
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  const int B = 3;
  const int64_t V = m->config().n_vocab;
  std::vector<std::unique_ptr<KvCache>> solo, batch;
  std::vector<std::vector<int32_t>> toks;
  for (int b = 0; b < B; ++b) {
    toks.push_back(Tokens(*m, seed + b, 20 + 5 * b));
    solo.push_back(Cache(*m, "full"));
    batch.push_back(Cache(*m, "full"));
    const int n = static_cast<int>(toks[b].size()) - 3;
    ASSERT_TRUE(m->Prefill(toks[b].data(), n, 8, solo[b].get(), &pool, nullptr).ok());
    ASSERT_TRUE(m->Prefill(toks[b].data(), n, 8, batch[b].get(), &pool, nullptr).ok());
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<int32_t> t(B);
    std::vector<KvCache*> cs(B);
    std::vector<float> want(B * V), got(B * V);
    for (int b = 0; b < B; ++b) {
      t[b] = toks[b][toks[b].size() - 3 + step];
      cs[b] = batch[b].get();
      ASSERT_TRUE(m->Decode(t[b], solo[b].get(), &pool, &want[b * V]).ok());
    }
    Status s = m->DecodeBatch(t.data(), B, cs.data(), &pool, got.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), 4 * want.size())) << "step " << step;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad files

// The tiny file rewritten: without tensor `drop` and key `drop_key`, with metadata `set`
// replaced.
StatusOr<std::unique_ptr<Model>> Rewritten(const std::string& drop,
                                           const std::map<std::string, GgufValue>& set,
                                           const std::string& drop_key = "") {
  ASSIGN_OR_RETURN(auto f, GgufFile::Open(TinyPath(TestSeed())));
  GgufWriter w;
  for (const auto& [k, v] : f->metadata()) {
    if (k == drop_key) continue;
    auto it = set.find(k);
    w.Set(k, it != set.end() ? it->second : v);
  }
  for (const GgufTensorInfo& t : f->tensors()) {
    if (t.name == drop) continue;
    ASSIGN_OR_RETURN(TensorView v, f->Tensor(t.name));
    RETURN_IF_ERROR(w.AddTensor(t.name, t.dtype, t.shape, v.data, t.n_bytes));
  }
  ASSIGN_OR_RETURN(auto g, GgufFile::FromBuffer(w.ToBytes(), "bad.gguf"));
  return Model::FromGguf(std::move(g));
}

TEST(KimiLinearModelTest, BadFilesNameTheTensorOrKey) {
  {
    auto m = Rewritten("blk.2.ssm_conv1d_k.weight", {});
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("blk.2.ssm_conv1d_k.weight"), std::string::npos)
        << m.status().ToString();
  }
  {  // 4 KDA heads x 16 = 64 rows; 3 heads do not divide them
    auto m = Rewritten("", {{"kimi-linear.attention.head_count", GgufValue::U32(3)}});
    ASSERT_FALSE(m.ok());
    const std::string msg = m.status().ToString();
    EXPECT_NE(msg.find("blk.0.attn_q.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kimi-linear.attention.head_count"), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not divide"), std::string::npos) << msg;
  }
  {
    auto m = Rewritten("", {{"kimi-linear.attention.head_count_kv",
                             GgufValue::I32Array({0, 1, 0})}});
    ASSERT_FALSE(m.ok());
    const std::string msg = m.status().ToString();
    EXPECT_NE(msg.find("kimi-linear.attention.head_count_kv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("block_count"), std::string::npos) << msg;
  }
  {  // a missing required KDA key
    auto m = Rewritten("", {}, "kimi-linear.ssm.conv_kernel");
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().ToString().find("kimi-linear.ssm.conv_kernel"), std::string::npos)
        << m.status().ToString();
  }
  {
    auto m = Rewritten("", {{"kimi-linear.kda.head_dim", GgufValue::U32(8)}});
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().ToString().find("kda.head_dim"), std::string::npos)
        << m.status().ToString();
  }
  {  // ssm_a must hold -exp(A_log) < 0 (catches a converter that skipped the transform)
    auto f = GgufFile::Open(TinyPath(TestSeed()));
    ASSERT_TRUE(f.ok());
    GgufWriter w;
    for (const auto& [k, v] : (*f)->metadata()) w.Set(k, v);
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      auto v = (*f)->Tensor(t.name);
      ASSERT_TRUE(v.ok());
      if (t.name == "blk.0.ssm_a") {
        std::vector<float> pos(4, 1.f);
        ASSERT_TRUE(w.AddTensorF32(t.name, DType::kF32, t.shape, pos.data()).ok());
      } else {
        ASSERT_TRUE(w.AddTensor(t.name, t.dtype, t.shape, v->data, t.n_bytes).ok());
      }
    }
    auto g = GgufFile::FromBuffer(w.ToBytes(), "bad.gguf");
    ASSERT_TRUE(g.ok());
    auto m = Model::FromGguf(std::move(g).value());
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().ToString().find("blk.0.ssm_a"), std::string::npos)
        << m.status().ToString();
  }
}

}  // namespace
}  // namespace strata
