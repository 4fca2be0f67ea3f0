// The model-level accuracy contract of the fast attention arithmetic (--attn-math bf16; see
// kernels/attn_math.h and the kernel bound in kernels/attention_test.cc): the next-token
// distribution under the fast path within KL(p_f32 || p_fast) <= 1e-4 nats per token of the f32
// path over 512 teacher-forced tokens, greedy text unchanged. It holds on every shipped testbed
// (models/*.gguf) and on the synthetic deepseek2 models; on the synthetic llama and qwen2 models
// (sharper weights, std 0.08) it does not, which this test records and which is one reason auto
// is f32 over bf16 rows. (The golden needle tables under bf16: eval/testbed_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "core/rng.h"
#include "kv/policy.h"
#include "model/gqa_prefill.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/synth.h"

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

namespace strata {
namespace {

constexpr int kTokens = 512;
constexpr double kMaxMeanKl = 1e-4;  // nats per token

// The testbed vocabulary (tools/testbed/tb_data.py ALPHABET): character i is token 50 + i.
constexpr std::string_view kAlphabet =
    " !'(),-.0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWYZabcdefghijklmnopqrstuvwxyz";
// Genesis 1:1-13 (KJV, the testbeds' training text), for teacher forcing.
constexpr std::string_view kPassage =
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
    "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
    "that it was good: and God divided the light from the darkness. And God called the light Day, "
    "and the darkness he called Night. And the evening and the morning were the first day. And God "
    "said, Let there be a firmament in the midst of the waters, and let it divide the waters from "
    "the waters. And God made the firmament, and divided the waters which were under the firmament "
    "from the waters which were above the firmament: and it was so. And God called the firmament "
    "Heaven. And the evening and the morning were the second day. And God said, Let the waters "
    "under the heaven be gathered together unto one place, and let the dry land appear: and it was "
    "so. And God called the dry land Earth; and the gathering together of the waters called he "
    "Seas: and God saw that it was good.";

std::vector<int32_t> PassageTokens() {
  std::vector<int32_t> t;
  for (char c : kPassage) {
    const size_t i = kAlphabet.find(c);
    if (i != std::string_view::npos) t.push_back(static_cast<int32_t>(50 + i));
  }
  return t;
}

std::unique_ptr<KvCache> Cache(const Model& m, AttnMath math) {
  auto c = m.NewCache(std::make_unique<FullPolicy>(), DType::kBF16, math);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

struct KlStats {
  double mean = 0, max = 0;
  int argmax_changed = 0;
};

// Teacher-forced logits of `tokens` under f32 and `fast`; KL(p_f32 || p_fast) per position.
KlStats CompareLogits(Model& m, const std::vector<int32_t>& tokens, AttnMath fast) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t V = m.config().n_vocab;
  std::vector<float> ref, got;
  auto c32 = Cache(m, AttnMath::kF32);
  auto cf = Cache(m, fast);
  // Every query through the per-query reads (those of every decode step), whose arithmetic
  // --attn-math chooses: MLA prefill chunks in the expanded form (model/mla.h) and GQA chunks in
  // the staged form (model/gqa_prefill.h) are f32 under every setting.
  const int64_t expanded = mla_internal::SetExpandedMinRowsForTest(-1);
  const int64_t staged = gqa_internal::SetStagedMinRowsForTest(-1);
  EXPECT_TRUE(m.Prefill(tokens.data(), n, 64, c32.get(), nullptr, nullptr, &ref).ok());
  EXPECT_TRUE(m.Prefill(tokens.data(), n, 64, cf.get(), nullptr, nullptr, &got).ok());
  mla_internal::SetExpandedMinRowsForTest(expanded);
  gqa_internal::SetStagedMinRowsForTest(staged);
  KlStats s;
  if (static_cast<int64_t>(ref.size()) != n * V || got.size() != ref.size()) {
    ADD_FAILURE() << "logit sizes";
    return s;
  }
  bool identical = true;
  for (int64_t i = 0; i < n; ++i) {
    const float* a = ref.data() + i * V;
    const float* b = got.data() + i * V;
    double ma = -INFINITY, mb = -INFINITY;
    for (int64_t j = 0; j < V; ++j) ma = std::max<double>(ma, a[j]), mb = std::max<double>(mb, b[j]);
    double za = 0, zb = 0;
    for (int64_t j = 0; j < V; ++j) za += std::exp(a[j] - ma), zb += std::exp(b[j] - mb);
    const double la = ma + std::log(za), lb = mb + std::log(zb);
    double kl = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double lpa = a[j] - la, lpb = b[j] - lb;
      kl += std::exp(lpa) * (lpa - lpb);
      identical = identical && a[j] == b[j];
    }
    kl = std::max(kl, 0.0);
    s.mean += kl / n;
    s.max = std::max(s.max, kl);
    s.argmax_changed += std::max_element(a, a + V) - a != std::max_element(b, b + V) - b;
  }
  // The fast path was taken (the caches' reads differ), or the test would prove nothing.
  EXPECT_FALSE(identical) << "the fast path gave bit-identical logits";
  return s;
}

std::vector<int32_t> Greedy(Model& m, const std::vector<int32_t>& prompt, int n,
                            AttnMath math) {
  auto c = Cache(m, math);
  std::vector<float> logits(m.config().n_vocab);
  EXPECT_TRUE(m.Prefill(prompt.data(), static_cast<int64_t>(prompt.size()), 64, c.get(), nullptr,
                        logits.data())
                  .ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                           logits.begin());
    out.push_back(t);
    EXPECT_TRUE(m.Decode(t, c.get(), nullptr, logits.data()).ok());
  }
  return out;
}

