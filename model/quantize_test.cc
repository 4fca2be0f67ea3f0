#include "model/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/quant.h"
#include "core/rng.h"
#include "core/status_testing.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("strata_quantize_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

TEST(FileTypeTest, ParsesLlamaCppNamesInAnyCase) {
  ASSERT_OK(ParseFileType("q4_k_m"));
  EXPECT_EQ(ParseFileType("Q4_K_M")->id, 15u);
  EXPECT_EQ(ParseFileType("q4_k_m")->base, DType::kQ4_K);
  EXPECT_EQ(ParseFileType("Q8_0")->id, 7u);
  EXPECT_EQ(ParseFileType("iq4_xs")->id, 30u);
  EXPECT_EQ(ParseFileType("f16")->base, DType::kF16);
  auto bad = ParseFileType("Q4_K_X");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'Q4_K_X' is not a file type"), std::string::npos);
  EXPECT_NE(bad.status().message().find("Q4_K_M"), std::string::npos);  // lists the valid ones
  EXPECT_EQ(FileTypeIdName(15), "MOSTLY_Q4_K_M");
  EXPECT_EQ(FileTypeIdName(0), "ALL_F32");
  EXPECT_EQ(FileTypeIdName(1234), "type 1234");
}

TEST(FileTypeTest, QuantizableTensorsAreMatricesButNotNormsOrRouters) {
  EXPECT_TRUE(IsQuantizableTensor("blk.0.attn_q.weight", {256, 256}));
  EXPECT_TRUE(IsQuantizableTensor("blk.0.ffn_down_exps.weight", {4, 256, 512}));
  EXPECT_FALSE(IsQuantizableTensor("blk.0.attn_norm.weight", {256}));
  EXPECT_FALSE(IsQuantizableTensor("blk.0.kv_a_norm.weight", {256, 1}));
  EXPECT_FALSE(IsQuantizableTensor("blk.0.ffn_gate_inp.weight", {8, 256}));
  EXPECT_FALSE(IsQuantizableTensor("blk.0.attn_q.bias", {256, 1}));
  EXPECT_FALSE(IsQuantizableTensor("rope_freqs.weight", {32}));
}

// The types llama.cpp's quantizer picks for a dense 12-layer llama (n_gqa 1) at each file type,
// as its rules state them: Q4_K_M puts attn_v and ffn_down of the "more bits" layers (the first
// and last eighth and every third between: 0, 3, 6, 9, 10, 11 of 12) at Q6_K.
std::map<std::string, DType> Plan(const std::string& type, int n_layer, bool tied, int n_gqa,
                                  int64_t cols) {
  MixModelInfo info;
  info.n_layer = n_layer;
  info.n_gqa = n_gqa;
  info.has_output = !tied;
  info.n_attention_wv = n_layer;
  TensorTypePlanner p(*ParseFileType(type), info);
  std::map<std::string, DType> out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    bool q = false;
    auto t = p.Choose(name, shape, &q);
    EXPECT_OK(t);
    out[name] = *t;
  };
  add("token_embd.weight", {1000, cols});
  for (int l = 0; l < n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {cols});
    add(b + "attn_q.weight", {cols, cols});
    add(b + "attn_k.weight", {cols, cols});
    add(b + "attn_v.weight", {cols, cols});
    add(b + "attn_output.weight", {cols, cols});
    add(b + "ffn_gate.weight", {cols, cols});
    add(b + "ffn_up.weight", {cols, cols});
    add(b + "ffn_down.weight", {cols, cols});
  }
  if (!tied) add("output.weight", {1000, cols});
  return out;
}

TEST(TensorTypePlannerTest, Q4KMGivesMoreBitsToAttnVAndFfnDownOfHalfTheLayers) {
  auto p = Plan("Q4_K_M", 12, false, 1, 768);
  EXPECT_EQ(p["token_embd.weight"], DType::kQ4_K);
  EXPECT_EQ(p["output.weight"], DType::kQ6_K);
  EXPECT_EQ(p["blk.0.attn_norm.weight"], DType::kF32);
  for (int l = 0; l < 12; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const bool more = l == 0 || l == 3 || l == 6 || l == 9 || l == 10 || l == 11;
    EXPECT_EQ(p[b + "attn_v.weight"], more ? DType::kQ6_K : DType::kQ4_K) << l;
    EXPECT_EQ(p[b + "ffn_down.weight"], more ? DType::kQ6_K : DType::kQ4_K) << l;
    EXPECT_EQ(p[b + "attn_q.weight"], DType::kQ4_K) << l;
    EXPECT_EQ(p[b + "ffn_up.weight"], DType::kQ4_K) << l;
  }
}

