#include "io/hf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "core/status_testing.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A fresh temporary directory, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("strata_hf_test_" + std::to_string(getpid()) + "_" + std::to_string(++counter));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const std::string dir() const { return path_.string(); }

 private:
  fs::path path_;
};

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// A raw safetensors image: u64 header length, header text, then `data_bytes` zero bytes.
std::vector<uint8_t> RawSafetensors(uint64_t header_len_field, const std::string& header,
                                    size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(header_len_field >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::vector<float> RandomValues(Rng& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ------------------------------------------------------------------------------------------------
// Safetensors

TEST(SafetensorsTest, RoundTripIsByteExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  const std::vector<std::vector<int64_t>> shapes = {{},        {1},          {7},    {3, 5},
                                                    {2, 3, 4}, {2, 1, 3, 2}, {0, 4}, {33, 17}};
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  std::vector<SafetensorsTensor> ts;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (DType dt : dtypes) {
      SafetensorsTensor t;
      t.name = std::string("t").append(std::to_string(i)).append(".").append(DTypeName(dt));
      t.dtype = dt;
      t.shape = shapes[i];
      t.values = RandomValues(rng, Numel(shapes[i]));
      ts.push_back(t);
    }
  }
  const std::string path = tmp.File("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, ts, {{"format", "pt"}, {"note", "x y"}}).ok());

  // Data starts 8-byte aligned.
  const std::vector<uint8_t> bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->metadata().at("note"), "x y");
  EXPECT_EQ((*f)->TensorNames().size(), ts.size());
  for (const SafetensorsTensor& t : ts) {
    SCOPED_TRACE(t.name);
    auto v = (*f)->Tensor(t.name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->dtype, t.dtype);
    ASSERT_EQ(v->n_dims, static_cast<int>(t.shape.size()));
    for (size_t d = 0; d < t.shape.size(); ++d) EXPECT_EQ(v->shape[d], t.shape[d]);
    const int64_t numel = Numel(t.shape);
    std::vector<uint8_t> want(static_cast<size_t>(DTypeRowBytes(t.dtype, numel)));
    if (numel == 0) continue;
    FromF32(t.dtype, t.values.data(), want.data(), numel);
    EXPECT_EQ(std::memcmp(v->data, want.data(), want.size()), 0);
  }
  auto missing = (*f)->Tensor("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  TempDir tmp;
  SafetensorsTensor t{"w", DType::kQ8_0, {32}, std::vector<float>(32)};
  Status s = WriteSafetensors(tmp.File("x.safetensors"), {t});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  t.dtype = DType::kF32;
  t.values.resize(31);
  s = WriteSafetensors(tmp.File("x.safetensors"), {t});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("31"), std::string::npos) << s.message();
  t.values.resize(32);
  s = WriteSafetensors(tmp.File("x.safetensors"), {t, t});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("duplicate"), std::string::npos) << s.message();
}

// Opens raw bytes and returns the status.
Status OpenRaw(const TempDir& tmp, const std::vector<uint8_t>& bytes) {
  const std::string path = tmp.File("bad.safetensors");
  WriteBytes(path, bytes);
  return SafetensorsFile::Open(path).status();
}

TEST(SafetensorsTest, MalformedHeaderLength) {
  TempDir tmp;
  const std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // Past EOF.
  Status s = OpenRaw(tmp, RawSafetensors(hdr.size() + 100, hdr, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(hdr.size() + 100)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("past the end"), std::string::npos) << s.message();
  // Absurd.
  s = OpenRaw(tmp, RawSafetensors(uint64_t{1} << 63, hdr, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("absurd"), std::string::npos) << s.message();
  // Too small for the length field.
  s = OpenRaw(tmp, {1, 2, 3});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("3 bytes"), std::string::npos) << s.message();
  // Missing file.
  EXPECT_EQ(SafetensorsFile::Open(tmp.File("none.safetensors")).status().code(),
            StatusCode::kNotFound);
  // Sanity: the same header with the right length opens.
  EXPECT_TRUE(OpenRaw(tmp, RawSafetensors(hdr.size(), hdr, 8)).ok());
}

TEST(SafetensorsTest, MalformedJson) {
  TempDir tmp;
  const std::string bad = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";  // no }
  Status s = OpenRaw(tmp, RawSafetensors(bad.size(), bad, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("not valid JSON"), std::string::npos) << s.message();
  const std::string arr = "[1, 2, 3]";
  s = OpenRaw(tmp, RawSafetensors(arr.size(), arr, 0));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  const std::string no_offsets = R"({"a":{"dtype":"F32","shape":[2]}})";
  s = OpenRaw(tmp, RawSafetensors(no_offsets.size(), no_offsets, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  const std::string neg = R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  s = OpenRaw(tmp, RawSafetensors(neg.size(), neg, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  const std::string meta = R"({"__metadata__":{"k":3}})";
  s = OpenRaw(tmp, RawSafetensors(meta.size(), meta, 0));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("__metadata__"), std::string::npos) << s.message();
}

TEST(SafetensorsTest, OffsetsOutOfRangeOverlapAndSizeMismatch) {
  TempDir tmp;
  // Out of range: 16 bytes claimed, 8 present.
  std::string h = R"({"weight.x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  Status s = OpenRaw(tmp, RawSafetensors(h.size(), h, 8));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("'weight.x'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s.message();
  // Reversed.
  h = R"({"weight.x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})";
  s = OpenRaw(tmp, RawSafetensors(h.size(), h, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  // Size mismatch: shape [3] F32 needs 12 bytes, offsets hold 8.
  h = R"({"weight.y":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  s = OpenRaw(tmp, RawSafetensors(h.size(), h, 16));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("'weight.y'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("12"), std::string::npos) << s.message();
  // Overlap.
  h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F16","shape":[4],"data_offsets":[4,12]}})";
  s = OpenRaw(tmp, RawSafetensors(h.size(), h, 16));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s.message();
  // Overflowing shape.
  h = R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})";
  s = OpenRaw(tmp, RawSafetensors(h.size(), h, 8));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, UnsupportedDTypeNamesItAndTheTensor) {
  TempDir tmp;
  const std::string h = R"({"pos_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                        R"("scale":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[16,20]},)"
                        R"("ok":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]}})";
  const std::string path = tmp.File("u.safetensors");
  WriteBytes(path, RawSafetensors(h.size(), h, 24));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->TensorNames(), (std::vector<std::string>{"ok", "pos_ids", "scale"}));
  auto a = (*f)->Tensor("pos_ids");
  EXPECT_EQ(a.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(a.status().message().find("I64"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("'pos_ids'"), std::string::npos) << a.status().message();
  auto b = (*f)->Tensor("scale");
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("F8_E4M3"), std::string::npos) << b.status().message();
  EXPECT_TRUE((*f)->Tensor("ok").ok());
  // A known dtype is still size-checked: I64 [3] needs 24 bytes.
  const std::string bad = R"({"pos_ids":{"dtype":"I64","shape":[3],"data_offsets":[0,16]}})";
  Status s = OpenRaw(tmp, RawSafetensors(bad.size(), bad, 16));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
}

// ------------------------------------------------------------------------------------------------
// Conversion: tiny random checkpoints written here.

// An HF checkpoint under construction: tensors with f32 values (as stored after dtype rounding).
class Checkpoint {
 public:
  Checkpoint(Rng* rng, DType dtype) : rng_(rng), dtype_(dtype) {}
  void Add(const std::string& name, std::vector<int64_t> shape) {
    std::vector<float> v = RandomValues(*rng_, Numel(shape));
    // Round to the storage type so the expected values are exact.
    std::vector<uint8_t> tmp(static_cast<size_t>(DTypeRowBytes(dtype_, Numel(shape))));
    FromF32(dtype_, v.data(), tmp.data(), Numel(shape));
    ToF32(dtype_, tmp.data(), v.data(), Numel(shape));
    tensors_.push_back({name, dtype_, std::move(shape), std::move(v)});
  }
  const SafetensorsTensor& Get(const std::string& name) const {
    for (const auto& t : tensors_) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "test bug: no tensor " << name;
    return tensors_.front();
  }
  void Remove(const std::string& name) {
    std::erase_if(tensors_, [&](const SafetensorsTensor& t) { return t.name == name; });
  }
  // One file, or `shards` files plus model.safetensors.index.json.
  void Write(const std::string& dir, const json& config, int shards = 1) const {
    std::ofstream(dir + "/config.json") << config.dump(2);
    if (shards == 1) {
      ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors_).ok());
      return;
    }
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    std::vector<std::vector<SafetensorsTensor>> parts(shards);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const int s = static_cast<int>(i % shards);
      parts[s].push_back(tensors_[i]);
      index["weight_map"][tensors_[i].name] = ShardName(s, shards);
    }
    for (int s = 0; s < shards; ++s) {
      ASSERT_TRUE(WriteSafetensors(dir + "/" + ShardName(s, shards), parts[s]).ok());
    }
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
  }
  static std::string ShardName(int s, int n) {
    return "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(n) + ".safetensors";
  }

 private:
  Rng* rng_;
  DType dtype_;
  std::vector<SafetensorsTensor> tensors_;
};

std::unique_ptr<GgufFile> ToGguf(const GgufWriter& w) {
  auto f = GgufFile::FromBuffer(w.ToBytes(), "converted");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(*f) : nullptr;
}

// Tensor values as f32 plus its torch-order shape.
std::vector<float> GgufValues(const GgufFile& g, const std::string& name,
                              std::vector<int64_t>* shape = nullptr, DType* dtype = nullptr) {
  auto v = g.Tensor(name);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  if (!v.ok()) return {};
  if (shape) shape->assign(v->shape.begin(), v->shape.begin() + v->n_dims);
  if (dtype) *dtype = v->dtype;
  std::vector<float> out(static_cast<size_t>(v->numel()));
  ToF32(v->dtype, v->data, out.data(), v->numel());
  return out;
}

std::vector<int64_t> GgufShape(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo* t = g.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? t->shape : std::vector<int64_t>{};
}

int64_t KeyInt(const GgufFile& g, const std::string& key) {
  auto v = g.GetInt(key);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : -1;
}
double KeyFloat(const GgufFile& g, const std::string& key) {
  auto v = g.GetFloat(key);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : -1;
}
std::string KeyString(const GgufFile& g, const std::string& key) {
  auto v = g.GetString(key);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : "";
}

struct LlamaDims {
  int64_t n_layer = 2, d = 64, n_head = 4, n_kv = 2, head_dim = 16, ff = 48, vocab = 40;
};

json LlamaConfig(const LlamaDims& m, const std::string& arch) {
  return {{"architectures", {arch}},         {"hidden_size", m.d},
          {"intermediate_size", m.ff},       {"num_hidden_layers", m.n_layer},
          {"num_attention_heads", m.n_head}, {"num_key_value_heads", m.n_kv},
          {"max_position_embeddings", 2048}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},          {"vocab_size", m.vocab},
          {"tie_word_embeddings", false},    {"torch_dtype", "float32"}};
}

