// Dequantization of GGUF files written by llama.cpp's llama-quantize, bit for bit against
// llama.cpp's own dequantization (issue 17 part 4). The fixtures in testdata/quant/ are data made
// by llama.cpp (testdata/quant/README.md says how): one tiny llama model quantized to each file
// type, and manifest.json with, per tensor, the SHA-256 of ggml's to_float output (f32 bytes), the
// first 64 values' bit patterns and an 8-hex-digit SHA-256 prefix per row (to name a bad row).
// Strata's reader opens each file, strata::DequantizeRow dequantizes every row, and the digests
// must match exactly. Each file must also hold the per-tensor type mix llama-quantize wrote, so a
// fixture that silently fell back to another type fails here too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/sha256.h"
#include "core/status_testing.h"
#include "io/gguf.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

const std::string kDir = std::string(STRATA_SOURCE_DIR) + "/testdata/quant/";

nlohmann::json Manifest() {
  std::ifstream f(kDir + "manifest.json");
  EXPECT_TRUE(f.good()) << "missing " << kDir << "manifest.json";
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string Hex8(const std::string& hex) { return hex.substr(0, 8); }

// The types llama-quantize chose for each tensor of the fixture model (1 layer, d_model 256, one
// KV head, no imatrix), per file type, in the order of kMatrices; the three norms are F32. A change
// in the fixture's mix (e.g. a fallback to F16 when a row length does not fit a K-quant) shows up
// as a difference from this table.
const char* const kMatrices[] = {"token_embd",   "blk.0.attn_q",      "blk.0.attn_k",
                                 "blk.0.attn_v", "blk.0.attn_output", "blk.0.ffn_gate",
                                 "blk.0.ffn_up", "blk.0.ffn_down",    "output"};
struct Mix {
  const char* ftype;
  const char* types;
};
constexpr Mix kMix[] = {
    {"IQ4_NL", "IQ4_NL IQ4_NL IQ4_NL Q5_K IQ4_NL IQ4_NL IQ4_NL IQ4_NL Q6_K"},
    {"IQ4_XS", "IQ4_XS IQ4_XS IQ4_XS Q5_K IQ4_XS IQ4_XS IQ4_XS IQ4_XS Q6_K"},
    {"Q2_K", "Q2_K Q2_K Q2_K Q4_K Q3_K Q2_K Q2_K Q3_K Q6_K"},
    {"Q3_K_L", "Q3_K Q3_K Q3_K Q5_K Q5_K Q3_K Q3_K Q5_K Q6_K"},
    {"Q3_K_M", "Q3_K Q3_K Q3_K Q5_K Q4_K Q3_K Q3_K Q4_K Q6_K"},
    {"Q3_K_S", "Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K Q6_K"},
    {"Q4_0", "Q4_0 Q4_0 Q4_0 Q4_0 Q4_0 Q4_0 Q4_0 Q4_0 Q6_K"},
    {"Q4_1", "Q4_1 Q4_1 Q4_1 Q4_1 Q4_1 Q4_1 Q4_1 Q4_1 Q6_K"},
    {"Q4_K_M", "Q4_K Q4_K Q4_K Q6_K Q4_K Q4_K Q4_K Q6_K Q6_K"},
    {"Q4_K_S", "Q4_K Q4_K Q4_K Q5_K Q4_K Q4_K Q4_K Q4_K Q6_K"},
    {"Q5_0", "Q5_0 Q5_0 Q5_0 Q5_0 Q5_0 Q5_0 Q5_0 Q5_0 Q6_K"},
    {"Q5_1", "Q5_1 Q5_1 Q5_1 Q5_1 Q5_1 Q5_1 Q5_1 Q5_1 Q6_K"},
    {"Q5_K_M", "Q5_K Q5_K Q5_K Q6_K Q5_K Q5_K Q5_K Q6_K Q6_K"},
    {"Q5_K_S", "Q5_K Q5_K Q5_K Q5_K Q5_K Q5_K Q5_K Q5_K Q6_K"},
    {"Q6_K", "Q6_K Q6_K Q6_K Q6_K Q6_K Q6_K Q6_K Q6_K Q6_K"},
    {"Q8_0", "Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0 Q8_0"},
};

std::map<std::string, std::string> ExpectedTypes(const std::string& ftype) {
  std::map<std::string, std::string> m = {{"blk.0.attn_norm.weight", "F32"},
                                          {"blk.0.ffn_norm.weight", "F32"},
                                          {"output_norm.weight", "F32"}};
  const Mix* mix = nullptr;
  for (const Mix& x : kMix) {
    if (ftype == x.ftype) mix = &x;
  }
  if (mix == nullptr) return {};
  std::istringstream types(mix->types);
  for (const char* t : kMatrices) types >> m[std::string(t) + ".weight"];
  return m;
}

TEST(QuantFixtureTest, EveryFileHoldsTheTypesLlamaQuantizeWrote) {
  const nlohmann::json man = Manifest();
  std::set<std::string> ftypes;
  for (const auto& f : man["files"]) {
    const std::string file = f["file"];
    ftypes.insert(f["ftype"].get<std::string>());
    auto g = GgufFile::Open(kDir + file);
    ASSERT_OK(g.status());
    const std::map<std::string, std::string> mix = ExpectedTypes(f["ftype"]);
    ASSERT_FALSE(mix.empty()) << file << ": no expected mix for " << f["ftype"];
    ASSERT_EQ((*g)->tensors().size(), mix.size()) << file;
    for (const GgufTensorInfo& t : (*g)->tensors()) {
      const auto want = mix.find(t.name);
      ASSERT_NE(want, mix.end()) << file << ": " << t.name;
      EXPECT_EQ(Upper(std::string(DTypeName(t.dtype))), want->second) << file << ": " << t.name;
    }
  }
  // Every type issue 17 lists, through the file types that carry it.
  for (const char* ft :
       {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
        "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    EXPECT_TRUE(ftypes.count(ft)) << "no fixture for " << ft;
  }
}

// Dequantizes every tensor of every fixture row by row and compares with llama.cpp's output.
TEST(QuantFixtureTest, DequantizationEqualsLlamaCppBitForBit) {
  const nlohmann::json man = Manifest();
  int tensors = 0;
  std::map<std::string, int> bad_by_type, good_by_type;
  for (const auto& f : man["files"]) {
    const std::string file = f["file"];
    auto g = GgufFile::Open(kDir + file);
    ASSERT_OK(g.status());
    for (const auto& mt : f["tensors"]) {
      const std::string name = mt["name"];
      const std::string type = Upper(mt["type"].get<std::string>());
      const GgufTensorInfo* info = (*g)->FindTensor(name);
      ASSERT_NE(info, nullptr) << file << ": " << name;
      ASSERT_EQ(Upper(std::string(DTypeName(info->dtype))), type) << file << ": " << name;
      auto view = (*g)->Tensor(name);
      ASSERT_OK(view.status());
      const int64_t ne0 = mt["ne"][0];
      int64_t n = 1;
      for (int64_t d : info->shape) n *= d;
      ASSERT_EQ(info->shape.back(), ne0) << file << ": " << name;
      const int64_t rows = n / ne0;
      const int64_t row_bytes = DTypeRowBytes(info->dtype, ne0);
      ASSERT_EQ(static_cast<uint64_t>(rows * row_bytes), info->n_bytes) << file << ": " << name;
      ASSERT_EQ(static_cast<int64_t>(mt["row_sha256_8"].size()), rows) << file << ": " << name;

      std::vector<float> out(n);
      const uint8_t* src = static_cast<const uint8_t*>(view->data);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(info->dtype, src + r * row_bytes, out.data() + r * ne0, ne0);
      }
      ++tensors;
      const std::string whole = Sha256::Hex(out.data(), out.size() * sizeof(float));
      if (whole == mt["sha256"].get<std::string>()) {
        ++good_by_type[type];
        continue;
      }
      ++bad_by_type[type];
      // Name the first differing row, and the first differing value if it is among the first 64.
      int64_t bad_row = -1;
      for (int64_t r = 0; r < rows && bad_row < 0; ++r) {
        if (Hex8(Sha256::Hex(out.data() + r * ne0, ne0 * sizeof(float))) !=
            mt["row_sha256_8"][r].get<std::string>()) {
          bad_row = r;
        }
      }
      std::string where = "row " + std::to_string(bad_row);
      for (size_t i = 0; i < mt["first64_bits"].size(); ++i) {
        const uint32_t want = std::stoul(mt["first64_bits"][i].get<std::string>(), nullptr, 16);
        if (F32Bits(out[i]) != want) {
          char buf[160];
          std::snprintf(buf, sizeof(buf),
                        "; element %zu: strata %.9g (0x%08x), llama.cpp %.9g (0x%08x)", i, out[i],
                        F32Bits(out[i]), BitsF32(want), want);
          where += buf;
          break;
        }
      }
      ADD_FAILURE() << file << ": tensor " << name << " (" << type
                    << ") differs from llama.cpp's dequantization: first differing " << where;
    }
  }
  EXPECT_GT(tensors, 0);
  for (const auto& [type, n] : good_by_type)
    std::printf("  %-7s %3d tensors bit-exact\n", type.c_str(), n);
  for (const auto& [type, n] : bad_by_type)
    std::printf("  %-7s %3d tensors DIFFER\n", type.c_str(), n);
}

}  // namespace
}  // namespace strata