TEST(TensorTypePlannerTest, OtherMixes) {
  // Q4_0: every matrix Q4_0 except the output at Q6_K.
  auto q40 = Plan("Q4_0", 4, false, 1, 512);
  EXPECT_EQ(q40["output.weight"], DType::kQ6_K);
  EXPECT_EQ(q40["blk.3.ffn_down.weight"], DType::kQ4_0);
  // Q8_0 keeps the output at Q8_0.
  EXPECT_EQ(Plan("Q8_0", 4, false, 1, 512)["output.weight"], DType::kQ8_0);
  // Tied embeddings: token_embd.weight is the output and gets its type.
  EXPECT_EQ(Plan("Q4_K_M", 4, true, 1, 512)["token_embd.weight"], DType::kQ6_K);
  // Q3_K_M: attn_v of the first two layers Q5_K then Q4_K; ffn_down Q5_K below n/16 else Q4_K;
  // attn_output Q4_K.
  auto q3m = Plan("Q3_K_M", 32, false, 1, 512);
  EXPECT_EQ(q3m["blk.1.attn_v.weight"], DType::kQ5_K);
  EXPECT_EQ(q3m["blk.2.attn_v.weight"], DType::kQ4_K);
  EXPECT_EQ(q3m["blk.1.ffn_down.weight"], DType::kQ5_K);
  EXPECT_EQ(q3m["blk.2.ffn_down.weight"], DType::kQ4_K);
  EXPECT_EQ(q3m["blk.5.attn_output.weight"], DType::kQ4_K);
  EXPECT_EQ(q3m["blk.5.attn_q.weight"], DType::kQ3_K);
  // Q2_K with GQA >= 4: attn_v at Q4_K; ffn_down Q3_K; attn_output Q3_K.
  auto q2 = Plan("Q2_K", 8, false, 4, 512);
  EXPECT_EQ(q2["blk.0.attn_v.weight"], DType::kQ4_K);
  EXPECT_EQ(q2["blk.0.ffn_down.weight"], DType::kQ3_K);
  EXPECT_EQ(q2["blk.0.attn_output.weight"], DType::kQ3_K);
  EXPECT_EQ(q2["blk.0.attn_q.weight"], DType::kQ2_K);
  // Q4_K_S: attn_v of the first 4 layers, ffn_down of the first eighth at Q5_K.
  auto q4s = Plan("Q4_K_S", 16, false, 1, 512);
  EXPECT_EQ(q4s["blk.3.attn_v.weight"], DType::kQ5_K);
  EXPECT_EQ(q4s["blk.4.attn_v.weight"], DType::kQ4_K);
  EXPECT_EQ(q4s["blk.1.ffn_down.weight"], DType::kQ5_K);
  EXPECT_EQ(q4s["blk.2.ffn_down.weight"], DType::kQ4_K);
  // IQ4_XS with GQA >= 4: attn_v at Q5_K.
  EXPECT_EQ(Plan("IQ4_XS", 8, false, 4, 512)["blk.5.attn_v.weight"], DType::kQ5_K);
  EXPECT_EQ(Plan("IQ4_XS", 8, false, 1, 512)["blk.5.attn_v.weight"], DType::kIQ4_XS);
}

