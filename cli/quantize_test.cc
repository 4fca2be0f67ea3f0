// `strata quantize` end to end: every file type writes a file the engine loads, whose logits stay
// within a stated per-type distance of the f32 model's; llama.cpp's metadata; the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <map>

#include "cli/cli_testing.h"
#include "cli/common.h"
#include "core/quant.h"
#include "core/status_testing.h"
#include "io/gguf.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/quantize.h"

namespace strata::cli {
namespace {

class QuantizeCliTest : public TinyModelSuite<QuantizeCliTest> {
 public:
  static constexpr const char* kDirPrefix = "strata_quantize_cli_";

 protected:
  static void SetUpTestSuite() {
    TinyModelSuite<QuantizeCliTest>::SetUpTestSuite();
    // Every matrix row a whole number of 256-blocks, so each K-quant is used as itself.
    CliResult r = Strata({"synth", "--arch", "llama", "--dims", "d_model=256,ff=512,vocab=512",
                          "--dtype", "f32", "--seed", "3", "-o", Path("f32.gguf")});
    ASSERT_EQ(r.code, 0) << r.err;
  }
};

// Logits of every position of a fixed prompt.
std::vector<float> AllLogits(const std::string& path) {
  auto m = Model::Load(path);
  EXPECT_OK(m);
  if (!m.ok()) return {};
  auto cache = (*m)->NewCache(std::make_unique<FullPolicy>());
  EXPECT_OK(cache);
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 500));
  std::vector<float> all;
  EXPECT_OK((*m)->Prefill(ids.data(), static_cast<int64_t>(ids.size()), 512, cache->get(), nullptr,
                          nullptr, &all));
  return all;
}