void AddLlamaTensors(Checkpoint& ck, const LlamaDims& m, bool biases) {
  ck.Add("model.embed_tokens.weight", {m.vocab, m.d});
  ck.Add("model.norm.weight", {m.d});
  ck.Add("lm_head.weight", {m.vocab, m.d});
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.Add(p + "input_layernorm.weight", {m.d});
    ck.Add(p + "post_attention_layernorm.weight", {m.d});
    ck.Add(p + "self_attn.q_proj.weight", {m.n_head * m.head_dim, m.d});
    ck.Add(p + "self_attn.k_proj.weight", {m.n_kv * m.head_dim, m.d});
    ck.Add(p + "self_attn.v_proj.weight", {m.n_kv * m.head_dim, m.d});
    ck.Add(p + "self_attn.o_proj.weight", {m.d, m.n_head * m.head_dim});
    if (biases) {
      ck.Add(p + "self_attn.q_proj.bias", {m.n_head * m.head_dim});
      ck.Add(p + "self_attn.k_proj.bias", {m.n_kv * m.head_dim});
      ck.Add(p + "self_attn.v_proj.bias", {m.n_kv * m.head_dim});
    }
    ck.Add(p + "mlp.gate_proj.weight", {m.ff, m.d});
    ck.Add(p + "mlp.up_proj.weight", {m.ff, m.d});
    ck.Add(p + "mlp.down_proj.weight", {m.d, m.ff});
  }
}

// Hand-computed llama.cpp permutation: GGUF row r of head h, pair i, member j (r = h*hd + 2i + j)
// is HF row h*hd + j*hd/2 + i.
int64_t PermutedSourceRow(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, w = r % head_dim;
  return h * head_dim + (w % 2) * (head_dim / 2) + w / 2;
}

