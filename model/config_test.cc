// ModelConfig from crafted GGUF metadata: strictly typed keys, 64-bit range checks before any
// narrowing, and counts checked against the tensors that must exist for them (issue 13, D5 and
// "strictly typed metadata"). Each case starts from a valid synthesized file and changes one key.
#include "model/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "core/status_testing.h"
#include "io/gguf.h"
#include "model/model.h"
#include "model/synth.h"

namespace strata {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("strata_config_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// A tiny valid model of `arch`, written once per arch.
const GgufFile& Base(Arch arch) {
  static std::map<Arch, std::unique_ptr<GgufFile>> files;
  auto& f = files[arch];
  if (!f) {
    SynthOptions o;
    o.arch = arch;
    o.nope = arch == Arch::kDeepseek2;
    o.dtype = DType::kF32;
    const std::string path = TempPath(std::string(ArchName(arch)) + ".gguf");
    EXPECT_OK(SynthGguf(o, path));
    auto opened = GgufFile::Open(path);
    EXPECT_OK(opened.status());
    f = std::move(*opened);
    std::filesystem::remove(path);
  }
  return *f;
}

// The base file with key `key` set to `value` (or removed when nullopt), re-parsed.
std::unique_ptr<GgufFile> With(Arch arch, const std::string& key, std::optional<GgufValue> value) {
  const GgufFile& base = Base(arch);
  GgufWriter w;
  bool seen = false;
  for (const auto& [k, v] : base.metadata()) {
    if (k == key) {
      seen = true;
      if (value) w.Set(k, *value);
    } else {
      w.Set(k, v);
    }
  }
  if (!seen && value) w.Set(key, *value);
  for (const GgufTensorInfo& t : base.tensors()) {
    auto view = base.Tensor(t.name);
    EXPECT_OK(view.status());
    EXPECT_OK(w.AddTensor(t.name, t.dtype, t.shape, view->data, t.n_bytes));
  }
  auto f = GgufFile::FromBuffer(w.ToBytes(), "crafted.gguf");
  EXPECT_OK(f.status());
  return std::move(*f);
}

Status ConfigOf(Arch arch, const std::string& key, std::optional<GgufValue> value) {
  return ModelConfig::FromGguf(*With(arch, key, std::move(value))).status();
}

void ExpectError(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(ModelConfigTest, BaseFilesAreValid) {
  EXPECT_OK(ModelConfig::FromGguf(Base(Arch::kLlama)).status());
  EXPECT_OK(ModelConfig::FromGguf(Base(Arch::kDeepseek2)).status());
  // A key rewritten with its own type and value changes nothing.
  EXPECT_OK(ConfigOf(Arch::kLlama, "llama.block_count", GgufValue::U32(2)));
  // Any integer type whose value fits is accepted.
  auto c = ModelConfig::FromGguf(*With(Arch::kLlama, "llama.attention.head_count_kv",
                                       GgufValue::U8(2)));
  ASSERT_OK(c.status());
  EXPECT_EQ(c->n_kv_heads, 2);
  c = ModelConfig::FromGguf(*With(Arch::kLlama, "llama.attention.head_count_kv",
                                  GgufValue::I64(2)));
  ASSERT_OK(c.status());
  EXPECT_EQ(c->n_kv_heads, 2);
}

// D5: a block count far beyond the tensors in the file is refused before anything is sized by it
// (a 290 KB file claiming 2^24 layers took 7.4 GB and 31 s before "missing tensor"; 2^31 ended in
// vector::_M_default_append).
TEST(ModelConfigTest, BlockCountIsCheckedAgainstTheTensors) {
  for (int64_t n : {int64_t{1} << 24, int64_t{1} << 31}) {
    for (Arch arch : {Arch::kLlama, Arch::kDeepseek2}) {
      const std::string key = std::string(ArchName(arch)) + ".block_count";
      const Status s = ConfigOf(arch, key, GgufValue::U32(static_cast<uint32_t>(n)));
      ExpectError(s, StatusCode::kOutOfRange, key);
      // And through Model::FromGguf, which sizes the layers.
      auto m = Model::FromGguf(With(arch, key, GgufValue::U32(static_cast<uint32_t>(n))));
      ASSERT_FALSE(m.ok());
      EXPECT_EQ(m.status().code(), StatusCode::kOutOfRange) << m.status().ToString();
    }
  }
  // The synthesized llama has 2 layers in 21 tensors: 6 layers would need at least 24.
  ExpectError(ConfigOf(Arch::kLlama, "llama.block_count", GgufValue::U32(6)),
              StatusCode::kOutOfRange, "holds only 21 tensors");
  // One more layer than the file has, within the tensor-count bound: the missing tensor is named.
  auto m = Model::FromGguf(With(Arch::kLlama, "llama.block_count", GgufValue::U32(3)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("blk.2."), std::string::npos) << m.status().message();
}

// Minor: 64-bit keys were cast to int before the range check (2^32 + 2 read as 2).
TEST(ModelConfigTest, WideIntegersAreRangeCheckedBeforeNarrowing) {
  ExpectError(ConfigOf(Arch::kLlama, "llama.attention.head_count_kv",
                       GgufValue::U64((uint64_t{1} << 32) + 2)),
              StatusCode::kOutOfRange, "4294967298");
  ExpectError(ConfigOf(Arch::kLlama, "llama.embedding_length",
                       GgufValue::I64((int64_t{1} << 32) + 64)),
              StatusCode::kOutOfRange, "llama.embedding_length");
  ExpectError(ConfigOf(Arch::kLlama, "llama.attention.key_length",
                       GgufValue::U64((uint64_t{1} << 32) + 16)),
              StatusCode::kOutOfRange, "llama.attention.key_length");
  ExpectError(ConfigOf(Arch::kLlama, "llama.feed_forward_length", GgufValue::I32(-128)),
              StatusCode::kOutOfRange, "llama.feed_forward_length");
  ExpectError(ConfigOf(Arch::kLlama, "llama.context_length", GgufValue::I32(-1)),
              StatusCode::kOutOfRange, "llama.context_length");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.expert_count",
                       GgufValue::U64((uint64_t{1} << 32) + 4)),
              StatusCode::kOutOfRange, "deepseek2.expert_count");
}

// A key of the wrong type is an error naming the key, its type and the expected one; it used to
// be treated as absent (a u8 mla_use_nope ran a NoPE model with RoPE; a float head_count_kv fell
// back to head_count).
TEST(ModelConfigTest, WrongTypesAreErrorsNotDefaults) {
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.attention.mla_use_nope", GgufValue::U8(1)),
              StatusCode::kInvalidArgument,
              "'deepseek2.attention.mla_use_nope' is u8, expected a bool");
  ExpectError(ConfigOf(Arch::kLlama, "llama.attention.head_count_kv", GgufValue::F32(2.f)),
              StatusCode::kInvalidArgument,
              "'llama.attention.head_count_kv' is f32, expected an integer");
  ExpectError(ConfigOf(Arch::kLlama, "llama.rope.freq_base", GgufValue::String("10000")),
              StatusCode::kInvalidArgument, "'llama.rope.freq_base' is string, expected a number");
  ExpectError(ConfigOf(Arch::kLlama, "general.name", GgufValue::U32(7)),
              StatusCode::kInvalidArgument, "'general.name' is u32, expected a string");
  ExpectError(ConfigOf(Arch::kLlama, "llama.rope.scaling.type", GgufValue::Bool(true)),
              StatusCode::kInvalidArgument, "'llama.rope.scaling.type' is bool");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.expert_weights_norm", GgufValue::U32(1)),
              StatusCode::kInvalidArgument, "'deepseek2.expert_weights_norm' is u32");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.expert_gating_func", GgufValue::F32(1.f)),
              StatusCode::kInvalidArgument, "'deepseek2.expert_gating_func' is f32");
  // The right type is still read (and a NoPE bool is honoured).
  auto c = ModelConfig::FromGguf(*With(Arch::kDeepseek2, "deepseek2.attention.mla_use_nope",
                                       GgufValue::Bool(false)));
  ASSERT_OK(c.status());
  EXPECT_FALSE(c->mla_nope);
  c = ModelConfig::FromGguf(Base(Arch::kDeepseek2));
  ASSERT_OK(c.status());
  EXPECT_TRUE(c->mla_nope);
}