TEST(TensorTypePlannerTest, RowsThatAreNotWholeSuperBlocksFallBack) {
  // 320 columns: not a multiple of 256, a multiple of 32.
  auto p = Plan("Q4_K_M", 8, false, 1, 320);
  EXPECT_EQ(p["blk.1.attn_q.weight"], DType::kQ5_0);    // Q4_K -> Q5_0
  EXPECT_EQ(p["blk.0.attn_v.weight"], DType::kQ8_0);    // Q6_K -> Q8_0
  EXPECT_EQ(p["output.weight"], DType::kQ8_0);
  EXPECT_EQ(Plan("Q3_K_S", 8, false, 1, 320)["blk.1.attn_q.weight"], DType::kQ4_0);
  EXPECT_EQ(Plan("IQ4_XS", 8, false, 1, 320)["blk.1.attn_q.weight"], DType::kIQ4_NL);
  EXPECT_EQ(Plan("Q5_K_S", 8, false, 1, 320)["blk.1.attn_q.weight"], DType::kQ5_1);
  // 40 columns: no 32-block either: F16.
  EXPECT_EQ(Plan("Q4_K_M", 8, false, 1, 40)["blk.1.attn_q.weight"], DType::kF16);
  EXPECT_EQ(Plan("Q4_0", 8, false, 1, 40)["blk.1.attn_q.weight"], DType::kF16);
}

TEST(TensorTypePlannerTest, MoeFfnDownReadsTheLayerFromItsName) {
  MixModelInfo info;
  info.n_layer = 8;
  info.n_expert = 4;
  info.n_attention_wv = 8;
  TensorTypePlanner p(*ParseFileType("Q4_K_M"), info);
  bool q = false;
  // Layer 3 is a "more bits" layer of 8 (n/8 = 1: (3 - 1) % 3 == 2); layer 2 is not.
  EXPECT_EQ(*p.Choose("blk.2.ffn_down_exps.weight", {4, 512, 512}, &q), DType::kQ4_K);
  EXPECT_EQ(*p.Choose("blk.3.ffn_down_exps.weight", {4, 512, 512}, &q), DType::kQ6_K);
  EXPECT_EQ(*p.Choose("blk.3.ffn_down_shexp.weight", {512, 512}, &q), DType::kQ6_K);
}

// The mix against llama-quantize's own choices: testdata/quant/mix.json holds the type of every
// tensor llama-quantize wrote for each file type, on a 16-layer llama (GQA 4) and an 8-layer
// deepseek2 MoE made by strata synth (the commands are in the file). The planner, run over the
// same models' tensors in file order, must choose the same type for every tensor.
TEST(TensorTypePlannerTest, MatchesLlamaQuantizeOnEveryTensor) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/testdata/quant/mix.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json mix = nlohmann::json::parse(in);
  struct M {
    const char* name;
    Arch arch;
    const char* dims;
  };
  const M models[] = {
      {"llama", Arch::kLlama, "d_model=256,layers=16,heads=4,kv_heads=1,head_dim=64,ff=256,vocab=260"},
      {"deepseek2", Arch::kDeepseek2,
       "d_model=256,layers=8,experts=4,experts_used=2,ff_expert=256,ff=256,kv_lora=256,"
       "nope_dim=64,rope_dim=64,v_dim=64,heads=4"},
  };
  int checked = 0;
  for (const M& m : models) {
    SynthOptions o;
    o.arch = m.arch;
    o.dtype = DType::kF16;
    ASSERT_OK(o.ApplyDims(m.dims));
    const std::string path = TempPath(std::string("mix-") + m.name + ".gguf");
    ASSERT_OK(SynthGguf(o, path));
    auto f = GgufFile::Open(path);
    ASSERT_OK(f);
    auto info = ReadMixModelInfo(**f);
    ASSERT_OK(info);
    ASSERT_TRUE(mix["models"].contains(m.name));
    for (const auto& [type, want] : mix["models"][m.name].items()) {
      SCOPED_TRACE(std::string(m.name) + " " + type);
      auto ft = ParseFileType(type);
      ASSERT_OK(ft);
      TensorTypePlanner p(*ft, *info);
      ASSERT_EQ(want.size(), (*f)->tensors().size());
      for (const GgufTensorInfo& t : (*f)->tensors()) {
        bool q = false;
        auto got = p.Choose(t.name, t.shape, &q);
        ASSERT_OK(got);
        const DType stored = q ? *got : t.dtype == DType::kF16 ? DType::kF32 : t.dtype;
        ASSERT_TRUE(want.contains(t.name)) << t.name;
        EXPECT_EQ(DTypeName(stored), want[t.name].get<std::string>()) << t.name;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace strata