// Gemma3ForCausalLM as llama.cpp's converter writes it: norms + 1, no q/k permutation, the
// sliding window with the keys llama.cpp reads only where the config departs from its defaults,
// tied output; configs a gemma3 GGUF cannot express are refused by name.
TEST(HfConvertTest, Gemma3NormsPlusOneWindowAndKeys) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  LlamaDims m;
  m.n_layer = 4;
  m.n_kv = 1;
  Checkpoint ck(&rng, DType::kF32);
  ck.Add("model.embed_tokens.weight", {m.vocab, m.d});
  ck.Add("model.norm.weight", {m.d});
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
      ck.Add(p + n + ".weight", {m.d});
    }
    ck.Add(p + "self_attn.q_norm.weight", {m.head_dim});
    ck.Add(p + "self_attn.k_norm.weight", {m.head_dim});
    ck.Add(p + "self_attn.q_proj.weight", {m.n_head * m.head_dim, m.d});
    ck.Add(p + "self_attn.k_proj.weight", {m.n_kv * m.head_dim, m.d});
    ck.Add(p + "self_attn.v_proj.weight", {m.n_kv * m.head_dim, m.d});
    ck.Add(p + "self_attn.o_proj.weight", {m.d, m.n_head * m.head_dim});
    ck.Add(p + "mlp.gate_proj.weight", {m.ff, m.d});
    ck.Add(p + "mlp.up_proj.weight", {m.ff, m.d});
    ck.Add(p + "mlp.down_proj.weight", {m.d, m.ff});
  }
  json cfg = LlamaConfig(m, "Gemma3ForCausalLM");
  cfg.erase("tie_word_embeddings");  // Gemma's default: tied
  cfg["head_dim"] = m.head_dim;
  cfg["query_pre_attn_scalar"] = m.head_dim;
  cfg["sliding_window"] = 32;
  cfg["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                        "full_attention"};
  cfg["rope_local_base_freq"] = 20000.0;
  cfg["final_logit_softcapping"] = nullptr;
  {
    TempDir tmp;
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto g = ToGguf(*w);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(KeyString(*g, "general.architecture"), "gemma3");
    EXPECT_EQ(KeyInt(*g, "gemma3.attention.key_length"), m.head_dim);
    EXPECT_EQ(KeyInt(*g, "gemma3.attention.sliding_window"), 32);
    EXPECT_EQ(KeyInt(*g, "gemma3.attention.sliding_window_pattern"), 2);  // not llama.cpp's 6
    EXPECT_FLOAT_EQ(KeyFloat(*g, "gemma3.rope.freq_base_swa"), 20000.f);
    EXPECT_FLOAT_EQ(KeyFloat(*g, "gemma3.rope.freq_base"), 500000.f);
    EXPECT_FALSE(g->Has("gemma3.final_logit_softcapping"));
    EXPECT_EQ(g->FindTensor("output.weight"), nullptr);  // tied
    const std::vector<float> hf = ck.Get("model.layers.1.pre_feedforward_layernorm.weight").values;
    const std::vector<float> gg = GgufValues(*g, "blk.1.ffn_norm.weight");
    ASSERT_EQ(gg.size(), hf.size());
    for (size_t i = 0; i < hf.size(); ++i) EXPECT_EQ(gg[i], hf[i] + 1.f) << i;
    const std::vector<float> qn = GgufValues(*g, "blk.0.attn_q_norm.weight");
    EXPECT_EQ(qn[3], ck.Get("model.layers.0.self_attn.q_norm.weight").values[3] + 1.f);
    // q rows as they are (NEOX RoPE: no permutation).
    EXPECT_EQ(GgufValues(*g, "blk.0.attn_q.weight"),
              ck.Get("model.layers.0.self_attn.q_proj.weight").values);
  }
  {  // A layer list that is no period cannot be a gemma3 GGUF.
    TempDir tmp;
    json bad = cfg;
    bad["layer_types"] = {"sliding_attention", "full_attention", "full_attention",
                          "sliding_attention"};
    ck.Write(tmp.dir(), bad);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("layer_types[2]"), std::string::npos)
        << w.status().message();
  }
  {  // Another query_pre_attn_scalar has no key in the file.
    TempDir tmp;
    json bad = cfg;
    bad["query_pre_attn_scalar"] = 7;
    ck.Write(tmp.dir(), bad);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("query_pre_attn_scalar"), std::string::npos);
  }
}