TEST(ModelConfigTest, LeadingDenseAndQLoraAreChecked) {
  // The synthesized deepseek2 has 2 layers.
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.leading_dense_block_count", GgufValue::U32(3)),
              StatusCode::kOutOfRange, "'deepseek2.leading_dense_block_count' = 3 is outside [0, 2]");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.leading_dense_block_count", GgufValue::I32(-1)),
              StatusCode::kOutOfRange, "deepseek2.leading_dense_block_count");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.attention.q_lora_rank", GgufValue::I32(-4)),
              StatusCode::kOutOfRange, "deepseek2.attention.q_lora_rank");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.attention.q_lora_rank",
                       GgufValue::U64(uint64_t{1} << 40)),
              StatusCode::kOutOfRange, "deepseek2.attention.q_lora_rank");
  ExpectError(ConfigOf(Arch::kDeepseek2, "deepseek2.expert_used_count", GgufValue::U32(5)),
              StatusCode::kOutOfRange, "'deepseek2.expert_used_count' = 5 is outside [1, 4]");
  // q_lora_rank 0 (absent) is the single attn_q path; a positive rank needs its tensors.
  auto m = Model::FromGguf(With(Arch::kDeepseek2, "deepseek2.attention.q_lora_rank",
                                GgufValue::U32(16)));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("attn_q_a"), std::string::npos) << m.status().message();
}

// Strata writes deepseek2.attention.q_lora_rank = 0 when there is no q LoRA (llama.cpp needs the
// key); files from elsewhere may lack it. Both are the single attn_q path and load.
TEST(ModelConfigTest, QLoraRankZeroAndAbsentAreTheSameModel) {
  ASSERT_TRUE(Base(Arch::kDeepseek2).Has("deepseek2.attention.q_lora_rank"));
  for (std::optional<GgufValue> v : {std::optional<GgufValue>(GgufValue::U32(0)),
                                     std::optional<GgufValue>()}) {
    auto g = With(Arch::kDeepseek2, "deepseek2.attention.q_lora_rank", v);
    EXPECT_EQ(g->Has("deepseek2.attention.q_lora_rank"), v.has_value());
    auto c = ModelConfig::FromGguf(*g);
    ASSERT_OK(c.status());
    EXPECT_EQ(c->q_lora_rank, 0);
    EXPECT_OK(Model::FromGguf(std::move(g)).status());
  }
}

}  // namespace
}  // namespace strata
