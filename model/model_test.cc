#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/gqa_prefill.h"
#include "model/mla.h"
#include "model/synth.h"

namespace strata {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() / ("strata_model_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

struct Variant {
  std::string label;
  Arch arch;
  bool nope = false;
  std::string dims;
};

std::vector<Variant> Variants() {
  return {
      {"llama", Arch::kLlama, false, ""},
      {"llama_mha_tied", Arch::kLlama, false, "kv_heads=4,tied=1"},
      {"qwen2", Arch::kQwen2, false, ""},
      {"deepseek2_rope", Arch::kDeepseek2, false, ""},
      {"deepseek2_nope", Arch::kDeepseek2, true, ""},
      {"deepseek2_qlora_sigmoid", Arch::kDeepseek2, false, "q_lora=24,gating=2,shared_experts=0"},
  };
}

std::unique_ptr<Model> MakeModel(const Variant& v, uint64_t seed, DType dtype = DType::kF32) {
  SynthOptions o;
  o.arch = v.arch;
  o.nope = v.nope;
  o.seed = seed;
  o.dtype = dtype;
  EXPECT_TRUE(o.ApplyDims(v.dims).ok());
  const std::string path = TempPath(v.label + "_" + std::to_string(seed) + ".gguf");
  Status st = SynthGguf(o, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<int32_t> RandomTokens(Rng& rng, int n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.Below(vocab));
  return t;
}

std::unique_ptr<KvCache> FullCache(const Model& m) {
  auto c = m.NewCache(std::make_unique<FullPolicy>());
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

// Cached decode (one token at a time) must equal one whole-sequence prefill at every position, and
// chunked prefill with chunk 1, 7 and 64 must give the same logits. Tolerance: the paths differ
// only in f32 summation order (MatVec vs tiled MatMul, page-split attention); logits are O(1), so
// 2e-4 absolute is ~100x the observed rounding noise and far below any semantic error.
// Prefill chunks attend per query here, as decode does (GQA's staged form and MLA's expanded
// form are off): their different f32 rounding of an attention output can move a later layer's
// K/V entry across a bf16 rounding boundary, which this random model amplifies to ~5e-4 of a
// logit (GQA: 15 % of seeds on an Intel Xeon, e.g. seed 9717055944227634376; deepseek2 NoPE:
// 3.2e-4, seed 9716992777461672561). Those forms have their own checks (model/gqa_prefill_test.cc
// against float64, BaselineModelTest.DensePromptReadsAreStagedLikeFullOnGqa,
// ModelTest.MlaExpandedPrefillMatchesAbsorbed).
TEST(ModelTest, DecodeEqualsFullRecomputeAndChunkingIsInvariant) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  struct PerQuery {
    int64_t staged = gqa_internal::SetStagedMinRowsForTest(-1);
    int64_t expanded = mla_internal::SetExpandedMinRowsForTest(-1);
    ~PerQuery() {
      gqa_internal::SetStagedMinRowsForTest(staged);
      mla_internal::SetExpandedMinRowsForTest(expanded);
    }
  } per_query;
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.label + " seed " + std::to_string(seed));
    auto m = MakeModel(v, seed);
    ASSERT_TRUE(m);
    const int64_t V = m->config().n_vocab;
    const int n = 70;
    std::vector<int32_t> toks = RandomTokens(rng, n, V);
    std::vector<float> ref;
    {
      auto cache = FullCache(*m);
      ASSERT_TRUE(m->Prefill(toks.data(), n, n, cache.get(), nullptr, nullptr, &ref).ok());
    }
    {
      auto cache = FullCache(*m);
      std::vector<float> logits(V);
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(m->Decode(toks[i], cache.get(), nullptr, logits.data()).ok());
        for (int64_t j = 0; j < V; ++j) {
          ASSERT_NEAR(logits[j], ref[i * V + j], 2e-4) << "position " << i << " token " << j;
        }
      }
    }
    for (int chunk : {1, 7, 64}) {
      ThreadPool pool(2);
      auto cache = FullCache(*m);
      std::vector<float> all;
      ASSERT_TRUE(m->Prefill(toks.data(), n, chunk, cache.get(), &pool, nullptr, &all).ok());
      for (size_t j = 0; j < all.size(); ++j) ASSERT_NEAR(all[j], ref[j], 2e-4) << "chunk " << chunk;
    }
  }
}