TEST(HfConvertTest, LlamaKeysPermutationAndLlama3Rope) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  LlamaDims m;
  Checkpoint ck(&rng, DType::kF32);
  AddLlamaTensors(ck, m, /*biases=*/true);
  ck.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {m.head_dim / 2});  // skipped
  json cfg = LlamaConfig(m, "LlamaForCausalLM");
  cfg["rope_theta"] = 10000.0;
  cfg["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  ck.Write(tmp.dir(), cfg);

  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = ToGguf(*w);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(KeyString(*g, "general.architecture"), "llama");
  EXPECT_FALSE(KeyString(*g, "general.name").empty());
  EXPECT_EQ(KeyInt(*g, "llama.context_length"), 2048);
  EXPECT_EQ(KeyInt(*g, "llama.embedding_length"), m.d);
  EXPECT_EQ(KeyInt(*g, "llama.block_count"), m.n_layer);
  EXPECT_EQ(KeyInt(*g, "llama.feed_forward_length"), m.ff);
  EXPECT_EQ(KeyInt(*g, "llama.attention.head_count"), m.n_head);
  EXPECT_EQ(KeyInt(*g, "llama.attention.head_count_kv"), m.n_kv);
  EXPECT_EQ(KeyInt(*g, "llama.vocab_size"), m.vocab);
  EXPECT_EQ(KeyInt(*g, "llama.rope.dimension_count"), m.head_dim);
  EXPECT_FLOAT_EQ(KeyFloat(*g, "llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_FLOAT_EQ(KeyFloat(*g, "llama.rope.freq_base"), 10000.f);
  EXPECT_FALSE(g->Has("llama.rope.scaling.type"));

  // rope_freqs against a float64 evaluation of the llama3 rule; 1e-5 relative covers float32
  // evaluation of pow and the smooth blend. Every regime is exercised with head_dim 16.
  std::vector<int64_t> shape;
  DType dt;
  const std::vector<float> rf = GgufValues(*g, "rope_freqs.weight", &shape, &dt);
  EXPECT_EQ(shape, (std::vector<int64_t>{m.head_dim / 2}));
  EXPECT_EQ(dt, DType::kF32);
  int n_one = 0, n_factor = 0, n_smooth = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(rf.size()); ++i) {
    const double freq = 1.0 / std::pow(10000.0, 2.0 * i / m.head_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = 1.0;
      ++n_one;
    } else if (wavelen > 8192.0 / 1.0) {
      want = 8.0;
      ++n_factor;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = 1.0 / ((1 - smooth) / 8.0 + smooth);
      ++n_smooth;
    }
    EXPECT_NEAR(rf[i], want, 1e-5 * want) << "i=" << i;
  }
  EXPECT_GT(n_one, 0);
  EXPECT_GT(n_factor, 0);
  EXPECT_GT(n_smooth, 0);

  EXPECT_EQ(g->FindTensor("blk.0.self_attn.rotary_emb.inv_freq"), nullptr);
  EXPECT_EQ(GgufShape(*g, "token_embd.weight"), (std::vector<int64_t>{m.vocab, m.d}));
  EXPECT_EQ(GgufValues(*g, "token_embd.weight"), ck.Get("model.embed_tokens.weight").values);
  EXPECT_EQ(GgufValues(*g, "output.weight"), ck.Get("lm_head.weight").values);
  EXPECT_EQ(GgufValues(*g, "output_norm.weight"), ck.Get("model.norm.weight").values);

  for (int64_t l = 0; l < m.n_layer; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string gg = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(GgufValues(*g, gg + "attn_norm.weight"),
              ck.Get(hf + "input_layernorm.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "ffn_norm.weight"),
              ck.Get(hf + "post_attention_layernorm.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_v.weight"), ck.Get(hf + "self_attn.v_proj.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_v.bias"), ck.Get(hf + "self_attn.v_proj.bias").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_output.weight"),
              ck.Get(hf + "self_attn.o_proj.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "ffn_gate.weight"), ck.Get(hf + "mlp.gate_proj.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "ffn_up.weight"), ck.Get(hf + "mlp.up_proj.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "ffn_down.weight"), ck.Get(hf + "mlp.down_proj.weight").values);
    EXPECT_EQ(GgufShape(*g, gg + "ffn_down.weight"), (std::vector<int64_t>{m.d, m.ff}));
    // q and k: permuted rows (weights and biases), with n_head and n_head_kv heads.
    for (const char* p : {"q", "k"}) {
      const int64_t heads = std::string(p) == "q" ? m.n_head : m.n_kv;
      const std::vector<float>& hw = ck.Get(hf + "self_attn." + p + "_proj.weight").values;
      const std::vector<float>& hb = ck.Get(hf + "self_attn." + p + "_proj.bias").values;
      const std::vector<float> gw = GgufValues(*g, gg + "attn_" + p + ".weight");
      const std::vector<float> gb = GgufValues(*g, gg + "attn_" + p + ".bias");
      EXPECT_EQ(GgufShape(*g, gg + "attn_" + p + ".weight"),
                (std::vector<int64_t>{heads * m.head_dim, m.d}));
      ASSERT_EQ(gw.size(), hw.size());
      ASSERT_EQ(gb.size(), hb.size());
      for (int64_t r = 0; r < heads * m.head_dim; ++r) {
        const int64_t s = PermutedSourceRow(r, m.head_dim);
        EXPECT_EQ(gb[r], hb[s]) << p << " bias row " << r;
        for (int64_t c = 0; c < m.d; ++c) {
          ASSERT_EQ(gw[r * m.d + c], hw[s * m.d + c]) << p << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST(HfConvertTest, Qwen2ShardedBf16TiedNoPermutationYarn) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  LlamaDims m;
  m.n_kv = 1;
  Checkpoint ck(&rng, DType::kBF16);
  AddLlamaTensors(ck, m, /*biases=*/true);
  ck.Remove("lm_head.weight");
  json cfg = LlamaConfig(m, "Qwen2ForCausalLM");
  cfg["tie_word_embeddings"] = true;
  cfg["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 512}};
  ck.Write(tmp.dir(), cfg, /*shards=*/3);
  // A stray file not in the index must be ignored.
  ASSERT_TRUE(WriteSafetensors(tmp.File("stray.safetensors"),
                               {{"junk.weight", DType::kF32, {2}, {1.f, 2.f}}})
                  .ok());

  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = ToGguf(*w);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(KeyString(*g, "general.architecture"), "qwen2");
  EXPECT_EQ(KeyInt(*g, "qwen2.attention.head_count_kv"), 1);
  EXPECT_FLOAT_EQ(KeyFloat(*g, "qwen2.rope.freq_base"), 500000.f);
  EXPECT_EQ(KeyString(*g, "qwen2.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(KeyFloat(*g, "qwen2.rope.scaling.factor"), 4.f);
  EXPECT_EQ(KeyInt(*g, "qwen2.rope.scaling.original_context_length"), 512);
  EXPECT_FALSE(g->Has("qwen2.rope.scaling.yarn_log_multiplier"));
  EXPECT_EQ(g->FindTensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(g->FindTensor("rope_freqs.weight"), nullptr);
  EXPECT_EQ(GgufValues(*g, "token_embd.weight"), ck.Get("model.embed_tokens.weight").values);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".self_attn.";
    const std::string gg = "blk." + std::to_string(l) + ".";
    for (const char* p : {"q", "k", "v"}) {
      // No permutation for qwen2 (NEOX RoPE); bf16 -> f32 is exact.
      EXPECT_EQ(GgufValues(*g, gg + "attn_" + p + ".weight"),
                ck.Get(hf + p + "_proj.weight").values)
          << p;
      std::vector<int64_t> shape;
      DType dt;
      EXPECT_EQ(GgufValues(*g, gg + "attn_" + p + ".bias", &shape, &dt),
                ck.Get(hf + p + "_proj.bias").values)
          << p;
      EXPECT_EQ(dt, DType::kF32);
      EXPECT_EQ(shape.size(), 1u);
    }
  }
}

TEST(HfConvertTest, OutDTypesAndQ8Fallback) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  LlamaDims m;
  m.n_layer = 1;
  m.ff = 48;  // ffn_down is [64, 48]: 48 % 32 != 0 -> F16
  Checkpoint ck(&rng, DType::kF16);
  AddLlamaTensors(ck, m, /*biases=*/false);
  json cfg = LlamaConfig(m, "LlamaForCausalLM");
  cfg["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ck.Write(tmp.dir(), cfg);
  for (DType out : {DType::kF16, DType::kBF16, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(DTypeName(out)));
    auto w = ConvertHfDirectory(tmp.dir(), {out});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto g = ToGguf(*w);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(KeyString(*g, "llama.rope.scaling.type"), "linear");
    EXPECT_FLOAT_EQ(KeyFloat(*g, "llama.rope.scaling.factor"), 2.f);
    EXPECT_EQ(g->FindTensor("blk.0.attn_v.weight")->dtype, out);
    EXPECT_EQ(g->FindTensor("blk.0.ffn_up.weight")->dtype, out);
    EXPECT_EQ(g->FindTensor("blk.0.ffn_down.weight")->dtype,
              out == DType::kQ8_0 ? DType::kF16 : out);
    EXPECT_EQ(g->FindTensor("blk.0.attn_norm.weight")->dtype, DType::kF32);
    EXPECT_EQ(g->FindTensor("output_norm.weight")->dtype, DType::kF32);
    // Values survive within the output type's precision (inputs are f16, |x| < ~6: Q8_0 step is
    // amax/127 per 32 values, BF16 keeps 8 bits).
    const std::vector<float> got = GgufValues(*g, "blk.0.attn_v.weight");
    const std::vector<float>& want = ck.Get("model.layers.0.self_attn.v_proj.weight").values;
    ASSERT_EQ(got.size(), want.size());
    const double tol = out == DType::kF16 ? 0.0 : out == DType::kBF16 ? 0.02 : 0.05;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::fabs(want[i]))) << i;
    }
  }
}

struct DsDims {
  int64_t n_layer = 3, d = 32, n_head = 3, q_lora = 0, kv_lora = 16, nope = 8, rope = 4, v = 6;
  int64_t ff = 40, moe_ff = 12, n_expert = 4, n_used = 2, n_shared = 1, n_dense = 1, vocab = 24;
};

json DsConfig(const DsDims& m) {
  json c = {{"architectures", {"DeepseekV2ForCausalLM"}},
            {"hidden_size", m.d},
            {"intermediate_size", m.ff},
            {"moe_intermediate_size", m.moe_ff},
            {"num_hidden_layers", m.n_layer},
            {"num_attention_heads", m.n_head},
            {"num_key_value_heads", m.n_head},
            {"kv_lora_rank", m.kv_lora},
            {"qk_nope_head_dim", m.nope},
            {"qk_rope_head_dim", m.rope},
            {"v_head_dim", m.v},
            {"n_routed_experts", m.n_expert},
            {"n_shared_experts", m.n_shared},
            {"num_experts_per_tok", m.n_used},
            {"first_k_dense_replace", m.n_dense},
            {"moe_layer_freq", 1},
            {"routed_scaling_factor", 2.5},
            {"norm_topk_prob", true},
            {"scoring_func", "sigmoid"},
            {"max_position_embeddings", 4096},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000},
            {"vocab_size", m.vocab},
            {"tie_word_embeddings", false}};
  c["q_lora_rank"] = m.q_lora > 0 ? json(m.q_lora) : json(nullptr);
  return c;
}

void AddDsTensors(Checkpoint& ck, const DsDims& m, bool score_bias) {
  ck.Add("model.embed_tokens.weight", {m.vocab, m.d});
  ck.Add("model.norm.weight", {m.d});
  ck.Add("lm_head.weight", {m.vocab, m.d});
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ck.Add(p + "input_layernorm.weight", {m.d});
    ck.Add(p + "post_attention_layernorm.weight", {m.d});
    const std::string a = p + "self_attn.";
    if (m.q_lora > 0) {
      ck.Add(a + "q_a_proj.weight", {m.q_lora, m.d});
      ck.Add(a + "q_a_layernorm.weight", {m.q_lora});
      ck.Add(a + "q_b_proj.weight", {m.n_head * (m.nope + m.rope), m.q_lora});
    } else {
      ck.Add(a + "q_proj.weight", {m.n_head * (m.nope + m.rope), m.d});
    }
    ck.Add(a + "kv_a_proj_with_mqa.weight", {m.kv_lora + m.rope, m.d});
    ck.Add(a + "kv_a_layernorm.weight", {m.kv_lora});
    ck.Add(a + "kv_b_proj.weight", {m.n_head * (m.nope + m.v), m.kv_lora});
    ck.Add(a + "o_proj.weight", {m.d, m.n_head * m.v});
    if (l < m.n_dense) {
      ck.Add(p + "mlp.gate_proj.weight", {m.ff, m.d});
      ck.Add(p + "mlp.up_proj.weight", {m.ff, m.d});
      ck.Add(p + "mlp.down_proj.weight", {m.d, m.ff});
      continue;
    }
    ck.Add(p + "mlp.gate.weight", {m.n_expert, m.d});
    if (score_bias) ck.Add(p + "mlp.gate.e_score_correction_bias", {m.n_expert});
    for (int64_t e = 0; e < m.n_expert; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      ck.Add(x + "gate_proj.weight", {m.moe_ff, m.d});
      ck.Add(x + "up_proj.weight", {m.moe_ff, m.d});
      ck.Add(x + "down_proj.weight", {m.d, m.moe_ff});
    }
    const std::string s = p + "mlp.shared_experts.";
    ck.Add(s + "gate_proj.weight", {m.moe_ff * m.n_shared, m.d});
    ck.Add(s + "up_proj.weight", {m.moe_ff * m.n_shared, m.d});
    ck.Add(s + "down_proj.weight", {m.d, m.moe_ff * m.n_shared});
  }
}

TEST(HfConvertTest, Deepseek2MlaSplitMoeStackingAndNope) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  DsDims m;
  Checkpoint ck(&rng, DType::kF32);
  AddDsTensors(ck, m, /*score_bias=*/true);
  ck.Add("model.layers.3.eh_proj.weight", {m.d, 2 * m.d});  // an MTP layer: skipped
  json cfg = DsConfig(m);
  cfg["mla_use_nope"] = true;
  cfg["rope_scaling"] = {
      {"type", "yarn"},          {"factor", 40.0},  {"original_max_position_embeddings", 4096},
      {"mscale_all_dim", 0.707}, {"mscale", 0.707}, {"beta_fast", 32},
      {"beta_slow", 1}};
  ck.Write(tmp.dir(), cfg);

  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = ToGguf(*w);
  ASSERT_NE(g, nullptr);
  const std::string a = "deepseek2.";
  EXPECT_EQ(KeyString(*g, "general.architecture"), "deepseek2");
  // 0, not absent: llama.cpp refuses a deepseek2 file without the key.
  EXPECT_EQ(KeyInt(*g, a + "attention.q_lora_rank"), 0);
  EXPECT_EQ(KeyInt(*g, a + "attention.kv_lora_rank"), m.kv_lora);
  EXPECT_EQ(KeyInt(*g, a + "attention.key_length"), m.kv_lora + m.rope);
  EXPECT_EQ(KeyInt(*g, a + "attention.value_length"), m.kv_lora);
  EXPECT_EQ(KeyInt(*g, a + "attention.key_length_mla"), m.nope + m.rope);
  EXPECT_EQ(KeyInt(*g, a + "attention.value_length_mla"), m.v);
  EXPECT_EQ(KeyInt(*g, a + "attention.head_count"), m.n_head);
  EXPECT_EQ(KeyInt(*g, a + "attention.head_count_kv"), 1);
  EXPECT_EQ(KeyInt(*g, a + "rope.dimension_count"), m.rope);
  EXPECT_EQ(KeyInt(*g, a + "leading_dense_block_count"), m.n_dense);
  EXPECT_EQ(KeyInt(*g, a + "expert_feed_forward_length"), m.moe_ff);
  EXPECT_EQ(KeyInt(*g, a + "feed_forward_length"), m.ff);
  EXPECT_EQ(KeyInt(*g, a + "expert_count"), m.n_expert);
  EXPECT_EQ(KeyInt(*g, a + "expert_used_count"), m.n_used);
  EXPECT_EQ(KeyInt(*g, a + "expert_shared_count"), m.n_shared);
  EXPECT_FLOAT_EQ(KeyFloat(*g, a + "expert_weights_scale"), 2.5f);
  auto norm = g->GetBool(a + "expert_weights_norm");
  ASSERT_TRUE(norm.ok()) << norm.status().ToString();
  EXPECT_TRUE(*norm);
  EXPECT_EQ(KeyInt(*g, a + "expert_gating_func"), 2);
  auto nope = g->GetBool(a + "attention.mla_use_nope");
  ASSERT_TRUE(nope.ok()) << nope.status().ToString();
  EXPECT_TRUE(*nope);
  EXPECT_EQ(KeyString(*g, a + "rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(KeyFloat(*g, a + "rope.scaling.factor"), 40.f);
  EXPECT_EQ(KeyInt(*g, a + "rope.scaling.original_context_length"), 4096);
  EXPECT_FLOAT_EQ(KeyFloat(*g, a + "rope.scaling.yarn_log_multiplier"), 0.0707f);

  const int64_t per = m.nope + m.v;
  for (int64_t l = 0; l < m.n_layer; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string gg = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(GgufValues(*g, gg + "attn_q.weight"), ck.Get(hf + "self_attn.q_proj.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_kv_a_mqa.weight"),
              ck.Get(hf + "self_attn.kv_a_proj_with_mqa.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_kv_a_norm.weight"),
              ck.Get(hf + "self_attn.kv_a_layernorm.weight").values);
    EXPECT_EQ(GgufValues(*g, gg + "attn_output.weight"),
              ck.Get(hf + "self_attn.o_proj.weight").values);
    EXPECT_EQ(g->FindTensor(gg + "attn_kv_b.weight"), nullptr);
    // kv_b split, exact in F32 mode.
    const std::vector<float>& kvb = ck.Get(hf + "self_attn.kv_b_proj.weight").values;
    std::vector<int64_t> kshape, vshape;
    const std::vector<float> kb = GgufValues(*g, gg + "attn_k_b.weight", &kshape);
    const std::vector<float> vb = GgufValues(*g, gg + "attn_v_b.weight", &vshape);
    ASSERT_EQ(kshape, (std::vector<int64_t>{m.n_head, m.kv_lora, m.nope}));
    ASSERT_EQ(vshape, (std::vector<int64_t>{m.n_head, m.v, m.kv_lora}));
    for (int64_t h = 0; h < m.n_head; ++h) {
      for (int64_t j = 0; j < m.kv_lora; ++j) {
        for (int64_t i = 0; i < m.nope; ++i) {
          ASSERT_EQ(kb[(h * m.kv_lora + j) * m.nope + i], kvb[(h * per + i) * m.kv_lora + j])
              << "k_b h=" << h << " j=" << j << " i=" << i;
        }
      }
      for (int64_t i = 0; i < m.v; ++i) {
        for (int64_t j = 0; j < m.kv_lora; ++j) {
          ASSERT_EQ(vb[(h * m.v + i) * m.kv_lora + j], kvb[(h * per + m.nope + i) * m.kv_lora + j])
              << "v_b h=" << h << " i=" << i << " j=" << j;
        }
      }
    }
    if (l < m.n_dense) {
      EXPECT_EQ(GgufValues(*g, gg + "ffn_gate.weight"), ck.Get(hf + "mlp.gate_proj.weight").values);
      EXPECT_EQ(GgufValues(*g, gg + "ffn_down.weight"), ck.Get(hf + "mlp.down_proj.weight").values);
      EXPECT_EQ(g->FindTensor(gg + "ffn_gate_exps.weight"), nullptr);
      continue;
    }
    EXPECT_EQ(g->FindTensor(gg + "ffn_gate.weight"), nullptr);
    EXPECT_EQ(GgufValues(*g, gg + "ffn_gate_inp.weight"), ck.Get(hf + "mlp.gate.weight").values);
    EXPECT_EQ(GgufShape(*g, gg + "ffn_gate_inp.weight"), (std::vector<int64_t>{m.n_expert, m.d}));
    EXPECT_EQ(GgufValues(*g, gg + "exp_probs_b.bias"),
              ck.Get(hf + "mlp.gate.e_score_correction_bias").values);
    struct Part {
      const char* name;
      std::vector<int64_t> shape;
    };
    for (const Part& p :
         {Part{"gate", {m.n_expert, m.moe_ff, m.d}}, Part{"up", {m.n_expert, m.moe_ff, m.d}},
          Part{"down", {m.n_expert, m.d, m.moe_ff}}}) {
      std::vector<int64_t> shape;
      const std::vector<float> st = GgufValues(*g, gg + "ffn_" + p.name + "_exps.weight", &shape);
      ASSERT_EQ(shape, p.shape) << p.name;
      const int64_t per_e = p.shape[1] * p.shape[2];
      for (int64_t e = 0; e < m.n_expert; ++e) {
        const std::vector<float>& src =
            ck.Get(hf + "mlp.experts." + std::to_string(e) + "." + p.name + "_proj.weight").values;
        EXPECT_TRUE(std::equal(src.begin(), src.end(), st.begin() + e * per_e))
            << p.name << " expert " << e;
      }
      EXPECT_EQ(GgufValues(*g, gg + "ffn_" + p.name + "_shexp.weight"),
                ck.Get(hf + "mlp.shared_experts." + p.name + "_proj.weight").values);
    }
  }
}

TEST(HfConvertTest, Deepseek2QLoraAndRopeOnByDefault) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir tmp;
  DsDims m;
  m.q_lora = 20;
  m.n_layer = 2;
  Checkpoint ck(&rng, DType::kF32);
  AddDsTensors(ck, m, /*score_bias=*/false);
  json cfg = DsConfig(m);
  cfg["scoring_func"] = "softmax";
  cfg["norm_topk_prob"] = false;
  ck.Write(tmp.dir(), cfg);
  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = ToGguf(*w);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(KeyInt(*g, "deepseek2.attention.q_lora_rank"), m.q_lora);
  EXPECT_EQ(KeyInt(*g, "deepseek2.expert_gating_func"), 1);
  EXPECT_FALSE(g->Has("deepseek2.attention.mla_use_nope"));
  EXPECT_FALSE(g->Has("deepseek2.rope.scaling.type"));
  EXPECT_EQ(g->FindTensor("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(g->FindTensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(GgufValues(*g, "blk.1.attn_q_a.weight"),
            ck.Get("model.layers.1.self_attn.q_a_proj.weight").values);
  EXPECT_EQ(GgufValues(*g, "blk.1.attn_q_a_norm.weight"),
            ck.Get("model.layers.1.self_attn.q_a_layernorm.weight").values);
  EXPECT_EQ(GgufValues(*g, "blk.1.attn_q_b.weight"),
            ck.Get("model.layers.1.self_attn.q_b_proj.weight").values);
}

// A deepseek2 without routed experts: every layer dense. llama.cpp takes that from the leading
// dense count and requires the expert FFN length and shared count even then (issue 17 part 5).
TEST(HfConvertTest, Deepseek2DenseWritesWhatLlamaCppRequires) {
  Rng rng(TestSeed());
  TempDir tmp;
  DsDims m;
  m.n_expert = 0;
  m.n_dense = m.n_layer;
  Checkpoint ck(&rng, DType::kF32);
  AddDsTensors(ck, m, /*score_bias=*/false);
  json cfg = DsConfig(m);
  cfg["first_k_dense_replace"] = 1;  // moot without experts
  ck.Write(tmp.dir(), cfg);
  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = ToGguf(*w);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(KeyInt(*g, "deepseek2.leading_dense_block_count"), m.n_layer);
  EXPECT_EQ(KeyInt(*g, "deepseek2.expert_feed_forward_length"), m.ff);
  EXPECT_EQ(KeyInt(*g, "deepseek2.expert_shared_count"), 0);
  EXPECT_EQ(KeyInt(*g, "deepseek2.attention.q_lora_rank"), 0);
  EXPECT_FALSE(g->Has("deepseek2.expert_count"));
  for (int64_t l = 0; l < m.n_layer; ++l) {
    EXPECT_NE(g->FindTensor("blk." + std::to_string(l) + ".ffn_gate.weight"), nullptr) << l;
  }
}

TEST(HfConvertTest, ErrorsNameTheProblem) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  LlamaDims m;
  m.n_layer = 1;
  {  // Unsupported architecture.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    ck.Write(tmp.dir(), LlamaConfig(m, "MistralForCausalLM"));
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(w.status().message().find("MistralForCausalLM"), std::string::npos);
  }
  {  // Missing required tensor.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    ck.Remove("model.layers.0.mlp.up_proj.weight");
    ck.Write(tmp.dir(), LlamaConfig(m, "LlamaForCausalLM"));
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_NE(w.status().message().find("model.layers.0.mlp.up_proj.weight"), std::string::npos)
        << w.status().message();
  }
  {  // Untied without lm_head.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    ck.Remove("lm_head.weight");
    ck.Write(tmp.dir(), LlamaConfig(m, "LlamaForCausalLM"));
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_NE(w.status().message().find("lm_head.weight"), std::string::npos);
  }
  {  // Shape disagrees with config.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    json cfg = LlamaConfig(m, "LlamaForCausalLM");
    cfg["intermediate_size"] = m.ff + 1;
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("mlp.gate_proj.weight"), std::string::npos)
        << w.status().message();
  }
  {  // Unknown extra tensor is not dropped silently.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    ck.Add("model.layers.0.mlp.extra.weight", {4});
    ck.Write(tmp.dir(), LlamaConfig(m, "LlamaForCausalLM"));
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(w.status().message().find("model.layers.0.mlp.extra.weight"), std::string::npos);
  }
  {  // Unsupported rope scaling; missing config key; no config.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    json cfg = LlamaConfig(m, "LlamaForCausalLM");
    cfg["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(w.status().message().find("dynamic"), std::string::npos);
    cfg.erase("rope_scaling");
    cfg.erase("hidden_size");
    ck.Write(tmp.dir(), cfg);
    w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_NE(w.status().message().find("hidden_size"), std::string::npos);
    fs::remove(tmp.File("config.json"));
    w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_NE(w.status().message().find("config.json"), std::string::npos);
  }
  {  // An unsupported-dtype tensor that the mapping needs.
    TempDir tmp;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    ck.Remove("model.norm.weight");
    ck.Write(tmp.dir(), LlamaConfig(m, "LlamaForCausalLM"));
    const std::string h =
        R"({"model.norm.weight":{"dtype":"F64","shape":[64],"data_offsets":[0,512]}})";
    WriteBytes(tmp.File("extra.safetensors"), RawSafetensors(h.size(), h, 512));
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(w.status().message().find("F64"), std::string::npos) << w.status().message();
    EXPECT_NE(w.status().message().find("model.norm.weight"), std::string::npos);
  }
}

// ------------------------------------------------------------------------------------------------
// Crafted inputs (issue 13: D1 deep JSON, D2 wrapped head products, D3 rope factors sized by an
// unchecked head dim). Each reproducer is generated here.

std::string Nested(int depth, const std::string& inner = "1") {
  return std::string(static_cast<size_t>(depth), '[') + inner +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(CraftedInputTest, DeepJsonIsRefusedBeforeAnyRecursion) {
  constexpr int kDeep = 100000;  // the release binary died near 52,000 levels
  TempDir tmp;
  {  // A safetensors shape entry (was dumped recursively into the error message).
    const std::string h =
        R"({"a":{"dtype":"F32","shape":[)" + Nested(kDeep) + R"(],"data_offsets":[0,0]}})";
    const Status s = OpenRaw(tmp, RawSafetensors(h.size(), h, 0));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("nests deeper than 64 levels"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s.message();
    fs::remove(tmp.File("bad.safetensors"));
  }
  Rng rng(1);
  LlamaDims m;
  m.n_layer = 1;
  Checkpoint ck(&rng, DType::kF32);
  AddLlamaTensors(ck, m, false);
  ck.Write(tmp.dir(), LlamaConfig(m, "LlamaForCausalLM"));
  auto write_config = [&](const std::string& key, const std::string& raw_value) {
    std::string text = LlamaConfig(m, "LlamaForCausalLM").dump();
    text.pop_back();  // the closing brace
    text += ",\"" + key + "\":" + raw_value + "}";
    std::ofstream(tmp.File("config.json"), std::ios::trunc) << text;
  };
  // config.json values that were dumped (num_hidden_layers) or deep-copied (rope_scaling).
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"num_hidden_layers", Nested(kDeep)},
           {"rope_scaling", std::string(kDeep, '[') + std::string(kDeep, ']')},
           {"extra", Nested(65)}}) {
    write_config(key, value);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok()) << key;
    EXPECT_EQ(w.status().code(), StatusCode::kDataLoss) << w.status().ToString();
    EXPECT_NE(w.status().message().find("config.json: JSON nests deeper than 64"),
              std::string::npos)
        << w.status().message();
  }
  // 64 levels are accepted (the key is unknown and ignored), and brackets inside strings do not
  // count.
  write_config("extra", Nested(63, "\"" + std::string(200, '[') + "\""));
  EXPECT_OK(ConvertHfDirectory(tmp.dir(), {DType::kF32}).status());
  // A bad value is named, cut short, in the error.
  write_config("num_hidden_layers", "\"" + std::string(5000, '7') + "\"");
  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("num_hidden_layers"), std::string::npos);
  EXPECT_LT(w.status().message().size(), 300u) << w.status().message();
}

TEST(CraftedInputTest, HeadProductsAreCheckedInSixtyFourBits) {
  Rng rng(2);
  {  // D2, DeepSeek: 2^62 + 1 heads wrapped q_rows and the kv_b split to 8 rows; [8, 4] tensors
     // then matched and the per-head loop read and wrote past its buffers.
    TempDir tmp;
    DsDims m;
    m.n_layer = 1, m.d = 4, m.n_head = 1, m.kv_lora = 4, m.nope = 4, m.rope = 4, m.v = 4;
    m.n_expert = 0, m.n_dense = 1;
    Checkpoint ck(&rng, DType::kF32);
    AddDsTensors(ck, m, false);
    json cfg = DsConfig(m);
    cfg["num_attention_heads"] = (int64_t{1} << 62) + 1;
    cfg["num_key_value_heads"] = (int64_t{1} << 62) + 1;
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kOutOfRange) << w.status().ToString();
    EXPECT_NE(w.status().message().find("num_attention_heads"), std::string::npos)
        << w.status().message();
    // Within the per-key cap, the product still overflows a dimension.
    cfg["num_attention_heads"] = int64_t{1} << 29;
    cfg["num_key_value_heads"] = int64_t{1} << 29;
    ck.Write(tmp.dir(), cfg);
    w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kOutOfRange) << w.status().ToString();
    EXPECT_NE(w.status().message().find("num_attention_heads x (qk_nope_head_dim + "
                                        "qk_rope_head_dim) = 536870912 x 8 exceeds"),
              std::string::npos)
        << w.status().message();
  }
  {  // D2, llama: 2^61 + 1 heads with an explicit head_dim silently loaded one head.
    TempDir tmp;
    LlamaDims m;
    m.n_layer = 1, m.n_head = 1, m.n_kv = 1;
    Checkpoint ck(&rng, DType::kF32);
    AddLlamaTensors(ck, m, false);
    json cfg = LlamaConfig(m, "LlamaForCausalLM");
    cfg["num_attention_heads"] = (int64_t{1} << 61) + 1;
    cfg["num_key_value_heads"] = 1;
    cfg["head_dim"] = m.head_dim;
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kOutOfRange) << w.status().ToString();
    EXPECT_NE(w.status().message().find("num_attention_heads"), std::string::npos);
    cfg["num_attention_heads"] = int64_t{1} << 28;
    ck.Write(tmp.dir(), cfg);
    w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("num_attention_heads x head_dim = 268435456 x 16"),
              std::string::npos)
        << w.status().message();
  }
}

