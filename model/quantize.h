// Whole-file GGUF quantization: llama.cpp's file types (Q4_K_M, Q8_0, ...), their per-tensor type
// mix, and the rewrite of a GGUF file with its weight matrices quantized (`strata quantize`,
// `synth --dtype`, `convert --dtype`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/gguf.h"

namespace strata {

// A file type as llama.cpp names it (general.file_type holds `id`, enum llama_ftype).
struct FileTypeInfo {
  const char* name;  // "Q4_K_M"
  uint32_t id;       // general.file_type
  DType base;        // the type most matrices get
  const char* what;  // one line for --help
};

// Every file type Strata writes. Not Q2_K_S and the IQ1/IQ2/IQ3 types: llama-quantize refuses to
// make them without an importance matrix, which Strata does not compute.
const std::vector<FileTypeInfo>& FileTypes();
// Case-insensitive ("q4_k_m" == "Q4_K_M"); InvalidArgument listing the valid names otherwise.
StatusOr<FileTypeInfo> ParseFileType(const std::string& name);
// Name of a general.file_type value ("MOSTLY_Q4_K_M"; unknown ids as "type N").
std::string FileTypeIdName(int64_t id);

// The shape facts the per-tensor mix depends on (read from the file's metadata).
struct MixModelInfo {
  int n_layer = 0;
  int n_gqa = 1;            // query heads per KV head (layer 0)
  int n_expert = 0;         // 0 or 1: dense
  bool has_output = true;   // false: tied embeddings (token_embd.weight is the output matrix)
  int n_attention_wv = 0;   // tensors named *attn_v.weight / *attn_qkv.weight / *attn_kv_b.weight
};
StatusOr<MixModelInfo> ReadMixModelInfo(const GgufFile& f);

// Chooses each tensor's type the way llama.cpp's quantizer does for the file type (no importance
// matrix): output and some attention/FFN matrices at higher precision for the _S/_M/_L types, a
// fallback type when a row is not a whole number of the chosen type's blocks. Stateful like
// llama.cpp's (it counts attn_v and ffn_down tensors in file order): call Choose once per tensor,
// in file order. Non-matrix tensors (norms, biases, routers) are not quantized: Choose returns
// F32 for them (`quantized` false).
class TensorTypePlanner {
 public:
  TensorTypePlanner(const FileTypeInfo& ft, const MixModelInfo& info);
  // shape outermost first (GGUF ne reversed). Returns the type to store the tensor in.
  StatusOr<DType> Choose(const std::string& name, const std::vector<int64_t>& shape,
                         bool* quantized);
  int n_fallback() const { return n_fallback_; }

 private:
  DType MixType(const std::string& name, int64_t row_len);
  FileTypeInfo ft_;
  MixModelInfo info_;
  int i_attention_wv_ = 0;
  int i_ffn_down_ = 0;
  int n_fallback_ = 0;
};

// True for the tensors llama.cpp's quantizer quantizes: names ending in "weight" with >= 2 dims,
// except norms, MoE routers (ffn_gate_inp) and position embeddings.
bool IsQuantizableTensor(const std::string& name, const std::vector<int64_t>& shape);

struct QuantizeProgress {
  int index = 0;  // 1-based tensor index
  int count = 0;
  const std::string* name = nullptr;
  DType from = DType::kF32;
  DType to = DType::kF32;
  int64_t bytes_in = 0, bytes_out = 0;
  bool converted = false;  // false: copied as it was (not a matrix, or already that type)
};

struct QuantizeFileOptions {
  FileTypeInfo type{};
  int threads = 1;
  // A source matrix that is already block-quantized is refused unless this is set (it is then
  // dequantized and quantized again, which loses precision twice).
  bool allow_requantize = false;
  std::function<void(const QuantizeProgress&)> progress;  // called after each tensor (may be null)
};

struct QuantizeFileReport {
  int64_t n_tensors = 0, n_quantized = 0, n_fallback = 0;
  int64_t bytes_in = 0, bytes_out = 0;  // tensor data
  int64_t n_weights = 0;
  double seconds = 0;
};

// Reads `in`, writes the quantized file to `out_path` (every metadata key kept; general.file_type
// and general.quantization_version set as llama.cpp sets them).
StatusOr<QuantizeFileReport> QuantizeGguf(const GgufFile& in, const std::string& out_path,
                                          const QuantizeFileOptions& o);

// For writers that build a model in f32 (synth, convert): writes `w` to a temporary file beside
// `out_path`, quantizes it into `out_path` and removes the temporary file.
StatusOr<QuantizeFileReport> WriteQuantized(const GgufWriter& w, const std::string& out_path,
                                            const QuantizeFileOptions& o);

// `--dtype` of synth/convert: f32, f16, bf16 or any file type name above (case-insensitive).
StatusOr<FileTypeInfo> ParseWeightFileType(const std::string& s);

}  // namespace strata