// MLA prefill in the expanded form (model/mla.h: per-head keys and values decompressed from the
// cache rows) is the absorbed attention up to f32 rounding: every position's logits within 1e-3
// (the f32 difference crosses bf16 boundaries of later layers' cache rows, which this random
// model amplifies: 2.0e-4 seen with seed 2630167791544311676, at most 1.4e-4 over 60 others, so
// 1e-3 is 5x the largest seen), counted as the same reads, and the cache holds the same rows (decode
// after either prefill continues alike). The two are not bit-identical, which shows the expanded
// form ran. Chunks of 7 and 70 rows (one segment; 70 > a page, so several tiles).
TEST(ModelTest, MlaExpandedPrefillMatchesAbsorbed) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (const Variant& v : Variants()) {
    if (v.arch != Arch::kDeepseek2) continue;
    SCOPED_TRACE(v.label + " seed " + std::to_string(seed));
    auto m = MakeModel(v, seed);
    ASSERT_TRUE(m);
    const int64_t V = m->config().n_vocab;
    const int n = 70;
    std::vector<int32_t> toks = RandomTokens(rng, n + 1, V);
    for (int chunk : {7, 70}) {
      ThreadPool pool(2);
      std::vector<float> ref, got, ref_next(V), got_next(V);
      const int64_t prev = mla_internal::SetExpandedMinRowsForTest(-1);
      auto a = FullCache(*m);
      ASSERT_TRUE(m->Prefill(toks.data(), n, chunk, a.get(), &pool, nullptr, &ref).ok());
      ASSERT_TRUE(m->Decode(toks[n], a.get(), &pool, ref_next.data()).ok());
      mla_internal::SetExpandedMinRowsForTest(2);
      auto b = FullCache(*m);
      ASSERT_TRUE(m->Prefill(toks.data(), n, chunk, b.get(), &pool, nullptr, &got).ok());
      ASSERT_TRUE(m->Decode(toks[n], b.get(), &pool, got_next.data()).ok());
      mla_internal::SetExpandedMinRowsForTest(prev);
      for (size_t j = 0; j < ref.size(); ++j) {
        ASSERT_NEAR(got[j], ref[j], 1e-3) << "chunk " << chunk << " position " << j / V;
      }
      for (int64_t j = 0; j < V; ++j) ASSERT_NEAR(got_next[j], ref_next[j], 1e-3) << j;
      EXPECT_NE(0, std::memcmp(got.data(), ref.data(), 4 * ref.size()))
          << "chunk " << chunk << ": the expanded form did not run";
      const CacheCounters& ca = a->counters();
      const CacheCounters& cb = b->counters();
      EXPECT_EQ(ca.reads, cb.reads);
      EXPECT_EQ(ca.bytes_read_total, cb.bytes_read_total);
      EXPECT_EQ(ca.rows_attended_total, cb.rows_attended_total);
      EXPECT_EQ(ca.rows_visible_total, cb.rows_visible_total);
      EXPECT_EQ(ca.full_bytes_read_total, cb.full_bytes_read_total);
    }
  }
}

TEST(ModelTest, LogitsAreNotDegenerate) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  auto m = MakeModel(Variants()[0], seed);
  ASSERT_TRUE(m);
  std::vector<int32_t> toks = RandomTokens(rng, 10, m->config().n_vocab);
  std::vector<float> all;
  auto cache = FullCache(*m);
  ASSERT_TRUE(m->Prefill(toks.data(), 10, 4, cache.get(), nullptr, nullptr, &all).ok());
  const int64_t V = m->config().n_vocab;
  double spread = 0;
  for (int64_t j = 0; j < V; ++j) spread = std::max(spread, static_cast<double>(std::fabs(all[9 * V + j] - all[8 * V + j])));
  EXPECT_GT(spread, 1e-3) << "seed " << seed;
  for (float x : all) ASSERT_TRUE(std::isfinite(x));
}