TEST(AttnMathModelTest, TestbedsWithinKlAndGreedyTextUnchanged) {
  const std::vector<int32_t> passage = PassageTokens();
  ASSERT_GE(passage.size(), static_cast<size_t>(kTokens));
  const std::vector<int32_t> tokens(passage.begin(), passage.begin() + kTokens);
  int n_models = 0;
  for (const char* name : {"gqa", "nope-mla", "rope-mla"}) {
    const std::string path = std::string(STRATA_SOURCE_DIR) + "/models/" + name + ".gguf";
    auto m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << path << ": " << m.status().ToString();
    ++n_models;
    const KlStats s = CompareLogits(**m, tokens, AttnMath::kBF16);
    std::printf("%s: KL(f32 || bf16) mean %.3g max %.3g nats/token over %d tokens, argmax changed "
                "at %d\n",
                name, s.mean, s.max, kTokens, s.argmax_changed);
    EXPECT_LE(s.mean, kMaxMeanKl) << name;
    const std::vector<int32_t> prompt(passage.begin(), passage.begin() + 96);
    EXPECT_EQ(Greedy(**m, prompt, 128, AttnMath::kF32), Greedy(**m, prompt, 128, AttnMath::kBF16))
        << name << ": greedy text changed under bf16";
  }
  EXPECT_EQ(n_models, 3);
}

std::string TempPath(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_attn_math_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// Random-weight models of each architecture, with weights large enough for peaked attention and
// next-token distributions (the default 0.02 makes both nearly uniform, where any arithmetic
// passes), head widths that exercise the bf16 kernel's tails (MLA rows of 64 + 16 = 80 and 48).
TEST(AttnMathModelTest, SyntheticModelsOfEachArchitectureWithinKl) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  struct V {
    const char* label;
    Arch arch;
    bool nope;
    const char* dims;
  };
  const V variants[] = {
      {"llama", Arch::kLlama, false, "d_model=128,heads=8,kv_heads=2,head_dim=32,layers=3"},
      {"qwen2", Arch::kQwen2, false, "d_model=128,heads=4,kv_heads=4,head_dim=64,layers=2"},
      {"deepseek2_rope", Arch::kDeepseek2, false, "kv_lora=64,rope_dim=16,nope_dim=32,heads=8"},
      {"deepseek2_nope", Arch::kDeepseek2, true, "kv_lora=40,rope_dim=8,heads=4"},
  };
  Rng rng(seed);
  for (const V& v : variants) {
    SynthOptions o;
    o.arch = v.arch;
    o.nope = v.nope;
    o.seed = seed;
    o.init_std = 0.08f;
    o.dtype = DType::kF32;
    ASSERT_TRUE(o.ApplyDims(v.dims).ok()) << v.label;
    const std::string path = TempPath(std::string(v.label) + ".gguf");
    ASSERT_TRUE(SynthGguf(o, path).ok()) << v.label;
    auto m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::vector<int32_t> tokens(kTokens);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.Below((*m)->config().n_vocab));
    const KlStats s = CompareLogits(**m, tokens, AttnMath::kBF16);
    std::printf("%s: KL(f32 || bf16) mean %.3g max %.3g nats/token over %d tokens, argmax changed "
                "at %d\n",
                v.label, s.mean, s.max, kTokens, s.argmax_changed);
    if (std::getenv("STRATA_KL_PORTABLE") != nullptr) {
      const bool prev = attn_math_internal::SetNativeBf16ForTest(false);
      const KlStats p = CompareLogits(**m, tokens, AttnMath::kBF16);
      attn_math_internal::SetNativeBf16ForTest(prev);
      std::printf("%s: portable bf16 KL mean %.3g max %.3g\n", v.label, p.mean, p.max);
    }
    if (v.arch == Arch::kDeepseek2) {
      EXPECT_LE(s.mean, kMaxMeanKl) << v.label;
    } else if (s.mean > kMaxMeanKl) {
      // Measured: bf16 query rounding does NOT meet the contract on these GQA models (llama
      // 2.0-2.6e-3, qwen2 2-4e-4 nats/token over seeds 1-3, the portable form the same as
      // vdpbf16ps: it is the query rounding, not the kernel). So auto must not pick bf16 for
      // them: auto over GQA bf16 rows is the f32 path (kernels/attn_math.h; only MLA latent
      // rows may take bf16 under auto).
      std::printf("%s: bf16 is outside the contract here; auto uses f32\n", v.label);
      EXPECT_EQ(Bf16RowsMath(AttnMath::kAuto, /*latent_rows=*/false), AttnMath::kF32) << v.label;
    }
  }
}

}  // namespace
}  // namespace strata