TEST(CraftedInputTest, RopeFactorsAreSizedOnlyByACheckedHeadDim) {
  // D3: llama3 rope scaling pushed head_dim / 2 floats for any positive even head_dim (2^40 grew
  // until memory ran out).
  Rng rng(3);
  TempDir tmp;
  LlamaDims m;
  m.n_layer = 1;
  Checkpoint ck(&rng, DType::kF32);
  AddLlamaTensors(ck, m, false);
  json cfg = LlamaConfig(m, "LlamaForCausalLM");
  cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  cfg["head_dim"] = int64_t{1} << 40;
  ck.Write(tmp.dir(), cfg);
  auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kOutOfRange) << w.status().ToString();
  EXPECT_NE(w.status().message().find("\"head_dim\" = 1099511627776 exceeds"), std::string::npos)
      << w.status().message();
  // In range but not what the tensors hold: refused at the q projection, before 2^29 factors.
  cfg["head_dim"] = int64_t{1} << 30;
  cfg["num_attention_heads"] = 1;
  cfg["num_key_value_heads"] = 1;
  ck.Write(tmp.dir(), cfg);
  w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().ToString();
  EXPECT_NE(w.status().message().find("model.layers.0.self_attn.q_proj.weight"),
            std::string::npos)
      << w.status().message();
  // DeepSeek's rope dim is checked against kv_a_proj_with_mqa the same way.
  TempDir ds;
  DsDims d;
  d.n_expert = 0, d.n_dense = d.n_layer;
  Checkpoint dck(&rng, DType::kF32);
  AddDsTensors(dck, d, false);
  json dcfg = DsConfig(d);
  dcfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  dcfg["qk_rope_head_dim"] = (int64_t{1} << 31) - 4;
  dck.Write(ds.dir(), dcfg);
  w = ConvertHfDirectory(ds.dir(), {DType::kF32});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("kv_lora_rank + qk_rope_head_dim"), std::string::npos)
      << w.status().message();
  dcfg["qk_rope_head_dim"] = int64_t{1} << 28;
  dck.Write(ds.dir(), dcfg);
  w = ConvertHfDirectory(ds.dir(), {DType::kF32});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("kv_a_proj_with_mqa"), std::string::npos)
      << w.status().message();
}