// ---- MLA: absorbed decode vs the naive (decompressed K/V) formulation in float64 ----

std::vector<double> F64(const GgufFile& f, const std::string& name) {
  TensorView t = f.Tensor(name).value();
  std::vector<float> tmp(t.numel());
  ToF32(t.dtype, t.data, tmp.data(), t.numel());
  return std::vector<double>(tmp.begin(), tmp.end());
}

void RmsNormD(std::vector<double>& x, size_t off, size_t n, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double r = 1.0 / std::sqrt(ss / n + eps);
  for (size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * r * w[i];
}

std::vector<double> MatVecD(const std::vector<double>& w, size_t rows, size_t cols,
                            const std::vector<double>& x, size_t xoff = 0) {
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[xoff + c];
    y[r] = s;
  }
  return y;
}

void RopeD(double* x, int dim, int64_t pos, double base) {
  for (int i = 0; i < dim / 2; ++i) {
    const double th = pos * std::pow(base, -2.0 * i / dim);
    const double c = std::cos(th), s = std::sin(th);
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

double Bf16Round(double v) { return Bf16ToF32(F32ToBf16(static_cast<float>(v))); }

// A 1-layer dense deepseek2 model computed naively: per head k_h = [W_UK,h c ; k_pe],
// v_h = W_UV,h c, q_h = [q_nope ; q_pe], softmax(q.k / sqrt(nope + rope)). The latent c and k_pe
// are rounded to bf16 exactly as the cache stores them, so the only remaining difference is the
// engine's f32 arithmetic (tolerance 1e-3 on O(1) logits).
// With --kv-type f32 (issue 19 defect 13) the engine is checked against the plain reference
// whose cache is not rounded at all; the default bf16 engine's distance to that plain reference
// (the rounding of the cache alone) is measured too, and the f32 cache must be 100x closer.
TEST(ModelTest, MlaAbsorbedDecodeEqualsNaiveFloat64) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  struct Case {
    DType kv_type;       // the engine's cache
    bool ref_bf16;       // the reference rounds its cache rows to bf16
  };
  std::map<bool, double> bf16_vs_plain, f32_vs_plain;  // [nope] max |logit difference|
  for (const Case cs : {Case{DType::kBF16, true}, Case{DType::kBF16, false},
                        Case{DType::kF32, false}})
  for (bool nope : {false, true}) {
    const DType kv_type = cs.kv_type;
    SCOPED_TRACE(std::string(nope ? "NoPE" : "RoPE") + " seed " + std::to_string(seed) +
                 " kv " + std::string(DTypeName(kv_type)) + (cs.ref_bf16 ? " ref bf16" : ""));
    auto m = MakeModel({nope ? "mla1_nope" : "mla1_rope", Arch::kDeepseek2, nope,
                        "layers=1,experts=0,dense_layers=1"},
                       seed);
    ASSERT_TRUE(m);
    const ModelConfig& c = m->config();
    const GgufFile& f = m->file();
    const size_t d = c.d_model, H = c.n_heads, dc = c.kv_lora_rank, dr = c.qk_rope_dim,
                 nope_d = c.qk_nope_dim, vd = c.v_head_dim, qk = nope_d + dr, V = c.n_vocab;
    const int n = 23;
    std::vector<int32_t> toks = RandomTokens(rng, n, V);
    auto emb = F64(f, "token_embd.weight");
    auto wq = F64(f, "blk.0.attn_q.weight");
    auto wkva = F64(f, "blk.0.attn_kv_a_mqa.weight");
    auto kvn = F64(f, "blk.0.attn_kv_a_norm.weight");
    auto kb = F64(f, "blk.0.attn_k_b.weight");  // [H, dc, nope]
    auto vb = F64(f, "blk.0.attn_v_b.weight");  // [H, vd, dc]
    auto wo = F64(f, "blk.0.attn_output.weight");
    auto an = F64(f, "blk.0.attn_norm.weight");
    auto fn = F64(f, "blk.0.ffn_norm.weight");
    auto wg = F64(f, "blk.0.ffn_gate.weight");
    auto wu = F64(f, "blk.0.ffn_up.weight");
    auto wd = F64(f, "blk.0.ffn_down.weight");
    auto on = F64(f, "output_norm.weight");
    auto wout = F64(f, "output.weight");
    const double eps = c.rms_eps;
    // Per position: k (per head) and v (per head), and the last position's logits.
    std::vector<std::vector<double>> K(n), Vv(n), Q(n), X(n);
    for (int t = 0; t < n; ++t) {
      X[t].assign(emb.begin() + toks[t] * d, emb.begin() + (toks[t] + 1) * d);
      std::vector<double> xn = X[t];
      RmsNormD(xn, 0, d, an, eps);
      Q[t] = MatVecD(wq, H * qk, d, xn);
      std::vector<double> kva = MatVecD(wkva, dc + dr, d, xn);
      RmsNormD(kva, 0, dc, kvn, eps);
      if (!nope) RopeD(&kva[dc], dr, t, c.rope_base);
      if (cs.ref_bf16) {
        for (auto& x : kva) x = Bf16Round(x);
      }
      K[t].resize(H * qk);
      Vv[t].resize(H * vd);
      for (size_t h = 0; h < H; ++h) {
        for (size_t i = 0; i < nope_d; ++i) {
          double s = 0;
          for (size_t j = 0; j < dc; ++j) s += kb[(h * dc + j) * nope_d + i] * kva[j];
          K[t][h * qk + i] = s;
        }
        for (size_t i = 0; i < dr; ++i) K[t][h * qk + nope_d + i] = kva[dc + i];
        for (size_t i = 0; i < vd; ++i) {
          double s = 0;
          for (size_t j = 0; j < dc; ++j) s += vb[(h * vd + i) * dc + j] * kva[j];
          Vv[t][h * vd + i] = s;
        }
        if (!nope) RopeD(&Q[t][h * qk + nope_d], dr, t, c.rope_base);
      }
    }
    const int t = n - 1;
    std::vector<double> o(H * vd, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
    for (size_t h = 0; h < H; ++h) {
      std::vector<double> s(n);
      double mx = -1e300;
      for (int u = 0; u <= t; ++u) {
        double acc = 0;
        for (size_t i = 0; i < qk; ++i) acc += Q[t][h * qk + i] * K[u][h * qk + i];
        s[u] = acc * scale;
        mx = std::max(mx, s[u]);
      }
      double z = 0;
      for (int u = 0; u <= t; ++u) z += std::exp(s[u] - mx);
      for (int u = 0; u <= t; ++u) {
        const double w = std::exp(s[u] - mx) / z;
        for (size_t i = 0; i < vd; ++i) o[h * vd + i] += w * Vv[u][h * vd + i];
      }
    }
    std::vector<double> x = X[t];
    std::vector<double> ao = MatVecD(wo, d, H * vd, o);
    for (size_t i = 0; i < d; ++i) x[i] += ao[i];
    std::vector<double> xn = x;
    RmsNormD(xn, 0, d, fn, eps);
    auto g = MatVecD(wg, c.d_ff, d, xn);
    auto u = MatVecD(wu, c.d_ff, d, xn);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    auto dn = MatVecD(wd, d, c.d_ff, g);
    for (size_t i = 0; i < d; ++i) x[i] += dn[i];
    RmsNormD(x, 0, d, on, eps);
    auto ref = MatVecD(wout, V, d, x);

    auto made = m->NewCache(std::make_unique<FullPolicy>(), kv_type);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    auto cache = std::move(made).value();
    std::vector<float> logits(V);
    ASSERT_TRUE(m->Prefill(toks.data(), n - 1, 5, cache.get(), nullptr, nullptr).ok());
    ASSERT_TRUE(m->Decode(toks[n - 1], cache.get(), nullptr, logits.data()).ok());
    double worst = 0;
    for (size_t j = 0; j < V; ++j) worst = std::max(worst, std::fabs(logits[j] - ref[j]));
    std::printf("kv %s vs reference with %s cache, %s: max |logit difference| = %.3g\n",
                std::string(DTypeName(kv_type)).c_str(), cs.ref_bf16 ? "bf16" : "f64",
                nope ? "NoPE" : "RoPE", worst);
    if (kv_type == DType::kBF16 && !cs.ref_bf16) {
      bf16_vs_plain[nope] = worst;  // the bf16 cache's own error: measured, not a pass/fail
      continue;
    }
    if (kv_type == DType::kF32) f32_vs_plain[nope] = worst;
    for (size_t j = 0; j < V; ++j) ASSERT_NEAR(logits[j], ref[j], 1e-3) << "token " << j;
  }
  for (bool nope : {false, true}) {
    SCOPED_TRACE(nope ? "NoPE" : "RoPE");
    EXPECT_LT(f32_vs_plain[nope], 2e-5);
    EXPECT_LT(f32_vs_plain[nope] * 100, bf16_vs_plain[nope]);
  }
}

// Lemma 1 of the VestigeKV paper: under NoPE a cache row carries no position, so in a 1-layer
// model permuting the earlier tokens permutes the rows and leaves the last query's output (and
// logits) unchanged up to f32 summation order; with RoPE the same permutation changes them.
TEST(ModelTest, NopeExchangeabilityAndRopeNegativeControl) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  for (bool nope : {true, false}) {
    SCOPED_TRACE(std::string(nope ? "NoPE" : "RoPE") + " seed " + std::to_string(seed));
    auto m = MakeModel({nope ? "ex_nope" : "ex_rope", Arch::kDeepseek2, nope,
                        "layers=1,experts=0,dense_layers=1"},
                       seed);
    ASSERT_TRUE(m);
    const int64_t V = m->config().n_vocab;
    const int n = 40;
    std::vector<int32_t> toks = RandomTokens(rng, n, V);
    std::vector<int32_t> perm = toks;
    std::vector<int> idx(n - 1);
    std::iota(idx.begin(), idx.end(), 0);
    for (int i = n - 2; i > 0; --i) std::swap(idx[i], idx[rng.Below(i + 1)]);
    for (int i = 0; i < n - 1; ++i) perm[i] = toks[idx[i]];
    std::vector<float> a(V), b(V);
    auto c1 = FullCache(*m);
    auto c2 = FullCache(*m);
    ASSERT_TRUE(m->Prefill(toks.data(), n, 8, c1.get(), nullptr, a.data()).ok());
    ASSERT_TRUE(m->Prefill(perm.data(), n, 8, c2.get(), nullptr, b.data()).ok());
    double maxdiff = 0;
    for (int64_t j = 0; j < V; ++j) maxdiff = std::max(maxdiff, static_cast<double>(std::fabs(a[j] - b[j])));
    if (nope) {
      EXPECT_LT(maxdiff, 1e-4);
    } else {
      EXPECT_GT(maxdiff, 1e-2);
    }
  }
}

TEST(ModelTest, BadInputsAreClearErrors) {
  auto missing = Model::Load("/nonexistent/model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);

  const uint64_t seed = TestSeed();
  auto m = MakeModel(Variants()[0], seed);
  ASSERT_TRUE(m);
  auto cache = FullCache(*m);
  std::vector<float> logits(m->config().n_vocab);
  Status s = m->Decode(static_cast<int32_t>(m->config().n_vocab), cache.get(), nullptr, logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos);
  int32_t t = -1;
  s = m->Prefill(&t, 1, 4, cache.get(), nullptr, logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  t = 1;
  s = m->Prefill(&t, 1, 0, cache.get(), nullptr, logits.data());
  EXPECT_NE(s.message().find("--chunk"), std::string::npos);

  // A GGUF whose architecture is unknown, and one with a tensor of the wrong shape.
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("mamba"));
  auto f = GgufFile::FromBuffer(w.ToBytes());
  ASSERT_TRUE(f.ok());
  auto bad = Model::FromGguf(std::move(f).value());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mamba"), std::string::npos);

  GgufWriter w2;
  w2.Set("general.architecture", GgufValue::String("llama"));
  w2.Set("llama.block_count", GgufValue::U32(1));
  w2.Set("llama.embedding_length", GgufValue::U32(8));
  w2.Set("llama.attention.head_count", GgufValue::U32(2));
  w2.Set("llama.feed_forward_length", GgufValue::U32(16));
  std::vector<float> emb(10 * 8, 0.1f), norm(8, 1.f), q(6 * 8, 0.f);
  ASSERT_TRUE(w2.AddTensorF32("token_embd.weight", DType::kF32, {10, 8}, emb.data()).ok());
  ASSERT_TRUE(w2.AddTensorF32("output_norm.weight", DType::kF32, {8}, norm.data()).ok());
  ASSERT_TRUE(w2.AddTensorF32("blk.0.attn_norm.weight", DType::kF32, {8}, norm.data()).ok());
  ASSERT_TRUE(w2.AddTensorF32("blk.0.ffn_norm.weight", DType::kF32, {8}, norm.data()).ok());
  ASSERT_TRUE(w2.AddTensorF32("blk.0.attn_q.weight", DType::kF32, {6, 8}, q.data()).ok());
  auto f2 = GgufFile::FromBuffer(w2.ToBytes());
  ASSERT_TRUE(f2.ok());
  auto bad2 = Model::FromGguf(std::move(f2).value());
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(bad2.status().message().find("[8, 8]"), std::string::npos);

  // Missing required metadata names the key.
  GgufWriter w3;
  w3.Set("general.architecture", GgufValue::String("llama"));
  auto f3 = GgufFile::FromBuffer(w3.ToBytes());
  auto bad3 = Model::FromGguf(std::move(f3).value());
  ASSERT_FALSE(bad3.ok());
  EXPECT_NE(bad3.status().message().find("llama.block_count"), std::string::npos);
}

TEST(ModelTest, SafetensorsDirectoryLoadsLikeGguf) {
  const uint64_t seed = TestSeed();
  Rng rng(seed);
  SynthOptions o;
  o.arch = Arch::kQwen2;
  o.seed = seed;
  o.dtype = DType::kF32;
  const std::string dir = TempPath("hf_qwen2_" + std::to_string(seed));
  ASSERT_TRUE(SynthHf(o, dir).ok());
  const std::string gguf = TempPath("hf_qwen2_" + std::to_string(seed) + ".gguf");
  ASSERT_TRUE(SynthGguf(o, gguf).ok());
  auto a = Model::Load(dir);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Model::Load(gguf);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::vector<int32_t> toks = RandomTokens(rng, 12, (*a)->config().n_vocab);
  std::vector<float> la((*a)->config().n_vocab), lb(la.size());
  auto ca = FullCache(**a);
  auto cb = FullCache(**b);
  ASSERT_TRUE((*a)->Prefill(toks.data(), 12, 4, ca.get(), nullptr, la.data()).ok());
  ASSERT_TRUE((*b)->Prefill(toks.data(), 12, 4, cb.get(), nullptr, lb.data()).ok());
  for (size_t j = 0; j < la.size(); ++j) ASSERT_EQ(la[j], lb[j]) << "seed " << seed;
}

}  // namespace
}  // namespace strata