// ||a - b|| / ||b||.
double RelativeRms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST_F(QuantizeCliTest, EveryFileTypeLoadsAndStaysCloseToF32) {
  const std::vector<float> ref = AllLogits(Path("f32.gguf"));
  ASSERT_FALSE(ref.empty());
  // Relative RMS distance of all logits to the f32 model's, measured on this model (seed 3; Q4_0
  // 0.249, Q4_1 0.295, Q5_0 0.190, Q5_1 0.155, IQ4_NL 0.276, IQ4_XS 0.268, Q2_K 0.565,
  // Q3_K_S 0.356, Q3_K_M 0.341, Q3_K_L 0.336, Q4_K_S 0.283, Q4_K_M 0.287, Q5_K_S 0.147,
  // Q5_K_M 0.146, Q6_K 0.086, Q8_0 0.029, F16 0.0031, BF16 0.015), allowed 1.5x. A random
  // 2-layer model's logits are a chaotic function of its weights, so at close bit rates the
  // order is not the bits' order (Q4_1 > Q4_0 here); the weights' own RMS errors are
  // (core/quant_encode_test.cc).
  const std::map<std::string, double> tol = {
      {"Q2_K", 0.85},   {"Q3_K_S", 0.53}, {"Q3_K_M", 0.51}, {"Q3_K_L", 0.50},
      {"Q4_0", 0.37},   {"Q4_1", 0.44},   {"IQ4_NL", 0.41}, {"IQ4_XS", 0.40}, {"Q4_K_S", 0.42},
      {"Q4_K_M", 0.43}, {"Q5_0", 0.29},   {"Q5_1", 0.23},   {"Q5_K_S", 0.22}, {"Q5_K_M", 0.22},
      {"Q6_K", 0.13},   {"Q8_0", 0.043},  {"F16", 0.005},   {"BF16", 0.023}};
  for (const FileTypeInfo& ft : FileTypes()) {
    if (std::string(ft.name) == "F32") continue;
    SCOPED_TRACE(ft.name);
    const std::string out = Path(std::string(ft.name) + ".gguf");
    CliResult r = Strata({"quantize", Path("f32.gguf"), out, "--type", ft.name, "-t", "2"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("[   1/  21] token_embd.weight: F32 -> "), std::string::npos) << r.err;
    EXPECT_NE(r.out.find(std::string("wrote ") + out + " (" + ft.name + ")"), std::string::npos)
        << r.out;
    auto f = GgufFile::Open(out);
    ASSERT_OK(f);
    EXPECT_EQ(*(*f)->GetInt("general.file_type"), ft.id);
    if (IsQuantized(ft.base)) {
      EXPECT_EQ(*(*f)->GetInt("general.quantization_version"), 2);
      // At least one matrix holds the file type's base type; norms stay F32.
      bool has_base = false;
      for (const GgufTensorInfo& t : (*f)->tensors()) has_base |= t.dtype == ft.base;
      EXPECT_TRUE(has_base);
    }
    EXPECT_EQ((*f)->FindTensor("output_norm.weight")->dtype, DType::kF32);
    const double d = RelativeRms(AllLogits(out), ref);
    std::cout << "  " << ft.name << ": relative RMS logit distance to f32 " << d << "\n";
    EXPECT_LE(d, tol.at(ft.name));
    // inspect names the file type.
    CliResult in = Strata({"inspect", out});
    ASSERT_EQ(in.code, 0) << in.err;
    EXPECT_NE(in.out.find("file type: " + FileTypeIdName(ft.id)), std::string::npos) << in.out;
  }
}

TEST_F(QuantizeCliTest, TypeAsThirdArgumentLikeLlamaQuantize) {
  CliResult r = Strata({"quantize", Path("f32.gguf"), Path("pos.gguf"), "q4_k_m"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto f = GgufFile::Open(Path("pos.gguf"));
  ASSERT_OK(f);
  EXPECT_EQ(*(*f)->GetInt("general.file_type"), 15);
  // Q4_K_M: output at Q6_K; of 2 layers, layer 1 is a "more bits" layer (i >= 7n/8) whose
  // attn_v and ffn_down are Q6_K, layer 0 is not.
  EXPECT_EQ((*f)->FindTensor("output.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_v.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_v.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_q.weight")->dtype, DType::kQ4_K);
}

TEST_F(QuantizeCliTest, Errors) {
  CliResult r = Strata({"quantize", Path("f32.gguf"), Path("x.gguf")});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("no file type given"), std::string::npos) << r.err;
  r = Strata({"quantize", Path("f32.gguf"), Path("x.gguf"), "--type", "Q4_K_Q"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("'Q4_K_Q' is not a file type"), std::string::npos) << r.err;
  r = Strata({"quantize", Path("f32.gguf"), Path("x.gguf"), "Q4_0", "--type", "Q8_0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("two file types given"), std::string::npos) << r.err;
  r = Strata({"quantize", Path("f32.gguf"), Path("f32.gguf"), "Q8_0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("is the input"), std::string::npos) << r.err;
  r = Strata({"quantize", Path("missing.gguf"), Path("x.gguf"), "Q8_0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("cannot read"), std::string::npos) << r.err;
  // An already quantized input is refused unless asked for.
  ASSERT_EQ(Strata({"quantize", Path("f32.gguf"), Path("q8.gguf"), "Q8_0"}).code, 0);
  r = Strata({"quantize", Path("q8.gguf"), Path("x.gguf"), "Q4_K_M"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("is already Q8_0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--allow-requantize"), std::string::npos) << r.err;
  r = Strata({"quantize", Path("q8.gguf"), Path("x.gguf"), "Q4_K_M", "--allow-requantize"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(QuantizeCliTest, NanWeightIsRefusedNamingTheTensor) {
  auto f = GgufFile::Open(Path("f32.gguf"));
  ASSERT_OK(f);
  GgufWriter w;
  for (const auto& [k, v] : (*f)->metadata()) w.Set(k, v);
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    auto v = (*f)->Tensor(t.name);
    ASSERT_OK(v);
    std::vector<float> vals(static_cast<const float*>(v->data),
                            static_cast<const float*>(v->data) + v->numel());
    if (t.name == "blk.1.ffn_up.weight") vals[777] = std::nanf("");
    ASSERT_OK(w.AddTensorF32(t.name, DType::kF32, t.shape, vals.data()));
  }
  ASSERT_OK(w.WriteFile(Path("nan.gguf")));
  CliResult r = Strata({"quantize", Path("nan.gguf"), Path("nan-q4.gguf"), "Q4_K_M"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("blk.1.ffn_up.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is nan (not finite)"), std::string::npos) << r.err;
}

TEST_F(QuantizeCliTest, SynthAndConvertTakeQuantizedTypes) {
  CliResult r = Strata({"synth", "--arch", "llama", "--dims", "d_model=256,ff=512,vocab=512",
                        "--dtype", "q4_k_m", "-o", Path("synth-q4km.gguf")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto f = GgufFile::Open(Path("synth-q4km.gguf"));
  ASSERT_OK(f);
  EXPECT_EQ(*(*f)->GetInt("general.file_type"), 15);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_q.weight")->dtype, DType::kQ4_K);
  r = Strata({"synth", "--dtype", "q4_k_m", "--format", "safetensors", "-o", Path("st")});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("needs --format gguf"), std::string::npos) << r.err;
  r = Strata({"synth", "--dtype", "q9", "-o", Path("q9.gguf")});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("--dtype 'q9' is not a file type"), std::string::npos) << r.err;
  // convert: an HF directory to Q8_0 and Q4_K_M.
  ASSERT_EQ(Strata({"synth", "--arch", "llama", "--dims", "d_model=256,ff=512,vocab=512",
                    "--format", "safetensors", "-o", Path("hf")})
                .code,
            0);
  for (const char* t : {"q8_0", "q4_k_m"}) {
    r = Strata({"convert", Path("hf"), "-o", Path(std::string("conv-") + t + ".gguf"), "--dtype",
                t});
    ASSERT_EQ(r.code, 0) << r.err;
    auto c = GgufFile::Open(Path(std::string("conv-") + t + ".gguf"));
    ASSERT_OK(c);
    EXPECT_EQ(*(*c)->GetInt("general.file_type"), std::string(t) == "q8_0" ? 7 : 15);
  }
}

// The output is compared with the input as a file (device and inode), not as a string: another
// spelling or a hard link of the input is refused and the input is left as it was; an existing
// output needs --overwrite; the file is written under a temporary name beside the output and
// renamed into place, so neither a failed nor a successful run leaves a temporary file.
TEST_F(QuantizeCliTest, OutputIsNeverTheInputAndIsReplacedOnlyWithOverwrite) {
  namespace fs = std::filesystem;
  const std::string dir = Path("safety");
  fs::create_directories(dir);
  const std::string in = dir + "/same.gguf";
  fs::copy_file(Path("f32.gguf"), in);
  const auto size = fs::file_size(in);
  const auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
  };
  fs::create_hard_link(in, dir + "/link.gguf");
  for (const std::string& out : {dir + "/./same.gguf", dir + "/../safety/same.gguf",
                                 dir + "/link.gguf"}) {
    SCOPED_TRACE(out);
    for (const bool overwrite : {false, true}) {
      std::vector<std::string> args = {"quantize", in, out, "Q8_0"};
      if (overwrite) args.push_back("--overwrite");
      CliResult r = Strata(args);
      EXPECT_EQ(r.code, kExitUsage);
      EXPECT_NE(r.err.find("the output '" + out + "' is the input '" + in + "' (the same file)"),
                std::string::npos)
          << r.err;
    }
  }
  EXPECT_EQ(fs::file_size(in), size);
  EXPECT_EQ(listing(), (std::set<std::string>{"same.gguf", "link.gguf"}));

  // An existing output is kept unless --overwrite.
  const std::string out = dir + "/out.gguf";
  std::ofstream(out) << "keep me";
  CliResult r = Strata({"quantize", in, out, "Q8_0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("the output '" + out + "' exists; pass --overwrite to replace it"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(fs::file_size(out), 7u);
  r = Strata({"quantize", in, out, "Q8_0", "--overwrite"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto q = GgufFile::Open(out);
  ASSERT_OK(q);
  EXPECT_EQ(*(*q)->GetInt("general.file_type"), 7);
  EXPECT_EQ(listing(), (std::set<std::string>{"same.gguf", "link.gguf", "out.gguf"}));

  // A run that fails leaves no output and no temporary file.
  r = Strata({"quantize", out, dir + "/again.gguf", "Q4_K_M"});  // needs --allow-requantize
  EXPECT_EQ(r.code, kExitUsage);
  r = Strata({"quantize", in, dir + "/missing/x.gguf", "Q8_0"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("the output's folder '" + dir + "/missing' does not exist"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(listing(), (std::set<std::string>{"same.gguf", "link.gguf", "out.gguf"}));

  // convert: the same rules; one of the checkpoint's own files is never the output.
  const std::string hf = dir + "/hf";
  ASSERT_EQ(Strata({"synth", "--arch", "llama", "--format", "safetensors", "-o", hf}).code, 0);
  r = Strata({"convert", hf, "-o", hf + "/model.safetensors"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("is the input"), std::string::npos) << r.err;
  EXPECT_TRUE(Model::Load(in).ok());
  r = Strata({"convert", hf, "-o", out});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("exists; pass --overwrite"), std::string::npos) << r.err;
  r = Strata({"convert", hf, "-o", out, "--overwrite", "--dtype", "q8_0"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(listing(), (std::set<std::string>{"same.gguf", "link.gguf", "out.gguf", "hf"}));
}

// The shipped testbeds quantized to Q8_0 give the same greedy text as the f32 files.
TEST_F(QuantizeCliTest, TestbedGreedyTextUnchangedAtQ8_0) {
  for (const char* name : {"gqa", "nope-mla", "rope-mla"}) {
    SCOPED_TRACE(name);
    const std::string in = std::string(STRATA_SOURCE_DIR) + "/models/" + name + ".gguf";
    const std::string out = Path(std::string(name) + "-q8.gguf");
    CliResult q = Strata({"quantize", in, out, "Q8_0"});
    ASSERT_EQ(q.code, 0) << q.err;
    CliResult a = Strata({"generate", "-m", in, "-p", "In the beginning", "-n", "24"});
    CliResult b = Strata({"generate", "-m", out, "-p", "In the beginning", "-n", "24"});
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
  }
}

}  // namespace
}  // namespace strata::cli