TEST(CraftedInputTest, CountsAreRangeChecked) {
  Rng rng(4);
  TempDir tmp;
  DsDims m;
  Checkpoint ck(&rng, DType::kF32);
  AddDsTensors(ck, m, false);
  const json base = DsConfig(m);
  auto expect = [&](const std::string& key, json value, const std::string& needle) {
    json cfg = base;
    cfg[key] = std::move(value);
    ck.Write(tmp.dir(), cfg);
    auto w = ConvertHfDirectory(tmp.dir(), {DType::kF32});
    ASSERT_FALSE(w.ok()) << key;
    EXPECT_NE(w.status().message().find(needle), std::string::npos) << w.status().message();
  };
  expect("first_k_dense_replace", m.n_layer + 1, "\"first_k_dense_replace\" = 4 exceeds 3");
  expect("first_k_dense_replace", -1, "\"first_k_dense_replace\" must be >= 0");
  expect("num_experts_per_tok", m.n_expert + 1, "\"num_experts_per_tok\" = 5 exceeds 4");
  expect("n_routed_experts", int64_t{1} << 33, "\"n_routed_experts\" = 8589934592 exceeds");
  expect("moe_layer_freq", 0, "\"moe_layer_freq\" must be >= 1");
  expect("n_group", int64_t{1} << 40, "\"n_group\"");
  expect("vocab_size", int64_t{1} << 32, "\"vocab_size\" = 4294967296 exceeds");
  expect("max_position_embeddings", -5, "\"max_position_embeddings\" must be >= 1");
}

}  // namespace
}  // namespace strata
